"""The shared frame runner (sam3track/phases.py): the phases in the documented order, each handed the
results of the phases before it, for a family that is neither SAM 3 nor SAM 3.1."""

from __future__ import annotations

import pytest

from sam3track.phases import FramePhases, run_frame


class RecordingFrame(FramePhases[str, str, str, str]):
    """A fake family whose phases log their calls and return tokens naming what they were given."""

    def __init__(self):
        self.calls: list[tuple[str, tuple]] = []

    def ground(self):
        self.calls.append(("ground", ()))
        return "grounded"

    def propagate(self, grounded):
        self.calls.append(("propagate", (grounded,)))
        return "tracked"

    def plan(self, grounded, tracked):
        self.calls.append(("plan", (grounded, tracked)))
        return "plan"

    def execute(self, grounded, tracked, plan):
        self.calls.append(("execute", (grounded, tracked, plan)))
        return "ignored"  # execution's return value is not the frame's result

    def outputs(self, grounded, tracked, plan):
        self.calls.append(("outputs", (grounded, tracked, plan)))
        return "output"


def test_run_frame_runs_the_phases_in_order_with_earlier_results():
    frame = RecordingFrame()
    assert run_frame(frame) == "output"
    assert frame.calls == [
        ("ground", ()),
        ("propagate", ("grounded",)),
        ("plan", ("grounded", "tracked")),
        ("execute", ("grounded", "tracked", "plan")),
        ("outputs", ("grounded", "tracked", "plan")),
    ]


def test_a_family_must_implement_every_phase():
    class NoPlanning(FramePhases):
        def ground(self): ...
        def propagate(self, grounded): ...
        def execute(self, grounded, tracked, plan): ...
        def outputs(self, grounded, tracked, plan): ...

    with pytest.raises(TypeError, match="plan"):
        NoPlanning()


def test_both_families_frames_are_frame_phases():
    from sam3track.families.sam31.tracker import Sam31Frame
    from sam3track.families.sam3.frame_loop import Sam3Frame

    assert issubclass(Sam3Frame, FramePhases) and issubclass(Sam31Frame, FramePhases)
