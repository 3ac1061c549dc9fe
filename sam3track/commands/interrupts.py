"""Ctrl-C handling for a run that writes several outputs frame by frame."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any


class InterruptGuard:
    """Turns SIGINT into KeyboardInterrupt, except inside :meth:`atomic` blocks.

    A frame is written to the video, the JSON and the masks folder inside one atomic block, so
    an interrupted run leaves every output holding the same frames. A Ctrl-C arriving inside the
    block is remembered and raised right after it; while outputs are being finalised
    (:meth:`finalising`) further Ctrl-Cs are ignored so the files are always closed properly.
    Installed only on the main thread (the only one Python delivers signals to).
    """

    def __init__(self) -> None:
        self._deferring = False
        self._ignoring = False
        self._pending = False
        self._previous: Any = None
        self._installed = False

    def _handler(self, signum: int, frame: Any) -> None:
        if self._ignoring:
            return
        if self._deferring:
            self._pending = True
            return
        raise KeyboardInterrupt

    def __enter__(self) -> "InterruptGuard":
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handler)
            self._installed = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)
            self._installed = False

    @contextmanager
    def _raised(self, flag: str) -> Iterator[None]:
        """Set the attribute ``flag`` for the duration of the block."""
        setattr(self, flag, True)
        try:
            yield
        finally:
            setattr(self, flag, False)

    @contextmanager
    def atomic(self) -> Iterator[None]:
        with self._raised("_deferring"):
            yield
        if self._pending:
            self._pending = False
            raise KeyboardInterrupt

    def finalising(self) -> AbstractContextManager[None]:
        return self._raised("_ignoring")
