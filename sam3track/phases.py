"""The frame loop's phases: one order and one contract for every model family.

A frame is tracked as five named phases, always run in this order by `run_frame`:

1. ground     backbone + grounding: the frame's features and its detections over all text prompts.
2. propagate  every tracked object carried onto the frame by the tracker. It may store what the
              tracker computed there (pointers, per-object records, which frames were tracked), nothing
              decided.
3. plan       every heuristic decided (association, hotstart, occlusion suppression, births under the
              cap, removals, the bookkeeping's new values) from host masks and scores. It mutates
              nothing -- no registry, metadata, memory, score table or warning flag -- so everything a
              frame changes follows from the plan, and the plan can be read before any of it happens.
4. execute    the plan applied: memory encoding, births, removals, the bookkeeping installed.
5. outputs    the frame's result, read from the earlier phases' results; it mutates nothing either.

Each family implements the phases in its own module (SAM 3: frame_loop.py with planning.py; SAM 3.1:
families/sam31/tracker.py) as one `FramePhases` object per frame, which holds that frame's arguments;
the loop itself never branches on the family. What each phase returns is the family's own type: the
runner only hands every result to the phases after it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Generic, TypeVar

GroundedT = TypeVar("GroundedT")  # phase 1's result: features and detections
TrackedT = TypeVar("TrackedT")  # phase 2's result: the tracked objects on this frame
PlanT = TypeVar("PlanT")  # phase 3's result: every decision of the frame
OutputT = TypeVar("OutputT")  # phase 5's result: what the frame returns


class FramePhases(ABC, Generic[GroundedT, TrackedT, PlanT, OutputT]):
    """One frame of one family, split into the phases `run_frame` runs in order (contract above)."""

    @abstractmethod
    def ground(self) -> GroundedT:
        """1. backbone + grounding."""

    @abstractmethod
    def propagate(self, grounded: GroundedT) -> TrackedT:
        """2. propagation: the tracker's outputs of the frame, nothing decided."""

    @abstractmethod
    def plan(self, grounded: GroundedT, tracked: TrackedT) -> PlanT:
        """3. planning: every decision, nothing mutated."""

    @abstractmethod
    def execute(self, grounded: GroundedT, tracked: TrackedT, plan: PlanT) -> None:
        """4. execution: the plan applied."""

    @abstractmethod
    def outputs(self, grounded: GroundedT, tracked: TrackedT, plan: PlanT) -> OutputT:
        """5. outputs: the frame's result, nothing mutated."""


def run_frame(phases: FramePhases[GroundedT, TrackedT, PlanT, OutputT]) -> OutputT:
    """Run one frame's phases in the documented order, each given the results of those before it."""
    grounded = phases.ground()
    tracked = phases.propagate(grounded)
    plan = phases.plan(grounded, tracked)
    phases.execute(grounded, tracked, plan)
    return phases.outputs(grounded, tracked, plan)
