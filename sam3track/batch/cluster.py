"""Ray for a batch: a local Ray started in this process (workers capped at what the cores and memory
allow), or a cluster joined through ``--address`` or ``RAY_ADDRESS`` as ``ray.init()`` reads it (never
with resource arguments). Before any task: can the cluster ever hold the workers asked for? Ray is
imported only here, on first use. Rules and messages: docs/batch.md."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sam3track.call_sizes import available_memory
from sam3track.errors import UsageError

ray_log = logging.getLogger("sam3track.batch.ray")  # what Ray prints from its threads, at DEBUG

CONNECT_SECONDS = 5.0  # a cluster address that takes longer to answer a TCP connect is unreachable
WORKER_BASE_BYTES = 400 * 2**20  # a worker process before its graphs: Python, Ray, the runtime, frames
REASON_CHARS = 300  # Ray's reasons can run to paragraphs: the message stays one readable line
GRAPH_MEMORY_FACTOR = 2  # a loaded graph takes about twice its file (weights plus the runtime's arenas)


@dataclass
class RayConnection:
    """Ray as this batch uses it, and what it should say about it."""

    ray: Any
    started_here: bool  # this call started or joined Ray, so it shuts it down
    local: bool  # a Ray started in this process for this batch (not a cluster)
    where: str  # "the local Ray", "the Ray cluster at HOST:PORT", ... for messages

    def close(self) -> None:
        """Shut Ray down if this batch started or joined it; stdout is the caller's again."""
        if self.started_here:
            try:
                self.ray.shutdown()
            finally:
                if isinstance(sys.stdout, _RayThreadsToLog):
                    sys.stdout = sys.stdout.stdout


class _RayThreadsToLog:
    """``sys.stdout`` while a batch holds Ray: what Ray's background threads print there (its
    listener prints the raylet's notes, tracebacks and all, to stdout) goes to the ``ray_log``
    logger at DEBUG (Ray's own logs keep it too; the batch reports each failure in one line of its
    own); every other thread's output goes where it went."""

    def __init__(self, stdout: Any) -> None:
        self.stdout = stdout

    def write(self, text: str) -> int:
        if not threading.current_thread().name.startswith("ray_"):
            return self.stdout.write(text)
        if text.strip():
            ray_log.debug("%s", text.rstrip())
        return len(text)

    def flush(self) -> None:
        self.stdout.flush()
        sys.stderr.flush()

    def __getattr__(self, name: str) -> Any:  # fileno, isatty, encoding...: the real stdout's
        return getattr(self.stdout, name)


@dataclass
class Demand:
    """What each worker reserves, and how many workers."""

    workers: int
    cpus: int  # CPUs per worker (its backend's threads)
    gpus: int  # 0 or 1 per worker


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise UsageError("sam3track batch needs Ray: pip install 'sam3track[ray]' "
                         "(or pip install 'ray>=2.40')") from None
    return ray


def joins_cluster(address: str | None) -> bool:
    """Whether ray.init(address=address) would join a running cluster, reading RAY_ADDRESS as it does."""
    target = address or os.environ.get("RAY_ADDRESS") or None
    return target is not None and target != "local"


def connect(address: str | None, num_cpus: int | None) -> RayConnection:
    """Start a local Ray (``num_cpus``: what it is told it has, default all cores) or join the
    cluster; :class:`UsageError` naming the address when it cannot be reached or joined."""
    ray = import_ray()
    if ray.is_initialized():  # the caller's own Ray: used as it is, and left running
        return RayConnection(ray, False, False, "the Ray this process runs")
    if not joins_cluster(address):
        with _stdout_to_stderr():
            ray.init(num_cpus=num_cpus or os.cpu_count() or 1, include_dashboard=False,
                     logging_level="ERROR", log_to_driver=False, configure_logging=True)
        sys.stdout = _RayThreadsToLog(sys.stdout)
        return RayConnection(ray, True, True, "the local Ray")
    target = address or os.environ["RAY_ADDRESS"]
    named = target if address else f"{target} (RAY_ADDRESS)"
    _check_reachable(target, named)
    try:
        with _stdout_to_stderr():
            # address None: ray.init reads RAY_ADDRESS itself, exactly as a user's script would.
            ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    except Exception as e:  # ConnectionError, RuntimeError, AuthenticationError...: all mean "not joined"
        with contextlib.suppress(Exception):
            ray.shutdown()
        raise UsageError(f"cannot join the Ray cluster at {named}: {_ray_reason(e)}") from None
    sys.stdout = _RayThreadsToLog(sys.stdout)
    return RayConnection(ray, True, False, f"the Ray cluster at {named}")


def _check_reachable(target: str, named: str) -> None:
    """A host:port address (GCS or ``ray://`` client) must accept a TCP connection within seconds:
    Ray alone retries for 20 s or more, then fails with a traceback."""
    host_port = target[len("ray://"):] if target.startswith("ray://") else target
    host, sep, port = host_port.rpartition(":")
    if not sep or not port.isdigit() or "://" in host_port:
        return  # "auto" and the like: Ray finds the cluster itself and fails fast when there is none
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_SECONDS).close()
    except OSError as e:
        why = e.strerror or str(e) or type(e).__name__
        raise UsageError(f"cannot reach the Ray cluster at {named}: {why}; start it with `ray start "
                         f"--head` or fix the address") from None


def _ray_reason(error: BaseException) -> str:
    """The most telling line of Ray's error: its innermost cause's first line, or the last line of a
    traceback quoted in it (e.g. an AuthenticationError)."""
    while error.__cause__ is not None:
        error = error.__cause__
    lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()] or [type(error).__name__]
    line = lines[-1] if "Traceback" in lines[0] else lines[0]
    return line if len(line) <= REASON_CHARS else line[:REASON_CHARS - 3] + "..."


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """Ray's messages, and those of the processes it starts now, go to stderr: stdout is the table's."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:
        saved = None
    try:
        if saved is not None:
            os.dup2(2, 1)
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        if saved is not None:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)


def worker_bytes(bundle_dir: Path) -> int:
    """About what one worker's memory holds: its process, and its graphs loaded."""
    graphs = sum(p.stat().st_size for p in bundle_dir.rglob("*") if p.is_file())
    return WORKER_BASE_BYTES + GRAPH_MEMORY_FACTOR * graphs


def local_workers(wanted: int, asked: int, cpus: int | None, cores: int, free: int | None, per_worker: int,
                  note: Callable[[str], None]) -> int:
    """How many of the ``wanted`` workers (``asked`` for, capped at the videos to do) a local Ray starts:
    no more than the cores hold at ``cpus`` each (1 if not given) and the free memory at ``per_worker``
    bytes each; a note says why when fewer."""
    by_cores = max(1, cores // (cpus or 1))
    by_memory = max(1, free // per_worker) if free else wanted
    count = min(wanted, by_cores, by_memory)
    if count < wanted:
        why = []  # the limits that bind
        if by_cores == count:
            why.append(f"{cores} cores at {cpus or 1} CPU{'s' if (cpus or 1) > 1 else ''} each")
        if by_memory == count:
            why.append(f"{free / 2**30:.1f} GiB of free memory at about {per_worker / 2**30:.1f} GiB each")
        note(f"local Ray: --workers {asked} asked, starting {count} ({' and '.join(why)} hold no more); "
             f"join a cluster with --address for more")
    return count


def check_fits(ray: Any, demand: Demand, where: str) -> None:
    """:class:`UsageError` when the workers can never all be placed: more CPUs or GPUs than the
    cluster has in all, or more per worker than its largest node has."""
    total = ray.cluster_resources()
    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    for kind, each, flag in (("GPU", demand.gpus, "--device cuda: one GPU per worker"),
                             ("CPU", demand.cpus, f"{demand.cpus} CPU{'s' if demand.cpus > 1 else ''} per worker")):
        if not each:
            continue
        have, need = int(total.get(kind, 0)), demand.workers * each
        if need > have:
            fit = f"use --workers {have // each} or fewer" if have >= each else "add nodes that have some"
            raise UsageError(f"--workers {demand.workers} needs {need} {kind}s ({flag}), but {where} has "
                             f"{have} {kind}{'s' if have != 1 else ''}; {fit}")
        largest = max((int(n.get(kind, 0)) for n in nodes), default=have)
        if each > largest:
            raise UsageError(f"each worker needs {each} {kind}s, but the largest node of {where} has "
                             f"{largest}; lower --cpus-per-worker")


def free_resources(ray: Any) -> str:
    """What the cluster has free now, for a note about workers waiting."""
    free = ray.available_resources()
    parts = [f"{int(free.get(k, 0))} {k}s free" for k in ("CPU", "GPU") if k in ray.cluster_resources()]
    return ", ".join(parts) or "no CPUs free"
