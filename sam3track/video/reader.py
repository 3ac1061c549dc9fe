"""Frame sources: a video file, a folder of images, or an in-memory array.

All three expose the same small interface (:class:`FrameSource`) so the predictor never cares
where frames come from. Frames are RGB ``uint8`` arrays of shape ``[H, W, 3]``, decoded lazily:
a long video is never held in memory, only the frame asked for (plus whatever the caller's
bounded cache keeps).
"""

from __future__ import annotations

import bisect
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import cv2
import numpy as np

from sam3track.errors import FrameIndexError, VideoError

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".webp"})

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


# --------------------------------------------------------------------------------------------
# Video files (PyAV)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _PacketIndex:
    """Where every frame sits in the file, from one demux-only pass (no decoding).

    ``pts`` is sorted, so ``pts[i]`` is the timestamp of frame ``i`` in presentation order;
    ``keyframes`` holds the frame indices of keyframes and ``seek_ts`` the timestamp to seek to
    for each of them (the smaller of its pts and dts: mp4 seeks by dts, matroska by pts, and
    the smaller one lands on that keyframe in both).
    """

    pts: list[int]
    pts_to_index: dict[int, int]
    keyframes: list[int]
    seek_ts: list[int]


def _build_index(path: str, stream_index: int) -> _PacketIndex | None:
    """Demux the whole file once; None when packets have no pts (then only sequential decode)."""
    entries: list[tuple[int, int, bool]] = []
    with av.open(path) as container:
        stream = container.streams[stream_index]
        for packet in container.demux(stream):
            # The demuxer's final flush packet is empty; discarded packets (trimmed by an mp4
            # edit list) are decoded but their frames dropped, so they are not frames of ours.
            if packet.size == 0 or packet.is_discard:
                continue
            if packet.pts is None:
                return None
            dts = packet.dts if packet.dts is not None else packet.pts
            entries.append((packet.pts, dts, bool(packet.is_keyframe)))
    entries.sort(key=lambda e: e[0])
    pts = [e[0] for e in entries]
    keyframes = [i for i, e in enumerate(entries) if e[2]]
    return _PacketIndex(
        pts=pts,
        pts_to_index={p: i for i, p in enumerate(pts)},
        keyframes=keyframes,
        seek_ts=[min(entries[i][0], entries[i][1]) for i in keyframes],
    )


def _count_packets(path: str, stream_index: int) -> int:
    with av.open(path) as container:
        stream = container.streams[stream_index]
        return sum(1 for p in container.demux(stream) if p.size and not p.is_discard)


class _DecodeCursor:
    """One open container + decoder positioned somewhere in the video.

    ``frame_at(i)`` decodes forward when ``i`` is at or shortly after the current position (the
    predictor mostly walks frames in order) and otherwise seeks to the keyframe before ``i``
    and decodes forward from there. Frames are identified by pts, so the result is exactly the
    frame sequential decoding would give.
    """

    def __init__(self, reader: "VideoReader") -> None:
        self._reader = reader
        self._container = reader._open_container()
        self._stream = self._container.streams[reader._stream_index]
        # Frame threading speeds decoding up; output is bit-identical to single-threaded.
        self._stream.thread_type = "AUTO"
        self._frames: Iterator[Any] | None = None
        self._next_index = 0  # index the next decoded frame is expected to have
        self._started = False  # whether decoding ever began (a fresh file needs no seek)
        self._restarted_at: int | None = None  # keyframe number of the last seek

    def close(self) -> None:
        self._frames = None
        self._container.close()

    def _restart(self, keyframe: int | None) -> None:
        """Position the decoder at keyframe number ``keyframe``, or at the file start (None)."""
        if keyframe is None:
            if self._started:
                # Reopen rather than seek to 0: files without timestamps (raw .h264) refuse
                # to seek, and a fresh container is at the start with a clean decoder.
                self._container.close()
                self._container = self._reader._open_container()
                self._stream = self._container.streams[self._reader._stream_index]
                self._stream.thread_type = "AUTO"
            self._next_index = 0
        else:
            index = self._reader._index
            assert index is not None
            self._container.seek(index.seek_ts[keyframe], stream=self._stream, backward=True)
            self._next_index = index.keyframes[keyframe]
        self._started = True
        self._restarted_at = keyframe
        self._frames = self._container.decode(self._stream)

    def _index_of(self, frame: Any) -> int:
        index = self._reader._index
        if index is not None and frame.pts is not None:
            found = index.pts_to_index.get(frame.pts)
            if found is not None:
                return found
        return self._next_index  # no usable pts: trust decode order

    def _next_frame(self, target: int) -> Any:
        reader = self._reader
        try:
            assert self._frames is not None
            return next(self._frames)
        except StopIteration:
            self._frames = None
            raise VideoError(
                f"{reader.name}: the file ends before frame {target} (the header promised "
                f"{len(reader)} frames); the file is probably truncated, download or copy it "
                f"again"
            ) from None
        except av.error.FFmpegError as e:
            self._frames = None
            raise VideoError(
                f"{reader.name}: cannot decode frame {target} ({e}); the file is damaged or "
                f"uses an unsupported codec feature, re-encode it to H.264"
            ) from e

    def frame_at(self, target: int) -> Any:
        reader = self._reader
        # Reading the next frame in order needs no index; anything else builds it (once).
        index = reader._index if target == self._next_index else reader._lazy_index()
        keyframe: int | None = None  # None = decode from the file start (files without pts)
        if index is not None and index.keyframes:
            keyframe = max(bisect.bisect_right(index.keyframes, target) - 1, 0)
        must_seek = self._frames is None or target < self._next_index
        if not must_seek and keyframe is not None and index is not None:
            # Seeking pays off only when a keyframe lies between here and the target.
            must_seek = index.keyframes[keyframe] > self._next_index
        if must_seek:
            self._restart(keyframe)
        while True:
            frame = self._next_frame(target)
            got = self._index_of(frame)
            self._next_index = got + 1
            if got == target:
                return frame
            if got > target:
                # Decoding passed the target: the demuxer seeked coarsely (landed after the
                # keyframe asked for) or a frame is missing. Walk back one keyframe at a time.
                if self._restarted_at is None:
                    back = keyframe
                else:
                    back = self._restarted_at - 1
                if back is None or back < 0:
                    raise VideoError(
                        f"{reader.name}: frame {target} is missing from the decoded stream; "
                        f"re-encode the video (e.g. ffmpeg -i in.mp4 -c:v libx264 out.mp4)"
                    )
                self._restart(back)


class VideoReader(FrameSource):
    """A video file decoded lazily with PyAV; only the first video stream is used."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.name = str(self.path)
        self._closed = False
        self._cursor: _DecodeCursor | None = None
        self._index: _PacketIndex | None = None
        self._index_built = False
        self._first: np.ndarray | None = None
        if not self.path.exists():
            raise VideoError(f"video file not found: {self.name}; check the path")
        if self.path.is_dir():
            raise VideoError(
                f"{self.name} is a directory; use open_image_folder() for a folder of frames"
            )
        container = self._open_container()
        try:
            streams = container.streams.video
            if not streams:
                kinds = sorted({s.type for s in container.streams}) or ["none"]
                raise VideoError(
                    f"{self.name} has no video stream (streams found: {', '.join(kinds)}); "
                    f"pass a video file"
                )
            stream = streams[0]
            if stream.codec_context is None:
                raise VideoError(
                    f"{self.name}: this build of PyAV/FFmpeg has no decoder for its video "
                    f"codec; re-encode the video to H.264 (ffmpeg -i in -c:v libx264 out.mp4)"
                )
            self._stream_index = stream.index
            self._width = int(stream.codec_context.width)
            self._height = int(stream.codec_context.height)
            self._time_base = Fraction(stream.time_base) if stream.time_base else None
            self._avg_rate = Fraction(stream.average_rate) if stream.average_rate else None
            declared = int(stream.frames or 0)
            codec_name = stream.codec_context.name
        finally:
            container.close()

        # stream.frames comes from the container header; formats without one (mkv, webm,
        # some avi) report 0, so count packets instead (demux only, no decoding).
        self._num_frames = declared if declared > 0 else self._lazy_index_count()
        if self._num_frames == 0:
            raise VideoError(f"{self.name} has a video stream but no frames; pass another file")
        if self._time_base is None:
            self._time_base = 1 / self.frame_rate

        # Decode frame 0 now so a file that cannot be decoded fails here, with its name, rather
        # than deep inside tracking. The cursor stays positioned, so read(0) afterwards is free.
        self._cursor = _DecodeCursor(self)
        try:
            frame = self._cursor.frame_at(0)
        except VideoError as e:
            self.close()
            raise VideoError(
                f"{self.name}: cannot decode the first frame of its {codec_name} video stream "
                f"({e}); re-encode it to H.264 (ffmpeg -i in -c:v libx264 out.mp4)"
            ) from e
        self._first = self._to_rgb(frame, 0)
        if self._first.shape[:2] != (self._height, self._width):
            # Trust the decoded frame over the header (some files lie about the size).
            self._height, self._width = self._first.shape[:2]

    # -- opening ----------------------------------------------------------------------------

    def _open_container(self) -> Any:
        try:
            return av.open(self.name, mode="r")
        except av.error.FFmpegError as e:
            raise VideoError(
                f"{self.name} is not a readable video ({e}); pass an mp4/mov/mkv/webm/avi file "
                f"or a folder of images"
            ) from e

    def _lazy_index(self) -> _PacketIndex | None:
        if not self._index_built:
            self._index = _build_index(self.name, self._stream_index)
            self._index_built = True
        return self._index

    def _lazy_index_count(self) -> int:
        index = self._lazy_index()
        if index is not None:
            return len(index.pts)
        return _count_packets(self.name, self._stream_index)

    # -- properties -------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._num_frames

    @property
    def height(self) -> int:
        return self._height

    @property
    def width(self) -> int:
        return self._width

    @property
    def frame_rate(self) -> Fraction:
        if self._avg_rate:
            return self._avg_rate
        # No declared rate: derive it from the timestamps if we can, else a sane default.
        index = self._lazy_index()
        tb = self._time_base
        if index is not None and tb is not None and len(index.pts) > 1:
            span = (index.pts[-1] - index.pts[0]) * tb
            if span > 0:
                return Fraction(len(index.pts) - 1) / span
        return DEFAULT_FPS

    @property
    def time_base(self) -> Fraction:
        assert self._time_base is not None
        return self._time_base

    def pts(self, index: int) -> int:
        index = self._check_index(index)
        packets = self._lazy_index()
        if packets is not None and index < len(packets.pts):
            return packets.pts[index]
        return round(index / (self.frame_rate * self.time_base))  # no pts in the file

    # -- decoding ---------------------------------------------------------------------------

    def _to_rgb(self, frame: Any, index: int) -> np.ndarray:
        try:
            # Contiguous: odd widths come back as a strided view, which OpenCV rejects.
            return np.ascontiguousarray(frame.to_ndarray(format="rgb24"))
        except (av.error.FFmpegError, ValueError) as e:
            raise VideoError(
                f"{self.name}: cannot convert frame {index} to RGB ({e}); re-encode the video"
            ) from e

    def read(self, index: int) -> np.ndarray:
        """Frame ``index`` by seeking to the keyframe before it and decoding forward."""
        self._assert_open()
        index = self._check_index(index)
        if index == 0 and self._first is not None:
            return self._first.copy()
        assert self._cursor is not None
        return self._to_rgb(self._cursor.frame_at(index), index)

    def frames(self, start: int = 0, stop: int | None = None) -> Iterator[DecodedFrame]:
        """Decode ``start .. stop-1`` sequentially on a decoder of its own.

        A separate container means iterating never disturbs :meth:`read`'s position (and vice
        versa). Frames are numbered in decode order from ``start``; pts come from the file.
        """
        self._assert_open()
        stop = len(self) if stop is None else min(stop, len(self))
        if start >= stop:
            return
        start = self._check_index(start)
        cursor = _DecodeCursor(self)
        try:
            for i in range(start, stop):
                frame = cursor.frame_at(i)
                pts = frame.pts if frame.pts is not None else self.pts(i)
                yield DecodedFrame(i, self._to_rgb(frame, i), int(pts), self.time_base)
        finally:
            cursor.close()

    def _assert_open(self) -> None:
        if self._closed:
            raise VideoError(f"{self.name} was closed; open it again with open_video()")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._first = None
        if self._cursor is not None:
            self._cursor.close()
            self._cursor = None

    def __enter__(self) -> "VideoReader":
        return self


def open_video(path: str | os.PathLike[str]) -> VideoReader:
    """Open a video file for lazy, random-access decoding (audio and other streams ignored)."""
    return VideoReader(path)


# --------------------------------------------------------------------------------------------
# Image folders (OpenCV)
# --------------------------------------------------------------------------------------------


def _natural_key(name: str) -> list[Any]:
    # "frame2.jpg" before "frame10.jpg"; zero-padded names sort the same as plain sorting.
    return [int(t) if t.isdigit() else t.lower() for t in re.split(r"(\d+)", name)]


class ImageFolderSource(FrameSource):
    """A folder of images (jpg/jpeg/png/bmp/webp), one frame per file in natural name order."""

    def __init__(self, path: str | os.PathLike[str], fps: float | Fraction = DEFAULT_FPS) -> None:
        self.path = Path(path)
        self.name = str(self.path)
        if not self.path.exists():
            raise VideoError(f"image folder not found: {self.name}; check the path")
        if not self.path.is_dir():
            raise VideoError(f"{self.name} is not a folder; use open_video() for a video file")
        files = [
            p for p in self.path.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES
        ]
        if not files:
            raise VideoError(
                f"{self.name} holds no images ({', '.join(sorted(IMAGE_SUFFIXES))}); "
                f"pass a folder of frames"
            )
        self.files = sorted(files, key=lambda p: _natural_key(p.name))
        self._rate = Fraction(fps).limit_denominator(1_000_000)
        first = self._load(0)
        self._height, self._width = first.shape[:2]

    def _load(self, index: int) -> np.ndarray:
        file = self.files[index]
        # imdecode of the raw bytes rather than imread: imread silently returns None for
        # unreadable files and mishandles some non-ASCII paths on Windows.
        try:
            data = np.fromfile(file, dtype=np.uint8)
        except OSError as e:
            raise VideoError(f"cannot read image {file} (frame {index}): {e}") from e
        bgr = cv2.imdecode(data, cv2.IMREAD_COLOR) if data.size else None
        if bgr is None:
            raise VideoError(
                f"cannot decode image {file} (frame {index}); the file is damaged or not an "
                f"image, replace or remove it"
            )
        return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)

    def __len__(self) -> int:
        return len(self.files)

    @property
    def height(self) -> int:
        return self._height

    @property
    def width(self) -> int:
        return self._width

    @property
    def frame_rate(self) -> Fraction:
        return self._rate

    def read(self, index: int) -> np.ndarray:
        index = self._check_index(index)
        rgb = self._load(index)
        if rgb.shape[:2] != (self._height, self._width):
            raise VideoError(
                f"image {self.files[index]} (frame {index}) is {rgb.shape[1]}x{rgb.shape[0]} but "
                f"the first image is {self._width}x{self._height}; all frames must share one size"
            )
        return rgb


def open_image_folder(
    path: str | os.PathLike[str], fps: float | Fraction = DEFAULT_FPS
) -> ImageFolderSource:
    """Open a folder of images as a video; ``fps`` only sets the timing of written outputs."""
    return ImageFolderSource(path, fps)


# --------------------------------------------------------------------------------------------
# In-memory frames
# --------------------------------------------------------------------------------------------


class ArraySource(FrameSource):
    """Frames already in memory: an ``[N, H, W, 3]`` uint8 array or a sequence of ``[H, W, 3]``."""

    def __init__(
        self, frames: np.ndarray | Sequence[np.ndarray], fps: float | Fraction = DEFAULT_FPS
    ) -> None:
        self.name = "<array of frames>"
        self._frames = frames
        self._rate = Fraction(fps).limit_denominator(1_000_000)
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

    @property
    def height(self) -> int:
        return self._height

    @property
    def width(self) -> int:
        return self._width

    @property
    def frame_rate(self) -> Fraction:
        return self._rate

    def read(self, index: int) -> np.ndarray:
        index = self._check_index(index)
        frame = self._validated(index)
        if frame.shape[:2] != (self._height, self._width):
            raise VideoError(
                f"frame {index} of the array is {frame.shape[1]}x{frame.shape[0]} but frame 0 is "
                f"{self._width}x{self._height}; all frames must share one size"
            )
        # A copy, so a caller's cache can't be changed behind its back through the input array.
        return np.array(frame, dtype=np.uint8, order="C", copy=True)


def frames_from_array(
    frames: np.ndarray | Sequence[np.ndarray], fps: float | Fraction = DEFAULT_FPS
) -> ArraySource:
    """Wrap in-memory RGB frames in the :class:`FrameSource` interface."""
    return ArraySource(frames, fps)


def open_source(
    source: str | os.PathLike[str] | np.ndarray | Sequence[np.ndarray] | FrameSource,
) -> FrameSource:
    """A video file, an image folder, an array of frames, or an existing source, as a source."""
    if isinstance(source, FrameSource):
        return source
    if isinstance(source, (str, os.PathLike)):
        return open_image_folder(source) if Path(source).is_dir() else open_video(source)
    return frames_from_array(source)
