"""Local scratch folders of batch workers (a fetched video, outputs before their upload), and the removal
of those that killed workers left behind. A worker holds an exclusive lock on its folder's lock file
while it works, and the kernel drops the lock when the worker dies. So a folder whose lock can be taken
belongs to no live worker on this machine, and the next worker to start removes it."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator

try:
    import fcntl
except ImportError:  # Windows: no flock, so no sweeping (a killed worker's folder stays)
    fcntl = None

PREFIX = "sam3track-batch-"
LOCK_FILE = ".owner.lock"


@contextlib.contextmanager
def scratch_folder() -> Iterator[str]:
    """A new scratch folder for the block, removed after it. It is made under a hidden name and renamed
    once its lock is held, so a sweep never sees it unlocked."""
    staging = tempfile.mkdtemp(prefix="." + PREFIX)
    fd = os.open(os.path.join(staging, LOCK_FILE), os.O_CREAT | os.O_RDWR, 0o600)
    folder = staging
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        folder = os.path.join(os.path.dirname(staging), PREFIX + uuid.uuid4().hex[:12])
        os.rename(staging, folder)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        os.close(fd)


def remove_orphaned_scratch() -> list[str]:
    """Remove the scratch folders in the temp folder that no live worker holds; returns them. Folders
    without a lock file (from sam3track before 2026-12-07, or not ours) are left alone."""
    if fcntl is None:
        return []
    removed = []
    for folder in glob.glob(os.path.join(tempfile.gettempdir(), PREFIX + "*")):
        try:
            fd = os.open(os.path.join(folder, LOCK_FILE), os.O_RDWR)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # a live worker holds it
        else:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
        finally:
            os.close(fd)
    return removed
