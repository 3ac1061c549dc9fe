"""File-to-file jobs: one video tracked into a mask video, JSON and PNG masks (``track.py``), with
its clicks and boxes (``geometric.py``), output checks (``outputs.py``) and signal handling
(``interrupts.py``). ``sam3track track`` and every video of ``sam3track batch`` run it."""

from sam3track.jobs.track import TrackJob, run_track

__all__ = ["TrackJob", "run_track"]
