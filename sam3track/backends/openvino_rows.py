"""OpenVINO's shapes="rows": a graph whose calls have settled on one set of row counts is compiled again
with those counts fixed, every other axis still dynamic.

The rows are the leading axis of each input (objects, buckets, prompts, images, the pools' rows: every
graph of both families puts them first). With them fixed, OpenVINO's CPU plugin plans and fuses a graph
as for static shapes (faster calls: the decoders and the memory encoder at many objects), while the axes
that move from frame to frame (memories and pointers per object, points) stay dynamic, so no memory
depth costs a compile as with shapes="static". The pools'
rows are fixed too: a SAM 3 pool never changes size, a SAM 3.1 pool doubles as it grows (one compile
each time). Only counts seen on ROWS_SETTLED calls in a row are compiled (from OpenVINO's cache where
seen before), never at fewer than ROWS_MIN rows (SAM 3.1's tracker graphs take 16 objects a row, a
bucket: fixed from two), in a thread beside the calls, and first used ROWS_LAG calls later; one such
model is kept per graph (each holds its own buffers and its own copy of the weights). docs/speed.md,
"Rows fixed".
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

log = logging.getLogger("sam3track")

ROWS_SETTLED = 2  # calls in a row at the same row counts before a model is compiled for them
# The compile runs beside the calls, and its model is first used this many calls of the graph after the
# one that settled it, waiting there if the compile still runs: no frame stalls for the whole compile
# (a second or more per graph at mid), and which call first runs on the fixed model does not depend on
# how fast the compile was, so a run's results are the same every time
ROWS_LAG = 2
# One row is left dynamic: the mid backbone (one image a call) took 3% less time fixed and held 540 MB
# more. The grounding head at one prompt took 14% less; its memory was not measured
ROWS_MIN = 2
MAX_ROW_MODELS = 1  # per graph: the mid decoder's at 16 objects held about 1.8 GB of buffers (with the snippets)
# Compile properties of a fixed model beside the backend's own: without OpenVINO's snippets (its own
# generated element-wise and attention kernels, which fixed rows let it form) SAM 3's decoders at real
# widths ran faster once objects' memory windows fill; SAM 3.1's small seeded decoder ran a little slower
FIXED_ROWS_CONFIG = {"SNIPPETS_MODE": "DISABLE"}


class _Compile(threading.Thread):
    """One fixed-rows compile, run beside the calls (OpenVINO's compile leaves the GIL free)."""

    def __init__(self, name: str, key: tuple, compile_model: Callable[[], object], due: int):
        # not a daemon: an interpreter that exits mid-compile waits for it rather than tearing it down
        super().__init__(name=f"sam3track-rows-{name}")
        self.key, self.due, self._compile_model = key, due, compile_model
        self.compiled = self.error = None
        self.start()

    def run(self) -> None:
        try:
            self.compiled = self._compile_model()
        except Exception as exc:  # raised again where the model would be installed
            self.error = exc


class RowModels:
    """The models of one graph compiled for fixed row counts; called under the graph's lock."""

    def __init__(self, name: str, leading: tuple[int, ...], compile_rows: Callable[[dict[int, int]], object]):
        """leading: the indices of the inputs whose leading axis is dynamic; compile_rows({input index:
        rows}): the graph compiled with those leading sizes fixed."""
        self.name, self.leading, self.compile_rows = name, leading, compile_rows
        self.models: dict[tuple, tuple] = {}  # row counts -> (infer request, compiled model)
        self.last: tuple | None = None
        self.streak = 0
        self.compiles = 0  # fixed-rows models made so far
        self.calls = 0  # calls with rows, the clock a pending compile's model is installed by
        self.pending: _Compile | None = None

    def request_for(self, shapes: tuple) -> tuple | None:
        """(request, compiled) of the model for these input shapes' row counts, or None where the
        dynamic model runs this call (the counts have not settled, are too few, their model is still
        compiling, or the graph has none)."""
        if not self.leading:
            return None
        self.calls += 1
        if self.pending is not None and self.calls >= self.pending.due:
            self._install()
            if not self.leading:
                return None
        key = tuple(shapes[i][0] for i in self.leading)
        if key in self.models:  # settled: a call at another count in between starts no new streak
            self.last, self.streak = key, ROWS_SETTLED
            return self.models[key]
        self.streak = self.streak + 1 if key == self.last else 1
        self.last = key
        if self.streak < ROWS_SETTLED or min(key) < ROWS_MIN or self.pending is not None:
            return None
        if len(self.models) >= MAX_ROW_MODELS:
            # dropped first, even if the compile then fails: a compile allocates the buffers its fixed
            # shapes need, and two such models at once are the peak this keeps down
            self.models.clear()
        rows = dict(zip(self.leading, key))
        self.pending = _Compile(self.name, key, lambda: self.compile_rows(rows), self.calls + ROWS_LAG)
        return None

    def _install(self) -> None:
        """The pending compile's model added (waiting for it only if it still runs), or, where it
        failed, this graph left on its dynamic model for good, with a warning."""
        pending, self.pending = self.pending, None
        pending.join()
        try:
            if pending.error is not None:
                raise pending.error
            self.models[pending.key] = (pending.compiled.create_infer_request(), pending.compiled)
            self.compiles += 1
        except Exception as exc:  # the dynamic model runs every shape: it stays this graph's only model
            cause = exc.__cause__ or exc  # OpenVINO's own words, not the load's advice to change backend
            lines = str(cause).strip().splitlines()
            log.warning("openvino: graph %s did not compile with its rows fixed at %s (%s); it runs on with "
                        "dynamic shapes", self.name, pending.key, lines[-1] if lines else type(cause).__name__)
            self.leading = ()

    def clear(self) -> None:
        if self.pending is not None:  # its compile finishes first: OpenVINO's compile cannot be stopped
            self.pending.join()
            self.pending = None
        self.models.clear()
        self.leading = ()
