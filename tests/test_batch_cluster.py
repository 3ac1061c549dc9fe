"""``sam3track batch`` against a real Ray cluster, as a user runs it: ``ray start --head`` on localhost
(its own temp dir, another working folder than the driver's; stopped at the end), the CLI joining it
through --address or RAY_ADDRESS with relative paths, more workers than CPUs, --out inside the inputs,
workers waiting for CPUs another job holds, inputs and outputs in S3 (moto's S3 server on localhost,
spoken to by s3fs over HTTP); and the errors that need no cluster (an address nobody answers, a folder
with no videos). One cluster for the module; clips of a few frames, the demo bundle."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import cv2
import pytest

import ray  # noqa: F401  (the test extra installs Ray: without it these tests fail, never skip)

from sam3track.batch import LEDGER_NAME, PID_DIR_ENV, FRAME_DELAY_ENV, output_name
from sam3track.demo import demo_bundle_path
from sam3track.video import MaskVideoWriter, open_source

from .conftest import HANG_SECONDS, communicate, run_child

pytestmark = pytest.mark.slow  # a Ray cluster and CLI subprocesses

ROOT = Path(__file__).resolve().parents[1]
BIKES = ROOT / "examples" / "clips" / "bikes.mp4"
FRAMES, WIDTH, HEIGHT = 3, 64, 36
CLUSTER_CPUS = 2
# A cluster started here trusts the local user: no token (Ray 2.5x's `ray start` turns token auth on
# when ~/.ray/auth_token exists, which a driver without RAY_AUTH_MODE=token then cannot join).
NO_AUTH = {"RAY_AUTH_MODE": "disabled"}
TABLE_LINE = re.compile(r"(status +attempts|failed +\d+ |\d+ done, \d+ failed, \d+ skipped \(done before\) in )")


S3_ENV: dict[str, str] = {}  # set by the s3 fixture: where the S3 server is, and its test credentials


def _env(**extra: str) -> dict[str, str]:
    """This checkout's code first (in the CLI and, through the cluster's env, in its workers), the S3
    server's address and credentials."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), **NO_AUTH)
    env.pop("RAY_ADDRESS", None)
    env.update(S3_ENV)
    env.update(extra)
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_clip(path: Path, first: int) -> None:
    with open_source(BIKES) as src, MaskVideoWriter(path, width=WIDTH, height=HEIGHT, fps=src.frame_rate) as w:
        for f in src.frames():
            if f.index >= first + FRAMES:
                break
            if f.index >= first:
                w.write(cv2.resize(f.rgb, (WIDTH, HEIGHT), interpolation=cv2.INTER_AREA))


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Four clips of FRAMES frames, written once and copied where each test needs them."""
    root = tmp_path_factory.mktemp("cluster-clips")
    paths = [root / f"clip{i}.mp4" for i in range(4)]
    for i, path in enumerate(paths):
        _write_clip(path, 30 * i)
    return paths


def _our_processes(marker: str) -> list[int]:
    """Processes whose command line names ``marker`` (the cluster's own temp dir): ours alone."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.fixture(scope="module")
def s3() -> str:
    """moto's S3 server on a localhost port for the module (before the cluster, whose workers read
    its address from their environment); the name of an empty bucket in it."""
    from moto.server import ThreadedMotoServer

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    S3_ENV.update(AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}", AWS_ACCESS_KEY_ID="testing",
                  AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
    try:
        _s3_client().create_bucket(Bucket="videos")
        yield "videos"
    finally:
        server.stop()
        S3_ENV.clear()


def _s3_client():
    import boto3

    return boto3.client("s3", endpoint_url=S3_ENV["AWS_ENDPOINT_URL"], region_name="us-east-1",
                        aws_access_key_id="testing", aws_secret_access_key="testing")


@pytest.fixture(scope="module")
def cluster_temp() -> Path:
    """The cluster's temp dir (Ray's sessions and logs) with its working folder ``cwd`` in it, removed
    at the end."""
    temp = Path(tempfile.mkdtemp(prefix="r", dir="/tmp"))  # short: Ray's socket paths must fit 107 bytes
    (temp / "cwd").mkdir()
    yield temp
    shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster(s3: str, cluster_temp: Path) -> str:
    """``ray start --head --block`` with CLUSTER_CPUS CPUs in its own temp dir and working folder;
    its address. SIGTERM at the end stops it and every process it started (checked)."""
    temp, home = str(cluster_temp), cluster_temp / "cwd"
    port = _free_port()
    command = [str(Path(sys.executable).with_name("ray")), "start", "--head", "--block", f"--port={port}", "--node-ip-address=127.0.0.1",
               f"--num-cpus={CLUSTER_CPUS}", f"--temp-dir={temp}", "--include-dashboard=false",
               "--disable-usage-stats"]
    log = open(Path(temp, "start.log"), "w")
    proc = subprocess.Popen(command, cwd=home, env=_env(), stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + HANG_SECONDS
        while "Ray runtime started" not in Path(temp, "start.log").read_text():
            assert proc.poll() is None, f"ray start failed: {Path(temp, 'start.log').read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"ray start: no cluster within {HANG_SECONDS} s"
            time.sleep(0.2)
        yield f"127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        left = _our_processes(temp)
        for pid in left:  # the cluster's own processes, by id, if SIGTERM left any
            os.kill(pid, signal.SIGKILL)
        assert not left, f"ray start --block left {len(left)} processes after SIGTERM"


def _batch(args: list[str], cwd: Path, what: str, **env: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "sam3track", "batch", *args, "--prompt", "person", "--prompt", "bike"]
    return run_child(command, what, cwd=cwd, env=_env(**env))


def _table_only(stdout: str) -> None:
    """stdout holds the final table and nothing else (no Ray message, no progress)."""
    assert stdout.strip() and all(TABLE_LINE.match(line) for line in stdout.strip().splitlines()), stdout


def _ledger(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / LEDGER_NAME).read_text().splitlines()]


def test_relative_paths_from_another_folder_and_a_rerun_from_a_third(
    cluster: str, cluster_temp: Path, clips: list[Path], tmp_path: Path
) -> None:
    work = tmp_path / "work"
    (work / "clips").mkdir(parents=True)
    for clip in clips[:2]:
        (work / "clips" / clip.name).write_bytes(clip.read_bytes())
    bundle = os.path.relpath(demo_bundle_path(), work)
    done = _batch(["clips", "--bundle", bundle, "--out", "out", "--address", cluster, "--workers", "2"],
                  work, "batch with relative paths")
    assert done.returncode == 0, done.stderr
    _table_only(done.stdout)
    assert done.stdout.strip().splitlines()[-1].startswith("2 done, 0 failed, 0 skipped")
    assert f"tracking: {2 * FRAMES} frames" in done.stderr  # one progress line for the batch, in frames
    lines = _ledger(work / "out")
    assert sorted(line["video"] for line in lines) == sorted(str(work / "clips" / c.name) for c in clips[:2])
    for line in lines:
        assert line["status"] == "done" and line["attempts"] == 1 and line["last_error"] == ""
        assert line["outputs"] == {"mp4": str(work / "out" / f"{output_name(line['video'])}.masks.mp4"),
                                   "json": str(work / "out" / f"{output_name(line['video'])}.json")}
        assert all(Path(p).is_file() for p in line["outputs"].values())
    assert list((cluster_temp / "cwd").iterdir()) == []  # nothing where the workers run

    # From another folder, the same videos by other relative paths: the ledger's absolute paths say done.
    again = _batch(["work/clips", "--bundle", str(demo_bundle_path()), "--out", "work/out", "--address",
                    cluster], tmp_path, "batch re-run from another folder")
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip().startswith("0 done, 0 failed, 2 skipped (done before)"), again.stdout
    assert len(_ledger(work / "out")) == 2


def test_ray_address_from_the_environment_and_threads_from_the_reservation(
    cluster: str, clips: list[Path], tmp_path: Path
) -> None:
    pids = tmp_path / "pids"
    pids.mkdir()
    out = tmp_path / "out"
    result = _batch([str(clips[0]), "--bundle", str(demo_bundle_path()), "--out", str(out),
                     "--cpus-per-worker", "2"], tmp_path, "batch with RAY_ADDRESS",
                    RAY_ADDRESS=cluster, **{PID_DIR_ENV: str(pids)})
    assert result.returncode == 0, result.stderr
    _table_only(result.stdout)
    assert "Traceback" not in result.stderr
    workers = [p for p in pids.iterdir() if p.name.isdigit()]
    # The backend's threads are the worker's 2 CPUs; the worker runs this checkout (the cluster's env).
    assert [p.read_text() for p in workers] == [f"threads=2\n{ROOT / 'sam3track' / '__init__.py'}"]
    assert [line["status"] for line in _ledger(out)] == ["done"]


def test_more_workers_than_the_cluster_has_cpus_stops_at_once(
    cluster: str, clips: list[Path], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    result = _batch([str(clips[0]), str(clips[1]), str(clips[2]), "--bundle", str(demo_bundle_path()),
                     "--out", str(out), "--address", cluster, "--workers", "3"], tmp_path,
                    "batch with more workers than CPUs")
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        f"error: --workers 3 needs 3 CPUs (1 CPU per worker), but the Ray cluster at {cluster} has "
        f"{CLUSTER_CPUS} CPUs; use --workers {CLUSTER_CPUS} or fewer"]
    assert not (out / LEDGER_NAME).exists()  # nothing was tried


def test_out_inside_the_input_folder_is_never_an_input(
    cluster: str, clips: list[Path], tmp_path: Path
) -> None:
    videos = tmp_path / "videos"
    videos.mkdir()
    for clip in clips[:2]:
        (videos / clip.name).write_bytes(clip.read_bytes())
    args = [str(videos), "--bundle", str(demo_bundle_path()), "--out", str(videos / "masks"),
            "--address", cluster, "--outputs", "mp4,json,png"]
    first = _batch(args, tmp_path, "batch with --out inside the inputs")
    assert first.returncode == 0, first.stderr
    (videos / "masks" / "stray.interrupted.mp4").write_bytes(clips[2].read_bytes())  # a video, in --out
    again = _batch(args, tmp_path, "batch re-run with --out inside the inputs")
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip().startswith("0 done, 0 failed, 2 skipped (done before)"), again.stdout
    assert sorted(line["video"] for line in _ledger(videos / "masks")) == sorted(
        str(videos / c.name) for c in clips[:2])


def test_a_bundle_the_workers_cannot_load_is_one_line_and_ray_stays_off_stdout(
    cluster: str, clips: list[Path], tmp_path: Path
) -> None:
    """Ray's listener prints the raylet's notes on the failing workers (tracebacks and all) to stdout;
    the batch keeps them off the terminal and says what is wrong in one line."""
    bundle = tmp_path / "bundle"
    shutil.copytree(demo_bundle_path(), bundle)
    (bundle / "backbone.onnx").write_bytes(b"not a graph")
    result = _batch([str(clips[0]), "--bundle", str(bundle), "--out", str(tmp_path / "out"), "--address",
                     cluster], tmp_path, "batch with a broken bundle")
    assert (result.returncode, result.stdout) == (2, ""), result.stdout
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith("error: a worker could not start: ") and "checksum mismatch" in result.stderr


def test_workers_waiting_for_cpus_say_so_and_the_others_go_on(
    cluster: str, clips: list[Path], tmp_path: Path
) -> None:
    """Another job holds one of the two CPUs: the second worker can be placed one day but not now."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import ray, sys; ray.init(address=sys.argv[1], logging_level='ERROR'); "
         "a = ray.remote(num_cpus=1)(type('Hold', (), {'up': lambda self: 1})).remote(); "
         "ray.get(a.up.remote()); print('held', flush=True); sys.stdin.read()", cluster],
        env=_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held", "the holding job could not reserve a CPU"
        out = tmp_path / "out"
        # Three videos of FRAMES frames at 0.4 s a frame keep the one placed worker busy 3.6 s or more,
        # past the driver's 2 s grace before it calls the other worker waiting.
        result = _batch([*map(str, clips[:3]), "--bundle", str(demo_bundle_path()), "--out", str(out),
                         "--address", cluster, "--workers", "2"], tmp_path, "batch while a CPU is held",
                        **{FRAME_DELAY_ENV: "0.4"})
    finally:
        communicate(holder, "the job holding a CPU")  # closes its stdin: it lets go and exits
    assert result.returncode == 0, result.stderr
    notes = [line for line in result.stderr.splitlines() if line.startswith("note: waiting for resources")]
    assert notes and "1 of 2 workers not placed yet" in notes[0] and "each needs 1 CPU" in notes[0], \
        result.stderr
    assert [line["status"] for line in _ledger(out)] == ["done"] * 3


def test_a_cluster_nobody_answers_is_one_line(tmp_path: Path, clips: list[Path]) -> None:
    address = f"127.0.0.1:{_free_port()}"  # nothing listens there
    result = _batch([str(clips[0]), "--bundle", str(demo_bundle_path()), "--out", str(tmp_path / "out"),
                     "--address", address], tmp_path, "batch against no cluster")
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith(f"error: cannot reach the Ray cluster at {address}: "), result.stderr


def test_a_folder_with_no_videos_says_what_was_looked_for(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt.bak").write_text("not a video")
    result = _batch([str(tmp_path / "empty"), "--bundle", str(demo_bundle_path()), "--out",
                     str(tmp_path / "out")], tmp_path, "batch of an empty folder")
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith(f"error: no videos found in {tmp_path / 'empty'}: looked for files "
                                    f"ending .mp4 .m4v .mov .mkv .avi .webm"), result.stderr


def test_inputs_outputs_and_ledger_in_s3(cluster: str, s3: str, clips: list[Path], tmp_path: Path) -> None:
    """Videos read from S3, outputs uploaded whole once complete, the ledger an object beside them;
    the outputs are what sam3track track writes for the same clip (the JSON naming the URL)."""
    from sam3track.jobs import TrackJob, run_track

    client = _s3_client()
    for clip in clips[:2]:
        client.upload_file(str(clip), s3, f"in/{clip.name}")
    args = [f"s3://{s3}/in", "--bundle", str(demo_bundle_path()), "--out", f"s3://{s3}/out/",
            "--address", cluster, "--workers", "2"]
    result = _batch(args, tmp_path, "batch from S3 to S3")
    assert result.returncode == 0, result.stderr
    _table_only(result.stdout)
    urls = [f"s3://{s3}/in/{clip.name}" for clip in clips[:2]]
    names = {url: output_name(url) for url in urls}
    keys = sorted(o["Key"] for o in client.list_objects_v2(Bucket=s3, Prefix="out/")["Contents"])
    assert keys == sorted([f"out/{LEDGER_NAME}"] + [f"out/{n}{suffix}" for n in names.values()
                                                     for suffix in (".json", ".masks.mp4")])  # no partials
    ledger = [json.loads(line) for line in client.get_object(Bucket=s3, Key=f"out/{LEDGER_NAME}")["Body"]
              .read().decode().splitlines()]
    assert sorted(line["video"] for line in ledger) == sorted(urls)
    assert all(line["outputs"]["mp4"] == f"s3://{s3}/out/{names[line['video']]}.masks.mp4" for line in ledger)

    alone_mp4, alone_json = tmp_path / "alone.masks.mp4", tmp_path / "alone.json"
    assert run_track(TrackJob(clips[0], ["person", "bike"], bundle=demo_bundle_path(), output=alone_mp4,
                              json_path=alone_json)) == 0
    name = names[urls[0]]
    assert client.get_object(Bucket=s3, Key=f"out/{name}.masks.mp4")["Body"].read() == alone_mp4.read_bytes()
    got = json.loads(client.get_object(Bucket=s3, Key=f"out/{name}.json")["Body"].read())
    want = json.loads(alone_json.read_text())
    assert got["metadata"].pop("video") == urls[0] and want["metadata"].pop("video") == str(clips[0])
    assert got == want

    again = _batch(args, tmp_path, "batch from S3 again")
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip().startswith("0 done, 0 failed, 2 skipped (done before)"), again.stdout

    missing = _batch([f"s3://{s3}/nothing", *args[1:]], tmp_path, "batch of a missing S3 prefix")
    assert (missing.returncode, missing.stderr) == (2, f"error: input not found: s3://{s3}/nothing\n")
