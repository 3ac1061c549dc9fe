"""The suite's own footprint: a run killed before its end leaves its private compile cache (gigabytes at
mid size) behind, and the next run removes it; a cache of a run still going is never touched."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from .conftest import CACHE_PREFIX, _remove_orphaned_caches


def test_private_caches_of_dead_runs_are_removed_and_live_ones_kept(tmp_path):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = tmp_path / f"{CACHE_PREFIX}{int(gone.stdout)}-abc"
    live = tmp_path / f"{CACHE_PREFIX}{os.getpid()}-def"
    old_unnamed, new_unnamed = tmp_path / f"{CACHE_PREFIX}x1y2z3", tmp_path / f"{CACHE_PREFIX}q9w8e7"
    other = tmp_path / "someone-else-123"
    for folder in (dead, live, old_unnamed, new_unnamed, other):
        (folder / "onnxruntime").mkdir(parents=True)
        (folder / "onnxruntime" / "graph.onnx").write_bytes(b"x")
    day_ago = time.time() - 2 * 86400
    os.utime(old_unnamed, (day_ago, day_ago))
    _remove_orphaned_caches(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in (live, new_unnamed, other))
