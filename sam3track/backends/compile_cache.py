"""What a runtime optimises or compiles from a bundle's graphs, kept on disk so the next load skips it, and
which graphs a load may leave for their first use.

ONNX Runtime (CPU provider): ONNX Runtime's "offline mode". A miss makes the graph's session as before, at
the full optimisation level, and has ONNX Runtime save the optimised graph while it does (weights in a side
file); that session is the one that runs, so a cold load costs one save more than a load without the cache.
A hit opens the saved graph with optimisations off, its weights already pre-packed for the CPU kernels. A graph optimised at the full level holds layouts and
fusions of this CPU, so the key holds the CPU's model and flags. The entry also records the graph's inputs
and outputs, so a deferred graph (`deferred`: the ones a text-prompted first frame may not run) is checked
at load and its session made at its first run, and a released graph (`released`: a large text encoder,
run only when a prompt is added) is freed after each run and opened from its entry again at the next. Other providers (CUDA, CANN) are not cached. OpenVINO: its
own compiled-model cache (CACHE_DIR), in a folder of the bundle.

An entry is keyed by the graph's sha256s from the manifest, the runtime and its version, the providers and
the CPU (not the thread count, which only sizes pools). It is written in a private folder and renamed into
place, so concurrent loads each see a whole entry or none; an entry that fails to open, or whose files
changed size or time, is removed and written again. After each load, entries used least recently go
while the cache is over its cap ($SAM3TRACK_CACHE_MAX_GB, default 20). Layout and numbers: docs/speed.md,
"Load time".
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import sys
import math
import re
import time
import weakref
from collections import Counter
from pathlib import Path

from ..user_cache import cache_folder, read_json

SCHEMA = 1  # bump when an entry's layout or meaning changes: older entries are then never read
# The cache's size cap: beyond it the entries used least recently go, never one used in the last
# RECENT_SECONDS (a load in another process may be opening it). $SAM3TRACK_CACHE_MAX_GB sets it; 0: no cap.
# 20 GB hold one full-size bundle's entries for ONNX Runtime (6.2 GB) and two OpenVINO configs.
ENV_MAX_GB = "SAM3TRACK_CACHE_MAX_GB"
DEFAULT_MAX_GB = 20.0
RECENT_SECONDS = 3600.0
ENTRY = "entry.json"  # written last inside the entry; lists its files with their sizes and times
STALE_PARTIAL_SECONDS = 3600.0  # a private folder this old belongs to a killed load
# A released graph (the text encoder) of this size or more is freed after each run: at full size its
# 1.2 GB of weights stay out of every frame's peak, for about 0.8 s to open it again at the next prompt
# (docs/speed.md, "Memory at full size"). Smaller ones stay: the memory is not worth the reopening.
RELEASE_MIN_BYTES = 512 * 2 ** 20

# what the caches of this process did ("hit", "written", "unusable", "evicted"): the tests read it, not the clock
STATS: Counter[str] = Counter()
_LIVE: weakref.WeakSet = weakref.WeakSet()  # the CompileCache of every load whose backend is alive
# what pruning may remove: runtime folders and entry folders as this module names them, nothing else
_RUNTIME_FOLDER = re.compile(r"^(onnxruntime|openvino)-\d[\w.+-]*$")
_ENTRY_FOLDER = re.compile(r"^(.+-)?[0-9a-f]{32}$")


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:32]


class CompileCache:
    """The cache entries of one bundle's graphs under `root` (None: no cache), and the graphs the load may
    defer to their first run."""

    def __init__(self, root: Path | None, digests: dict[str, dict[str, str]], deferred=(), released=()):
        self.root = Path(root) if root is not None else None
        self.digests = digests  # graph name -> {file: sha256}, from the manifest
        self.deferred = frozenset(deferred)
        # graphs freed after each run and opened again from their entry at the next (cache on only)
        self.released = frozenset(released) if self.root is not None else frozenset()
        self.used: set[Path] = set()  # this load's entries: marked used now, never pruned in this process
        _LIVE.add(self)  # while a backend holds this cache, no load in this process prunes its entries

    @classmethod
    def for_bundle(cls, bundle, setting=None, release: bool | None = None) -> "CompileCache":
        """setting: None (on unless SAM3TRACK_COMPILE_CACHE=0), True, False or a folder (user_cache).
        release: free the family's released_graphs after each run: None (default) those of at least
        RELEASE_MIN_BYTES, True all of them, False none."""
        manifest = bundle.manifest
        family = bundle.family
        released = [name for name in getattr(family, "released_graphs", ()) if name in manifest["graphs"]
                    and (release or (release is None and bundle.graph_bytes(name) >= RELEASE_MIN_BYTES))]
        return cls(cache_folder(setting), {name: dict(g.get("sha256", {})) for name, g in manifest["graphs"].items()},
                   getattr(family, "deferred_graphs", ()), released)

    @property
    def enabled(self) -> bool:
        return self.root is not None

    def entry(self, runtime: str, name: str, options: dict) -> Path:
        key = _digest({"schema": SCHEMA, "graph": name, "files": self.digests.get(name, {}), "options": options})
        return self.root / runtime / f"{name}-{key}"

    def openvino_dir(self, version: str, config: dict) -> Path | None:
        """OpenVINO's CACHE_DIR for this bundle, CPU and compile config (None: no cache). OpenVINO keys
        its blobs by model but, in 2026.4's CPU plugin, not by INFERENCE_PRECISION_HINT or
        INFERENCE_NUM_THREADS (measured: f32, bf16, one thread and every thread all name one blob), so
        a bf16 load imported a graph compiled for fp32 and corrupted the heap at its first run: one
        folder per config keeps each config's blobs apart."""
        if self.root is None:
            return None
        config = {str(k): str(v) for k, v in config.items()}
        folder = self.root / f"openvino-{version}" / _digest({"schema": SCHEMA, "graphs": self.digests,
                                                              "config": config, "cpu": cpu_key()})
        self._mark_used(folder)
        return folder

    # ------------------------------------------------------------------------------ onnxruntime
    def ort_entry(self, ort, name: str, providers: list[str], weights: str = "fp32") -> Path | None:
        """Graph `name`'s entry folder, or None when the cache is off or the provider is not cached.
        weights="fp16": the entry of its fp16-weights rewrite (fp16_weights.py), made from the fp32 one."""
        if self.root is None or providers != ["CPUExecutionProvider"]:
            return None
        options = {"providers": providers, "cpu": cpu_key(), "saved": "all+prepacked"}
        if weights != "fp32":
            from .fp16_weights import SCHEMA as FP16_SCHEMA

            options.update(weights=weights, rewrite=FP16_SCHEMA)
        return self.entry(f"onnxruntime-{ort.__version__}", name, options)

    def ort_lookup(self, entry: Path | None) -> tuple[str, dict] | None:
        """(saved graph, its inputs and outputs) of a whole entry; None on a miss."""
        if entry is not None:
            self._mark_used(entry)  # first: a concurrent prune then sees it as just used
        record = _valid_record(entry) if entry is not None else None
        if record is None or not isinstance(record.get("io"), dict):
            return None
        STATS["hit"] += 1
        return str(entry / "model.onnx"), record["io"]

    def ort_writer(self, entry: Path | None) -> "EntryWriter | None":
        """A private folder to save graph `entry` into, or None when the cache is off or unwritable."""
        if entry is None:
            return None
        self.used.add(entry)
        temp = entry.with_name(f"{entry.name}.{os.getpid()}.{secrets.token_hex(4)}.partial")
        try:
            entry.parent.mkdir(parents=True, exist_ok=True)
            _remove_stale_partials(entry)
            temp.mkdir()
        except OSError as exc:
            _warn(f"cannot write the compile cache in {entry.parent} ({_first_line(exc)}); loading without it")
            return None
        return EntryWriter(entry, temp)

    def mark_used(self, entry: Path) -> None:
        """Stamp `entry` used now (a deferred graph opened from it at its first run)."""
        self._mark_used(entry)

    def _mark_used(self, entry: Path) -> None:
        """Record `entry` as this load's and stamp it used now (its folder's time: what pruning sorts by)."""
        self.used.add(entry)
        try:
            os.utime(entry)
        except OSError:  # not made yet (OpenVINO makes its folder's blobs), or a read-only cache
            pass

    def prune(self) -> list[Path]:
        """After a load: remove the entries used least recently while the cache holds more than its cap
        (ENV_MAX_GB), never those of a predictor alive in this process nor any used in the last
        RECENT_SECONDS. The entries removed; never an error (the cache must not fail a load)."""
        if self.root is None:
            return []
        try:
            return prune(self.root, max_bytes(), keep=set().union(*(c.used for c in list(_LIVE))))
        except Exception as exc:  # noqa: BLE001 - a cache problem is a line on stderr, never a failed load
            _warn(f"could not prune the compile cache in {self.root} ({_first_line(exc)})")
            return []

    def drop(self, model: str, why: str) -> None:
        """Remove the entry holding `model` (a saved graph from ort_lookup that failed to open)."""
        _remove(Path(model).parent, why)


class EntryWriter:
    """One entry being written: ONNX Runtime saves the graph into `temp` while it makes the session
    (configure), then commit() records the files and renames the folder into place."""

    def __init__(self, entry: Path, temp: Path):
        self.entry, self.temp = entry, temp

    def configure(self, options) -> None:
        configure_saving(options, self.temp)

    def commit(self, session, source: str) -> bool:
        try:
            if not (self.temp / "model.onnx").is_file():
                raise OSError("ONNX Runtime saved no optimised graph")
            (self.temp / ENTRY).write_text(json.dumps({"files": _files_record(self.temp), "source": source,
                                                       "io": _io_of(session), "written": time.time()},
                                                      sort_keys=True))
            try:
                os.rename(self.temp, self.entry)
            except OSError:
                if not (self.entry / ENTRY).is_file():  # not another load's whole entry: a real failure
                    raise
                self.abandon()  # another load wrote the same entry first: theirs stays
            STATS["written"] += 1
            return True
        except OSError as exc:
            self.abandon()
            _warn(f"cannot write the compile cache in {self.entry.parent} ({_first_line(exc)}); loaded without it")
            return False

    def abandon(self) -> None:
        shutil.rmtree(self.temp, ignore_errors=True)


def configure_saving(options, folder: Path, prepacked: bool = True) -> None:
    """Session options that make ONNX Runtime save the graph it optimises into folder/model.onnx (and,
    with `prepacked`, the kernels' pre-packed weights beside it)."""
    options.optimized_model_filepath = str(folder / "model.onnx")
    # weights in a side file: a graph over 2 GB cannot be one protobuf
    options.add_session_config_entry("session.optimized_model_external_initializers_file_name", "model.data")
    options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes",
                                     "1024")
    # and the weights as the CPU kernels pre-pack them (MatMul's packed B): a hit maps them instead of
    # packing again. Full size: the backbone opens in 1.9-2.1 s instead of 2.5-2.8 s, the whole warm load
    # in 3.8 s instead of 4.7-5.1 s, for twice the disk (both forms are kept) and a slower first save.
    if prepacked:
        options.add_session_config_entry("session.save_external_prepacked_constant_initializers", "1")


def cpu_key() -> str:
    """The CPU a graph optimised at the full level was made for: model name and instruction-set flags."""
    global _CPU_KEY
    if _CPU_KEY is None:
        try:
            lines = Path("/proc/cpuinfo").read_text().splitlines()
            wanted = [next((ln for ln in lines if ln.startswith(k)), "") for k in ("model name", "flags")]
        except OSError:  # not Linux: what the platform says
            import platform

            wanted = [platform.processor(), platform.machine()]
        _CPU_KEY = _digest(wanted)
    return _CPU_KEY


_CPU_KEY: str | None = None


def _files_record(folder: Path) -> dict:
    return {p.name: [p.stat().st_size, p.stat().st_mtime_ns] for p in sorted(folder.iterdir()) if p.name != ENTRY}


def _valid_record(entry: Path) -> dict | None:
    """The entry's record when it is whole and unchanged; None (and the entry removed) otherwise."""
    record = read_json(entry / ENTRY)
    if record is None:
        if entry.exists():
            _remove(entry, "it has no readable entry.json")
        return None
    try:
        same = record.get("files") == _files_record(entry)
    except OSError:
        same = False
    if not same:
        _remove(entry, "its files changed size or time since it was written")
        return None
    return record


def max_bytes() -> int | None:
    """The cache's cap in bytes from $SAM3TRACK_CACHE_MAX_GB (default DEFAULT_MAX_GB); None: no cap."""
    text = os.environ.get(ENV_MAX_GB, "").strip()
    try:
        gb = float(text) if text else DEFAULT_MAX_GB
        if math.isnan(gb):
            raise ValueError(text)
    except ValueError:
        _warn(f"${ENV_MAX_GB}={text!r} is not a number of GB; using {DEFAULT_MAX_GB:g}")
        gb = DEFAULT_MAX_GB
    return int(gb * 1e9) if 0 < gb < math.inf else None


def prune(root: Path, limit: int | None, keep=(), now: float | None = None) -> list[Path]:
    """Remove whole entries of the cache under `root`, least recently used first, until the entries
    hold at most `limit` bytes. Entries in `keep` and those used within RECENT_SECONDS stay (the cache
    may then stay over its cap). Each goes by rename first, as _remove does; private folders of loads
    killed long ago go too."""
    if limit is None:
        return []
    now = time.time() if now is None else now
    entries = []
    for runtime in (f for f in _subfolders(root) if _RUNTIME_FOLDER.match(f.name)):
        for entry in _subfolders(runtime):
            used = _mtime(entry)
            if entry.name.endswith(".partial"):
                if used is not None and now - used > STALE_PARTIAL_SECONDS:
                    shutil.rmtree(entry, ignore_errors=True)
            elif used is not None and _ENTRY_FOLDER.match(entry.name):
                entries.append((used, _size(entry), entry))
    total = sum(size for _, size, _ in entries)
    removed = []
    keep = {Path(k) for k in keep}
    for _, size, entry in sorted(entries, key=lambda t: t[0]):
        if total <= limit:
            break
        used = _mtime(entry)  # again: another process may have used it since the listing
        if entry in keep or used is None or now - used < RECENT_SECONDS:
            total -= size if used is None else 0  # gone meanwhile
            continue
        doomed = entry.with_name(f"{entry.name}.{os.getpid()}.{secrets.token_hex(4)}.removed.partial")
        try:
            os.rename(entry, doomed)
        except OSError:
            total -= size if not entry.exists() else 0  # another process removed it
            continue
        shutil.rmtree(doomed, ignore_errors=True)
        total -= size
        removed.append(entry)
    if removed:
        STATS["evicted"] += len(removed)
        _warn(f"compile cache over {limit / 1e9:g} GB (${ENV_MAX_GB}): removed {len(removed)} entries used least "
              f"recently; {total / 1e9:.1f} GB left in {root}")
    return removed


def _mtime(folder: Path) -> float | None:
    try:
        return folder.stat().st_mtime
    except OSError:  # removed meanwhile
        return None


def _subfolders(folder: Path) -> list[Path]:
    try:
        return [p for p in folder.iterdir() if p.is_dir()]
    except OSError:
        return []


def _size(folder: Path) -> int:
    total = 0
    for base, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.stat(os.path.join(base, name)).st_size
            except OSError:
                pass
    return total


def _io_of(session) -> dict:
    """A session's inputs and outputs as JSON: [[name, dims], ...] (a dim: a size, a name or None)."""
    return {kind: [[t.name, list(t.shape)] for t in tensors]
            for kind, tensors in (("inputs", session.get_inputs()), ("outputs", session.get_outputs()))}


def _remove_stale_partials(entry: Path) -> None:
    now = time.time()
    for stale in entry.parent.glob(f"{entry.name}.*.partial"):
        try:
            if now - stale.stat().st_mtime > STALE_PARTIAL_SECONDS:
                shutil.rmtree(stale, ignore_errors=True)
        except OSError:
            pass


def _remove(entry: Path, why: str) -> None:
    STATS["unusable"] += 1
    _warn(f"compile cache entry {entry} is unusable ({why}); optimising the graph again")
    # a rename first, so a concurrent load never opens a half-removed folder under the entry's name
    doomed = entry.with_name(f"{entry.name}.{os.getpid()}.{secrets.token_hex(4)}.removed.partial")
    try:
        os.rename(entry, doomed)
    except OSError:
        return  # gone already, another load is replacing it, or a read-only cache (then it stays a miss)
    shutil.rmtree(doomed, ignore_errors=True)


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _warn(message: str) -> None:
    try:
        print(f"sam3track: {message}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass
