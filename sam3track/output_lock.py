"""Advisory locks on output paths, so two runs never write the same file or folder at once.

A writer holds an exclusive ``flock`` on ``.<name>.lock`` beside its output while it writes, and the
file says who holds it (pid, host, start time). A second writer fails at once with
:class:`~sam3track.errors.OutputBusyError` naming the output and the holder. The kernel drops the lock
of a process that dies however it dies, so a lock left by a dead run is simply taken over.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import BinaryIO

from sam3track.errors import OutputBusyError, VideoError

try:
    import fcntl
except ImportError:  # not POSIX: no flock, outputs are written unlocked (see OutputLock.held)
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

# A holder writes who it is just after taking the lock; a run that finds it busy in between waits
# this long for the name, so its message can say which process to wait for.
_HOLDER_WAIT_S = 0.5
# Filesystems (some network mounts) that cannot lock answer with these: write unlocked, as before.
_NO_LOCKS = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}


def lock_path(output: Path) -> Path:
    """``.<name>.lock`` beside ``output`` (a file or a folder; "." names the real folder)."""
    output = Path(os.path.abspath(output)) if Path(output).name in ("", "..") else Path(output)
    return output.with_name(f".{output.name}.lock")


@dataclass
class OutputLock:
    """The lock of one output path, held from :meth:`acquire` until :meth:`release`.

    ``held`` is False only where the filesystem has no locks (then nothing is excluded, and the
    writer says so once in a warning). Closing the file on garbage collection also frees the lock.
    """

    output: Path
    file: Path
    held: bool
    _handle: BinaryIO | None = None

    @classmethod
    def acquire(cls, output: str | os.PathLike[str], *, make_parents: bool = False) -> "OutputLock":
        """Take the lock of ``output`` or raise :class:`OutputBusyError` at once (never waits).
        ``make_parents``: create the folders the lock file goes in (as a masks folder's writer
        creates them)."""
        output = Path(output)
        file = lock_path(output)
        if make_parents:
            try:
                file.parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise VideoError(f"cannot create the folder {file.parent} for {output}: {e}") from e
        for _ in range(100):  # more only if holders keep removing the file as we open it
            handle = _open_lock_file(output, file)
            if not _try_lock(handle, output, file):
                return cls(output, file, held=False, _handle=handle)
            if _still_named(handle, file):
                _write_holder(handle, output)
                return cls(output, file, held=True, _handle=handle)
            handle.close()  # its holder removed it as we opened it: lock the new one
        raise VideoError(f"cannot lock {output}: {file} keeps being replaced; retry")

    def release(self) -> None:
        """Free the lock and remove its file (when it is still ours); safe to call again."""
        handle, self._handle = self._handle, None
        if handle is None:
            return
        try:
            if self.held and _still_named(handle, self.file):
                self.file.unlink()  # while still locked: a newcomer then locks a fresh file
        except OSError as e:
            log.debug("cannot remove the lock file %s: %s", self.file, e)
        finally:
            handle.close()


def _open_lock_file(output: Path, file: Path) -> BinaryIO:
    try:
        fd = os.open(file, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise VideoError(f"cannot write {output}: cannot create its lock file {file}: {e}") from e
    return os.fdopen(fd, "r+b", buffering=0)


def _try_lock(handle: BinaryIO, output: Path, file: Path) -> bool:
    """Lock ``handle``; False where the filesystem cannot lock; OutputBusyError when held."""
    if fcntl is None:
        return False
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        holder = _read_holder(handle)
        handle.close()
        raise OutputBusyError(output, holder.get("pid"), _busy_message(output, holder)) from None
    except OSError as e:
        if e.errno not in _NO_LOCKS:
            handle.close()
            raise VideoError(f"cannot lock {output} with {file}: {e}") from e
        log.warning("cannot lock %s (%s): a second run writing it at once would go unnoticed", output, e)
        return False


def _still_named(handle: BinaryIO, file: Path) -> bool:
    """Whether ``file`` still names the open ``handle`` (a releasing holder may have removed it)."""
    try:
        return os.stat(file).st_ino == os.fstat(handle.fileno()).st_ino
    except FileNotFoundError:
        return False


def _write_holder(handle: BinaryIO, output: Path) -> None:
    # Any dead holder's record is replaced: the kernel freed its lock when it died.
    record = {"pid": os.getpid(), "host": socket.gethostname(), "output": str(output),
              "started": datetime.now().astimezone().isoformat(timespec="seconds")}
    try:
        handle.truncate(0)
        handle.write(json.dumps(record).encode())
    except OSError as e:  # the lock holds without the record; a busy message then names no pid
        log.debug("cannot record the holder of %s: %s", output, e)


def _read_holder(handle: BinaryIO) -> dict:
    """The holder's record, waiting a moment for a holder that has just taken the lock."""
    deadline = time.monotonic() + _HOLDER_WAIT_S
    while True:
        try:
            handle.seek(0)
            record = json.loads(handle.read().decode() or "null")
            if isinstance(record, dict):
                return record
        except (OSError, ValueError):
            pass
        if time.monotonic() > deadline:
            return {}
        time.sleep(0.01)


def _busy_message(output: Path, holder: dict) -> str:
    pid = holder.get("pid")
    who = "another process" if pid is None else f"process {pid}"
    if pid == os.getpid() and holder.get("host") == socket.gethostname():
        who = f"this process ({pid}), through another writer still open"
    elif holder.get("host") not in (None, socket.gethostname()):
        who += f" on {holder['host']}"
    since = f", since {holder['started']}" if holder.get("started") else ""
    return (f"cannot write {output}: {who} is writing it{since}; wait for it to finish or choose "
            f"another output path")
