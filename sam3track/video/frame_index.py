"""Which frames a video file holds and where decoding can start (the frame index).

A frame is what a plain PyAV decode of the file yields. One demux pass lists the packets; the
frames are those an mp4 edit list does not hide, in presentation order (sorted pts: with
B-frames packets arrive in decode order, so their pts are not monotonic). Decoding the first
picture and the last GOP then drops packets the decoder gives no picture for (a file cut
mid-GOP, a trailing end-of-stream packet), so the count is the decoder's.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import av

from sam3track.errors import VideoError

# Decoder threads: 0 lets FFmpeg pick (one frame thread per core). Tests pin it to check that
# the frames decoded, and the errors about them, do not depend on the thread count.
DECODER_THREADS = 0


@dataclass(frozen=True)
class FrameIndex:
    """Every frame's pts in presentation order, and the keyframes decoding can start from.

    ``key_pts`` are keyframe packets' pts, sorted, including keyframes an edit list hides
    (decoding still starts there); ``seek_ts[k]`` is what to seek to for ``key_pts[k]``: the
    smaller of its pts and dts (mp4 seeks by dts, matroska by pts; the smaller lands on that
    keyframe in both). ``packets`` counts packets with data, hidden ones included, to compare
    with the header's frame count; ``hidden`` counts those an edit list hides.
    """

    pts: list[int]
    key_pts: list[int]
    seek_ts: list[int]
    packets: int
    hidden: int
    pts_to_index: dict[int, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "pts_to_index", {p: i for i, p in enumerate(self.pts)})

    def keyframe_before(self, frame: int) -> int | None:
        """Position in ``key_pts`` of the last keyframe at or before ``frame``; None: none is,
        so decoding must start at the beginning of the file."""
        k = bisect.bisect_right(self.key_pts, self.pts[frame]) - 1
        return k if k >= 0 else None


@dataclass
class DecodeLog:
    """The last error a decoder reported on a packet it then skipped (for error messages)."""

    last_error: str | None = None


def decoder_stream(container: Any, stream_index: int) -> Any:
    """The video stream of ``container``, set up to decode with threads."""
    stream = container.streams[stream_index]
    stream.thread_type = "AUTO"  # frame threading; its output is bit-identical to one thread's
    stream.thread_count = DECODER_THREADS
    return stream


def decoded(container: Any, stream: Any, log: DecodeLog) -> Iterator[Any]:
    """The frames ``container.decode(stream)`` yields, made independent of the thread count.

    A cut download ends in a partial packet (flagged corrupt), which one decoder thread rejects
    with an error while frame threads drop the frames in flight with it: so a corrupt last
    packet is left out, and any packet the decoder rejects is skipped (noted in ``log``).
    """
    held = None  # a corrupt packet, decoded only once another packet follows it
    for packet in container.demux(stream):  # ends with an empty packet, which drains the decoder
        if held is not None and packet.size:
            yield from _decode(held, log)
        held = None
        if packet.is_corrupt and packet.size:
            held = packet
        else:
            yield from _decode(packet, log)


def _decode(packet: Any, log: DecodeLog) -> list[Any]:
    try:
        return packet.decode()
    except av.error.FFmpegError as e:
        log.last_error = str(e)
        return []


def scan_packets(path: str, stream_index: int) -> FrameIndex | None:
    """Demux the whole file once (no decoding); None when the packets' pts cannot tell the
    frames apart (none, as in raw .h264, or repeated): then frames go in decode order."""
    frames: list[int] = []
    keys: list[tuple[int, int]] = []
    packets = hidden = 0
    with av.open(path) as container:
        for packet in container.demux(container.streams[stream_index]):
            if packet.size == 0:  # the demuxer's final flush packet
                continue
            if packet.pts is None:
                return None
            packets += 1
            if packet.is_keyframe:
                dts = packet.dts if packet.dts is not None else packet.pts
                keys.append((packet.pts, min(packet.pts, dts)))
            if packet.is_discard:  # an edit list hides it: decoded (as a reference), not shown
                hidden += 1
            else:
                frames.append(packet.pts)
    if len(set(frames)) != len(frames):
        return None
    keys.sort()
    return FrameIndex(sorted(frames), [k[0] for k in keys], [k[1] for k in keys], packets, hidden)


def count_packets(path: str, stream_index: int) -> int:
    """Packets with data an edit list does not hide: the frame count of a file without pts."""
    with av.open(path) as container:
        stream = container.streams[stream_index]
        return sum(1 for p in container.demux(stream) if p.size and not p.is_discard)


def keep_decoded(index: FrameIndex, open_container: Callable[[], Any],
                 stream_index: int) -> FrameIndex:
    """``index`` without the frames the decoder never outputs before its first picture or in
    the last GOP (the places a file's packets and pictures part ways in practice)."""
    first = _first_pts(open_container, stream_index)
    tail_from, tail = _tail_pts(index, open_container, stream_index)
    kept = [p for p in index.pts if p >= first and (p < tail_from or p in tail)]
    return index if kept == index.pts else replace(index, pts=kept)


def _first_pts(open_container: Callable[[], Any], stream_index: int) -> int:
    log = DecodeLog()
    with open_container() as container:
        for frame in decoded(container, decoder_stream(container, stream_index), log):
            if frame.pts is not None:
                return int(frame.pts)
    raise VideoError(f"no frame of it decodes: {log.last_error or 'the decoder gave no picture'}")


def _tail_pts(index: FrameIndex, open_container: Callable[[], Any],
              stream_index: int) -> tuple[float, set[int]]:
    """The pts decoded from the last keyframe on, and the pts from which that is the whole
    truth (the keyframe's own). If the seek misses the keyframe, decode the whole file."""
    if index.key_pts:
        key = index.key_pts[-1]
        seen = _pts_decoded(open_container, stream_index, index.seek_ts[-1])
        if key in seen or key not in index.pts_to_index:
            return key, seen
    return float("-inf"), _pts_decoded(open_container, stream_index, None)


def _pts_decoded(open_container: Callable[[], Any], stream_index: int,
                 seek_ts: int | None) -> set[int]:
    """The pts of every frame decoded from ``seek_ts`` (None: the file start) to the end."""
    with open_container() as container:
        stream = decoder_stream(container, stream_index)
        if seek_ts is not None:
            container.seek(seek_ts, stream=stream, backward=True)
        return {int(f.pts) for f in decoded(container, stream, DecodeLog()) if f.pts is not None}
