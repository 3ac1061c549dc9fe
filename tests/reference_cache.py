"""Transformers reference runs (SAM 3) cached on disk, keyed by everything that decides their outputs.

A reference run is a pure function of the checkpoint, the model inputs (pixel values, token ids, clicks),
the test-side code that drives it, the torch / transformers / numpy versions and the CPU it runs on. The
key hashes all of these, so a run is recomputed live whenever any of them changes, and reused otherwise
(as graphs.sam31.reference does for Meta's SAM 3.1 outputs). What a cached run proves is what the live run
proved when it was made: the comparison against sam3track is still made live, every time.

Home: ``$SAM3TRACK_SAM3_REFERENCE_HOME`` or ``~/.cache/sam3track/sam3-reference``;
``SAM3TRACK_SAM3_REFERENCE_CACHE=0`` recomputes every run (and stores nothing).
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import platform
import tempfile
import zlib
from pathlib import Path
from typing import Any, Callable

import numpy as np

TESTS = Path(__file__).resolve().parent
# The code that drives the references: a change to any of it recomputes every cached run.
DRIVERS = ("reference_cache.py", "reference_kernels.py", "reference_tracker.py", "reference_video.py")


def home() -> Path:
    return Path(os.environ.get("SAM3TRACK_SAM3_REFERENCE_HOME") or Path.home() / ".cache/sam3track/sam3-reference")


def enabled() -> bool:
    return os.environ.get("SAM3TRACK_SAM3_REFERENCE_CACHE", "1") != "0"


def _cpu() -> str:
    """The CPU model and its flags: kernels pick their code paths (and so their rounding) from these."""
    try:
        lines = open("/proc/cpuinfo").read().splitlines()
    except OSError:
        return platform.processor()
    return "|".join(next((line for line in lines if line.startswith(k)), "") for k in ("model name", "flags"))


def _update_array(h, value: np.ndarray) -> None:
    value = np.ascontiguousarray(value)
    h.update(f"{value.dtype.str}{value.shape}".encode())
    h.update(value.tobytes())


def run_key(kind: str, bundle: Path, arrays: dict[str, np.ndarray], params: dict) -> str:
    """Hash of the run's kind, weights, inputs, parameters, driver code, library versions and CPU."""
    import torch
    import transformers

    h = hashlib.sha256(kind.encode())
    for path in sorted((Path(bundle) / "source").iterdir()):  # the checkpoint the reference loads
        h.update(path.name.encode())
        h.update(hashlib.sha256(path.read_bytes()).digest())
    for name in DRIVERS:
        h.update((TESTS / name).read_bytes())
    for name in sorted(arrays):
        h.update(name.encode())
        _update_array(h, arrays[name])
    h.update(json.dumps(params, sort_keys=True, default=repr).encode())
    h.update(f"{torch.__version__} {transformers.__version__} {np.__version__} threads={torch.get_num_threads()}"
             .encode())
    h.update(_cpu().encode())
    return h.hexdigest()[:24]


class _Packed:
    """A bool array stored as bits (masks are most of a run's bytes)."""

    def __init__(self, value: np.ndarray):
        self.shape, self.bits = value.shape, np.packbits(value, axis=None)

    def unpack(self) -> np.ndarray:
        return np.unpackbits(self.bits, count=int(np.prod(self.shape))).reshape(self.shape).astype(bool)


def _map(obj, leaf):
    """``obj`` with ``leaf`` applied to every value inside its lists, tuples, dicts and dataclasses."""
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map(v, leaf) for v in obj)
    if isinstance(obj, dict):
        return {k: _map(v, leaf) for k, v in obj.items()}
    if hasattr(obj, "__dataclass_fields__"):
        return type(obj)(**{f: _map(getattr(obj, f), leaf) for f in obj.__dataclass_fields__})
    return leaf(obj)


def _pack(obj):
    return _map(obj, lambda v: _Packed(v) if isinstance(v, np.ndarray) and v.dtype == bool else v)


def _unpack(obj):
    return _map(obj, lambda v: v.unpack() if isinstance(v, _Packed) else v)


def cached_run(kind: str, bundle: Path, arrays: dict[str, np.ndarray], params: dict, compute: Callable[[], Any]):
    """``compute()``'s result, from the cache when a run with the same key was stored, else computed live
    and stored (atomically: a run killed midway leaves no entry). Results are plain data: numpy arrays,
    lists, dicts, dataclasses."""
    if not enabled():
        return compute()
    path = home() / f"{kind}-{run_key(kind, bundle, arrays, params)}.pkl.z"
    if path.is_file():
        return _unpack(pickle.loads(zlib.decompress(path.read_bytes())))
    result = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, prefix=path.name, suffix=".partial", delete=False) as f:
        f.write(zlib.compress(pickle.dumps(_pack(result), protocol=pickle.HIGHEST_PROTOCOL), 1))
    os.replace(f.name, path)
    return result
