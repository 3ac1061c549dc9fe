"""Random access into a video file: a decoder that seeks to the keyframe at or before a frame
and decodes forward to it, telling frames apart by pts (the decode cursor).

It serves :class:`~sam3track.video.video_file.VideoReader`, which owns the open file's name,
stream and :class:`~sam3track.video.frame_index.FrameIndex`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

import av

from sam3track.errors import VideoError
from sam3track.video.frame_index import DecodeLog, FrameIndex, decoded, decoder_stream

_REENCODE = "re-encode it (ffmpeg -i in.mp4 -c:v libx264 out.mp4)"


class IndexedFile(Protocol):
    """What a cursor reads from the file it decodes (VideoReader): its name and frame count, its
    video stream, fresh containers on it, and its frame index (None when the file's pts cannot
    tell frames apart: then frames are numbered in the order the decoder gives them)."""

    name: str
    stream_index: int

    def __len__(self) -> int: ...

    def open_container(self) -> Any: ...

    def frame_index(self) -> FrameIndex | None: ...


class DecodeCursor:
    """One open container + decoder positioned somewhere in the video.

    ``frame_at(i)`` decodes forward when no keyframe lies between the current position and
    ``i`` (the predictor mostly walks frames in order), and otherwise seeks to the keyframe at
    or before ``i`` (by pts: presentation order) and decodes forward from there. Frames are
    matched by pts, so the result is exactly the frame a plain decode of the file gives.
    """

    def __init__(self, reader: IndexedFile) -> None:
        self._reader = reader
        self._container = reader.open_container()
        self._stream = decoder_stream(self._container, reader.stream_index)
        self._log = DecodeLog()
        self._frames: Iterator[Any] | None = None  # the decode under way, if any
        self._pos = -1  # index of the last frame the decoder gave (-1: none since the restart)
        self._origin: int | None = None  # keyframe the decode started from; None: the file start
        self._used = False  # whether the container was read (a fresh one is at the file start)

    def close(self) -> None:
        self._frames = None
        self._container.close()

    def frame_at(self, target: int) -> Any:
        index = self._reader.frame_index()
        if index is None:
            return self._in_decode_order(target)
        if target >= len(index.pts):  # only a truncated file promises more frames than it holds
            raise self._ends_before(target)
        key = index.keyframe_before(target)
        walk = self._frames is not None and 0 <= self._pos < target and (
            key is None or index.key_pts[key] <= index.pts[self._pos])
        if not walk:
            self._restart(key, None if key is None else index.seek_ts[key])
        while True:
            frame = self._next_frame(target)
            got = None if frame is None else index.pts_to_index.get(frame.pts)
            if frame is not None and got is None:
                continue  # a picture that is no frame of ours (a plain decode would not give it)
            if got == target:
                self._pos = target
                return frame
            if got is not None and got < target:
                self._pos = got
                continue
            self._passed(index, target, key)  # decoded past the target, or to the end, without it

    def _passed(self, index: FrameIndex, target: int, key: int | None) -> None:
        """The decode went past ``target`` without giving it. The demuxer may have landed after
        the keyframe asked for: try one keyframe earlier, then the file start, then give up."""
        if self._origin is None:
            why = f" (the decoder reported: {self._log.last_error})" if self._log.last_error else ""
            seconds = float(index.pts[target] * self._stream.time_base)
            raise VideoError(
                f"{self._reader.name}: frame {target} (at {seconds:.3f} s) is missing from the "
                f"decoded stream{why}; the file is damaged, {_REENCODE}"
            )
        back = self._origin - 1 if self._origin == key and self._origin > 0 else None
        self._restart(back, None if back is None else index.seek_ts[back])

    def _in_decode_order(self, target: int) -> Any:
        """Frame ``target`` of a file without usable pts: the target-th picture decoded."""
        if self._frames is None or target <= self._pos:
            self._restart(None, None)
        frame = None
        while self._pos < target:
            frame = self._next_frame(target)
            if frame is None:
                raise self._ends_before(target)
            self._pos += 1
        return frame

    def _restart(self, key: int | None, seek_ts: int | None) -> None:
        """Position the decoder at keyframe ``key`` (seeking to ``seek_ts``), or the file start."""
        if seek_ts is not None:
            self._container.seek(seek_ts, stream=self._stream, backward=True)
        elif self._used:
            # Reopen rather than seek to 0: files without timestamps (raw .h264) refuse to
            # seek, and a fresh container is at the start with a clean decoder.
            self._container.close()
            self._container = self._reader.open_container()
            self._stream = decoder_stream(self._container, self._reader.stream_index)
        self._used = True
        self._origin = key
        self._pos = -1
        self._frames = decoded(self._container, self._stream, self._log)

    def _next_frame(self, target: int) -> Any:
        """The next decoded picture, or None at the end of the file."""
        try:
            assert self._frames is not None
            return next(self._frames)
        except StopIteration:
            self._frames = None
            return None
        except av.error.FFmpegError as e:  # the demuxer cannot read on (decode errors are logged)
            self._frames = None
            raise VideoError(
                f"{self._reader.name}: cannot decode frame {target} ({e}); the file is damaged "
                f"or uses an unsupported codec feature, {_REENCODE}"
            ) from e

    def _ends_before(self, target: int) -> VideoError:
        reader = self._reader
        return VideoError(
            f"{reader.name}: the file ends before frame {target} (the header promised "
            f"{len(reader)} frames); the file is probably truncated, download or copy it again"
        )
