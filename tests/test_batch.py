"""``sam3track batch`` on an embedded Ray: bad videos fail alone, outputs equal ``sam3track track``'s,
a killed worker's video is redone once, and an interrupted run resumes from its ledger."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import av
import cv2
import pytest

# The test extra installs Ray: without it these tests fail, never skip.
import ray  # noqa: E402,F401

from sam3track.batch import (  # noqa: E402
    FRAME_DELAY_ENV,
    HOLD_FILE_ENV,
    HOLD_SECONDS,
    LEDGER_NAME,
    PID_DIR_ENV,
    collect_inputs,
    output_name,
    read_ledger,
    track_videos,
)
from sam3track.batch.cluster import local_workers  # noqa: E402
from sam3track.batch.driver import RETRIED_NOTE  # noqa: E402
from sam3track.batch.ledger import VideoSummary  # noqa: E402
from sam3track.commands.batch import summary_table  # noqa: E402
from sam3track.commands.track import run_track  # noqa: E402
from sam3track.demo import demo_bundle_path  # noqa: E402
from sam3track.errors import UsageError  # noqa: E402
from sam3track.video import MaskVideoWriter, open_source, open_video  # noqa: E402

from .conftest import HANG_SECONDS, communicate  # noqa: E402

pytestmark = pytest.mark.slow  # the full tier: Ray clusters and CLI subprocesses

ROOT = Path(__file__).resolve().parents[1]
BIKES = ROOT / "examples" / "clips" / "bikes.mp4"
FRAMES, WIDTH, HEIGHT = 6, 128, 72
PROMPTS = ["person", "bike"]
# HANG_SECONDS (conftest) is above HOLD_SECONDS: a driver that waits for a held video shows up in the
# ledger, not as a timeout.
assert HANG_SECONDS > HOLD_SECONDS


def _write_clip(path: Path, first: int) -> None:
    """FRAMES frames of bikes.mp4 from ``first``, shrunk to WIDTH x HEIGHT, with our writer."""
    with open_source(BIKES) as src, MaskVideoWriter(path, width=WIDTH, height=HEIGHT,
                                                     fps=src.frame_rate) as w:
        for f in src.frames():
            if f.index >= first + FRAMES:
                break
            if f.index >= first:
                w.write(cv2.resize(f.rgb, (WIDTH, HEIGHT), interpolation=cv2.INTER_AREA))


def _write_zero_frames(path: Path) -> None:
    """An mp4 container that holds no frame at all."""
    with av.open(str(path), "w") as c:
        s = c.add_stream("libx264", rate=25)
        s.width, s.height, s.pix_fmt = WIDTH, HEIGHT, "yuv420p"
        c.start_encoding()
        c.mux(s.encode(None))


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Path]]:
    """Four good clips (two share the stem "clip", in different folders) and two bad ones."""
    root = tmp_path_factory.mktemp("clips")
    (root / "a").mkdir()
    (root / "b").mkdir()
    good = [root / "a" / "clip.mp4", root / "b" / "clip.mp4", root / "c.mp4", root / "d.mp4"]
    for path, first in zip(good, (0, 40, 80, 120)):
        _write_clip(path, first)
    bad = [root / "corrupt.mp4", root / "empty.mp4"]
    bad[0].write_bytes(b"\x00\x00\x00\x18ftypmp42" + os.urandom(4000))
    _write_zero_frames(bad[1])
    return {"root": [root], "good": good, "bad": bad}


@pytest.fixture(scope="module")
def references(clips: dict[str, list[Path]], tmp_path_factory: pytest.TempPathFactory) -> dict:
    """What ``sam3track track`` writes for each good clip alone: {clip: (mp4 bytes, json bytes)}."""
    root = tmp_path_factory.mktemp("alone")
    refs = {}
    for i, clip in enumerate(clips["good"]):
        mp4, js = root / f"{i}.mp4", root / f"{i}.json"
        assert run_track(clip, PROMPTS, bundle=demo_bundle_path(), output=mp4, json_path=js) == 0
        refs[clip] = (mp4.read_bytes(), js.read_bytes())
    return refs


@pytest.fixture(scope="module")
def cluster():
    """One embedded Ray for the in-process tests (track_videos reuses it and leaves it running)."""
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    yield
    ray.shutdown()


def _ledger_lines(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / LEDGER_NAME).read_text().splitlines()]


def _check_outputs_equal_track(out: Path, clips: list[Path], references: dict) -> None:
    for clip in clips:
        name = output_name(clip)
        mp4_ref, json_ref = references[clip]
        got = json.loads((out / f"{name}.json").read_text())
        want = json.loads(json_ref)
        assert got["frames"] == want["frames"], clip  # every RLE mask, box and score
        assert (out / f"{name}.json").read_bytes() == json_ref, clip
        assert (out / f"{name}.masks.mp4").read_bytes() == mp4_ref, clip
        with open_video(out / f"{name}.masks.mp4") as v:
            assert len(v) == FRAMES


def _no_partials(out: Path) -> None:
    assert not [p.name for p in out.iterdir() if ".partial" in p.name or ".interrupted" in p.name]


def test_collect_inputs_and_names(clips: dict[str, list[Path]], tmp_path: Path) -> None:
    listing = tmp_path / "list.txt"
    listing.write_text(f"# two of them\n{clips['good'][2]}\n\n{clips['good'][0]}\n")
    found = collect_inputs([listing, clips["root"][0]])
    assert found[:2] == [clips["good"][2], clips["good"][0]]
    assert sorted(found) == sorted(clips["good"] + clips["bad"])  # each once
    names = {output_name(p) for p in clips["good"]}
    assert len(names) == 4 and all(n.startswith(("clip-", "c-", "d-")) for n in names)


def test_two_workers_bad_videos_fail_alone_and_outputs_equal_track(
    cluster: None, clips: dict[str, list[Path]], references: dict, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    inputs = clips["good"] + clips["bad"]
    summaries = list(track_videos(inputs, PROMPTS, demo_bundle_path(), out, workers=2))
    assert len(summaries) == 6
    by_video = {Path(s.video): s for s in summaries}
    for clip in clips["good"]:
        s = by_video[clip]
        assert (s.status, s.frames, s.reason) == ("done", FRAMES, ""), s
    corrupt, empty = (by_video[p] for p in clips["bad"])
    assert corrupt.status == "failed" and "not a readable video" in corrupt.reason
    assert empty.status == "failed" and "no video stream" in empty.reason
    for s in (corrupt, empty):
        assert "\n" not in s.reason and str(s.video) in s.reason
    lines = _ledger_lines(out)
    assert sorted(line["video"] for line in lines) == sorted(str(p) for p in inputs)
    _check_outputs_equal_track(out, clips["good"], references)
    _no_partials(out)

    # The same call again: the done ones are skipped, the failed ones tried (and fail) again.
    again = list(track_videos(inputs, PROMPTS, demo_bundle_path(), out, workers=2))
    assert sorted(str(Path(s.video)) for s in again if s.skipped) == sorted(map(str, clips["good"]))
    assert sorted(s.video for s in again if not s.skipped) == sorted(map(str, clips["bad"]))
    assert len(_ledger_lines(out)) == 8
    last = read_ledger(out)  # attempts count over both runs; the last error stays with the video
    for clip in clips["bad"]:
        assert (last[str(clip)].attempts, last[str(clip)].last_error) == (2, last[str(clip)].reason)
    assert all(last[str(clip)].attempts == 1 and last[str(clip)].last_error == "" for clip in clips["good"])


def test_killed_worker_is_replaced_and_its_video_redone_once(
    cluster: None, clips: dict[str, list[Path]], references: dict, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out, pids = tmp_path / "out", tmp_path / "pids"
    pids.mkdir()
    monkeypatch.setenv(FRAME_DELAY_ENV, "0.25")  # ~1.5 s a clip: the kill lands mid-video
    monkeypatch.setenv(PID_DIR_ENV, str(pids))
    killed: list[tuple[int, str]] = []

    def kill_first_busy_worker() -> None:
        deadline = time.monotonic() + HANG_SECONDS
        while time.monotonic() < deadline:
            busy = sorted(pids.glob("*.busy"))
            if busy:
                time.sleep(0.6)  # a few frames in: its outputs are open under .partial names
                pid = int(busy[0].name.split(".")[0])
                killed.append((pid, busy[0].read_text()))
                os.kill(pid, signal.SIGKILL)
                return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_first_busy_worker)
    killer.start()
    summaries = list(track_videos(clips["good"], PROMPTS, demo_bundle_path(), out, workers=2))
    killer.join()
    assert killed, f"no worker was seen busy within {HANG_SECONDS} s (a hang before the first frame?)"
    assert all(s.status == "done" for s in summaries), summaries
    lines = _ledger_lines(out)
    assert sorted(line["video"] for line in lines) == sorted(map(str, clips["good"]))  # once each
    assert all(line["status"] == "done" for line in lines)
    attempts = {line["video"]: (line["attempts"], line["last_error"]) for line in lines}
    assert attempts.pop(killed[0][1]) == (2, RETRIED_NOTE)  # Ray's retry is counted and said
    assert set(attempts.values()) == {(1, "")}
    started = {int(p.name) for p in pids.iterdir() if p.name.isdigit()}
    assert killed[0][0] in started and len(started) == 3  # 2 workers + the replacement
    _check_outputs_equal_track(out, clips["good"], references)
    _no_partials(out)


def test_interrupted_cli_resumes_without_redoing(
    clips: dict[str, list[Path]], references: dict, tmp_path: Path
) -> None:
    """Its own Ray: the CLI in a subprocess, Ctrl-C after the first video, then the same command."""
    out = tmp_path / "out"
    command = [sys.executable, "-m", "sam3track", "batch", *map(str, clips["good"]),
               "--bundle", str(demo_bundle_path()), "--out", str(out), "--workers", "1"]
    for p in PROMPTS:
        command += ["--prompt", p]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    # The worker is held before its second video while the hold file exists: the Ctrl-C lands with
    # exactly one video done and the driver waiting on the next, however loaded the machine is
    # (a frame delay alone raced the suite's load). The CLI must stop without waiting for the video.
    hold = tmp_path / "hold"
    hold.touch()
    proc = subprocess.Popen(command, env=dict(env, **{HOLD_FILE_ENV: str(hold)}), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        ledger = out / LEDGER_NAME
        deadline = time.monotonic() + HANG_SECONDS
        while time.monotonic() < deadline and proc.poll() is None:
            if ledger.exists() and ledger.read_text().count("\n") >= 1:
                break
            time.sleep(0.05)
        assert proc.poll() is None, f"the batch ended before the Ctrl-C: {proc.communicate()[1]}"
        assert ledger.exists() and ledger.read_text().count("\n") == 1, \
            f"no video finished in {HANG_SECONDS} s (the batch hangs)"
        proc.send_signal(signal.SIGINT)
        # The worker stays held while we wait: a driver that waited for its video would finish it only
        # once the hold expires (HOLD_SECONDS) and write a second ledger line, which fails below.
        stdout, stderr = communicate(proc, "sam3track batch after Ctrl-C")
    finally:
        hold.unlink(missing_ok=True)
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, stderr
    assert "interrupted" in stderr
    first = _ledger_lines(out)
    assert len(first) == 1 and first[0]["status"] == "done"
    done_names = {output_name(Path(line["video"])) for line in first}
    finals = {p.name for p in out.iterdir() if p.name.endswith((".json", ".masks.mp4"))
              and ".partial" not in p.name and ".interrupted" not in p.name}
    assert finals == {f"{n}{s}" for n in done_names for s in (".json", ".masks.mp4")}

    again = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    again_out, again_err = communicate(again, "sam3track batch, the re-run")
    assert again.returncode == 0, again_err
    lines = _ledger_lines(out)
    assert sorted(line["video"] for line in lines) == sorted(map(str, clips["good"]))  # once each
    assert [line["video"] for line in lines[:len(first)]] == [line["video"] for line in first]
    # stdout is the table alone (no Ray message), here one line: the successes are counted, not listed.
    redone = len(clips["good"]) - len(first)
    assert len(again_out.splitlines()) == 1, again_out
    assert re.fullmatch(rf"{redone} done, 0 failed, {len(first)} skipped \(done before\) in [\d.]+ s, "
                        rf"{redone * FRAMES} frames; .* frames/s, .* videos/min", again_out.strip()), again_out
    assert read_ledger(out).keys() == {str(p) for p in clips["good"]}
    _check_outputs_equal_track(out, clips["good"], references)
    _no_partials(out)


def test_a_bundle_no_worker_can_load_stops_the_run(
    cluster: None, clips: dict[str, list[Path]], tmp_path: Path
) -> None:
    import shutil

    from sam3track.commands.common import CliError

    bundle = tmp_path / "bundle"
    shutil.copytree(demo_bundle_path(), bundle)
    (bundle / "backbone.onnx").write_bytes(b"not a graph")
    with pytest.raises(CliError, match="a worker could not start: .*checksum mismatch"):
        list(track_videos(clips["good"][:2], PROMPTS, bundle, tmp_path / "out", workers=2))
    assert _ledger_lines(tmp_path / "out") == []  # not the videos' fault: nothing recorded


def test_the_runtime_does_not_import_ray() -> None:
    code = ("import sys, sam3track, sam3track.cli, sam3track.batch; "
            "sam3track.cli.build_parser(); print('ray' in sys.modules)")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "False", out.stderr


def test_a_torn_ledger_line_is_skipped_and_not_glued_to(
    cluster: None, clips: dict[str, list[Path]], references: dict, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / LEDGER_NAME).write_text('{"video": "/x.mp4", "status": "do')  # a crash mid-line
    assert read_ledger(out) == {}
    summaries = list(track_videos(clips["good"][:1], PROMPTS, demo_bundle_path(), out))
    assert [s.status for s in summaries] == ["done"]
    assert set(read_ledger(out)) == {str(clips["good"][0])}
    _check_outputs_equal_track(out, clips["good"][:1], references)


def test_a_local_ray_starts_no_more_workers_than_cores_and_memory_hold() -> None:
    notes: list[str] = []
    gib = 2**30
    assert local_workers(2, 2, None, cores=8, free=64 * gib, per_worker=gib, note=notes.append) == 2
    assert notes == []  # fits: nothing to say
    assert local_workers(100, 100, None, cores=2, free=64 * gib, per_worker=gib, note=notes.append) == 2
    assert notes.pop() == ("local Ray: --workers 100 asked, starting 2 (2 cores at 1 CPU each hold no more); "
                           "join a cluster with --address for more")
    assert local_workers(8, 8, 2, cores=16, free=5 * gib, per_worker=2 * gib, note=notes.append) == 2
    assert notes.pop() == ("local Ray: --workers 8 asked, starting 2 (5.0 GiB of free memory at about 2.0 GiB "
                           "each hold no more); join a cluster with --address for more")
    assert local_workers(3, 3, None, cores=4, free=None, per_worker=gib, note=notes.append) == 3  # unknown memory


def test_the_final_table_lists_failures_and_counts_the_rest() -> None:
    rows = [VideoSummary("/v/a.mp4", "done", frames=10, attempts=1),
            VideoSummary("/v/b.mp4", "done", frames=5, skipped=True),
            VideoSummary("/v/c.mp4", "failed", reason="not a readable video", attempts=3, seconds=0.5)]
    lines = summary_table(rows, elapsed=2.0).splitlines()
    assert lines[0].split() == ["status", "attempts", "seconds", "video:", "reason"]
    assert lines[1].split() == ["failed", "3", "0.50", "/v/c.mp4:", "not", "a", "readable", "video"]
    assert lines[2] == "1 done, 1 failed, 1 skipped (done before) in 2.0 s, 10 frames; 5.0 frames/s, 30.0 videos/min"
    assert len(lines) == 3  # the done and skipped videos are counted, not listed
    assert summary_table(rows[:1], elapsed=2.0).splitlines() == [
        "1 done, 0 failed, 0 skipped (done before) in 2.0 s, 10 frames; 5.0 frames/s, 30.0 videos/min"]


def test_inputs_in_an_object_store_and_the_output_folder_left_out() -> None:
    """URLs through fsspec (its in-memory store here; S3 itself in test_batch_cluster.py): a prefix is a
    folder searched for videos, a .txt object a list, each URL spelled as given; none under --out."""
    import fsspec

    fs = fsspec.filesystem("memory")
    for name in ("in/a.mp4", "in/sub/b.MOV", "in/notes.md", "in/out/a-1234abcd.masks.mp4"):
        fs.pipe(f"/bucket/{name}", b"x")
    fs.pipe("/bucket/list.txt", b"in/a.mp4\n# a comment\ns3://other/z.mp4\n/abs/local.mp4\n")
    assert collect_inputs(["memory://bucket/in/"], exclude="memory://bucket/in/out") == [
        "memory://bucket/in/a.mp4", "memory://bucket/in/sub/b.MOV"]
    assert collect_inputs(["memory://bucket/list.txt"]) == [
        "memory://bucket/in/a.mp4", "s3://other/z.mp4", Path("/abs/local.mp4")]
    assert output_name("memory://bucket/in/a.mp4").startswith("a-")
    assert output_name("memory://bucket/in/a.mp4") != output_name("memory://bucket/x/a.mp4")
    with pytest.raises(UsageError, match=r"^input not found: memory://bucket/missing$"):
        collect_inputs(["memory://bucket/missing"])
    with pytest.raises(UsageError, match=r"^nope://x: Protocol not known: nope; give a local path or a URL"):
        collect_inputs(["nope://x"])


class _ClusterView:
    """What check_fits reads of Ray: the cluster's totals and its nodes."""

    def __init__(self, nodes: list[dict]) -> None:
        self._nodes = nodes

    def cluster_resources(self) -> dict:
        total: dict = {}
        for node in self._nodes:
            for k, v in node.items():
                total[k] = total.get(k, 0) + v
        return total

    def nodes(self) -> list[dict]:
        return [{"Alive": True, "Resources": n} for n in self._nodes]


def test_workers_that_can_never_be_placed_are_refused_before_any_task() -> None:
    from sam3track.batch.cluster import Demand, check_fits

    two_nodes = _ClusterView([{"CPU": 4.0, "GPU": 1.0}, {"CPU": 2.0}])
    check_fits(two_nodes, Demand(workers=6, cpus=1, gpus=0), "the cluster")  # 6 CPUs: fits
    with pytest.raises(UsageError, match=r"^--workers 2 needs 2 GPUs \(--device cuda: one GPU per worker\), but "
                                         r"the cluster has 1 GPU; use --workers 1 or fewer$"):
        check_fits(two_nodes, Demand(workers=2, cpus=1, gpus=1), "the cluster")
    with pytest.raises(UsageError, match=r"^--workers 4 needs 8 CPUs \(2 CPUs per worker\), but the cluster has 6 "
                                         r"CPUs; use --workers 3 or fewer$"):
        check_fits(two_nodes, Demand(workers=4, cpus=2, gpus=0), "the cluster")
    with pytest.raises(UsageError, match=r"^each worker needs 5 CPUs, but the largest node of the cluster has 4; "
                                         r"lower --cpus-per-worker$"):
        check_fits(two_nodes, Demand(workers=1, cpus=5, gpus=0), "the cluster")
    with pytest.raises(UsageError, match=r"has 0 GPUs; add nodes that have some$"):
        check_fits(_ClusterView([{"CPU": 2.0}]), Demand(workers=1, cpus=1, gpus=1), "the local Ray")


def test_a_killed_workers_scratch_is_removed_by_the_next_worker_and_a_live_one_is_kept(tmp_path, monkeypatch):
    """A worker killed mid-video cannot remove its scratch (a fetched video can be gigabytes); the next
    worker to start on the machine does: the dead one's lock is free, a live worker's is held. Folders
    without a lock file (older sam3track, or not ours) are left alone."""
    import tempfile

    from sam3track.batch import scratch

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom sam3track.batch.scratch import scratch_folder\n"
         "with scratch_folder() as f:\n    open(f + '/video.mp4', 'wb').write(b'x' * 1000)\n"
         "    print(f, flush=True)\n    time.sleep(600)"],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "TMPDIR": str(tmp_path)})
    dead = child.stdout.readline().strip()
    legacy = tmp_path / "sam3track-batch-legacy"
    legacy.mkdir()
    with scratch.scratch_folder() as live:
        assert Path(dead).parent == tmp_path and Path(live).parent == tmp_path
        assert scratch.remove_orphaned_scratch() == []  # the child is alive: its folder stays
        child.kill()
        child.wait()
        assert scratch.remove_orphaned_scratch() == [dead]
        assert Path(live).is_dir() and legacy.is_dir() and not Path(dead).exists()
    assert not Path(live).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sam3track-batch-legacy"]
