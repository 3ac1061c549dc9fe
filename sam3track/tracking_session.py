"""The one session type a caller needs: what ``predictor.start_session`` returns for either family.

SAM 3's :class:`sam3track.families.sam3.session.Sam3Session` and SAM 3.1's
:class:`sam3track.families.sam31.session.Sam31Session` both satisfy :class:`TrackingSession`; the
CLI, the request API (compat.py), batch, sinks and notebooks use only what it names. Where the
families read a prompt differently, the session says so in data (``box_prompts``), never by type.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal, Protocol, runtime_checkable

import numpy as np

from .results import FrameResult

# How a session reads boxes: "tracker" (SAM 3: each box is an object of its own, decoded by the
# tracker) or "detector" (SAM 3.1: boxes are exemplars of the text prompt, read by that frame's
# detection, as in Meta's predictor)
BoxPrompts = Literal["tracker", "detector"]


@runtime_checkable
class TrackingSession(Protocol):
    box_prompts: BoxPrompts

    @property
    def num_frames(self) -> int | None:
        """Frames of the video; None for a live stream."""

    @property
    def object_ids(self) -> list[int]:
        """Ids of the objects tracked now."""

    def frame(self, index: int) -> np.ndarray:
        """The RGB frame ``index`` of the video (decoded once, cached)."""

    def add_prompt(self, frame_index: int = 0, text: str | None = None, points=None, labels=None, boxes=None,
                   obj_id: int | None = None, clear_old_points: bool = ...):
        """A text prompt, clicks or boxes on ``frame_index`` (each family's defaults and extras: its
        session's add_prompt)."""

    def propagate(self, direction: str = "forward", start_frame: int | None = None,
                  max_frames: int | None = None) -> Iterator[FrameResult]:
        """Track through the video, one FrameResult per frame."""

    def run_frame(self, frame_index: int) -> FrameResult:
        """Track one frame of the video now."""

    def track(self, frame: np.ndarray) -> FrameResult:
        """A live stream's next frame."""

    def remove_object(self, obj_id: int) -> None:
        """Stop tracking ``obj_id`` (its id is never reused)."""

    def reset(self) -> None:
        """Forget every object, memory and prompt; the video stays."""

    def text_prompt_result(self, frame_index: int, text: str) -> FrameResult:
        """The objects of one text prompt on one frame (the request API's add_prompt answer)."""

    def close(self) -> None:
        """Free the session's device memory; any later call raises SessionClosedError."""

    def __enter__(self) -> TrackingSession: ...

    def __exit__(self, *exc) -> None: ...
