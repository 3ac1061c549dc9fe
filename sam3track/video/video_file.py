"""Video files decoded lazily with PyAV, with random access by frame index.

Only the frame asked for is decoded: reading in order walks the decoder forward, and any other
frame seeks to the keyframe before it (see :mod:`~sam3track.video.random_access`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np

from sam3track.errors import VideoError
from sam3track.video.frame_index import FrameIndex, count_packets, keep_decoded, scan_packets
from sam3track.video.random_access import DecodeCursor
from sam3track.video.source import DEFAULT_FPS, DecodedFrame, SizedSource


class VideoReader(SizedSource):
    """A video file decoded lazily with PyAV; only the first video stream is used.

    Its frames are those a plain PyAV decode yields, numbered in presentation order (see
    :mod:`~sam3track.video.frame_index`), except that a file cut short keeps the count its
    header promised and says it is truncated when a frame past the cut is asked for.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.name = str(self.path)
        self._closed = False
        self._cursor: DecodeCursor | None = None
        self._first: np.ndarray | None = None
        _check_is_file(self.path)
        declared, codec_name = self._probe()
        try:
            self._index = self._index_frames()
        except VideoError as e:
            raise _undecodable(self.name, codec_name, e) from e
        self._num_frames = self._count_frames(declared)
        if self._num_frames == 0:
            raise VideoError(f"{self.name} has a video stream but no frames; pass another file")
        if self._time_base is None:
            self._time_base = 1 / self.frame_rate
        # Decode frame 0 now so a file that cannot be decoded fails here, with its name, rather
        # than deep inside tracking. The cursor stays positioned, so read(0) afterwards is free.
        self._cursor = DecodeCursor(self)
        try:
            frame = self._cursor.frame_at(0)
        except VideoError as e:
            self.close()
            raise _undecodable(self.name, codec_name, e) from e
        self._first = self._to_rgb(frame, 0)
        if self._first.shape[:2] != (self._height, self._width):
            # Trust the decoded frame over the header (some files lie about the size).
            self._height, self._width = self._first.shape[:2]

    def _probe(self) -> tuple[int, str]:
        """Read the header: stream, size, timing. Returns its frame count (0: none) and codec."""
        container = self.open_container()
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
            self.stream_index = stream.index
            self._width = int(stream.codec_context.width)
            self._height = int(stream.codec_context.height)
            self._time_base = Fraction(stream.time_base) if stream.time_base else None
            self._avg_rate = Fraction(stream.average_rate) if stream.average_rate else None
            return int(stream.frames or 0), stream.codec_context.name
        finally:
            container.close()

    def _index_frames(self) -> FrameIndex | None:
        """One demux pass, then a decode of the first picture and the last GOP (frame_index)."""
        try:
            index = scan_packets(self.name, self.stream_index)
            if index is None:
                return None
            return keep_decoded(index, self.open_container, self.stream_index)
        except av.error.FFmpegError as e:
            raise VideoError(f"{self.name}: cannot read it ({e})") from e

    def _count_frames(self, declared: int) -> int:
        index = self._index
        if index is None:  # no pts to index by: the header's count, else one per packet
            return declared if declared > 0 else count_packets(self.name, self.stream_index)
        if declared > index.packets:
            # The header lists packets the file no longer holds: a cut download. Keep its
            # count, so the frames past the cut say so when asked for.
            return declared - index.hidden
        return len(index.pts)

    # -- opening ----------------------------------------------------------------------------

    def open_container(self) -> Any:
        try:
            return av.open(self.name, mode="r")
        except av.error.FFmpegError as e:
            raise VideoError(
                f"{self.name} is not a readable video ({e}); pass an mp4/mov/mkv/webm/avi file "
                f"or a folder of images"
            ) from e

    def frame_index(self) -> FrameIndex | None:
        """Every frame's pts and the keyframes; None when the file's pts cannot tell its
        frames apart (then they are numbered in the order the decoder gives them)."""
        return self._index

    # -- properties -------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._num_frames

    @property
    def frame_rate(self) -> Fraction:
        if self._avg_rate:
            return self._avg_rate
        # No declared rate: derive it from the timestamps if we can, else a sane default.
        index = self._index
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
        frames = self._index
        if frames is not None and index < len(frames.pts):
            return frames.pts[index]
        # No pts in the file, or a frame past the cut of a truncated one: where it would be.
        return round(index / (self.frame_rate * self.time_base))

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
        versa). Frames are numbered in presentation order from ``start``; pts come from the file.
        """
        self._assert_open()
        stop = len(self) if stop is None else min(stop, len(self))
        if start >= stop:
            return
        start = self._check_index(start)
        cursor = DecodeCursor(self)
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


def _check_is_file(path: Path) -> None:
    if not path.exists():
        raise VideoError(f"video file not found: {path}; check the path")
    if path.is_dir():
        raise VideoError(f"{path} is a directory; use open_image_folder() for a folder of frames")
    if not path.is_file():
        # A FIFO or a device would block FFmpeg's probing forever, or be read only once
        # when the reader needs to open the file several times (probe, index, decode).
        raise VideoError(f"{path} is not a regular file; pass a video file or a folder of images")


def _undecodable(name: str, codec_name: str, e: VideoError) -> VideoError:
    return VideoError(
        f"{name}: cannot decode the first frame of its {codec_name} video stream ({e}); "
        f"re-encode it to H.264 (ffmpeg -i in -c:v libx264 out.mp4)"
    )


def open_video(path: str | os.PathLike[str]) -> VideoReader:
    """Open a video file for lazy, random-access decoding (audio and other streams ignored)."""
    return VideoReader(path)
