"""Random access into a video file: where each frame sits (the packet index) and a decoder that
seeks to the keyframe before a frame and decodes forward to it (the decode cursor).

Both serve :class:`~sam3track.video.video_file.VideoReader`, which owns the open file's name,
stream and lazily built index.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import av

from sam3track.errors import VideoError


@dataclass(frozen=True)
class PacketIndex:
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


def build_packet_index(path: str, stream_index: int) -> PacketIndex | None:
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
    return PacketIndex(
        pts=pts,
        pts_to_index={p: i for i, p in enumerate(pts)},
        keyframes=keyframes,
        seek_ts=[min(entries[i][0], entries[i][1]) for i in keyframes],
    )


def count_packets(path: str, stream_index: int) -> int:
    with av.open(path) as container:
        stream = container.streams[stream_index]
        return sum(1 for p in container.demux(stream) if p.size and not p.is_discard)


class IndexedFile(Protocol):
    """What a cursor reads from the file it decodes (VideoReader): its name and frame count, its video
    stream, fresh containers on it, and its packet index (``built_index``: None until first built)."""

    name: str
    stream_index: int

    def __len__(self) -> int: ...

    def open_container(self) -> Any: ...

    def built_index(self) -> PacketIndex | None: ...

    def packet_index(self) -> PacketIndex | None: ...


class DecodeCursor:
    """One open container + decoder positioned somewhere in the video.

    ``frame_at(i)`` decodes forward when ``i`` is at or shortly after the current position (the
    predictor mostly walks frames in order) and otherwise seeks to the keyframe before ``i``
    and decodes forward from there. Frames are identified by pts, so the result is exactly the
    frame sequential decoding would give.
    """

    def __init__(self, reader: IndexedFile) -> None:
        self._reader = reader
        self._container = reader.open_container()
        self._stream = self._container.streams[reader.stream_index]
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
                self._container = self._reader.open_container()
                self._stream = self._container.streams[self._reader.stream_index]
                self._stream.thread_type = "AUTO"
            self._next_index = 0
        else:
            index = self._reader.built_index()
            assert index is not None
            self._container.seek(index.seek_ts[keyframe], stream=self._stream, backward=True)
            self._next_index = index.keyframes[keyframe]
        self._started = True
        self._restarted_at = keyframe
        self._frames = self._container.decode(self._stream)

    def _index_of(self, frame: Any) -> int:
        index = self._reader.built_index()
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
        index = reader.built_index() if target == self._next_index else reader.packet_index()
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
