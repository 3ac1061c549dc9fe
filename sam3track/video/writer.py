"""Writing rendered frames to an H.264 video that keeps the input's size, frame count and timing.

The file is written under a temporary name of its own next to the destination, with the
destination locked (:mod:`sam3track.output_lock`), and renamed when closed, so the destination
path only ever holds a finished, complete video of this writer. An interrupted run (an
exception or Ctrl-C inside the ``with`` block) still flushes the encoder and writes the
container trailer, and leaves the frames done so far as a valid, shorter video beside the
destination, ``<stem>.interrupted<suffix>``.
"""

from __future__ import annotations

import logging
import os
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np

from sam3track.atomic_files import FinishedOnExit, finish_partial, partial_path, remove_stale_files
from sam3track.errors import VideoError
from sam3track.output_lock import OutputLock
from sam3track.video.source import DEFAULT_FPS, FrameSource

log = logging.getLogger(__name__)

# Container chosen from the destination's suffix; the temporary file has another suffix, so
# the format is always passed explicitly.
_FORMATS = {".mp4": "mp4", ".m4v": "mp4", ".mov": "mov", ".mkv": "matroska"}
VIDEO_SUFFIXES = tuple(_FORMATS)  # what MaskVideoWriter can write
READABLE_SUFFIXES = VIDEO_SUFFIXES + (".avi", ".webm")  # video files taken by suffix (batch, serve)
ENCODER_THREADS = 4  # x264 frame threads: the same bytes on every machine (see MaskVideoWriter)


def _as_fraction(value: float | Fraction, what: str) -> Fraction:
    frac = Fraction(value).limit_denominator(1_000_000)
    if frac <= 0:
        raise VideoError(f"{what} must be positive, got {value}")
    return frac


class MaskVideoWriter(FinishedOnExit):
    """Encode RGB frames to H.264 (libx264) at the exact input size and timing.

    Pixel format: ``yuv420p`` (plays everywhere) when width and height are even. 4:2:0 chroma
    cannot represent odd sizes, and padding or cropping would change the size, so odd-sized
    videos are written as ``yuv444p`` (H.264 High 4:4:4): same size, but some players (browsers,
    QuickTime) cannot play that profile; ffmpeg, VLC and PyAV/OpenCV read it fine.

    Timing: pass each input frame's ``pts`` (and its ``time_base`` if it differs from the
    writer's) to :meth:`write`; the stream uses the input's time base, so variable frame rate
    survives. Without ``pts``, frames are spaced ``1/fps`` apart.

    Closing: ``close(complete=True)`` is the normal end; ``close(complete=False)`` is for an
    interrupted run. Both flush the encoder and write the trailer, so either way the result is a
    valid video of every frame written; a complete close renames it onto ``path``, an incomplete
    one onto ``<stem>.interrupted<suffix>`` beside it (never replacing a complete video at
    ``path`` with a shorter one). They differ in what counts as failure too: a complete close raises :class:`VideoError` if no frame
    was written or finalising fails; an incomplete close never raises for those (it logs a
    warning, removes the temporary file if nothing usable is left, and returns ``None``), so
    the exception that interrupted the run is the one the caller sees. ``__exit__`` calls
    ``close(complete=exc is None)``. A complete close also removes the
    ``<stem>.interrupted<suffix>`` an earlier run left. A process killed outright (SIGKILL, power
    loss) leaves only the temporary ``<name>.<pid>.<random>.partial`` file, which is not playable
    and which the next writer of ``path`` removes.

    Locking: ``path`` is locked from here to ``close``; while another writer (this process or
    another) holds it, the constructor raises :class:`~sam3track.errors.OutputBusyError` naming
    that writer's pid. ``lock``: one already taken for ``path``, released by ``close``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        width: int,
        height: int,
        fps: float | Fraction = DEFAULT_FPS,
        time_base: Fraction | None = None,
        crf: int = 18,
        preset: str = "veryfast",
        lock: OutputLock | None = None,
    ) -> None:
        self.path = Path(path)
        fmt = _FORMATS.get(self.path.suffix.lower())
        if fmt is None:
            raise VideoError(
                f"cannot write {self.path}: unknown video suffix {self.path.suffix!r}; "
                f"use one of {', '.join(sorted(_FORMATS))}"
            )
        if width <= 0 or height <= 0:
            raise VideoError(f"cannot write {self.path}: frame size {width}x{height} is empty")
        if not self.path.parent.is_dir():
            raise VideoError(
                f"cannot write {self.path}: folder {self.path.parent} does not exist; create it"
            )
        self.width, self.height = int(width), int(height)
        self.frame_rate = _as_fraction(fps, "fps")
        self.time_base = (
            Fraction(time_base) if time_base is not None else 1 / self.frame_rate
        )
        self.pix_fmt = "yuv420p" if self.width % 2 == 0 and self.height % 2 == 0 else "yuv444p"
        self.frames_written = 0
        self.completed: bool | None = None  # set by close()
        self.result: Path | None = None  # where close() left the video, if anywhere
        self._last_pts: int | None = None
        self._closed = False
        self._lock = lock if lock is not None else OutputLock.acquire(self.path)
        try:
            if self._lock.held:
                remove_stale_files(self.path, log)
            self._tmp = partial_path(self.path)
            self._open(fmt, crf, preset)
        except BaseException:
            self._lock.release()
            raise

    def _open(self, fmt: str, crf: int, preset: str) -> None:
        """The container under the temporary name, with its H.264 stream."""
        try:
            self._container: Any = av.open(str(self._tmp), mode="w", format=fmt)
        except (av.error.FFmpegError, OSError) as e:
            raise VideoError(f"cannot create {self._tmp} to write {self.path}: {e}") from e
        try:
            stream = self._container.add_stream("libx264", rate=self.frame_rate)
            stream.width, stream.height, stream.pix_fmt = self.width, self.height, self.pix_fmt
            # Encoder and stream both count in the input's time base, so input pts pass
            # through unchanged (the muxer may still pick a finer timescale of its own).
            stream.time_base = self.time_base
            stream.codec_context.time_base = self.time_base
            stream.options = {"crf": str(crf), "preset": preset}
            stream.thread_type = "AUTO"
            # A fixed count, not x264's default (1.5 x the CPUs this process may use): x264's output
            # depends on its thread count, so the same input gave other bytes on a host with other
            # cores, or in a process pinned to fewer (a batch worker vs sam3track track).
            stream.codec_context.thread_count = ENCODER_THREADS
            self._stream: Any = stream
        except Exception as e:
            self._container.close()
            self._tmp.unlink(missing_ok=True)
            raise VideoError(f"cannot set up an H.264 encoder for {self.path}: {e}") from e

    @classmethod
    def like(
        cls, path: str | os.PathLike[str], source: FrameSource, **options: Any
    ) -> "MaskVideoWriter":
        """A writer with ``source``'s size, frame rate and time base."""
        return cls(
            path,
            width=source.width,
            height=source.height,
            fps=source.frame_rate,
            time_base=source.time_base,
            **options,
        )

    def write(
        self, rgb: np.ndarray, pts: int | None = None, time_base: Fraction | None = None
    ) -> None:
        """Encode one RGB uint8 ``[H, W, 3]`` frame shown at ``pts * time_base`` seconds."""
        if self._closed:
            raise VideoError(f"{self.path} is already closed; open a new MaskVideoWriter")
        n = self.frames_written
        if rgb.dtype != np.uint8 or rgb.shape != (self.height, self.width, 3):
            raise VideoError(
                f"frame {n} for {self.path} has shape {rgb.shape} and dtype {rgb.dtype}; "
                f"expected ({self.height}, {self.width}, 3) uint8 RGB, the input video's size"
            )
        if pts is None:
            step = max(round(1 / (self.frame_rate * self.time_base)), 1)
            pts = 0 if self._last_pts is None else self._last_pts + step
        elif time_base is not None and Fraction(time_base) != self.time_base:
            pts = round(pts * Fraction(time_base) / self.time_base)
        pts = int(pts)
        if self._last_pts is not None and pts <= self._last_pts:
            raise VideoError(
                f"frame {n} for {self.path} has pts {pts}, not after the previous frame's "
                f"{self._last_pts}; pass each input frame's own pts, in order"
            )
        frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
        frame.pts = pts
        frame.time_base = self.time_base
        try:
            for packet in self._stream.encode(frame):  # the encoder converts rgb24 -> yuv
                self._container.mux(packet)
        except (av.error.FFmpegError, OSError) as e:
            raise VideoError(f"cannot encode frame {n} into {self.path}: {e}") from e
        self._last_pts = pts
        self.frames_written += 1

    def close(self, complete: bool = True) -> Path | None:
        """Finish the file and move it to :attr:`path`; see the class docstring for ``complete``.

        Returns the path written (``path``, or its ``.interrupted`` name for an incomplete
        close), or ``None`` when nothing usable was left. Calling it again returns the first
        call's result.
        """
        if self._closed:
            return self.result
        self._closed = True
        self.completed = complete
        try:
            self.result = self._finish(complete)
        finally:
            self._lock.release()
        return self.result

    def _finish(self, complete: bool) -> Path | None:
        try:
            if self.frames_written:
                for packet in self._stream.encode(None):  # drain the encoder's lookahead
                    self._container.mux(packet)
            self._container.close()  # writes the trailer (the mp4 moov atom)
        except BaseException as e:
            try:
                self._container.close()
            except Exception:
                pass
            self._tmp.unlink(missing_ok=True)
            if not isinstance(e, Exception):
                raise  # a second Ctrl-C while finalising: stop, leaving no broken file
            message = f"cannot finish {self.path} after {self.frames_written} frames: {e}"
            if complete:
                raise VideoError(message + "; check free disk space and retry") from e
            log.warning(message)
            return None
        if self.frames_written == 0:
            self._tmp.unlink(missing_ok=True)
            if complete:
                raise VideoError(f"no frames were written to {self.path}; nothing was saved")
            return None
        holds = f"{self.frames_written} frames written so far"
        try:
            return finish_partial(self._tmp, self.path, complete=complete, log=log, holds=holds)
        except OSError as e:
            self._tmp.unlink(missing_ok=True)
            if complete:
                raise VideoError(f"cannot move the finished video onto {self.path}: {e}") from e
            log.warning("cannot keep the %d frames written for %s: %s", self.frames_written,
                        self.path, e)
            return None
