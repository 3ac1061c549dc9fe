"""Frames already in memory (an array or a sequence of arrays) behind the FrameSource interface."""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

import numpy as np

from sam3track.errors import VideoError
from sam3track.video.source import DEFAULT_FPS, FixedRateSource


class ArraySource(FixedRateSource):
    """Frames already in memory: an ``[N, H, W, 3]`` uint8 array or a sequence of ``[H, W, 3]``."""

    def __init__(
        self, frames: np.ndarray | Sequence[np.ndarray], fps: float | Fraction = DEFAULT_FPS
    ) -> None:
        self.name = "<array of frames>"
        self._frames = frames
        super().__init__(fps)
        if len(frames) == 0:
            raise VideoError("the frame array is empty; pass at least one RGB frame")
        if isinstance(frames, np.ndarray) and (frames.ndim != 4 or frames.shape[-1] != 3):
            raise VideoError(
                f"the frame array has shape {frames.shape}; expected [N, H, W, 3] RGB uint8"
            )
        first = self._validated(0)
        self._height, self._width = first.shape[:2]

    def _validated(self, index: int) -> np.ndarray:
        frame = np.asarray(self._frames[index])
        if frame.ndim != 3 or frame.shape[2] != 3 or frame.dtype != np.uint8:
            raise VideoError(
                f"frame {index} of the array has shape {frame.shape} and dtype {frame.dtype}; "
                f"expected [H, W, 3] uint8 RGB"
            )
        return frame

    def __len__(self) -> int:
        return len(self._frames)

    def _load(self, index: int) -> np.ndarray:
        # A copy, so a caller's cache can't be changed behind its back through the input array.
        return np.array(self._validated(index), dtype=np.uint8, order="C", copy=True)

    def _frame_name(self, index: int) -> str:
        return f"frame {index} of the array"


def frames_from_array(
    frames: np.ndarray | Sequence[np.ndarray], fps: float | Fraction = DEFAULT_FPS
) -> ArraySource:
    """Wrap in-memory RGB frames in the :class:`FrameSource` interface."""
    return ArraySource(frames, fps)
