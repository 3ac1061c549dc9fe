"""Writing a file under a temporary name and renaming it into place, so that a destination path
only ever holds a finished file (a crash or Ctrl-C leaves at most ``<name>.partial`` behind)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from types import TracebackType
from typing import TypeVar

_Output = TypeVar("_Output", bound="FinishedOnExit")


def partial_path(path: Path) -> Path:
    """``<name>.partial`` beside ``path``: the same folder, so the final rename is atomic (never
    across disks)."""
    return path.with_name(path.name + ".partial")


def finish_partial(
    tmp: Path, path: Path, *, complete: bool, log: logging.Logger, holds: str
) -> Path:
    """Rename the finished ``tmp`` onto ``path`` and return ``path``.

    After an interrupted run (``complete`` false) this logs ``run interrupted: <path> holds the
    <holds>`` on the caller's ``log``, so the caller (the CLI) can tell those notes apart.
    """
    os.replace(tmp, path)
    if not complete:
        log.warning("run interrupted: %s holds the %s", path, holds)
    return path


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


class FinishedOnExit:
    """The ``with`` protocol of an output finished by ``close(complete=...)``.

    Leaving the block normally closes it as complete; leaving it by an exception (or Ctrl-C)
    closes it with ``complete=False``, which keeps what was written and lets the exception
    through.
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
