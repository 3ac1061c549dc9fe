"""The demo bundle: a tiny SAM 3 with RANDOM weights, exported once into the user's cache.

It exists so ``sam3track demo`` and ``sam3track track`` work straight after installation, without
downloading the real facebook/sam3 checkpoint. Its masks show the machinery (reading, tracking,
drawing, writing), not the model's skill. Building it needs the export extra (torch), which is
imported only here and only when the bundle is missing.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from sam3track.errors import Sam3TrackError

DEMO_BUNDLE_NAME = "demo-bundle-v3"
DEMO_SEED = 0
CACHE_ENV = "SAM3TRACK_CACHE_DIR"  # overrides the cache root (tests, read-only home folders)
REAL_MODEL_HINT = (
    "python -m graphs.export --checkpoint /path/to/facebook-sam3-snapshot --out sam3-bundle\n"
    "    sam3track track video.mp4 --prompt dog --bundle sam3-bundle"
)


def cache_dir() -> Path:
    """Where sam3track keeps what it builds: ``$SAM3TRACK_CACHE_DIR`` or the platform's cache."""
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override).expanduser().absolute()
    import platformdirs

    return Path(platformdirs.user_cache_dir("sam3track")).absolute()


def _is_bundle(path: Path) -> bool:
    return (path / "manifest.json").is_file()


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` across processes (POSIX flock; Windows msvcrt.locking)."""
    with open(path, "a+b") as handle:
        if sys.platform == "win32":  # pragma: no cover - exercised on Windows only
            import msvcrt
            import time

            while True:
                try:
                    msvcrt.locking(handle.fileno(), msvcrt.LK_NBLCK, 1)
                    break
                except OSError:
                    time.sleep(0.2)
            try:
                yield
            finally:
                handle.seek(0)
                msvcrt.locking(handle.fileno(), msvcrt.LK_UNLCK, 1)
        else:
            import fcntl

            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


@contextmanager
def _quiet_progress_bars() -> Iterator[None]:
    """Hide transformers' per-step progress bars while the tiny model is built (restored after)."""
    restore: list[Callable[[], None]] = []
    try:
        from transformers.utils import logging as hf_logging

        if hf_logging.is_progress_bar_enabled():
            hf_logging.disable_progress_bar()
            restore.append(hf_logging.enable_progress_bar)
    except Exception:  # transformers missing or changed: bars are cosmetic
        pass
    try:
        yield
    finally:
        for undo in restore:
            undo()


def demo_bundle_path(log: Callable[[str], None] | None = None) -> Path:
    """The demo bundle's directory, exporting it first if it is not in the cache yet.

    Concurrent callers (two terminals, parallel tests) are serialised by a lock file next to the
    bundle; the exporter also builds in a temporary sibling directory and renames it into place
    only when complete, so a half-built bundle is never mistaken for a finished one.
    ``log`` receives one line when a build starts (nothing is logged when the bundle exists).
    """
    root = cache_dir()
    path = root / DEMO_BUNDLE_NAME
    if _is_bundle(path):
        return path
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise Sam3TrackError(
            f"cannot create the cache folder {root} for the demo bundle: {e.strerror or e}; "
            f"set {CACHE_ENV} to a writable folder"
        ) from e
    try:
        lock = _file_lock(root / f"{DEMO_BUNDLE_NAME}.lock")
        lock.__enter__()
    except OSError as e:
        raise Sam3TrackError(
            f"cannot lock the cache folder {root} to build the demo bundle: {e.strerror or e}; "
            f"set {CACHE_ENV} to a writable folder"
        ) from e
    try:
        if _is_bundle(path):  # another process built it while we waited for the lock
            return path
        try:
            from graphs.export import export_bundle  # torch and transformers come with it
        except ImportError as e:
            raise Sam3TrackError(
                "the demo bundle is built with the export extra: pip install -e '.[export]' "
                f"({e})"
            ) from e
        if log is not None:
            log(f"building the demo bundle (tiny model, random weights) in {path}; this happens once")
        try:
            with _quiet_progress_bars():
                export_bundle(None, path, tiny_seed=DEMO_SEED, overwrite=path.exists(),
                              log=lambda *_: None)
        except ImportError as e:
            raise Sam3TrackError(
                "the demo bundle is built with the export extra: pip install -e '.[export]' "
                f"({e})"
            ) from e
        except Sam3TrackError:
            raise
        except Exception as e:  # ExportError, CheckpointError, OSError from the exporter
            raise Sam3TrackError(f"cannot build the demo bundle in {path}: {e}") from e
    finally:
        lock.__exit__(None, None, None)
    if not _is_bundle(path):
        raise Sam3TrackError(f"building the demo bundle left no manifest.json in {path}")
    return path
