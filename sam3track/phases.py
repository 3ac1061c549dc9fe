"""The frame loop's phases: one order and one contract for every model family.

`run_frame` runs five named phases, always in this order: ground, propagate, plan, execute, outputs.
plan and outputs mutate nothing, so everything a frame changes follows from the plan. Each family
implements the phases as one `FramePhases` object per frame (SAM 3: families/sam3/frame_loop.py; SAM 3.1:
families/sam31/tracker.py); the loop never branches on the family. What each phase may change:
docs/architecture.md, "A frame's phases".
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
