"""What every family's session shares: the lifecycle, the checks of public arguments, the frame cache.

A family's session (families/sam3/session.py, families/sam31/session.py) subclasses `SessionBase` and
adds its own prompts and propagation; callers only see the TrackingSession protocol
(tracking_session.py).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection

import numpy as np

from .errors import (ArgumentError, FrameIndexError, ObjectIdError, PromptError, SessionBusyError,
                     SessionClosedError, VideoError, frame_index_argument, object_id_argument,
                     shown, whole_number_argument)

DIRECTIONS = ("forward", "backward", "both")
MIN_FRAME_SIDE = 16  # smaller frames carry nothing to track; refuse them rather than upsample noise


def check_frame_size(height: int, width: int, where: str) -> None:
    if min(height, width) < MIN_FRAME_SIDE:
        raise VideoError(f"{where} is {width}x{height} pixels; frames must be at least {MIN_FRAME_SIDE} pixels on "
                         "each side")


def check_stream_frame(frame, index: int, size: tuple[int, int] | None) -> tuple[np.ndarray, tuple[int, int]]:
    """A live stream's frame `index`: an RGB uint8 (H, W, 3) array of the stream's first frame's size
    (`size`, None for the first frame). Returns the array and the stream's size."""
    frame = np.asarray(frame)
    if frame.ndim != 3 or frame.shape[2] != 3 or frame.dtype != np.uint8:
        raise VideoError(f"track() takes one RGB uint8 frame of shape (H, W, 3); got {frame.dtype} {frame.shape}")
    check_frame_size(frame.shape[0], frame.shape[1], f"frame {index} of the stream")
    if size is not None and frame.shape[:2] != size:
        raise VideoError(f"frame {index} is {frame.shape[1]}x{frame.shape[0]}, but the stream started at "
                         f"{size[1]}x{size[0]}; start a new session for a new size")
    return frame, size or frame.shape[:2]


def check_direction(direction) -> None:
    if not isinstance(direction, str) or direction not in DIRECTIONS:
        raise ArgumentError(f"direction must be one of {', '.join(map(repr, DIRECTIONS))}, not {shown(direction)}")


def check_max_frames(max_frames) -> None:
    if max_frames is not None and whole_number_argument(max_frames, "max_frames") < 1:
        raise ArgumentError(f"max_frames must be a whole number >= 1 or None, not {max_frames!r}")


def clicked_object_id(obj_id, where: str, tracked: Collection[int], max_used: int, max_num_objects: int,
                      reuse_ids: bool) -> tuple[int, bool]:
    """The object a clicks add_prompt is for, and whether it is new: None takes the next free id; a new
    object must fit under max_num_objects; without `reuse_ids`, a new id must be above `max_used`."""
    if obj_id is None:
        obj_id = max_used + 1
    elif object_id_argument(obj_id, f"{where}: obj_id") < 0:
        raise ObjectIdError(f"{where}: obj_id {obj_id!r} must be a whole number >= 0 (or None for a new object)")
    elif not reuse_ids and obj_id not in tracked and obj_id <= max_used:
        raise ObjectIdError(f"{where}: object {obj_id} is not tracked, and ids are never reused: a new object's "
                            f"id must be above {max_used}, the largest used so far; give obj_id=None "
                            "for the next free one")
    obj_id = int(obj_id)
    new = obj_id not in tracked
    if new and len(tracked) >= max_num_objects:
        raise PromptError(f"{where}: a new object {obj_id} would exceed max_num_objects={max_num_objects}; remove "
                          "an object first or load with a larger max_num_objects")
    return obj_id, new


class FrameCache:
    """A few decoded frames; frames are read lazily from the source and evicted oldest first."""

    def __init__(self, source, size: int = 4):
        self.source, self.size = source, size
        self._frames: OrderedDict[int, np.ndarray] = OrderedDict()

    def get(self, index: int) -> np.ndarray:
        if index not in self._frames:
            self._frames[index] = self.source.read(index)
            while len(self._frames) > self.size:
                self._frames.popitem(last=False)
        return self._frames[index]

    def clear(self) -> None:
        self._frames.clear()


class SessionBase:
    """Lifecycle and argument checks of a session over one predictor and one video (or a live stream,
    `source` None). Subclasses set `closed`, `_running` and implement `close` and `num_frames`."""

    predictor: object
    closed: bool
    _running: object | None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        raise NotImplementedError

    @property
    def num_frames(self) -> int | None:
        raise NotImplementedError

    def _check_open(self) -> None:
        if self.predictor.closed:
            raise SessionClosedError("the predictor of this session was closed; load the bundle again")
        if self.closed:
            raise SessionClosedError("this session is closed; start a new one with predictor.start_session()")

    def _check_idle(self, what: str) -> None:
        if self._running is not None:
            raise SessionBusyError(f"{what} while a propagate() of this session is still running; iterate it to "
                                   "the end or call .close() on it first")

    def _check_frame(self, index, what: str = "frame index") -> None:
        n = self.num_frames
        if not 0 <= frame_index_argument(index, what) < n:
            raise FrameIndexError(f"{what} {index!r} is out of range: the video has {n} frames (0..{n - 1})")
