"""Progress on stderr: tqdm's bar on a terminal; in a log file, a plain line every few seconds instead of
tqdm's carriage-return redraws (which a log keeps as one endless line)."""

from __future__ import annotations

import time
from typing import Any, TextIO

PLAIN_EVERY_SECONDS = 10.0  # how often a plain progress line is written when stderr is not a terminal


class PlainProgress:
    """What the CLI uses of a tqdm bar (update, set_postfix, close), written as plain lines."""

    def __init__(self, total: int | None, desc: str, unit: str, file: TextIO,
                 every: float = PLAIN_EVERY_SECONDS, clock=time.monotonic):
        self.total, self.desc, self.unit, self.file = total, desc, unit, file
        self.every, self.clock = every, clock
        self.n = 0
        self.postfix = ""
        self.started = self._last = clock()

    def set_postfix(self, ordered_dict=None, refresh: bool = True, **values: Any) -> None:
        values = {**(ordered_dict or {}), **values}
        self.postfix = ", ".join(f"{k}={v}" for k, v in values.items())

    def update(self, n: int = 1) -> None:
        self.n += n
        if self.clock() - self._last >= self.every:
            self._write()

    def close(self) -> None:
        if self.n:
            self._write()

    def _write(self) -> None:
        self._last = now = self.clock()
        of = f"/{self.total}" if self.total is not None else ""
        rate = self.n / max(now - self.started, 1e-9)
        extra = f", {self.postfix}" if self.postfix else ""
        print(f"{self.desc}: {self.n}{of} {self.unit}s, {rate:.2f} {self.unit}/s{extra}", file=self.file, flush=True)


def progress_bar(total: int | None, desc: str, unit: str, file: TextIO, **tqdm_options: Any):
    """tqdm on a terminal, PlainProgress otherwise."""
    isatty = getattr(file, "isatty", None)
    if isatty is not None and isatty():
        from tqdm import tqdm

        return tqdm(total=total, desc=desc, unit=unit, file=file, **tqdm_options)
    return PlainProgress(total, desc, unit, file)
