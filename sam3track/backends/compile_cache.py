"""What a runtime optimises or compiles from a bundle's graphs, kept on disk so the next load skips it, and
which graphs a load may leave for their first use.

ONNX Runtime: each graph saved once after its hardware-independent optimisations (level EXTENDED, weights
in a side file), then every load - the first one too, so a cold and a warm load run the same graph - opens
that copy at the full level, whose remaining passes are the layout ones for this CPU. The entry also
records the graph's inputs and outputs, so a deferred graph (`deferred`: the ones the first text-prompted
frame does not run) is checked at load and its session made at its first run. OpenVINO: its own
compiled-model cache (CACHE_DIR), in a folder of the bundle.

An entry is keyed by the graph's sha256s from the manifest, the runtime and its version and the options
that change the optimised graph (the execution providers; not the thread count, which only sizes pools).
It is written in a private folder and renamed into place, so concurrent loads each see a whole entry or
none; an entry that fails to open, or whose files changed size or time, is removed and written again.
Layout and numbers: docs/speed.md, "Load time".
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import sys
import time
from collections import Counter
from pathlib import Path

from .. import load_notice
from ..user_cache import cache_folder, read_json

SCHEMA = 1  # bump when an entry's layout or meaning changes: older entries are then never read
ENTRY = "entry.json"  # written last inside the entry; lists its files with their sizes and times
STALE_PARTIAL_SECONDS = 3600.0  # a private folder this old belongs to a killed load

# what the caches of this process did ("hit", "written", "unusable"): the tests read it, not the clock
STATS: Counter[str] = Counter()


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:32]


class CompileCache:
    """The cache entries of one bundle's graphs under `root` (None: no cache), and the graphs the load may
    defer to their first run."""

    def __init__(self, root: Path | None, digests: dict[str, dict[str, str]], deferred=()):
        self.root = Path(root) if root is not None else None
        self.digests = digests  # graph name -> {file: sha256}, from the manifest
        self.deferred = frozenset(deferred)

    @classmethod
    def for_bundle(cls, bundle, setting=None) -> "CompileCache":
        """setting: None (on unless SAM3TRACK_COMPILE_CACHE=0), True, False or a folder (user_cache)."""
        manifest = bundle.manifest
        return cls(cache_folder(setting), {name: dict(g.get("sha256", {})) for name, g in manifest["graphs"].items()},
                   getattr(bundle.family, "deferred_graphs", ()))

    @property
    def enabled(self) -> bool:
        return self.root is not None

    def entry(self, runtime: str, name: str, options: dict) -> Path:
        key = _digest({"schema": SCHEMA, "graph": name, "files": self.digests.get(name, {}), "options": options})
        return self.root / runtime / f"{name}-{key}"

    def openvino_dir(self, version: str) -> Path | None:
        """OpenVINO's CACHE_DIR for this bundle (None: no cache). OpenVINO keys its blobs by model and
        config itself; one folder per bundle content keeps them findable (and removable) by bundle."""
        if self.root is None:
            return None
        return self.root / f"openvino-{version}" / _digest({"schema": SCHEMA, "graphs": self.digests})

    # ------------------------------------------------------------------------------ onnxruntime
    def ort_source(self, ort, name: str, path: str, providers: list[str]) -> tuple[str, dict | None]:
        """(file to open, its inputs and outputs) for graph `name`: the cache entry's optimised copy,
        written first when absent or broken; (`path`, None) when the cache is off or cannot be written."""
        if self.root is None:
            return path, None
        entry = self.entry(f"onnxruntime-{ort.__version__}", name, {"providers": providers, "saved": "extended"})
        record = _valid_record(entry)
        if record is None:
            with load_notice.step(f"optimising graph {name} for ONNX Runtime into the cache {entry.parent} "
                                  "(once per bundle and ONNX Runtime version)"):
                written = _write_entry(ort, entry, path, providers)
            record = _valid_record(entry) if written else None
            if record is None:
                return path, None
        else:
            STATS["hit"] += 1
        return str(entry / "model.onnx"), record.get("io")

    def drop(self, source: str, why: str) -> None:
        """Remove the entry holding `source` (a file from ort_source that failed to open)."""
        if self.root is not None and Path(source).name == "model.onnx" and Path(source).parent.parent.parent == \
                self.root:
            _remove(Path(source).parent, why)


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


def _io_of(session) -> dict:
    """A session's inputs and outputs as JSON: [[name, dims], ...] (a dim: a size, a name or None)."""
    return {kind: [[t.name, list(t.shape)] for t in tensors]
            for kind, tensors in (("inputs", session.get_inputs()), ("outputs", session.get_outputs()))}


def _write_entry(ort, entry: Path, path: str, providers) -> bool:
    """Optimise `path` into a private folder, then rename it onto `entry`; False when that cannot be done."""
    temp = entry.with_name(f"{entry.name}.{os.getpid()}.{secrets.token_hex(4)}.partial")
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_partials(entry)
        temp.mkdir()
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        options.optimized_model_filepath = str(temp / "model.onnx")
        # weights in a side file: a graph over 2 GB cannot be one protobuf
        options.add_session_config_entry("session.optimized_model_external_initializers_file_name", "model.data")
        options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes",
                                         "1024")
        session = ort.InferenceSession(path, sess_options=options, providers=providers)  # writes the copy
        (temp / ENTRY).write_text(json.dumps({"files": _files_record(temp), "source": path, "io": _io_of(session),
                                              "written": time.time()}, sort_keys=True))
        del session
        try:
            os.rename(temp, entry)
        except OSError:
            if not (entry / ENTRY).is_file():  # not another load's whole entry: a real failure
                raise
            shutil.rmtree(temp, ignore_errors=True)  # another load wrote the same entry first: use theirs
        STATS["written"] += 1
        return True
    except Exception as exc:  # an unwritable folder, a full disk, a graph ORT cannot save: load without it
        shutil.rmtree(temp, ignore_errors=True)
        _warn(f"cannot write the compile cache in {entry.parent} ({_first_line(exc)}); loading without it")
        return False


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
