"""The batch driver: :func:`track_videos` checks the arguments, makes every path absolute, finds the
videos (never in the output folder), skips those the ledger has done, starts or joins Ray, checks the
workers can be placed, hands each started worker the next video, and records each result in the
ledger before yielding it. Flow and rules: docs/batch.md."""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sam3track.batch import cluster, storage
from sam3track.batch.inputs import find_videos, no_videos_message, output_paths, parse_outputs
from sam3track.batch.ledger import Ledger, VideoSummary, read_ledger
from sam3track.batch.worker import (
    FRAME_DELAY_ENV,
    HOLD_FILE_ENV,
    MAX_TASK_RETRIES,
    PID_DIR_ENV,
    ProgressBoard,
    Worker,
)
from sam3track.errors import UsageError

log = logging.getLogger(__name__)

POLL_SECONDS = 0.5  # how often the driver reads the workers' progress while it waits
WAITING_GRACE_SECONDS = 2.0  # a worker unplaced for longer waits for resources: say so
WAITING_NOTE_SECONDS = 30.0  # and say it again this often while it waits
RETRIED_NOTE = "a worker died during an earlier attempt; Ray retried the video"


@dataclass
class BatchProgress:
    """Where a batch stands, handed to ``on_progress`` while it runs."""

    videos: int  # the videos of this run, done-before ones included
    finished: int = 0  # of those, finished (done, failed, or done before)
    failed: int = 0
    frames: int = 0  # frames tracked by this run across every video, finished or not
    workers: int = 0  # workers started
    waiting: int = 0  # workers the cluster has no resources for yet


def track_videos(
    paths: Iterable[str | os.PathLike[str]],
    prompts: Sequence[str] | str,
    bundle: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    workers: int = 1,
    address: str | None = None,
    backend: str = "auto",
    device: str = "cpu",
    outputs: str | Sequence[str] = ("mp4", "json"),
    overrides: dict | None = None,
    threads: int | None = None,
    num_cpus: int | None = None,
    cpus_per_worker: int | None = None,
    on_progress: Callable[[BatchProgress], None] | None = None,
    note: Callable[[str], None] | None = None,
) -> Iterator[VideoSummary]:
    """Track ``prompts`` through every video of ``paths`` on ``workers`` Ray actors; yields a
    :class:`VideoSummary` per video as it finishes (first those an earlier run already did, with
    ``skipped=True``). Each finished video is recorded in ``out_dir/ledger.jsonl`` before it is yielded.

    ``paths`` and ``out_dir``: local paths (made absolute here) or fsspec URLs. ``address``: None
    joins the cluster in RAY_ADDRESS if set, else starts a local Ray (told it has ``num_cpus`` CPUs,
    default all cores); ``"auto"``, ``"HOST:PORT"`` or ``"ray://HOST:PORT"`` joins that cluster.
    ``cpus_per_worker``: what each worker reserves (default: the cores shared among local workers, 1
    on a cluster); its backend's threads are that many unless ``threads`` says otherwise.
    ``on_progress`` gets a :class:`BatchProgress` about every POLL_SECONDS; ``note`` gets one-line
    notes (workers capped, waiting for resources; default: this module's logger). Closing the
    generator early (Ctrl-C) kills the workers; the ledger keeps what finished.
    """
    paths = list(paths)
    plan = _plan(prompts, workers, outputs, bundle, out_dir, cpus_per_worker)
    videos = find_videos(paths, exclude=plan.out)
    if not videos:
        raise UsageError(no_videos_message(paths, plan.out))
    yield from _skip_done(plan, videos)
    if not plan.todo:
        return
    connection = cluster.connect(address, num_cpus)
    run = None
    try:
        demand = _demand(plan, connection, workers, device, num_cpus, note or log.warning)
        cluster.check_fits(connection.ray, demand, connection.where)
        run = _start(connection, plan, demand, backend, device, overrides, threads)
        run.progress = BatchProgress(len(videos), finished=len(videos) - len(plan.todo))
        run.on_progress, run.note = on_progress, note or log.warning
        yield from _track_todo(plan, run)
    finally:
        _stop(connection, run)


@dataclass
class _Plan:
    """The checked arguments of :func:`track_videos` and the videos left to track."""

    prompts: list[str]
    kinds: list[str]
    bundle_dir: Path
    out: str  # absolute path or URL
    settings: dict[str, Any]
    cpus_per_worker: int | None
    todo: list[str] = field(default_factory=list)
    previous: dict[str, VideoSummary] = field(default_factory=dict)  # the ledger's last records


@dataclass
class _Run:
    """Ray, the workers and the open ledger while the videos are tracked."""

    ray: Any
    actors: list[Any]
    board: Any  # the ProgressBoard actor
    ledger: Ledger
    demand: cluster.Demand
    where: str
    progress: BatchProgress = field(default_factory=lambda: BatchProgress(0))
    on_progress: Callable[[BatchProgress], None] | None = None
    note: Callable[[str], None] = log.warning


def _plan(prompts: Sequence[str] | str, workers: int, outputs: str | Sequence[str],
          bundle: str | os.PathLike[str], out_dir: str | os.PathLike[str],
          cpus_per_worker: int | None) -> _Plan:
    """Check the arguments (:class:`UsageError` on a bad one) and create a local output folder."""
    prompts = [prompts] if isinstance(prompts, str) else list(prompts)
    if not prompts or any(not p.strip() for p in prompts):
        raise UsageError("give at least one non-empty --prompt TEXT (e.g. --prompt person)")
    if workers < 1:
        raise UsageError(f"--workers must be 1 or more, got {workers}")
    if cpus_per_worker is not None and cpus_per_worker < 1:
        raise UsageError(f"--cpus-per-worker must be 1 or more, got {cpus_per_worker}")
    kinds = parse_outputs(outputs)
    bundle_dir = Path(os.path.abspath(bundle))
    if not (bundle_dir / "manifest.json").is_file():
        raise UsageError(f"--bundle {bundle_dir} is not a bundle folder (no manifest.json); export "
                         f"one with python -m graphs.export --checkpoint SNAPSHOT --out DIR")
    out = storage.absolute(out_dir)
    if storage.is_url(out):
        storage.filesystem(out)  # fsspec and the protocol's package are there, before any work
    else:
        with storage.failing_as_usage("create the output folder", out):
            Path(out).mkdir(parents=True, exist_ok=True)
    return _Plan(prompts, kinds, bundle_dir, out, {"prompts": prompts, "outputs": kinds}, cpus_per_worker)


def _skip_done(plan: _Plan, videos: list[str]) -> Iterator[VideoSummary]:
    """Yield the videos an earlier run did (``skipped=True``); the others go to ``plan.todo``."""
    plan.previous = read_ledger(plan.out)
    for video in videos:
        record = plan.previous.get(video)
        if _already_done(record, plan, video):
            yield replace(record, skipped=True)
        else:
            plan.todo.append(video)


def _already_done(record: VideoSummary | None, plan: _Plan, video: str) -> bool:
    """Done with the same settings, and its outputs where this run would write them (so a ledger of
    an older release, or one whose files were deleted, is redone rather than trusted)."""
    return (record is not None and record.done and record.settings == plan.settings
            and all(storage.exists(p) for p in output_paths(video, plan.out, plan.kinds).values()))


def _demand(plan: _Plan, connection: cluster.RayConnection, workers: int, device: str,
            num_cpus: int | None, note: Callable[[str], None]) -> cluster.Demand:
    """How many workers, and what each reserves: a local Ray starts no more than it can hold."""
    gpus = 1 if str(device).startswith("cuda") else 0
    wanted, cpus = min(workers, len(plan.todo)), plan.cpus_per_worker
    if connection.local:
        cores = num_cpus or os.cpu_count() or 1
        count = cluster.local_workers(wanted, workers, cpus, cores, cluster.available_memory(),
                                      cluster.worker_bytes(plan.bundle_dir), note)
        return cluster.Demand(count, cpus or max(1, cores // count), gpus)
    return cluster.Demand(wanted, cpus or 1, gpus)


def _start(connection: cluster.RayConnection, plan: _Plan, demand: cluster.Demand, backend: str,
           device: str, overrides: dict | None, threads: int | None) -> _Run:
    """The progress board, one actor per worker (each loading the bundle), and the open ledger."""
    ray = connection.ray
    hooks = {"frame_delay": os.environ.get(FRAME_DELAY_ENV), "pid_dir": os.environ.get(PID_DIR_ENV),
             "hold_file": os.environ.get(HOLD_FILE_ENV)}
    hooks = {k: v for k, v in hooks.items() if v}
    board_name = f"sam3track-batch-board-{uuid.uuid4().hex}"
    board = ray.remote(ProgressBoard).options(num_cpus=0, name=board_name).remote()
    worker_class = ray.remote(Worker).options(
        max_restarts=-1,  # each restart comes from a video with bounded retries
        max_task_retries=MAX_TASK_RETRIES,
        num_cpus=demand.cpus,
        num_gpus=demand.gpus,
    )
    # Ray gives each GPU actor its own device as the only one it sees.
    worker_device = "cuda:0" if demand.gpus else device
    actors = [worker_class.remote(str(plan.bundle_dir), backend, worker_device, dict(overrides or {}),
                                  threads, hooks, board_name) for _ in range(demand.workers)]
    return _Run(ray, actors, board, Ledger.open(plan.out), demand, connection.where)


@dataclass
class _Loop:
    """The driver's bookkeeping while videos are in flight."""

    queue: list[str]  # videos not yet handed out, the next one last
    starting: dict[Any, Any]  # a worker's pid() call -> the worker, until it answers
    idle: list[Any] = field(default_factory=list)
    pending: dict[Any, tuple[str, Any]] = field(default_factory=dict)  # track() call -> video, worker
    frames: dict[str, int] = field(default_factory=dict)  # frames of each finished video
    unplaced_since: float | None = None  # when workers were first seen waiting for resources
    noted_at: float = 0.0


def _track_todo(plan: _Plan, run: _Run) -> Iterator[VideoSummary]:
    """Each video of ``plan.todo`` on a started, free worker; each result in the ledger, then yielded."""
    loop = _Loop(list(reversed(plan.todo)), {actor.pid.remote(): actor for actor in run.actors})
    while loop.queue or loop.pending:
        while loop.idle and loop.queue:  # one video per worker at a time: the next goes to whoever is free
            actor, video = loop.idle.pop(), loop.queue.pop()
            ref = actor.track.remote(video, plan.prompts, output_paths(video, plan.out, plan.kinds),
                                     plan.settings)
            loop.pending[ref] = (video, actor)
        ready, _ = run.ray.wait(list(loop.pending) + list(loop.starting), num_returns=1,
                                timeout=POLL_SECONDS)
        for ref in ready:
            if ref in loop.starting:
                _worker_started(run, loop, ref)
                continue
            summary = _finish(plan, run, loop, ref)
            yield summary
        _report(run, loop)
    run.ledger.sync(force=True)


def _worker_started(run: _Run, loop: _Loop, ref: Any) -> None:
    """A worker answered: it takes videos from now on; :class:`UsageError` when it could not start
    (it could not load the bundle, so no worker can run a video)."""
    actor = loop.starting.pop(ref)
    try:
        run.ray.get(ref)
    except run.ray.exceptions.RayError as e:
        lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
        raise UsageError(f"a worker could not start: {lines[-1] if lines else type(e).__name__}") from None
    loop.idle.append(actor)


def _finish(plan: _Plan, run: _Run, loop: _Loop, ref: Any) -> VideoSummary:
    """A video's result, with its history from the ledger, recorded there."""
    video, actor = loop.pending.pop(ref)
    summary = _result(run, ref, video, plan.settings)
    loop.idle.append(actor)
    summary = _with_history(summary, plan.previous.get(video))
    run.ledger.append(summary)
    loop.frames[video] = summary.frames
    run.progress.finished += 1
    run.progress.failed += not summary.done
    return summary


def _result(run: _Run, ref: Any, video: str, settings: dict[str, Any]) -> VideoSummary:
    """The worker's summary, or the video failed with Ray's first line when its worker died."""
    ray = run.ray
    try:
        return ray.get(ref)
    except ray.exceptions.RayError as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        if isinstance(e, ray.exceptions.RayActorError):  # died more often than retried
            first = f"the worker died (tried {MAX_TASK_RETRIES + 1} times at most): {first}"
        attempts = _board(run)[1].get(video, 1)
        return VideoSummary(video, "failed", settings=settings, reason=first, attempts=attempts,
                            last_error=first)


def _with_history(summary: VideoSummary, before: VideoSummary | None) -> VideoSummary:
    """Attempts counted over every run; the last error kept until a newer one replaces it."""
    last_error = summary.last_error or (RETRIED_NOTE if summary.attempts > 1 else "")
    if before is not None:
        return replace(summary, attempts=before.attempts + summary.attempts,
                       last_error=last_error or before.last_error)
    return replace(summary, last_error=last_error)


def _board(run: _Run) -> tuple[dict[str, int], dict[str, int]]:
    """The board's frames and attempts per video (empty if it cannot answer)."""
    try:
        return run.ray.get(run.board.snapshot.remote(), timeout=POLL_SECONDS * 4)
    except Exception:  # progress is for show: never fail a batch over it
        return {}, {}


def _report(run: _Run, loop: _Loop) -> None:
    """Tell ``on_progress`` where the batch stands, and note workers that wait for resources."""
    progress = run.progress
    progress.workers = len(run.actors) - len(loop.starting)
    progress.waiting = _unplaced(run.ray, len(loop.starting), run.demand)
    _note_waiting(run, loop)
    if run.on_progress is None:
        return
    frames, _ = _board(run)
    progress.frames = sum(max(frames.get(v, 0), n) for v, n in loop.frames.items()) + \
        sum(n for v, n in frames.items() if v not in loop.frames)
    run.on_progress(progress)


def _note_waiting(run: _Run, loop: _Loop) -> None:
    now = time.monotonic()
    if not run.progress.waiting:
        loop.unplaced_since = None
        return
    loop.unplaced_since = loop.unplaced_since or now
    if now - loop.unplaced_since < WAITING_GRACE_SECONDS or now - loop.noted_at < WAITING_NOTE_SECONDS:
        return
    loop.noted_at = now
    demand, waiting = run.demand, run.progress.waiting
    each = f"{demand.cpus} CPU{'s' if demand.cpus > 1 else ''}" + (" and 1 GPU" if demand.gpus else "")
    run.note(f"waiting for resources: {waiting} of {len(run.actors)} workers not placed yet on "
             f"{run.where} (each needs {each}; {cluster.free_resources(run.ray)} now); the others go on")


def _unplaced(ray: Any, starting: int, demand: cluster.Demand) -> int:
    """How many of the ``starting`` workers wait for resources: the cluster's pending demands of a
    worker's shape (what `ray status` lists as pending), at most ``starting``. A worker whose CPUs
    are granted but whose process is still coming up is not among them."""
    if not starting:
        return 0
    shape = {k: float(v) for k, v in (("CPU", demand.cpus), ("GPU", demand.gpus)) if v}
    try:
        from ray.autoscaler.v2.sdk import get_cluster_status  # the source of `ray status`

        status = get_cluster_status(ray.get_runtime_context().gcs_address)
        pending = sum(request.count for d in status.resource_demands.ray_task_actor_demand
                      for request in d.bundles_by_count
                      if {k: v for k, v in request.bundle.items() if v} == shape)
    except Exception:  # an SDK of Ray's own tools: without it, no waiting notes
        return 0
    return min(starting, pending)


def _stop(connection: cluster.RayConnection, run: _Run | None) -> None:
    """Close the ledger, kill the workers, and shut Ray down if this call started or joined it."""
    try:
        if run is not None:
            run.ledger.close()
            for actor in run.actors + [run.board]:
                try:
                    run.ray.kill(actor, no_restart=True)
                except Exception:
                    pass
    finally:
        connection.close()
