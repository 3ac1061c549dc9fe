"""The ``sam3track`` command line: track, demo, info; outputs, Ctrl-C and user errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import pytest

import sam3track
from sam3track.cli import main
from sam3track.render import draw_objects
from sam3track.results import FrameResult
from sam3track.sinks import decode_rle
from sam3track.video import open_video

from .conftest import HANG_SECONDS, communicate, run_child

REPO = Path(__file__).resolve().parents[1]
BIKES = REPO / "examples" / "clips" / "bikes.mp4"
COUNT = 12
# (first frame, prompts, --set): runs in which the tiny bundle's random weights find objects, so the
# pixel checks below have masks to look at (they find none for "person" alone on frames 76..87). The
# hotstart rules remove every random-weight object within these 12 frames, so they are off, as in the demo.
RUNS = [(76, ("bike",), ("hotstart_delay=0",)), (200, ("person", "bike"), ("hotstart_delay=0",))]


def _env() -> dict[str, str]:
    """Environment for a child ``python -m sam3track.cli``: this checkout first on the path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return env


def _result_from_json(frame: dict) -> FrameResult:
    objects = frame["objects"]
    h, w = frame["height"], frame["width"]
    return FrameResult(
        frame_index=frame["frame_index"],
        object_ids=np.asarray([o["object_id"] for o in objects], np.int64),
        scores=np.asarray([o["score"] for o in objects], np.float32),
        boxes_xyxy=np.asarray([o["box_xyxy"] for o in objects], np.float32).reshape(-1, 4),
        masks=np.asarray([decode_rle(o) for o in objects], bool).reshape(-1, h, w),
        prompts=[o["prompt"] for o in objects],
    )


# -- track: a real run over frames 76..87 of bikes.mp4 ---------------------------------------


@pytest.fixture(scope="module", params=RUNS, ids=lambda run: f"{'+'.join(run[1])}@{run[0]}")
def tracked(request, tiny_bundle: Path, tmp_path_factory) -> dict:
    start, prompts, settings = request.param
    out_dir = tmp_path_factory.mktemp("track")
    paths = {"video": out_dir / "bikes.masks.mp4", "json": out_dir / "bikes.json",
             "masks": out_dir / "masks"}
    rc = main([
        "track", str(BIKES), *(a for p in prompts for a in ("--prompt", p)),
        "--bundle", str(tiny_bundle),
        "-o", str(paths["video"]), "--json", str(paths["json"]), "--masks-dir", str(paths["masks"]),
        "--start-frame", str(start), "--max-frames", str(COUNT), *(a for x in settings for a in ("--set", x)),
    ])
    assert rc == 0
    doc = json.loads(paths["json"].read_text())
    assert sum(len(f["objects"]) for f in doc["frames"]) > 0, "the run must find objects for the checks to mean anything"
    return dict(paths, start=start, prompts=prompts, settings=settings, doc=doc)


def test_track_video_keeps_size_frame_count_and_timing(tracked: dict) -> None:
    assert sorted(p.name for p in tracked["video"].parent.iterdir()) == [
        "bikes.json", "bikes.masks.mp4", "masks"]  # no .partial left behind
    with open_video(BIKES) as src, open_video(tracked["video"]) as out:
        assert (out.width, out.height) == (src.width, src.height) == (640, 272)
        assert len(out) == COUNT
        got = [f.time for f in out.frames()]
        start = tracked["start"]
        want = [f.time for f in src.frames(start, start + COUNT)]
        # The clip starts at 0 (no --keep-timestamps); the input's spacing is kept.
        assert got == pytest.approx([t - want[0] for t in want], abs=1e-6)
    doc = tracked["doc"]
    assert doc["complete"] is True and doc["num_frames"] == len(doc["frames"]) == COUNT
    assert [f["frame_index"] for f in doc["frames"]] == list(range(start, start + COUNT))


def _check_pixels(video: Path, doc: dict) -> int:
    """Mask pixels tinted, pixels far from every object unchanged (up to codec error).

    Returns how many frames had a big, contrasting mask interior to check the tint on.
    """
    tinted = untouched = 0
    start = doc["frames"][0]["frame_index"]
    with open_video(BIKES) as src, open_video(video) as out:
        inputs = src.frames(start, start + len(doc["frames"]))
        for entry, s, o in zip(doc["frames"], inputs, out.frames(), strict=True):
            result = _result_from_json(entry)
            src_rgb = s.rgb.astype(np.int16)
            out_rgb = o.rgb.astype(np.int16)
            # Far from every mask, box and label: the input frame, up to codec error.
            near = np.zeros((out.height, out.width), np.uint8)
            for m in result.masks:
                near |= m.astype(np.uint8)
            near = cv2.dilate(near, np.ones((21, 21), np.uint8))
            for x0, y0, x1, y1 in np.nan_to_num(result.boxes_xyxy).astype(int):
                # labels sit above the box and may run past its right edge
                near[max(y0 - 35, 0):y1 + 10, max(x0 - 10, 0):max(x1, x0 + 260) + 10] = 1
            far = near == 0
            if far.sum() > 1000:  # an object may cover the whole frame (the demo model's masks are random)
                assert np.abs(out_rgb[far] - src_rgb[far]).mean() < 6, entry["frame_index"]
                untouched += 1
            if not len(result):
                continue
            # Inside the masks: what draw_objects gives on the input, clearly unlike the input.
            expected = draw_objects(s.rgb, result).astype(np.int16)
            union = np.any(result.masks, axis=0).astype(np.uint8)
            inner = cv2.erode(union, np.ones((7, 7), np.uint8)).astype(bool)
            if inner.sum() < 200:
                continue
            assert np.abs(out_rgb[inner] - expected[inner]).mean() < 6, entry["frame_index"]
            if np.abs(expected[inner] - src_rgb[inner]).mean() > 25:  # the tint contrasts here
                assert np.abs(out_rgb[inner] - src_rgb[inner]).mean() > 20, entry["frame_index"]
                tinted += 1
    assert untouched > 0, "no frame left room to check that pixels away from objects are untouched"
    return tinted


def test_track_video_colours_masks_and_leaves_the_rest(tracked: dict) -> None:
    tinted = _check_pixels(tracked["video"], tracked["doc"])
    assert tinted > 0, "no frame had a mask large and contrasting enough to check its tint"
    assert len(tracked["doc"]["frames"]) == COUNT


class _ScriptedSession:
    """Two discs (object ids 0 and 7) drifting right: known masks to check the drawing with."""

    box_prompts = "tracker"  # a sam3track.TrackingSession member

    def __init__(self, source, keep_history: bool = True) -> None:
        self.owned = isinstance(source, (str, Path))
        self.reader = open_video(source) if self.owned else source

    def frame(self, index: int) -> np.ndarray:
        return self.reader.read(index)

    def add_prompt(self, frame_index: int = 0, text: str = "") -> None:
        self.text = text

    def propagate(self, direction="forward", start_frame=None, max_frames=None):
        start = start_frame or 0
        stop = len(self.reader) if max_frames is None else min(len(self.reader), start + max_frames)
        h, w = self.reader.height, self.reader.width
        for i in range(start, stop):
            masks = np.zeros((2, h, w), np.uint8)
            cv2.circle(masks[0], (150 + 2 * (i - start), 140), 45, 1, -1)
            cv2.circle(masks[1], (420, 120 + (i - start)), 35, 1, -1)
            boxes = []
            for m in masks:
                ys, xs = np.nonzero(m)
                boxes.append([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1])
            yield FrameResult(i, np.array([0, 7], np.int64), np.array([0.9, 0.8], np.float32),
                              np.asarray(boxes, np.float32), masks.astype(bool),
                              [self.text, self.text])

    def close(self) -> None:
        if self.owned:
            self.reader.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _ScriptedPredictor:
    def __init__(self, *args, **overrides) -> None:
        self.overrides = overrides

    def start_session(self, source, keep_history=True):
        return _ScriptedSession(source)

    def close(self) -> None:
        pass


def test_track_tints_known_masks(tmp_path: Path, monkeypatch) -> None:
    """The drawing and the outputs, with masks known in advance (the model's are random)."""
    monkeypatch.setattr(sam3track, "load", lambda *args, **kwargs: _ScriptedPredictor())
    (tmp_path / "bundle").mkdir()
    video, doc_path, masks = tmp_path / "o.mp4", tmp_path / "o.json", tmp_path / "masks"
    assert main(["track", str(BIKES), "--prompt", "person", "--bundle", str(tmp_path / "bundle"),
                 "-o", str(video), "--json", str(doc_path), "--masks-dir", str(masks),
                 "--start-frame", "30", "--max-frames", "6"]) == 0
    doc = json.loads(doc_path.read_text())
    assert [f["frame_index"] for f in doc["frames"]] == list(range(30, 36))
    assert _check_pixels(video, doc) == 6
    script = _ScriptedSession(str(BIKES))
    script.add_prompt(30, "person")
    for result, entry in zip(script.propagate(start_frame=30, max_frames=6), doc["frames"]):
        assert [o["object_id"] for o in entry["objects"]] == [0, 7]
        for o, mask in zip(entry["objects"], result.masks):
            assert np.array_equal(decode_rle(o), mask)
        png = cv2.imread(str(masks / f"{result.frame_index:06d}.png"), cv2.IMREAD_UNCHANGED)
        assert png.dtype == np.uint8 and set(np.unique(png)) == {0, 1, 8}
        assert np.array_equal(png == 1, result.masks[0] & ~result.masks[1])
        assert np.array_equal(png == 8, result.masks[1])
    script.close()


def test_track_json_and_pngs_match_the_python_api(tracked: dict, tiny_bundle: Path) -> None:
    overrides = {k: json.loads(v) for k, v in (x.split("=", 1) for x in tracked["settings"])}
    predictor = sam3track.load(tiny_bundle, backend="onnxruntime", device="cpu", **overrides)
    try:
        with predictor.start_session(str(BIKES)) as session:
            for text in tracked["prompts"]:
                session.add_prompt(frame_index=tracked["start"], text=text)
            api = list(session.propagate(direction="forward", start_frame=tracked["start"],
                                         max_frames=COUNT))
    finally:
        predictor.close()
    frames = tracked["doc"]["frames"]
    assert [r.frame_index for r in api] == [f["frame_index"] for f in frames]
    for result, entry in zip(api, frames):
        objs = entry["objects"]
        assert [o["object_id"] for o in objs] == [int(i) for i in result.object_ids]
        assert [o["prompt"] for o in objs] == list(result.prompts)
        assert [o["score"] for o in objs] == pytest.approx(result.scores.tolist(), abs=1e-6)
        for o, box in zip(objs, result.boxes_xyxy):
            assert o["box_xyxy"] == pytest.approx(box.tolist(), abs=1e-4)
        for o, mask in zip(objs, result.masks):
            assert np.array_equal(decode_rle(o), mask)
        # PNG: pixel value = object id + 1, 0 = background; later objects win overlaps.
        png = cv2.imread(str(tracked["masks"] / f"{result.frame_index:06d}.png"),
                         cv2.IMREAD_UNCHANGED)
        want = np.zeros((result.height, result.width), np.int64)
        for oid, mask in zip(result.object_ids, result.masks):
            want[mask] = int(oid) + 1
        assert np.array_equal(png.astype(np.int64), want)


# -- Ctrl-C and SIGTERM ------------------------------------------------------------------------


def _track_args(bundle: Path, out_dir: Path, frames: int = 40) -> list[str]:
    return ["track", str(BIKES), "--prompt", "person", "--bundle", str(bundle),
            "-o", str(out_dir / "part.mp4"), "--json", str(out_dir / "part.json"),
            "--masks-dir", str(out_dir / "masks"), "--max-frames", str(frames)]


def _stop_midway(args: list[str], cwd: Path, signum: int) -> tuple[int, str]:
    """Run ``sam3track`` in a child, send ``signum`` once a few frames are done; (rc, stderr)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "sam3track.cli", *args],
        cwd=cwd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    deadline = time.monotonic() + HANG_SECONDS
    try:
        # The JSON sink flushes each frame: wait until a few are done, then send the signal.
        while proc.poll() is None:
            partial = next(cwd.glob("part.json.*.partial"), None)  # the run's own temporary name
            if partial is not None and partial.read_text().count('"frame_index"') >= 3:
                break
            if time.monotonic() > deadline:
                pytest.fail(f"sam3track wrote fewer than 3 frames in {HANG_SECONDS} s: a hang", pytrace=False)
            time.sleep(0.005)
        assert proc.poll() is None, f"the run ended before it could be stopped:\n{proc.communicate()}"
        proc.send_signal(signum)
        _, stderr = communicate(proc, f"sam3track after signal {signum}")
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, stderr


def _check_interrupted_outputs(out_dir: Path, stderr: str) -> int:
    """The .interrupted video, JSON and masks folder hold the same frames; their count."""
    video = out_dir / "part.interrupted.mp4"
    doc = out_dir / "part.interrupted.json"
    masks = out_dir / "masks.interrupted"
    with open_video(video) as out:
        n = len(out)
        assert 1 <= n < 40
        assert len(list(out.frames())) == n
    data = json.loads(doc.read_text())
    assert data["complete"] is False
    assert data["num_frames"] == len(data["frames"]) == n
    indices = [f["frame_index"] for f in data["frames"]]
    assert indices == list(range(n))
    assert sorted(p.name for p in masks.iterdir()) == [f"{i:06d}.png" for i in indices]
    assert f"interrupted after {n} frames" in stderr
    for path in (video, doc, masks):
        assert str(path) in stderr  # the message says where the partial results are
    assert not list(out_dir.rglob("*.partial"))  # no temp file or staging folder left
    return n


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals to a child process")
@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)],
                         ids=["SIGINT", "SIGTERM"])
def test_signal_leaves_valid_partial_outputs(
    tiny_bundle: Path, tmp_path: Path, signum: int, code: int
) -> None:
    rc, stderr = _stop_midway(_track_args(tiny_bundle, tmp_path), tmp_path, signum)
    assert rc == code, stderr
    assert "Traceback" not in stderr
    _check_interrupted_outputs(tmp_path, stderr)
    # Nothing under the names asked for: they only ever hold complete outputs.
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "masks.interrupted", "part.interrupted.json", "part.interrupted.mp4"]


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals to a child process")
def test_stopped_rerun_keeps_the_complete_outputs(tiny_bundle: Path, tmp_path: Path) -> None:
    args = _track_args(tiny_bundle, tmp_path)
    proc = run_child([sys.executable, "-m", "sam3track.cli", *args], "sam3track track", cwd=tmp_path, env=_env())
    assert proc.returncode == 0, proc.stderr
    finals = [tmp_path / "part.mp4", tmp_path / "part.json",
              *sorted((tmp_path / "masks").iterdir())]
    assert len(finals) == 2 + 40
    before = {p: p.read_bytes() for p in finals}

    rc, stderr = _stop_midway(args, tmp_path, signal.SIGINT)
    assert rc == 130, stderr
    assert {p: p.read_bytes() for p in finals} == before  # byte for byte
    assert len(list((tmp_path / "masks").iterdir())) == 40
    assert json.loads((tmp_path / "part.json").read_text())["complete"] is True
    _check_interrupted_outputs(tmp_path, stderr)


class _FailingSession(_ScriptedSession):
    """Tracks three frames, then fails like a damaged file would."""

    def propagate(self, direction="forward", start_frame=None, max_frames=None):
        for n, result in enumerate(super().propagate(direction, start_frame, max_frames)):
            if n == 3:
                raise sam3track.VideoError("frame 33 of the test video is damaged")
            yield result


def test_error_after_frames_keeps_them_beside_the_outputs(tmp_path: Path, monkeypatch,
                                                          capsys) -> None:
    predictor = _ScriptedPredictor()
    predictor.start_session = _FailingSession
    monkeypatch.setattr(sam3track, "load", lambda *args, **kwargs: predictor)
    (tmp_path / "bundle").mkdir()
    out = tmp_path / "out"
    out.mkdir()
    (out / "masks").mkdir()
    (out / "masks" / "000030.png").write_bytes(b"from an earlier complete run")
    rc = main(["track", str(BIKES), "--prompt", "person", "--bundle", str(tmp_path / "bundle"),
               "-o", str(out / "o.mp4"), "--json", str(out / "o.json"),
               "--masks-dir", str(out / "masks"), "--start-frame", "30", "--max-frames", "10"])
    assert rc == 2
    *progress, err = capsys.readouterr().err.rstrip("\n").split("\n")  # the bar, then one line
    assert err.startswith("error: ") and not any("error" in line for line in progress)
    assert "frame 33 of the test video is damaged" in err and "3 frames done" in err
    assert sorted(p.name for p in out.iterdir()) == [
        "masks", "masks.interrupted", "o.interrupted.json", "o.interrupted.mp4"]
    assert (out / "masks" / "000030.png").read_bytes() == b"from an earlier complete run"
    for path in ("o.interrupted.mp4", "o.interrupted.json", "masks.interrupted"):
        assert str(out / path) in err
    with open_video(out / "o.interrupted.mp4") as video:
        assert len(video) == 3
    doc = json.loads((out / "o.interrupted.json").read_text())
    assert doc["complete"] is False and doc["num_frames"] == 3
    assert sorted(p.name for p in (out / "masks.interrupted").iterdir()) == [
        "000030.png", "000031.png", "000032.png"]


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_interrupt_guard_handles_both_signals_and_restores_handlers() -> None:
    from sam3track.jobs.interrupts import InterruptGuard, Interrupted, exit_code_for

    seen: list[int] = []

    def previous(signum, frame):
        seen.append(signum)

    old = {s: signal.signal(s, previous) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for signum, code in [(signal.SIGINT, 130), (signal.SIGTERM, 143)]:
            with InterruptGuard():
                with pytest.raises(Interrupted) as raised:
                    os.kill(os.getpid(), signum)
                    time.sleep(1)  # the handler runs between bytecodes; this is never reached
                assert raised.value.signum == signum and exit_code_for(raised.value) == code
                os.kill(os.getpid(), signum)  # a second one while stopping: ignored
            with InterruptGuard() as guard:
                # Inside an atomic block the signal waits for the block's end.
                finished = False
                with pytest.raises(Interrupted):
                    with guard.atomic():
                        os.kill(os.getpid(), signum)
                        finished = True
                assert finished
            with InterruptGuard() as guard:
                with guard.finalising():  # ignored while outputs are being closed
                    os.kill(os.getpid(), signum)
                guard.finish()  # and once the work is done
                os.kill(os.getpid(), signum)
            assert signal.getsignal(signal.SIGINT) is previous
            assert signal.getsignal(signal.SIGTERM) is previous
        assert seen == []  # the guard, not the previous handlers, got every signal
        assert exit_code_for(KeyboardInterrupt()) == 130  # a plain Ctrl-C with no guard
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


# -- user errors: exit code 2, a message naming the culprit, no traceback ------------------------


def _run_error(args: list[str], capsys) -> str:
    rc = main(args)
    captured = capsys.readouterr()
    assert rc == 2, captured
    assert captured.err.startswith("error: ") and captured.err.count("\n") == 1, captured.err
    return captured.err


def test_each_frame_is_decoded_once(tiny_bundle: Path, tmp_path: Path, monkeypatch) -> None:
    """The session decodes a frame to track it; the drawing must reuse it, not decode again."""
    from collections import Counter

    from sam3track.video.random_access import DecodeCursor

    decoded: Counter[int] = Counter()
    frame_at = DecodeCursor.frame_at

    def counting(self, target: int):
        decoded[target] += 1
        return frame_at(self, target)

    monkeypatch.setattr(DecodeCursor, "frame_at", counting)
    start, count = 30, 12
    assert main(["track", str(BIKES), "--prompt", "person", "--bundle", str(tiny_bundle),
                 "-o", str(tmp_path / "o.mp4"), "--start-frame", str(start),
                 "--max-frames", str(count)]) == 0
    # Frame 0 once when the video is opened (to fail early on an undecodable file), then each
    # tracked frame exactly once.
    assert decoded == Counter({0: 1, **{i: 1 for i in range(start, start + count)}})
    with open_video(tmp_path / "o.mp4") as out:
        assert len(out) == count


@pytest.mark.parametrize("keep", [False, True], ids=["from-zero", "keep-timestamps"])
def test_clip_timestamps(tmp_path: Path, monkeypatch, keep: bool) -> None:
    monkeypatch.setattr(sam3track, "load", _ScriptedPredictor)
    (tmp_path / "bundle").mkdir()
    start, count = 76, 8
    video, doc = tmp_path / "clip.mp4", tmp_path / "clip.json"
    args = ["track", str(BIKES), "--prompt", "person", "--bundle", str(tmp_path / "bundle"),
            "-o", str(video), "--json", str(doc), "--start-frame", str(start),
            "--max-frames", str(count)]
    assert main(args + (["--keep-timestamps"] if keep else [])) == 0
    with open_video(BIKES) as src:
        source_times = [src.pts(i) * src.time_base for i in range(start, start + count)]
    with open_video(video) as out:
        times = [out.pts(i) * out.time_base for i in range(len(out))]
        assert [f.time for f in out.frames()] == pytest.approx([float(t) for t in times])
    assert source_times[0] > 3  # frame 76 of a 25 fps video: a start worth shifting
    assert times[0] == (source_times[0] if keep else 0)
    assert [t - times[0] for t in times] == [t - source_times[0] for t in source_times]
    assert json.loads(doc.read_text())["metadata"]["keep_timestamps"] is keep


def test_set_values_are_passed_to_the_bundle_configuration(tmp_path: Path, monkeypatch) -> None:
    """--set NAME=VALUE reads VALUE as JSON when it parses and hands every pair to load()."""
    loaded: list[dict] = []

    def load(*args, **overrides):
        loaded.append(overrides)
        return _ScriptedPredictor()

    monkeypatch.setattr(sam3track, "load", load)
    (tmp_path / "bundle").mkdir()
    assert main(["track", str(BIKES), "--prompt", "person", "--bundle", str(tmp_path / "bundle"),
                 "-o", str(tmp_path / "o.mp4"), "--max-frames", "2",
                 "--set", "new_det_thresh=0.6", "--set", "hotstart_delay=0",
                 "--set", " flag = true", "--set", "mode=fast"]) == 0
    assert loaded == [{"backend": "auto", "device": "cpu", "new_det_thresh": 0.6,
                       "hotstart_delay": 0, "flag": True, "mode": "fast"}]


# -- info and demo -----------------------------------------------------------------------------


def test_info_lists_every_graph(tiny_bundle: Path, tmp_path: Path, capsys) -> None:
    assert main(["info", str(tiny_bundle)]) == 0
    out = capsys.readouterr().out
    manifest = json.loads((tiny_bundle / "manifest.json").read_text())
    for name, graph in manifest["graphs"].items():
        assert name in out
        for tensor in graph["inputs"] + graph["outputs"]:
            assert tensor["name"] in out
    assert "format version" in out and "onnxruntime" in out
    assert "CPUExecutionProvider" in out and "RANDOM weights" in out

    err = _run_error(["info", str(tmp_path)], capsys)
    assert "manifest.json" in err and str(tmp_path) in err


def test_demo_tracks_with_the_shipped_bundle(tmp_path: Path, capsys) -> None:
    from sam3track.demo import demo_bundle_path

    assert demo_bundle_path() == REPO / "sam3track" / "demo_bundle"  # shipped: nothing is built
    video = tmp_path / "demo.mp4"
    assert main(["demo", "-o", str(video), "--max-frames", "4"]) == 0
    captured = capsys.readouterr()
    assert "random weights" in captured.out.lower()
    assert "python -m graphs.export --checkpoint" in captured.out
    with open_video(video) as out:
        assert len(out) == 4 and (out.width, out.height) == (640, 272)


def test_set_overrides_the_bundle_configuration(tiny_bundle: Path, tmp_path: Path, capsys) -> None:
    def objects_seen(*settings: str) -> int:
        doc_path = tmp_path / f"{len(list(tmp_path.iterdir()))}.json"
        args = ["track", str(BIKES), "--prompt", "bike", "--bundle", str(tiny_bundle), "--start-frame", "76",
                "--max-frames", "12", "-o", str(doc_path.with_suffix(".mp4")), "--json", str(doc_path)]
        assert main(args + [a for s in settings for a in ("--set", s)]) == 0
        doc = json.loads(doc_path.read_text())
        return len({o["object_id"] for f in doc["frames"] for o in f["objects"]})

    assert objects_seen("hotstart_delay=0") > 0
    assert objects_seen("hotstart_delay=0", "score_threshold_detection=1.0") == 0  # no probability exceeds 1
    for setting, says in (("score_threshold_detection=1.5", "takes a number from 0 to 1"),
                          ("hotstart_delay=-1", "must be at least 0"),
                          ("image_size=224", "fixed by the exported graphs")):
        rc = main(["track", str(BIKES), "--prompt", "bike", "--bundle", str(tiny_bundle), "--set", setting,
                   "-o", str(tmp_path / "refused.mp4")])
        err = capsys.readouterr().err
        assert rc == 2 and says in err and err.count("error:") == 1 and "Traceback" not in err, err
        assert not (tmp_path / "refused.mp4").exists()
    rc = main(["track", str(BIKES), "--prompt", "bike", "--bundle", str(tiny_bundle), "--set", "no_such=1",
               "-o", str(tmp_path / "x.mp4")])
    assert rc == 2
    err = capsys.readouterr().err
    assert "unknown configuration options ['no_such']" in err and "Traceback" not in err
    assert not (tmp_path / "x.mp4").exists()


# -- clicks and boxes: --point, --box, --obj-id ---------------------------------------------------


def test_points_boxes_and_obj_ids_group_into_add_prompt_calls() -> None:
    from sam3track.cli import build_parser
    from sam3track.jobs.geometric import group_calls

    args = build_parser().parse_args([
        "track", "v.mp4", "--point", "3:10,20", "--point", "3:30.5,40:0", "--box", "5:1,2,30,40",
        "--box", "5:3,4,50,60", "--obj-id", "7", "--point", "4:1,1", "--box", "4:0,0,9,9",
        "--point", "3:2,2", "--obj-id", "2", "--box", "6:0,0,5,5", "--point", "8:1,1:1"])
    assert args.prompt == []  # optional when clicks or boxes are given
    assert [str(g) for g in args.geometric][:2] == ["--point 3:10,20", "--point 3:30.5,40:0"]
    calls = [c.kwargs() for c in group_calls(args.geometric)]
    assert calls == [
        # the clicks without an id on frame 3: one new object
        {"frame_index": 3, "obj_id": None, "points": [[10.0, 20.0], [30.5, 40.0]], "labels": [1, 0]},
        # each box without an id: a new object
        {"frame_index": 5, "obj_id": None, "boxes": [1.0, 2.0, 30.0, 40.0]},
        {"frame_index": 5, "obj_id": None, "boxes": [3.0, 4.0, 50.0, 60.0]},
        # --obj-id 7 holds until --obj-id 2: its box and clicks on frame 4 go together
        {"frame_index": 4, "obj_id": 7, "points": [[1.0, 1.0]], "labels": [1], "boxes": [0.0, 0.0, 9.0, 9.0]},
        {"frame_index": 3, "obj_id": 7, "points": [[2.0, 2.0]], "labels": [1]},
        {"frame_index": 6, "obj_id": 2, "boxes": [0.0, 0.0, 5.0, 5.0]},
        {"frame_index": 8, "obj_id": 2, "points": [[1.0, 1.0]], "labels": [1]},
    ]


class _ClickSession(_ScriptedSession):
    """A scripted session that records every prompt and run_frame call."""

    def __init__(self, source, log: list) -> None:
        super().__init__(source)
        self.log = log

    def add_prompt(self, frame_index: int = 0, text=None, **clicks):
        if clicks.get("obj_id") == 99:
            raise sam3track.PromptError("points outside the frame")
        self.log.append(("add_prompt", frame_index, text, clicks))
        self.text = text or ""

    def run_frame(self, frame_index: int):
        self.log.append(("run_frame", frame_index))


def test_clicks_and_boxes_reach_the_session_before_tracking(tmp_path: Path, monkeypatch, capsys) -> None:
    log: list = []

    class Predictor(_ScriptedPredictor):
        def start_session(self, source, keep_history=True):
            return _ClickSession(source, log)

    monkeypatch.setattr(sam3track, "load", lambda *a, **k: Predictor())
    (tmp_path / "bundle").mkdir()
    common = ["track", str(BIKES), "--bundle", str(tmp_path / "bundle"), "-o", str(tmp_path / "o.mp4"),
              "--json", str(tmp_path / "o.json"), "--start-frame", "30", "--max-frames", "4"]
    # clicks alone: no text prompt, no run_frame
    assert main(common + ["--point", "31:100,50", "--box", "30:10,10,60,90"]) == 0
    assert log == [("add_prompt", 31, None, {"obj_id": None, "points": [[100.0, 50.0]], "labels": [1]}),
                   ("add_prompt", 30, None, {"obj_id": None, "boxes": [10.0, 10.0, 60.0, 90.0]})]
    meta = json.loads((tmp_path / "o.json").read_text())["metadata"]
    assert meta["prompts"] == [] and [c["option"] for c in meta["clicks_and_boxes"]] == ["--point", "--box"]
    # with text: the text first; a frame whose clicks name an id is tracked with the text before them
    log.clear()
    assert main(common + ["--prompt", "bike", "--point", "32:5,5", "--obj-id", "3", "--point", "32:100,50:0",
                          "--point", "32:110,50"]) == 0
    assert log == [("add_prompt", 30, "bike", {}),
                   ("add_prompt", 32, None, {"obj_id": None, "points": [[5.0, 5.0]], "labels": [1]}),
                   ("run_frame", 32),
                   ("add_prompt", 32, None, {"obj_id": 3, "points": [[100.0, 50.0], [110.0, 50.0]],
                                             "labels": [0, 1]})]
    # the session's own refusal names the options of the call
    capsys.readouterr()
    err = _run_error(common + ["--obj-id", "99", "--point", "31:1,1", "--point", "31:2,2"], capsys)
    assert "--point 31:1,1, --point 31:2,2: points outside the frame" in err


def test_track_with_clicks_only(tiny_bundle: Path, tmp_path: Path) -> None:
    """A real run from clicks and a box alone (needs Session.add_prompt(points=..., boxes=...))."""
    doc = tmp_path / "o.json"
    assert main(["track", str(BIKES), "--bundle", str(tiny_bundle), "-o", str(tmp_path / "o.mp4"),
                 "--json", str(doc), "--start-frame", "76", "--max-frames", "4",
                 "--point", "76:300,150", "--obj-id", "5", "--box", "77:100,50,250,200"]) == 0
    frames = json.loads(doc.read_text())["frames"]
    assert [f["frame_index"] for f in frames] == [76, 77, 78, 79]
    assert 5 in {o["object_id"] for f in frames[1:] for o in f["objects"]}
