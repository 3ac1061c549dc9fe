"""sam3track: SAM 3 video tracking from exported graphs, without PyTorch at run time."""

from . import moved as _moved
from .errors import (ArgumentError, BackendError, BundleError, CapacityError, CapacityWarning, FrameIndexError,
                     ObjectIdError, OutputBusyError, PromptError, Sam3TrackError, SessionBusyError,
                     SessionClosedError, VideoError)
from .results import FrameResult
from .tracking_session import TrackingSession

__version__ = "0.1.0"

_moved.install()  # old paths of modules that moved into families/sam3 (sam3track/moved.py)


def load(bundle_dir, backend: str = "auto", device: str = "cpu", **options):
    """Load a bundle and return a Predictor (see sam3track.predictor.Predictor); its start_session gives a
    TrackingSession, whichever family the bundle holds."""
    from .load_notice import loading
    from .predictor import Predictor

    with loading():  # a slow load says on stderr what it is doing (load_notice.py)
        return Predictor.load(bundle_dir, backend=backend, device=device, **options)


__all__ = ["load", "FrameResult", "TrackingSession", "Sam3TrackError", "ArgumentError", "BackendError",
           "BundleError", "CapacityError", "CapacityWarning", "VideoError", "PromptError", "FrameIndexError",
           "ObjectIdError", "OutputBusyError", "SessionBusyError", "SessionClosedError", "__version__"]
