"""Outputs of a run: their paths checked and locked before any work is done, and all of them
closed at the end (or after an interruption) without one failure stopping the others."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

from sam3track.atomic_files import partial_path
from sam3track.errors import UsageError
from sam3track.output_lock import OutputLock
from sam3track.sinks import MasksDirSink

# ------------------------------------------------------------------------------------------
# Checking outputs before any work is done
# ------------------------------------------------------------------------------------------


def _nearest_existing(path: Path) -> Path:
    current = path
    while not current.exists() and current != current.parent:
        current = current.parent
    return current


def _check_dir_writable(folder: Path, target: Path, what: str) -> None:
    if not folder.exists():
        existing = _nearest_existing(folder)
        if existing.exists() and not existing.is_dir():
            raise UsageError(f"cannot write {what} {target}: {existing} is a file, not a folder")
        raise UsageError(f"cannot write {what} {target}: folder {folder} does not exist; create it")
    if not folder.is_dir():
        raise UsageError(f"cannot write {what} {target}: {folder} is a file, not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"cannot write {what} {target}: folder {folder} is not writable")


def check_output_file(path: Path, what: str) -> None:
    if path.is_dir():
        raise UsageError(f"cannot write {what} {path}: it is a folder; give a file name")
    _check_dir_writable(path.parent, path, what)
    if path.exists() and not os.access(path, os.W_OK):
        raise UsageError(f"cannot write {what} {path}: the file exists and is read-only")


def check_masks_dir(path: Path) -> None:
    if path.exists():
        if not path.is_dir():
            raise UsageError(f"cannot write the masks folder {path}: it is a file, not a folder")
        if not os.access(path, os.W_OK | os.X_OK):
            raise UsageError(f"cannot write the masks folder {path}: it is not writable")
        # The PNGs are staged in a sibling folder, so the parent must take a new folder too.
        staging = partial_path(path)
        if not os.access(staging.parent, os.W_OK | os.X_OK):
            raise UsageError(
                f"cannot write the masks folder {path}: its masks are staged in {staging}, but "
                f"folder {staging.parent} is not writable; choose a folder whose parent is"
            )
        return
    existing = _nearest_existing(path)
    if not existing.is_dir():
        raise UsageError(f"cannot create the masks folder {path}: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"cannot create the masks folder {path}: folder {existing} is not writable")


def lock_outputs(paths: list[Path], masks_dir: Path | None) -> dict[Path, OutputLock]:
    """Each output's lock, taken before the bundle loads so a run aimed at another live run's
    outputs stops at once (OutputBusyError); none is kept when one is busy."""
    locks: dict[Path, OutputLock] = {}
    try:
        for path in paths:
            locks[path] = OutputLock.acquire(path, make_parents=path == masks_dir)
    except BaseException:
        release_all(locks)
        raise
    return locks


def release_all(locks: dict[Path, OutputLock]) -> None:
    """Release every lock (those a sink already released stay released)."""
    for lock in locks.values():
        lock.release()


def default_output(video: Path) -> Path:
    if video.is_dir():  # an image folder: <folder>.masks.mp4 beside it
        return video.parent / f"{video.name}.masks.mp4"
    return video.with_name(f"{video.stem}.masks.mp4")


def same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


# ------------------------------------------------------------------------------------------
# Closing outputs
# ------------------------------------------------------------------------------------------


def close_bar(bar: Any) -> None:
    if bar is not None:
        try:
            bar.close()
        except Exception:
            pass


def _drop_interrupt_notes(record: logging.LogRecord) -> bool:
    # The sinks log "run interrupted: <file> holds N frames" each; the CLI says it in one line.
    return not str(record.msg).startswith("run interrupted")


def close_all(sinks: list[Any], paths: list[Path], complete: bool) -> list[str]:
    """Close every sink (never raising); where each output that holds something ended up.

    After a run stopped early that is each output's ``.interrupted`` name (an output with no
    frame done leaves nothing), so the outputs under the names asked for are never touched.
    """
    kept = []
    loggers = [logging.getLogger(name) for name in ("sam3track.video.writer", "sam3track.sinks")]
    for logger in loggers:
        logger.addFilter(_drop_interrupt_notes)
    try:
        for sink, path in zip(sinks, paths):
            try:
                result = sink.close(complete=complete)
            except Exception as e:  # finalising one output must not stop the others
                print(f"warning: could not finish {path}: {e}", file=sys.stderr)
                continue
            if result is not None and Path(result).exists():
                kept.append(str(result) + ("/" if isinstance(sink, MasksDirSink) else ""))
    finally:
        for logger in loggers:
            logger.removeFilter(_drop_interrupt_notes)
    return kept
