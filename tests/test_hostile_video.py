"""Videos whose packets and pictures part ways, read against a plain PyAV decode (issue 25).

Each clip is a tiny H.264 file written here with the frame number drawn into its pixels as
bars, so order can be read back after decoding: B-frames with open GOPs (packets in decode
order, pts not monotonic), an mp4 edit list hiding the first frames, a first pts that is not
0, variable frame rate, and a last packet that gives no picture. The reference for every
count, order, timestamp and pixel is ``container.decode(video=0)``.
"""

from __future__ import annotations

import hashlib
from fractions import Fraction
from pathlib import Path
from typing import NamedTuple

import av
import numpy as np
import pytest

import sam3track
import sam3track.video.frame_index as frame_index
from sam3track.cli import main
from sam3track.results import FrameResult
from sam3track.video import open_video

W, H, BITS = 64, 48, 8  # eight 8-pixel bars: frame numbers up to 255
VFR_MS = [0, 40, 80, 95, 110, 190, 230, 231, 300, 340, 345, 420, 460, 500, 520, 600, 640, 700,
          705, 760, 800, 880, 900, 960, 1000, 1050, 1100, 1120, 1200, 1240]


def _picture(number: int) -> np.ndarray:
    img = np.full((H, W, 3), 30, np.uint8)
    for bit in range(BITS):
        if number >> bit & 1:
            img[:, bit * 8 + 1: bit * 8 + 7] = 225
    return img


def _number(rgb: np.ndarray) -> int:
    return sum(1 << bit for bit in range(BITS) if rgb[8:40, bit * 8 + 3: bit * 8 + 5].mean() > 127)


def _encode(path: Path, pts: list[int], *, bf: int = 3, keyint: int = 10,
            time_base: Fraction = Fraction(1, 25)) -> None:
    """Frame ``i`` shows number ``i`` at ``pts[i]``: H.264 High, open GOPs with B-frames
    (b-adapt=0 keeps them even where the picture barely changes)."""
    with av.open(str(path), "w") as c:
        v = c.add_stream("libx264", rate=25)
        v.width, v.height, v.pix_fmt = W, H, "yuv420p"
        v.time_base = v.codec_context.time_base = time_base
        v.options = {"bf": str(bf), "profile": "high", "crf": "18", "x264-params":
                     f"open-gop=1:b-adapt=0:keyint={keyint}:min-keyint={keyint}:scenecut=0"}
        for i, t in enumerate(pts):
            frame = av.VideoFrame.from_ndarray(_picture(i), format="rgb24")
            frame.pts, frame.time_base = t, time_base
            for p in v.encode(frame):
                c.mux(p)
        for p in v.encode(None):
            c.mux(p)


def _append_end_of_stream(src: Path, dst: Path) -> None:
    """Copy ``src`` and add one last packet, an end-of-sequence NAL unit: no picture."""
    with av.open(str(src)) as i, av.open(str(dst), "w") as o:
        stream = o.add_stream_from_template(i.streams.video[0])
        pts, dts = [], []
        for packet in (p for p in i.demux(video=0) if p.size):
            pts.append(packet.pts)
            dts.append(packet.dts)
            packet.stream = stream
            o.mux(packet)
        step = sorted(pts)[1] - sorted(pts)[0]
        extra = av.Packet(b"\x00\x00\x00\x01\x0a")  # NAL length 1, then end of sequence
        extra.stream, extra.time_base = stream, i.streams.video[0].time_base
        extra.pts, extra.dts = max(pts) + step, max(dts) + step
        o.mux(extra)


def _make(name: str, folder: Path) -> Path:
    path = folder / f"{name}.mp4"
    if name == "bframes3":
        _encode(path, list(range(36)))
    elif name == "bframes2":
        _encode(path, list(range(30)), bf=2, keyint=8)
    elif name == "edit_list":  # pts -3..-1 come before the start: an edit list hides them
        _encode(path, [i - 3 for i in range(36)])
    elif name == "late_start":
        _encode(path, [i + 5 for i in range(30)])
    elif name == "vfr":
        _encode(path, VFR_MS, bf=2, keyint=8, time_base=Fraction(1, 1000))
    elif name == "no_last_picture":
        _encode(folder / "whole.mp4", list(range(30)))
        _append_end_of_stream(folder / "whole.mp4", path)
    return path


def _digest(rgb: np.ndarray) -> str:
    return hashlib.sha1(np.ascontiguousarray(rgb).tobytes()).hexdigest()


class Clip(NamedTuple):
    name: str
    path: Path
    frames: list[tuple[int, int, str]]  # (pts, number in the pixels, digest) from plain PyAV
    time_base: Fraction


def _pyav(name: str, path: Path) -> Clip:
    """Every frame a plain PyAV decode gives, in the order it gives them."""
    with av.open(str(path)) as c:
        frames = [(f.pts, f.to_ndarray(format="rgb24")) for f in c.decode(video=0)]
        time_base = Fraction(c.streams.video[0].time_base)
    return Clip(name, path, [(pts, _number(rgb), _digest(rgb)) for pts, rgb in frames], time_base)


def _packets(path: Path) -> list[av.Packet]:
    with av.open(str(path)) as c:
        return [p for p in c.demux(video=0) if p.size]


NAMES = ["bframes3", "bframes2", "edit_list", "late_start", "vfr", "no_last_picture"]


@pytest.fixture(scope="module", params=NAMES)
def clip(request, tmp_path_factory) -> Clip:
    folder = tmp_path_factory.mktemp(request.param)
    return _pyav(request.param, _make(request.param, folder))


def test_each_clip_has_what_it_is_named_for(clip: Clip) -> None:
    """The clips must be as hostile as their names say, or the tests below prove nothing."""
    name, path, frames, tb = clip
    packets = _packets(path)
    assert [n for _, n, _ in frames] == sorted(n for _, n, _ in frames)  # PyAV: presentation order
    pts = [p.pts for p in packets]
    assert pts != sorted(pts), "packets in decode order: pts not monotonic"
    keys = [i for i, p in enumerate(packets) if p.is_keyframe]
    # Open GOP: a later keyframe is followed (in decode order) by a B-frame shown before it.
    assert any(packets[k + 1].pts < packets[k].pts for k in keys[1:])
    with av.open(str(path)) as c:
        declared = c.streams.video[0].frames
    hidden = sum(p.is_discard for p in packets)
    if name == "edit_list":
        assert hidden == 3 and declared == len(frames) + 3 and frames[0][1] == 3
    elif name == "late_start":
        assert frames[0][0] > 0 and frames[0][1] == 0
    elif name == "vfr":
        assert [p * tb * 1000 for p, _, _ in frames] == VFR_MS
    elif name == "no_last_picture":
        assert len(packets) == declared == len(frames) + 1
    if name != "edit_list":
        assert hidden == 0 and [n for _, n, _ in frames] == list(range(len(frames)))


@pytest.mark.parametrize("threads", [1, 3])
def test_count_order_and_timestamps_match_pyav(clip: Clip, threads: int, monkeypatch) -> None:
    """Also one decoder thread against frame threads: the frames must not depend on them."""
    monkeypatch.setattr(frame_index, "DECODER_THREADS", threads)
    _, path, frames, _ = clip
    with open_video(path) as r:
        assert len(r) == len(frames)
        assert [r.pts(i) for i in range(len(r))] == [p for p, _, _ in frames]
        got = [(f.index, f.pts, _number(f.rgb), _digest(f.rgb)) for f in r.frames()]
    assert got == [(i, *frame) for i, frame in enumerate(frames)]


def test_random_access_matches_pyav(clip: Clip) -> None:
    _, path, frames, _ = clip
    n = len(frames)
    # Backward jumps, both sides of GOP edges (keyint 8 or 10) and the leading B-frames of open
    # GOPs, steps inside a GOP, the first and last frames, then a shuffle of the rest.
    order = [n - 1, 0, n // 2, 9, 10, 11, 7, 8, 1, 2, n - 2, 19, 20, 17, 18, 3]
    order += [int(i) for i in np.random.default_rng(0).permutation(n)[:12]]
    with open_video(path) as r:
        for i in order:
            rgb = r.read(i)
            assert (_number(rgb), _digest(rgb)) == frames[i][1:], f"read({i})"
        for start in (1, 9, n - 3):  # iteration from an offset, on a decoder of its own
            got = [(f.index, f.pts, _digest(f.rgb)) for f in r.frames(start=start, stop=start + 4)]
            assert got == [(i, frames[i][0], frames[i][2]) for i in range(start, min(start + 4, n))]


class _NoObjects:
    """A predictor whose session finds nothing: the mask video is then the input, re-encoded."""

    box_prompts = "tracker"

    def __init__(self, *args, **kwargs) -> None:
        self.reader = None

    def start_session(self, reader, keep_history=True):
        self.reader = reader
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass

    def close(self) -> None:
        pass

    def add_prompt(self, frame_index: int = 0, text: str = "") -> None:
        pass

    def frame(self, index: int) -> np.ndarray:
        return self.reader.read(index)

    def propagate(self, direction="forward", start_frame=0, max_frames=None):
        stop = len(self.reader) if max_frames is None else start_frame + max_frames
        for i in range(start_frame, min(stop, len(self.reader))):
            yield FrameResult(i, np.zeros(0, np.int64), np.zeros(0, np.float32),
                              np.zeros((0, 4), np.float32), np.zeros((0, H, W), bool))


def test_track_from_a_start_frame_keeps_frames_and_timing(clip: Clip, tmp_path: Path,
                                                           monkeypatch) -> None:
    """``track --start-frame``: the mask video holds the frames PyAV gives from there, each at
    its own time relative to the start frame's."""
    _, path, frames, tb = clip
    monkeypatch.setattr(sam3track, "load", _NoObjects)
    (tmp_path / "bundle").mkdir()
    out, start = tmp_path / "masks.mp4", 9
    assert main(["track", str(path), "--prompt", "x", "--bundle", str(tmp_path / "bundle"),
                 "-o", str(out), "--start-frame", str(start)]) == 0
    expected = frames[start:]
    with open_video(out) as o:
        assert len(o) == len(expected)
        got = [(f.pts * f.time_base, _number(f.rgb)) for f in o.frames()]
    assert got == [((p - expected[0][0]) * tb, number) for p, number, _ in expected]
