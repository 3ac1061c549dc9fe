"""OpenVINO's shapes="rows": a graph whose calls have settled on one set of row counts is compiled again
with those counts fixed, every other axis still dynamic.

The rows are the leading axis of each input (objects, buckets, prompts, images, the pools' rows: every
graph of both families puts them first). With them fixed, OpenVINO's CPU plugin plans and fuses a graph
as for static shapes (faster calls: the decoders and the memory encoder at many objects), while the axes
that move from frame to frame (memories and pointers per object, points) stay dynamic, so no memory
depth costs a compile as with shapes="static". The pools' rows are fixed too: a SAM 3 pool never changes
size, a SAM 3.1 pool doubles as it grows (one compile each time). Only counts seen on ROWS_SETTLED calls
in a row are compiled (from OpenVINO's cache where seen before), never at fewer than ROWS_MIN rows (SAM
3.1's tracker graphs take 16 objects a row, a bucket: fixed from two), and one such model is kept per
graph (each holds its own buffers and its own copy of the weights). docs/speed.md, "Rows fixed".
"""

from __future__ import annotations

import logging
from typing import Callable

log = logging.getLogger("sam3track")

ROWS_SETTLED = 2  # calls in a row at the same row counts before a model is compiled for them
# One row is left dynamic: the mid backbone (one image a call) took 3% less time fixed and held 540 MB
# more. The grounding head at one prompt took 14% less; its memory was not measured
ROWS_MIN = 2
MAX_ROW_MODELS = 1  # per graph: the mid decoder's at 16 objects held about 1.8 GB of buffers (with the snippets)
# Compile properties of a fixed model beside the backend's own: without OpenVINO's snippets (its own
# generated element-wise and attention kernels, which fixed rows let it form) SAM 3's decoders at real
# widths ran faster once objects' memory windows fill; SAM 3.1's small seeded decoder ran a little slower
FIXED_ROWS_CONFIG = {"SNIPPETS_MODE": "DISABLE"}


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

    def request_for(self, shapes: tuple) -> tuple | None:
        """(request, compiled) of the model for these input shapes' row counts, or None where the
        dynamic model runs this call (the counts have not settled, are too few, or the graph has none)."""
        if not self.leading:
            return None
        key = tuple(shapes[i][0] for i in self.leading)
        if key in self.models:  # settled: a call at another count in between starts no new streak
            self.last, self.streak = key, ROWS_SETTLED
            return self.models[key]
        self.streak = self.streak + 1 if key == self.last else 1
        self.last = key
        if self.streak < ROWS_SETTLED or min(key) < ROWS_MIN:
            return None
        if len(self.models) >= MAX_ROW_MODELS:
            # dropped first, even if the compile then fails: a compile allocates the buffers its fixed
            # shapes need, and two such models at once are the peak this keeps down
            self.models.clear()
        try:
            compiled = self.compile_rows(dict(zip(self.leading, key)))
            self.models[key] = (compiled.create_infer_request(), compiled)
            self.compiles += 1
        except Exception as exc:  # the dynamic model runs every shape: it stays this graph's only model
            cause = exc.__cause__ or exc  # OpenVINO's own words, not the load's advice to change backend
            lines = str(cause).strip().splitlines()
            log.warning("openvino: graph %s did not compile with its rows fixed at %s (%s); it runs on with "
                        "dynamic shapes", self.name, key, lines[-1] if lines else type(cause).__name__)
            self.leading = ()
            return None
        return self.models[key]

    def clear(self) -> None:
        self.models.clear()
        self.leading = ()
