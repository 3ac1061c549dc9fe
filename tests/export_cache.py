"""The test suite's bundles, exported (and converted to OM) once per code version instead of once per run.

An export is deterministic (tests/test_graphs.py::test_tiny_export_is_deterministic): its bundle is a
function of the export code, the runtime code it writes the manifest for, the reference harness that
seeds SAM 3.1's checkpoint, the library versions and the export arguments. The key hashes all of them;
a hit copies the stored bundle to the test's own folder (tests may write beside it), a miss exports
live and stores a copy. Home: ``$SAM3TRACK_EXPORT_CACHE_HOME`` or ``~/.cache/sam3track/test-exports``;
``SAM3TRACK_EXPORT_CACHE=0`` exports every time. Cached entries beyond the newest few are removed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
SOURCES = ("graphs", "sam3track", "reference", "om")  # everything an export can read
LIBRARIES = ("torch", "transformers", "onnx", "onnxscript", "onnxruntime", "numpy", "safetensors", "tokenizers")
KEEP = 12  # entries kept: the suite's few bundles, for a couple of code versions


def home() -> Path:
    return Path(os.environ.get("SAM3TRACK_EXPORT_CACHE_HOME") or Path.home() / ".cache/sam3track/test-exports")


def _code_digest() -> bytes:
    h = hashlib.sha256()
    for top in SOURCES:
        for path in sorted((REPO / top).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix not in (".pyc", ".onnx"):
                h.update(str(path.relative_to(REPO)).encode())
                h.update(path.read_bytes())
    for name in LIBRARIES:
        h.update(f"{name}={metadata.version(name)}".encode())
    return h.digest()


_DIGEST: bytes | None = None


def export_key(kind: str, args: dict, inputs: tuple[Path, ...] = ()) -> str:
    global _DIGEST
    if _DIGEST is None:
        _DIGEST = _code_digest()
    h = hashlib.sha256(_DIGEST + kind.encode() + json.dumps(args, sort_keys=True, default=str).encode())
    for top in map(Path, inputs):  # files or folders outside the repo it reads (a checkpoint, a bundle)
        for path in sorted(top.rglob("*")) if top.is_dir() else [top]:
            if path.is_file():
                h.update(str(path.relative_to(top)).encode() if top.is_dir() else b"")
                h.update(hashlib.sha256(path.read_bytes()).digest())
    return f"{kind}-{h.hexdigest()[:20]}"


def cached_export(kind: str, args: dict, out: Path, export: Callable[[Path], object],
                  inputs: tuple[Path, ...] = ()) -> Path:
    """The bundle ``export(out)`` writes, at ``out``: copied from the cache when this code exported it
    before with these ``args`` (and ``inputs``), else exported and stored."""
    out = Path(out)
    if os.environ.get("SAM3TRACK_EXPORT_CACHE", "1") == "0":
        export(out)
        return out
    entry = home() / export_key(kind, args, inputs)
    if (entry / "manifest.json").is_file():
        os.utime(entry)  # recently used: kept by _prune
        shutil.copytree(entry, out)
        return out
    export(out)
    home().mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=home(), prefix=entry.name + ".partial-"))
    shutil.copytree(out, staging, dirs_exist_ok=True)
    try:
        staging.rename(entry)  # atomic: a half-copied entry is never a hit
    except OSError:  # another run stored it first
        shutil.rmtree(staging, ignore_errors=True)
    _prune()
    return out


def cached_conversion(kind: str, bundle: Path, out: Path, **convert) -> tuple[Path, dict]:
    """``om.convert.convert_bundle(bundle, out=out, log=None, **convert)`` through the cache (the fake
    ``atc`` on PATH is sam3track code, so in the key): (out, its om_manifest)."""
    from om.convert import convert_bundle

    def run(o: Path) -> None:
        om = convert_bundle(bundle, out=o, log=lambda *_: None, **convert)
        assert om == json.loads((o / "om_manifest.json").read_text())  # what it returns is what it wrote

    args = {k: sorted(v.items()) if isinstance(v, dict) else v for k, v in convert.items()}
    args["atc on PATH"] = shutil.which("atc") is not None  # planned-only and compiled bundles differ
    cached_export(kind, args, out, run, inputs=(bundle,))
    return out, json.loads((out / "om_manifest.json").read_text())


def exported(code: int) -> None:
    """graphs.export's command line returned ``code``: 0 or the export failed."""
    assert code == 0, f"python -m graphs.export exited {code}"


def _prune() -> None:
    entries = sorted((p for p in home().iterdir() if p.is_dir() and ".partial-" not in p.name),
                     key=lambda p: p.stat().st_mtime, reverse=True)
    for stale in entries[KEEP:]:
        shutil.rmtree(stale, ignore_errors=True)
