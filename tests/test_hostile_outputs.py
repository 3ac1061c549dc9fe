"""Two writers aimed at one output (issue 25): each run writes a temporary of its own and locks the
output, so the second stops at once naming the first; a dead writer's lock is taken over; a later
complete run removes the ``.interrupted`` leftovers of earlier ones. Real processes, started together."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import cv2
import numpy as np
import pytest

from sam3track.demo import demo_bundle_path
from sam3track.errors import OutputBusyError
from sam3track.results import FrameResult
from sam3track.sinks import JsonSink, MasksDirSink
from sam3track.video import MaskVideoWriter, open_video

from .conftest import CLIPS, HANG_SECONDS, communicate

REPO = Path(__file__).resolve().parents[1]
H, W = 24, 32
FRAMES = 3  # --max-frames of the command-line runs

# A child holding the three Python sinks on OUT's same.json, masks/ and same.mp4: it reports, per sink,
# whether it opened it, writes FRAMES frames whose object id is FRAMES (so the outputs tell which child
# wrote them), prints "ready" and keeps every sink open until its stdin closes (or it is killed).
SINK_CHILD = r"""
import json, sys
from pathlib import Path
import numpy as np
from sam3track.errors import OutputBusyError
from sam3track.results import FrameResult
from sam3track.sinks import JsonSink, MasksDirSink
from sam3track.video import MaskVideoWriter

out, frames = Path(sys.argv[1]), int(sys.argv[2])
H, W = 24, 32
openers = {"json": lambda: JsonSink(out / "same.json", metadata={"frames": frames}),
           "masks": lambda: MasksDirSink(out / "masks"),
           "video": lambda: MaskVideoWriter(out / "same.mp4", width=W, height=H, fps=10)}
sinks = {}
for kind, opener in openers.items():
    try:
        sinks[kind] = opener()
        print(json.dumps({"kind": kind, "opened": True}), flush=True)
    except OutputBusyError as e:
        print(json.dumps({"kind": kind, "opened": False, "pid": e.pid, "message": str(e)}), flush=True)
for i in range(frames):
    masks = np.zeros((1, H, W), bool)
    masks[0, 4:12, 6:20] = True
    result = FrameResult(i, np.asarray([frames]), np.asarray([0.9], np.float32),
                         np.asarray([[6, 4, 20, 12]], np.float32), masks, ["thing"])
    if "json" in sinks: sinks["json"].write(result)
    if "masks" in sinks: sinks["masks"].write(result)
    if "video" in sinks: sinks["video"].write(np.full((H, W, 3), 40 * frames, np.uint8))
print("ready", flush=True)
sys.stdin.read()
for sink in sinks.values():
    sink.close()
"""

# `sam3track track` in a child whose bundle loading waits for stdin to close: the run has locked its
# outputs by then (they are locked before the bundle loads), so the test decides when it goes on.
HELD_TRACK = r"""
import sys
import sam3track
from sam3track.cli import main

real_load = sam3track.load
def held_load(*args, **kwargs):
    print("loading", flush=True)
    sys.stdin.read()
    return real_load(*args, **kwargs)
sam3track.load = held_load
sys.exit(main(sys.argv[1:]))
"""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return env


def _start(code: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env())


@contextmanager
def _children(*procs: subprocess.Popen):
    """Kill the children on the way out, and past HANG_SECONDS (a hang: their reads then end empty)."""
    guard = threading.Timer(HANG_SECONDS, lambda: [p.kill() for p in procs])
    guard.start()
    try:
        yield procs
    finally:
        guard.cancel()
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate()


def _line(proc: subprocess.Popen) -> str:
    line = proc.stdout.readline()
    if not line:
        pytest.fail(f"child {proc.pid} ended (or hung past {HANG_SECONDS} s) before reporting: "
                    f"{proc.stderr.read()[-2000:]}", pytrace=False)
    return line.strip()


def _result(index: int, object_id: int) -> FrameResult:
    masks = np.zeros((1, H, W), bool)
    masks[0, 4:12, 6:20] = True
    return FrameResult(index, np.asarray([object_id]), np.asarray([0.9], np.float32),
                       np.asarray([[6, 4, 20, 12]], np.float32), masks, ["thing"])


def _check_outputs(out: Path, frames: dict[str, int]) -> None:
    """same.json, masks/ and same.mp4 each hold the ``frames[kind]`` frames of one writer, whole."""
    doc = json.loads((out / "same.json").read_text())
    assert doc["complete"] is True and doc["num_frames"] == doc["metadata"]["frames"] == frames["json"]
    assert {o["object_id"] for f in doc["frames"] for o in f["objects"]} == {frames["json"]}
    pngs = sorted((out / "masks").iterdir())
    assert len(pngs) == frames["masks"]
    assert all(cv2.imread(str(p), cv2.IMREAD_UNCHANGED).max() == frames["masks"] for p in pngs)
    with open_video(out / "same.mp4") as video:
        assert len(list(video.frames())) == frames["video"]


def test_a_second_writer_in_this_process_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    with JsonSink(path) as first:
        with pytest.raises(OutputBusyError, match=f"{path}: this process \\({os.getpid()}\\).*writing it") as e:
            JsonSink(path)
        assert e.value.pid == os.getpid() and e.value.path == path
        first.write(_result(0, 7))
    assert json.loads(path.read_text())["num_frames"] == 1  # the refused one touched nothing
    assert [p.name for p in tmp_path.iterdir()] == ["t.json"]  # no temporary, no lock file
    with JsonSink(path):  # free again once the first is closed
        pass


def test_two_sink_processes_started_together(tmp_path: Path) -> None:
    """Per sink, exactly one child opens it; the other is refused naming it, and its output is whole."""
    with _children(_start(SINK_CHILD, str(tmp_path), "2"), _start(SINK_CHILD, str(tmp_path), "3")) as procs:
        reports = {p.pid: [json.loads(_line(p)) for _ in range(3)] for p in procs}
        assert [_line(p) for p in procs] == ["ready", "ready"]  # both hold what they opened
        frames = {}
        for kind, target in (("json", "same.json"), ("masks", "masks"), ("video", "same.mp4")):
            opened = [pid for pid, rs in reports.items() for r in rs if r["kind"] == kind and r["opened"]]
            refused = [r for rs in reports.values() for r in rs if r["kind"] == kind and not r["opened"]]
            assert len(opened) == 1 and len(refused) == 1, reports
            assert refused[0]["pid"] == opened[0]
            assert f"{tmp_path / target}: process {opened[0]} is writing it" in refused[0]["message"]
            frames[kind] = 2 if opened[0] == procs[0].pid else 3
        for p in procs:
            _, err = communicate(p, "a sink child")
            assert p.returncode == 0, err
    _check_outputs(tmp_path, frames)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["masks", "same.json", "same.mp4"]


def test_two_track_runs_started_together(tmp_path: Path) -> None:
    """The run that locks first holds mp4, JSON and PNG folder; the other exits 2 at once with one line
    naming the output and that run's pid, touching nothing; the first then completes, and removes the
    .interrupted leftovers of an earlier run."""
    leftovers = [tmp_path / "same.interrupted.mp4", tmp_path / "same.interrupted.json"]
    for leftover in leftovers:
        leftover.write_bytes(b"the frames an earlier, interrupted run did")
    (tmp_path / "masks.interrupted").mkdir()
    (tmp_path / "masks.interrupted" / "000000.png").write_bytes(b"an interrupted run's mask")
    args = ["track", str(CLIPS / "bikes.mp4"), "--prompt", "bike", "--bundle", str(demo_bundle_path()),
            "-o", str(tmp_path / "same.mp4"), "--json", str(tmp_path / "same.json"),
            "--masks-dir", str(tmp_path / "masks"), "--max-frames", str(FRAMES)]
    with _children(_start(HELD_TRACK, *args), _start(HELD_TRACK, *args)) as procs:
        deadline = time.monotonic() + HANG_SECONDS
        while all(p.poll() is None for p in procs):  # the one refused exits; the other waits
            if time.monotonic() > deadline:
                pytest.fail(f"neither run stopped in {HANG_SECONDS} s: the second was not refused", pytrace=False)
            time.sleep(0.01)
        loser, winner = procs if procs[0].poll() is not None else procs[::-1]
        out, err = communicate(loser, "the refused run")
        assert loser.returncode == 2 and out == "" and err.count("\n") == 1, (out, err)
        assert err.startswith(f"error: cannot write {tmp_path / 'same.mp4'}: process {winner.pid} is writing it")
        assert "Traceback" not in err
        assert all(p.exists() for p in leftovers)  # the refused run removed nothing
        out, err = communicate(winner, "the run holding the outputs")
        assert winner.returncode == 0, err
        assert out.startswith("loading\ntracked 3 frames")
    _check_outputs_of_track(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["masks", "same.json", "same.mp4"]


def _check_outputs_of_track(out: Path) -> None:
    doc = json.loads((out / "same.json").read_text())
    assert doc["complete"] is True and doc["num_frames"] == FRAMES
    assert sorted(p.name for p in (out / "masks").iterdir()) == [f"{i:06d}.png" for i in range(FRAMES)]
    with open_video(out / "same.mp4") as video:
        assert len(list(video.frames())) == FRAMES


def test_a_killed_writers_lock_is_taken_over(tmp_path: Path) -> None:
    with _children(_start(SINK_CHILD, str(tmp_path), "2")) as (child,):
        assert [json.loads(_line(child))["opened"] for _ in range(3)] == [True, True, True]
        assert _line(child) == "ready"
        child.send_signal(signal.SIGKILL)  # no close, no clean-up: what a power cut leaves
        child.wait()
    stale = sorted(p.name for p in tmp_path.iterdir())
    assert {".masks.lock", ".same.json.lock", ".same.mp4.lock"} <= set(stale)
    assert json.loads((tmp_path / ".same.json.lock").read_text())["pid"] == child.pid
    # Its temporaries: the JSON and the PNG staging folder (PyAV creates the mp4's only at its first packet).
    partials = [name for name in stale if name.endswith(".partial")]
    assert [name.split(".")[0] for name in partials if not name.startswith("same.mp4.")] == ["masks", "same"]
    with JsonSink(tmp_path / "same.json", metadata={"frames": 1}) as doc, \
            MasksDirSink(tmp_path / "masks") as masks, \
            MaskVideoWriter(tmp_path / "same.mp4", width=W, height=H, fps=10) as video:
        doc.write(_result(0, 1))
        masks.write(_result(0, 1))
        video.write(np.zeros((H, W, 3), np.uint8))
    _check_outputs(tmp_path, {"json": 1, "masks": 1, "video": 1})
    # The dead run's temporaries and lock files are gone with this run's.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["masks", "same.json", "same.mp4"]


def test_a_complete_run_removes_interrupted_leftovers(tmp_path: Path) -> None:
    def run(complete: bool) -> None:
        with JsonSink(tmp_path / "t.json") as doc, MasksDirSink(tmp_path / "masks") as masks, \
                MaskVideoWriter(tmp_path / "t.mp4", width=W, height=H, fps=10) as video:
            doc.write(_result(0, 1))
            masks.write(_result(0, 1))
            video.write(np.zeros((H, W, 3), np.uint8))
            if not complete:
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(complete=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["masks.interrupted", "t.interrupted.json",
                                                          "t.interrupted.mp4"]
    run(complete=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["masks", "t.json", "t.mp4"]
    # A folder of that name holding files sam3track never writes is not its to delete.
    (tmp_path / "masks.interrupted").mkdir()
    (tmp_path / "masks.interrupted" / "notes.txt").write_text("mine")
    run(complete=True)
    assert (tmp_path / "masks.interrupted" / "notes.txt").read_text() == "mine"
