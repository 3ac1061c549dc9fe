"""Ctrl-C and termination handling for a run that writes several outputs frame by frame."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

# SIGINT is Ctrl-C; SIGTERM is what `kill`, `timeout` and `docker stop` send. Both ask the run
# to stop, and both deserve the same tidy ending (valid partial outputs), so both are handled.
HANDLED_SIGNALS = tuple(
    s for s in (getattr(signal, "SIGINT", None), getattr(signal, "SIGTERM", None)) if s is not None
)


class Interrupted(KeyboardInterrupt):
    """A stop request by signal ``signum``; a KeyboardInterrupt so code that already cleans up
    after Ctrl-C cleans up after SIGTERM too."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def exit_code_for(interrupt: KeyboardInterrupt) -> int:
    """128 + the signal number, what shells report for a program a signal stopped (130 for a
    Ctrl-C, 143 for SIGTERM)."""
    return 128 + getattr(interrupt, "signum", signal.SIGINT)


class InterruptGuard:
    """Turns SIGINT and SIGTERM into :class:`Interrupted`, except inside :meth:`atomic` blocks.

    A frame is written to the video, the JSON and the masks folder inside one atomic block, so
    an interrupted run leaves every output holding the same frames. A signal arriving inside the
    block is remembered and raised right after it. Once a signal has been raised, and while
    outputs are being finalised (:meth:`finalising`, :meth:`finish`), further signals are
    ignored, so a second Ctrl-C cannot stop the files from being closed properly.
    Installed only on the main thread (the only one Python delivers signals to); the previous
    handlers come back on exit.
    """

    def __init__(self) -> None:
        self._deferring = False
        self._ignoring = False
        self._pending: int | None = None
        self._previous: dict[int, Any] = {}

    def _handler(self, signum: int, frame: Any) -> None:
        if self._ignoring:
            return
        if self._deferring:
            self._pending = signum
            return
        self._ignoring = True  # the run is stopping now; a second signal must not cut that short
        raise Interrupted(signum)

    def __enter__(self) -> "InterruptGuard":
        if threading.current_thread() is threading.main_thread():
            for signum in HANDLED_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        while self._previous:
            signum, previous = self._previous.popitem()
            # None: the previous handler was not installed from Python; the default is closest.
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)

    @contextmanager
    def _raised(self, flag: str) -> Iterator[None]:
        """Set the attribute ``flag`` for the duration of the block (then back as it was)."""
        before = getattr(self, flag)
        setattr(self, flag, True)
        try:
            yield
        finally:
            setattr(self, flag, before)

    @contextmanager
    def atomic(self) -> Iterator[None]:
        with self._raised("_deferring"):
            yield
        if self._pending is not None:
            signum, self._pending = self._pending, None
            self._ignoring = True
            raise Interrupted(signum)

    def finish(self) -> None:
        """Ignore signals from now on: the work is done and only finalising is left. Call it as
        the last statement of the ``try`` whose ``except`` handles :class:`Interrupted`, so no
        moment is left in which a signal could escape both that handler and the finalising."""
        self._ignoring = True

    def finalising(self) -> AbstractContextManager[None]:
        return self._raised("_ignoring")
