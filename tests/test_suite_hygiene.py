"""The suite's own footprint: a run killed before its end leaves its private compile cache (gigabytes at
mid size) behind, and the next run removes it; a cache a live run holds is never touched."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from .conftest import CACHE_PREFIX, REPO, _lock


def test_private_caches_of_dead_runs_are_removed_and_held_ones_kept(tmp_path):
    dead, live = tmp_path / f"{CACHE_PREFIX}dead", tmp_path / f"{CACHE_PREFIX}live"
    old_unlocked, new_unlocked = tmp_path / f"{CACHE_PREFIX}x1y2z3", tmp_path / f"{CACHE_PREFIX}q9w8e7"
    other = tmp_path / "someone-else-123"
    for folder in (dead, live, old_unlocked, new_unlocked, other):
        (folder / "onnxruntime").mkdir(parents=True)
        (folder / "onnxruntime" / "graph.onnx").write_bytes(b"x")
    # a run that took its lock and was killed: the lock went with its process
    code = f"import fcntl, os; h = open({str(dead / '.lock')!r}, 'a+'); fcntl.flock(h, fcntl.LOCK_EX); os._exit(9)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 9
    held = _lock(live)  # a live run's (another process would hold it the same way)
    day_ago = time.time() - 2 * 86400
    os.utime(old_unlocked, (day_ago, day_ago))
    try:
        _remove_orphaned_caches_from_another_process(tmp_path)
    finally:
        held.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in (live, new_unlocked, other))


def _remove_orphaned_caches_from_another_process(tmp_path):
    """flock locks are per open file: a second process sees this one's lock as held, as a new run
    sees a live run's."""
    code = (f"import sys; sys.path.insert(0, {str(REPO)!r}); from tests.conftest import _remove_orphaned_caches; "
            f"from pathlib import Path; _remove_orphaned_caches(Path({str(tmp_path)!r}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr

