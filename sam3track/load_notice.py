"""Lines on stderr about what a slow load is doing (hashing files, optimising graphs), so a cold load
of a multi-GB bundle is not a silent wait. A fast load (the usual warm one) prints nothing.

A step is announced when the load has already run NOTICE_AFTER seconds as it starts, or when the step
itself runs that long (a timer thread writes the line then). `loading()` marks one load; a step
outside any load times itself alone.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
import threading
import time

NOTICE_AFTER = 2.0  # seconds: below this a load is quiet

_started: contextvars.ContextVar[float | None] = contextvars.ContextVar("sam3track_load_started", default=None)


@contextlib.contextmanager
def loading():
    """Mark a load: steps inside it are announced once the whole load has taken NOTICE_AFTER s."""
    token = _started.set(time.monotonic() if _started.get() is None else _started.get())
    try:
        yield
    finally:
        _started.reset(token)


def _write(what: str) -> None:
    try:
        print(f"sam3track: {what} ...", file=sys.stderr, flush=True)
    except (OSError, ValueError):  # a closed stderr never fails a load
        pass


@contextlib.contextmanager
def step(what: str):
    """Announce `what` on stderr if the load is slow by now, or once this step turns out to be."""
    started = _started.get()
    if started is not None and time.monotonic() - started >= NOTICE_AFTER:
        _write(what)
        yield
        return
    timer = threading.Timer(NOTICE_AFTER, _write, args=(what,))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
