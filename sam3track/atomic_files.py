"""Writing a file under a temporary name and renaming it into place, so that a destination path
only ever holds a finished, complete output.

While a run writes, its output lives under ``<name>.<pid>.<random>.partial``, a name no other run
uses. A complete run renames it onto the destination (and removes the ``.interrupted`` leftovers
of earlier runs, which it supersedes); a run stopped early (Ctrl-C, SIGTERM, an error) renames it
to ``<stem>.interrupted<suffix>`` instead, so an earlier complete output under the destination
name is never replaced by a shorter one. Only a process killed outright (SIGKILL, power loss)
leaves a ``.partial`` behind; the next run that locks the output (:mod:`sam3track.output_lock`)
removes it.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import shutil
import tempfile
from pathlib import Path
from types import TracebackType
from typing import TypeVar

_Output = TypeVar("_Output", bound="FinishedOnExit")


def _named(path: Path) -> Path:
    # "." and ".." (a masks folder may be given so) have no name to extend: use the real one.
    return Path(os.path.abspath(path)) if path.name in ("", "..") else Path(path)


def partial_path(path: Path) -> Path:
    """A new ``<name>.<pid>.<random>.partial`` beside ``path``: the same folder, so the final rename
    is atomic (never across disks), and a name of this process alone, so two runs never share one."""
    path = _named(path)
    return path.with_name(f"{path.name}.{os.getpid()}.{secrets.token_hex(4)}.partial")


def partial_pattern(name: str) -> str:
    """The regular expression of every :func:`partial_path` of a file or folder named ``name``."""
    return re.escape(name) + r"\.\d+\.[0-9a-f]{8}\.partial"


def stale_partials(path: Path) -> list[Path]:
    """The temporaries of ``path`` that runs left behind. Only the holder of ``path``'s lock may
    remove them: then no live run is writing any of them."""
    path = _named(path)
    pattern = re.compile(partial_pattern(path.name))
    try:
        return sorted(p for p in path.parent.iterdir() if pattern.fullmatch(p.name))
    except OSError:
        return []


def remove_stale_files(path: Path, log: logging.Logger) -> None:
    """Remove the temporary files (never folders) of ``path`` that killed runs left."""
    for stale in stale_partials(path):
        if stale.is_file() and not stale.is_symlink():
            try:
                stale.unlink()
                log.info("removed %s, left by a run that was killed", stale)
            except OSError as e:
                log.warning("cannot remove %s, left by a killed run: %s", stale, e)


def interrupted_path(path: Path) -> Path:
    """``<stem>.interrupted<suffix>`` beside the file ``path`` (``out.masks.interrupted.mp4``):
    where a run stopped early leaves what it did; the suffix stays so players still open it."""
    path = _named(path)
    return path.with_name(f"{path.stem}.interrupted{path.suffix}")


def interrupted_folder(path: Path) -> Path:
    """``<name>.interrupted`` beside the folder ``path`` (a folder's dots are not a suffix)."""
    path = _named(path)
    return path.with_name(path.name + ".interrupted")


def finish_partial(
    tmp: Path, path: Path, *, complete: bool, log: logging.Logger, holds: str
) -> Path:
    """Rename the finished ``tmp`` onto ``path`` (complete, then removing an earlier run's
    :func:`interrupted_path`) or onto its :func:`interrupted_path` (stopped early, replacing an
    older one there); returns where it went.

    After an interrupted run this logs ``run interrupted: <where> holds the <holds>`` on the
    caller's ``log``, so the caller (the CLI) can tell those notes apart.
    """
    where = path if complete else interrupted_path(path)
    os.replace(tmp, where)
    if not complete:
        log.warning("run interrupted: %s holds the %s", where, holds)
        return where
    leftover = interrupted_path(path)
    if leftover.is_file() or leftover.is_symlink():  # an earlier run's part, superseded now
        try:
            leftover.unlink()
        except OSError as e:
            log.warning("cannot remove %s, which %s supersedes: %s", leftover, path, e)
    return where


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` by way of its partial file; on OSError nothing is left behind
    under either name and the error propagates."""
    tmp = partial_path(path)
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)  # never leave a half-written file under the final name
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def replace_directory(staging: Path, out: Path) -> None:
    """Move a finished directory onto ``out``. An existing ``out`` is moved aside only now, once the
    new one is complete, and deleted afterwards, so ``out`` is never a half-written directory."""
    if out.exists():
        trash = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
        os.replace(out, trash / out.name)
        os.replace(staging, out)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.replace(staging, out)


class FinishedOnExit:
    """The ``with`` protocol of an output finished by ``close(complete=...)``.

    Leaving the block normally closes it as complete; leaving it by an exception (or Ctrl-C)
    closes it with ``complete=False``, which keeps what was written under the
    :func:`interrupted_path` and lets the exception through.
    """

    def close(self, complete: bool = True) -> Path | None:
        raise NotImplementedError

    def __enter__(self: _Output) -> _Output:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(complete=exc_type is None)
