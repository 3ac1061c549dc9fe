"""Local scratch folders of batch workers (a fetched video, outputs before their upload), and the removal
of those that killed workers left behind. A worker holds its folder's output lock (output_lock.py: an
flock the kernel drops when the process dies) from before the folder exists until after it is removed,
so a folder whose lock can be taken belongs to no live worker, and the next worker to start removes it."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator

from sam3track.errors import VideoError
from sam3track.output_lock import OutputLock, lock_path

PREFIX = "sam3track-batch-"


@contextlib.contextmanager
def scratch_folder() -> Iterator[str]:
    """A new scratch folder for the block, removed after it; locked for its whole life."""
    folder = os.path.join(tempfile.gettempdir(), PREFIX + uuid.uuid4().hex[:12])
    lock = OutputLock.acquire(folder)
    try:
        os.mkdir(folder)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        lock.release()


def remove_orphaned_scratch() -> list[str]:
    """Remove the scratch folders in the temp folder that no live worker holds; returns them. Folders
    without a lock file (from sam3track before 2026-12-07, or not ours) are left alone, and so is
    everything where the filesystem cannot lock."""
    removed = []
    for folder in glob.glob(os.path.join(tempfile.gettempdir(), PREFIX + "*")):
        if not lock_path(folder).exists():
            continue
        try:
            lock = OutputLock.acquire(folder)
        except VideoError:  # OutputBusyError: a live worker holds it; else its lock file cannot be opened
            continue
        try:
            if lock.held:
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(folder)
        finally:
            lock.release()
    return removed
