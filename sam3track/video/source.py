"""The frame-source interface: what the predictor, the writer and the CLI read frames through.

Frames are RGB ``uint8`` arrays of shape ``[H, W, 3]``, decoded lazily: a long video is never
held in memory, only the frame asked for (plus whatever the caller's bounded cache keeps). The
concrete sources live beside this module: :mod:`~sam3track.video.video_file`,
:mod:`~sam3track.video.image_folder` and :mod:`~sam3track.video.array`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from sam3track.errors import FrameIndexError, VideoError

# Image folders and arrays carry no timing; this is the rate their frames are stamped with
# (and the rate a mask video written from them plays at) unless the caller passes ``fps``.
DEFAULT_FPS = Fraction(25)


@dataclass(frozen=True)
class DecodedFrame:
    """One frame plus the timestamp the writer needs to keep the input's timing.

    ``pts`` is in units of ``time_base`` seconds; for a video it is the container's own
    presentation timestamp, so variable frame rate survives a read -> write round trip.
    """

    index: int
    rgb: np.ndarray  # uint8 [H, W, 3]
    pts: int
    time_base: Fraction

    @property
    def time(self) -> float:
        """Presentation time in seconds."""
        return float(self.pts * self.time_base)


class FrameSource:
    """The interface the predictor uses to get frames.

    Subclasses implement :meth:`read`, :meth:`__len__`, :attr:`height`, :attr:`width` and
    :meth:`close`; iteration (:meth:`frames`) defaults to calling :meth:`read` in order.
    Every source is a context manager; ``close()`` is idempotent.
    """

    name: str = "<frames>"  # what error messages call this source (a path, usually)

    def __len__(self) -> int:
        raise NotImplementedError

    @property
    def num_frames(self) -> int:
        return len(self)

    @property
    def height(self) -> int:
        raise NotImplementedError

    @property
    def width(self) -> int:
        raise NotImplementedError

    @property
    def frame_rate(self) -> Fraction:
        """Nominal frame rate as an exact fraction (e.g. 30000/1001)."""
        return DEFAULT_FPS

    @property
    def fps(self) -> float:
        return float(self.frame_rate)

    @property
    def time_base(self) -> Fraction:
        """Unit of :attr:`DecodedFrame.pts`, in seconds."""
        return 1 / self.frame_rate

    def read(self, index: int) -> np.ndarray:
        """Return frame ``index`` as RGB uint8 ``[H, W, 3]`` (a fresh array the caller may keep)."""
        raise NotImplementedError

    def pts(self, index: int) -> int:
        """Presentation timestamp of frame ``index`` in :attr:`time_base` units."""
        self._check_index(index)
        return index  # synthetic sources: one tick of 1/fps per frame

    def frames(self, start: int = 0, stop: int | None = None) -> Iterator[DecodedFrame]:
        """Yield frames ``start .. stop-1`` in order, with their timestamps."""
        stop = len(self) if stop is None else min(stop, len(self))
        for i in range(start, stop):
            yield DecodedFrame(i, self.read(i), self.pts(i), self.time_base)

    def __iter__(self) -> Iterator[DecodedFrame]:
        return self.frames()

    def close(self) -> None:
        pass

    def __enter__(self) -> "FrameSource":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_index(self, index: int) -> int:
        n = len(self)
        if not isinstance(index, (int, np.integer)) or not 0 <= index < n:
            raise FrameIndexError(
                f"frame {index} is outside {self.name}, which has {n} frames (valid: 0..{n - 1})"
            )
        return int(index)


class SizedSource(FrameSource):
    """A source that learns its frame size when it opens: subclasses set ``_height``, ``_width``."""

    _height: int
    _width: int

    @property
    def height(self) -> int:
        return self._height

    @property
    def width(self) -> int:
        return self._width


class FixedRateSource(SizedSource):
    """A source with no timing of its own (image folders, arrays): frames stamped at ``fps``.

    Subclasses implement :meth:`__len__` and :meth:`_load` (frame ``index`` as RGB uint8, a fresh
    array), set ``_height`` and ``_width`` from their first frame, and say how error messages
    name a frame (:meth:`_frame_name`) and the first one (``_first_name``): every frame read
    must have the first frame's size.
    """

    _first_name = "frame 0"

    def __init__(self, fps: float | Fraction = DEFAULT_FPS) -> None:
        self._rate = Fraction(fps).limit_denominator(1_000_000)

    @property
    def frame_rate(self) -> Fraction:
        return self._rate

    def _load(self, index: int) -> np.ndarray:
        raise NotImplementedError

    def _frame_name(self, index: int) -> str:
        return f"frame {index}"

    def read(self, index: int) -> np.ndarray:
        index = self._check_index(index)
        frame = self._load(index)
        if frame.shape[:2] != (self._height, self._width):
            raise VideoError(
                f"{self._frame_name(index)} is {frame.shape[1]}x{frame.shape[0]} but "
                f"{self._first_name} is {self._width}x{self._height}; all frames must share one "
                f"size"
            )
        return frame
