"""Many videos on one machine or a cluster: ``sam3track batch`` on Ray.

Ray actors, each holding one predictor loaded once, track one video at a time through
:func:`sam3track.jobs.run_track`; the driver alone writes ``OUT/ledger.jsonl``, so a rerun skips
what is done. Ray is an optional dependency, imported only here, on first use. Output names,
retries and the ledger, with measurements: ``docs/batch.md``.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sam3track.errors import UsageError
from sam3track.video.writer import VIDEO_SUFFIXES

__all__ = [
    "LEDGER_NAME",
    "OUTPUT_KINDS",
    "VideoSummary",
    "collect_inputs",
    "output_name",
    "read_ledger",
    "track_videos",
]

LEDGER_NAME = "ledger.jsonl"
OUTPUT_KINDS = ("mp4", "json", "png")
INPUT_SUFFIXES = VIDEO_SUFFIXES + (".avi", ".webm")
MAX_TASK_RETRIES = 2  # a video whose worker dies is tried at most 3 times in all
# Test hooks, read by the driver and handed to the workers (whose environment Ray sets up): a
# sleep after each frame so a kill lands mid-video, a folder where workers note their pid, and a
# file whose existence holds each worker before its second video (so a Ctrl-C lands between videos
# however fast or slow the machine is).
FRAME_DELAY_ENV = "SAM3TRACK_BATCH_TEST_FRAME_DELAY"
PID_DIR_ENV = "SAM3TRACK_BATCH_TEST_PID_DIR"
HOLD_FILE_ENV = "SAM3TRACK_BATCH_TEST_HOLD_FILE"
HOLD_SECONDS = 300  # a hold never outlives a test that forgot to remove the file


@dataclass
class VideoSummary:
    """One finished video, as the ledger records it."""

    video: str  # absolute path of the input
    status: str  # "done" or "failed"
    frames: int = 0
    objects: int = 0
    seconds: float = 0.0
    reason: str = ""  # the one-line reason of a failure
    outputs: dict[str, str] = field(default_factory=dict)  # kind (mp4, json, png) -> path
    settings: dict[str, Any] = field(default_factory=dict)  # prompts and outputs asked for
    skipped: bool = False  # done by an earlier run (not written to the ledger again)

    @property
    def done(self) -> bool:
        return self.status == "done"

    def to_json(self) -> str:
        record = asdict(self)
        record.pop("skipped")
        return json.dumps(record, sort_keys=True)


# ------------------------------------------------------------------------------------------
# Inputs, names, ledger
# ------------------------------------------------------------------------------------------


def collect_inputs(inputs: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """Video files as given, folders searched recursively by video suffix (sorted), and ``.txt``
    files read as one path a line (relative to the list's folder; blank and ``#`` lines skipped).
    Absolute paths, each once, in the order found. A missing input raises :class:`UsageError`."""
    found: list[Path] = []
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            found += sorted(p for p in path.rglob("*")
                            if p.is_file() and p.suffix.lower() in INPUT_SUFFIXES)
        elif path.suffix.lower() == ".txt" and path.is_file():
            for line in path.read_text().splitlines():
                line = line.strip()
                if line and not line.startswith("#"):
                    listed = Path(line).expanduser()
                    found.append(listed if listed.is_absolute() else path.parent / listed)
        elif path.exists():
            found.append(path)
        else:
            raise UsageError(f"input not found: {path}")
    seen: set[Path] = set()
    videos = []
    for p in found:
        p = Path(os.path.abspath(p))
        if p not in seen:
            seen.add(p)
            videos.append(p)
    return videos


def output_name(video: Path) -> str:
    """``<stem>-<8 hex>``: the hash of the absolute path keeps same-stem inputs apart."""
    absolute = os.path.abspath(video)
    return f"{Path(absolute).stem}-{hashlib.sha1(absolute.encode()).hexdigest()[:8]}"


def output_paths(video: Path, out_dir: Path, kinds: Sequence[str]) -> dict[str, Path]:
    name = output_name(video)
    paths = {"mp4": out_dir / f"{name}.masks.mp4", "json": out_dir / f"{name}.json",
             "png": out_dir / f"{name}.masks"}
    return {k: paths[k] for k in OUTPUT_KINDS if k in kinds}


def read_ledger(out_dir: str | os.PathLike[str]) -> dict[str, VideoSummary]:
    """The last record of each video in ``out_dir/ledger.jsonl`` (a torn last line is ignored)."""
    path = Path(out_dir) / LEDGER_NAME
    records: dict[str, VideoSummary] = {}
    if not path.exists():
        return records
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
            records[record["video"]] = VideoSummary(**record)
        except (ValueError, TypeError, KeyError):
            continue
    return records


def _already_done(record: VideoSummary | None, settings: dict[str, Any]) -> bool:
    return (record is not None and record.done and record.settings == settings
            and all(Path(p).exists() for p in record.outputs.values()))


def _parse_outputs(outputs: str | Sequence[str]) -> list[str]:
    kinds = [k.strip().lower() for k in (outputs.split(",") if isinstance(outputs, str) else outputs)]
    kinds = [k for k in kinds if k]
    unknown = [k for k in kinds if k not in OUTPUT_KINDS]
    if unknown:
        raise UsageError(f"unknown output {unknown[0]!r}; choose among {','.join(OUTPUT_KINDS)}")
    if "mp4" not in kinds:
        raise UsageError("--outputs must include mp4: the mask video is always written (as by "
                       "sam3track track); add json and/or png for more")
    return kinds


# ------------------------------------------------------------------------------------------
# The worker
# ------------------------------------------------------------------------------------------


class _Worker:
    """One predictor, loaded once, tracking one video per call (a Ray actor; see docs/batch.md)."""

    def __init__(self, bundle: str, backend: str, device: str, overrides: dict,
                 threads: int | None, hooks: dict) -> None:
        import sam3track

        self.hooks = hooks
        self.videos_started = 0
        if hooks.get("pid_dir"):
            Path(hooks["pid_dir"], str(os.getpid())).touch()
        if hooks.get("frame_delay"):
            import sam3track.jobs.track as track_module

            draw, delay = track_module.draw_objects, float(hooks["frame_delay"])

            def slow_draw(*args: Any, **kwargs: Any) -> Any:
                time.sleep(delay)
                return draw(*args, **kwargs)

            track_module.draw_objects = slow_draw  # called once per frame, outputs open
        options = dict(overrides)
        if threads and "threads" not in options:
            options["threads"] = threads
        self.bundle = bundle
        self.predictor = sam3track.load(bundle, backend=backend, device=device, **options)

    def pid(self) -> int:
        return os.getpid()

    def track(self, video: str, prompts: list[str], outputs: dict[str, str],
              settings: dict) -> VideoSummary:
        from sam3track.jobs import track as track_job

        if self.hooks.get("pid_dir"):
            Path(self.hooks["pid_dir"], f"{os.getpid()}.busy").write_text(video)
        if self.hooks.get("hold_file") and self.videos_started:
            until = time.monotonic() + HOLD_SECONDS
            while Path(self.hooks["hold_file"]).exists() and time.monotonic() < until:
                time.sleep(0.05)
        self.videos_started += 1
        started = time.perf_counter()
        report: dict = {}
        err = io.StringIO()
        try:
            job = track_job.TrackJob(video, list(prompts), bundle=self.bundle, output=outputs["mp4"],
                           json_path=outputs.get("json"), masks_dir=outputs.get("png"))
            code = track_job.run_track(job, stdout=io.StringIO(), stderr=err, predictor=self.predictor,
                                       report=report)
            reason = "" if code == 0 else _reason(err.getvalue(), code)
        except Exception as e:  # anything run_track does not report itself: still this video's
            code, reason = -1, f"{type(e).__name__}: {e}".splitlines()[0]
        seconds = round(time.perf_counter() - started, 3)
        if code != 0:
            return VideoSummary(video, "failed", seconds=seconds, reason=reason, settings=settings)
        return VideoSummary(video, "done", frames=int(report["frames"]),
                            objects=int(report["objects"]), seconds=seconds, outputs=outputs,
                            settings=settings)


def _reason(stderr: str, code: int) -> str:
    errors = [line[len("error: "):] for line in stderr.splitlines() if line.startswith("error: ")]
    return errors[-1] if errors else f"sam3track track exited with {code}"


# ------------------------------------------------------------------------------------------
# The driver
# ------------------------------------------------------------------------------------------


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise UsageError("sam3track batch needs Ray: pip install 'sam3track[ray]' "
                       "(or pip install 'ray>=2.40')") from None
    return ray


def track_videos(
    paths: Iterable[str | os.PathLike[str]],
    prompts: Sequence[str] | str,
    bundle: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    workers: int = 1,
    address: str | None = None,
    backend: str = "onnxruntime",
    device: str = "cpu",
    outputs: str | Sequence[str] = ("mp4", "json"),
    overrides: dict | None = None,
    threads: int | None = None,
    num_cpus: int | None = None,
) -> Iterator[VideoSummary]:
    """Track ``prompts`` through every video of ``paths`` on ``workers`` Ray actors; yields a
    :class:`VideoSummary` per video as it finishes (first those an earlier run already did, with
    ``skipped=True``). Each finished video is appended to ``out_dir/ledger.jsonl`` before it is
    yielded.

    ``paths``: files, folders or ``.txt`` lists (:func:`collect_inputs`). ``address``: None starts
    (or reuses) a Ray in this process; ``"auto"`` or ``"ray://HOST:PORT"`` joins a cluster.
    ``outputs``: which of mp4 (always), json and png to write. ``threads``: inference threads
    per worker (default: the machine's cores shared among the local workers). Closing the
    generator early (Ctrl-C) kills the workers; the ledger keeps what finished.
    """
    plan = _plan(prompts, workers, outputs, bundle, out_dir)
    yield from _skip_done(plan, collect_inputs(paths))
    if not plan.todo:
        return
    ray, started_here = _start_ray(address, workers, num_cpus)
    actors = _start_workers(ray, plan, workers, address, backend, device, overrides, threads)
    run = _Run(ray, actors, started_here, _open_ledger(plan.out))
    try:
        yield from _track_todo(plan, run)
    finally:
        _stop(run)


@dataclass
class _Plan:
    """The checked arguments of :func:`track_videos` and the videos left to track."""

    prompts: list[str]
    kinds: list[str]
    bundle_dir: Path
    out: Path
    settings: dict[str, Any]
    todo: list[Path] = field(default_factory=list)


@dataclass
class _Run:
    """Ray, the workers and the open ledger while the videos are tracked."""

    ray: Any
    actors: list[Any]
    started_here: bool  # this call started Ray, so it shuts it down
    ledger: io.TextIOWrapper


def _plan(prompts: Sequence[str] | str, workers: int, outputs: str | Sequence[str],
          bundle: str | os.PathLike[str], out_dir: str | os.PathLike[str]) -> _Plan:
    """Check the arguments (:class:`UsageError` on a bad one) and create the output folder."""
    prompts = [prompts] if isinstance(prompts, str) else list(prompts)
    if not prompts or any(not p.strip() for p in prompts):
        raise UsageError("give at least one non-empty --prompt TEXT (e.g. --prompt person)")
    if workers < 1:
        raise UsageError(f"--workers must be 1 or more, got {workers}")
    kinds = _parse_outputs(outputs)
    bundle_dir = Path(os.path.abspath(bundle))
    if not (bundle_dir / "manifest.json").is_file():
        raise UsageError(f"--bundle {bundle_dir} is not a bundle folder (no manifest.json); export "
                       f"one with python -m graphs.export --checkpoint SNAPSHOT --out DIR")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return _Plan(prompts, kinds, bundle_dir, out, {"prompts": prompts, "outputs": kinds})


def _skip_done(plan: _Plan, videos: list[Path]) -> Iterator[VideoSummary]:
    """Yield the videos an earlier run did (``skipped=True``); the others go to ``plan.todo``."""
    previous = read_ledger(plan.out)
    for video in videos:
        record = previous.get(str(video))
        if _already_done(record, plan.settings):
            record.skipped = True
            yield record
        else:
            plan.todo.append(video)


def _start_ray(address: str | None, workers: int, num_cpus: int | None) -> tuple[Any, bool]:
    """Ray, started here unless it already runs in this process; and whether it was."""
    ray = _import_ray()
    if ray.is_initialized():
        return ray, False
    if address is None:
        ray.init(num_cpus=num_cpus or max(os.cpu_count() or 1, workers), include_dashboard=False,
                 logging_level="ERROR", log_to_driver=False, configure_logging=True)
    else:
        ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    return ray, True


def _start_workers(ray: Any, plan: _Plan, workers: int, address: str | None, backend: str,
                   device: str, overrides: dict | None, threads: int | None) -> list[Any]:
    """One actor per worker (no more than there are videos), each loading the bundle."""
    hooks = {"frame_delay": os.environ.get(FRAME_DELAY_ENV), "pid_dir": os.environ.get(PID_DIR_ENV),
             "hold_file": os.environ.get(HOLD_FILE_ENV)}
    hooks = {k: v for k, v in hooks.items() if v}
    on_gpu = str(device).startswith("cuda")
    if threads is None and address is None:
        threads = max(1, (os.cpu_count() or 1) // workers)
    worker_class = ray.remote(_Worker).options(
        max_restarts=-1,  # each restart comes from a video with bounded retries
        max_task_retries=MAX_TASK_RETRIES,
        num_cpus=0 if on_gpu else 1,
        num_gpus=1 if on_gpu else 0,
    )
    # Ray gives each GPU actor its own device as the only one it sees.
    worker_device = "cuda:0" if on_gpu else device
    return [worker_class.remote(str(plan.bundle_dir), backend, worker_device, dict(overrides or {}),
                                threads, hooks) for _ in range(min(workers, len(plan.todo)))]


def _open_ledger(out: Path) -> io.TextIOWrapper:
    """``out/ledger.jsonl`` opened to append, starting on a fresh line."""
    ledger = open(out / LEDGER_NAME, "a", encoding="utf-8")
    if ledger.tell() and not (out / LEDGER_NAME).read_bytes().endswith(b"\n"):
        ledger.write("\n")  # a line torn by a crash stays alone (read_ledger skips it)
    return ledger


def _track_todo(plan: _Plan, run: _Run) -> Iterator[VideoSummary]:
    """Each video of ``plan.todo`` on a free worker; each result in the ledger, then yielded."""
    pending: dict[Any, tuple[Path, Any]] = {}
    queue = list(reversed(plan.todo))
    idle = list(run.actors)
    while queue or pending:
        while idle and queue:  # one video per worker at a time: the next goes to whoever is free
            actor, video = idle.pop(), queue.pop()
            paths_out = {k: str(p) for k, p in output_paths(video, plan.out, plan.kinds).items()}
            ref = actor.track.remote(str(video), plan.prompts, paths_out, plan.settings)
            pending[ref] = (video, actor)
        ready, _ = run.ray.wait(list(pending), num_returns=1)
        ref = ready[0]
        video, actor = pending.pop(ref)
        summary = _result(run.ray, ref, video, plan.settings)
        idle.append(actor)
        run.ledger.write(summary.to_json() + "\n")
        run.ledger.flush()
        os.fsync(run.ledger.fileno())
        yield summary


def _result(ray: Any, ref: Any, video: Path, settings: dict[str, Any]) -> VideoSummary:
    """The worker's summary, or the video failed with Ray's first line when its worker died;
    :class:`UsageError` when a worker could not start (no video can run)."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayError as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        if "creation task" in first:  # the worker could not load the bundle: no video can run
            lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
            raise UsageError(f"a worker could not start: {lines[-1]}") from None
        if isinstance(e, ray.exceptions.RayActorError):  # died more often than retried
            first = f"the worker died (tried {MAX_TASK_RETRIES + 1} times at most): {first}"
        return VideoSummary(str(video), "failed", settings=settings, reason=first)


def _stop(run: _Run) -> None:
    """Close the ledger, kill the workers, and shut Ray down if this call started it."""
    run.ledger.close()
    for actor in run.actors:
        try:
            run.ray.kill(actor, no_restart=True)
        except Exception:
            pass
    if run.started_here:
        run.ray.shutdown()
