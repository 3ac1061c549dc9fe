"""The memory bank's device side, shared by every family: pools of rows on the device, and SAM's
selection of conditioning frames.

Memories and pointers live in device pools (`DevicePool`: rows of [HW, Cm] and [C]); graphs write
new rows in place and the propagation decoder gathers each object's rows by index. Which frame owns
which row, and which rows a frame reads, is each family's memory (families/sam3/memory.py,
families/sam31/memory.py); `select_closest_cond_frames` is the conditioning-frame rule both use.
"""

from __future__ import annotations

import numpy as np

from .backends import Backend, DeviceTensor
from .errors import CapacityError, Sam3TrackError

ZERO_ROW = 0  # every pool's row 0 stays zeros: padding entries of a query point at it


class DevicePool:
    """Rows of one shape on the device, zero-filled, handed out one by one (no contiguity needed).

    The capacity is fixed when the pool is made: a static-shape backend (Ascend OM) compiles the pool
    into the graphs that read it, and a fixed buffer never moves under a view. Rows are handed out
    lowest first (a batch takes the lowest run of consecutive free rows that holds it, if any, so that
    its graph writes it in place), so the rows in use stay near the front. Running out is a
    CapacityError naming the setting that sizes the pool. Which rows hold what changes no result:
    graphs read rows by index.
    """

    def __init__(self, backend: Backend, row_shape: tuple[int, ...], capacity: int, dtype=np.float32,
                 name: str = "pool", setting: str = "pool_objects"):
        self.backend, self.name, self.setting = backend, name, setting
        self.row_shape = tuple(row_shape)
        self.dtype = np.dtype(dtype)
        if capacity < 2:
            raise Sam3TrackError(f"internal error: {name} needs at least 2 rows (the zero row and one more)")
        self.tensor: DeviceTensor = backend.zeros((int(capacity),) + self.row_shape, self.dtype)
        self.free = np.ones(int(capacity), bool)
        self.free[ZERO_ROW] = False

    @property
    def capacity(self) -> int:
        return self.tensor.shape[0]

    @property
    def free_rows(self) -> int:
        """Rows `allocate` can hand out now."""
        return int(self.free.sum())

    @property
    def used(self) -> int:
        """Rows holding data (the zero row excluded)."""
        return int((~self.free).sum()) - 1

    def allocate(self, count: int) -> np.ndarray:
        """`count` free rows: the lowest run of `count` consecutive free rows where there is one (a
        graph then writes the batch in place, no scatter), else the lowest free rows."""
        available = np.flatnonzero(self.free)
        if count > 1 and available.size >= count:
            # runs of consecutive free rows: starts where the previous row is not free
            starts = np.flatnonzero(np.diff(available, prepend=-2) != 1)
            lengths = np.diff(np.append(starts, available.size))
            fits = np.flatnonzero(lengths >= count)
            if fits.size:
                first = available[starts[fits[0]]]
                rows = np.arange(first, first + count)
                self.free[rows] = False
                return rows
        if available.size < count:
            raise CapacityError(
                f"the {self.name} is full: {self.used} of its {self.capacity - 1} rows hold the memories of the "
                f"objects tracked now and {count} more are needed. The video tracks more objects at once than the "
                f"pools were sized for: load the bundle with a larger {self.setting} (sam3track.load(..., "
                f"{self.setting}=N)); for an OM bundle, convert it again with larger --gears memory_rows/pointer_rows")
        rows = available[:count]
        self.free[rows] = False
        return rows

    def release(self, rows) -> None:
        for r in rows:
            if r is not None and r != ZERO_ROW:
                self.free[r] = True

    def target(self, rows: np.ndarray, size: int | None = None) -> DeviceTensor:
        """Where a graph run of `size` rows (default: as many as `rows`, more when padded to a gear)
        writes the batch for `rows`: a view of the pool when the rows are consecutive and nothing is
        padded, else a scratch tensor that `commit` scatters."""
        size = int(rows.size) if size is None else int(size)
        if self._in_place(rows, size):
            return self.backend.rows(self.tensor, int(rows[0]), int(rows.size))
        return self.backend.empty((size,) + self.row_shape, self.dtype)

    def commit(self, rows: np.ndarray, written: DeviceTensor) -> None:
        """Scatter the first len(rows) rows of a scratch batch from `target` into the pool (one device
        copy per run of rows); padding rows are dropped."""
        if self._in_place(rows, written.shape[0]):
            return
        self._copy_rows(written, np.arange(rows.size), self.tensor, rows)
        self.backend.free(written)

    @staticmethod
    def _in_place(rows: np.ndarray, size: int) -> bool:
        return bool(rows.size) and size == rows.size and bool(np.all(np.diff(rows) == 1))

    def read(self, rows: np.ndarray) -> np.ndarray:
        """Host copies of `rows` (one transfer)."""
        return self.backend.to_host(self.tensor, rows=np.asarray(rows, np.int64))

    def write(self, rows: np.ndarray, values: np.ndarray) -> None:
        """pool[rows] = values (host rows, uploaded once, then one device copy per run of rows)."""
        staged = self.backend.upload(np.ascontiguousarray(values, self.dtype).reshape((len(rows),) + self.row_shape))
        try:
            self._copy_rows(staged, np.arange(len(rows)), self.tensor, np.asarray(rows))
        finally:
            self.backend.free(staged)

    def reset(self) -> None:
        """Every row free and zero again (session reset)."""
        capacity = self.capacity
        self._replace(self.backend.zeros((capacity,) + self.row_shape, self.dtype))
        self.free = np.ones(capacity, bool)
        self.free[ZERO_ROW] = False

    def close(self) -> None:
        if self.tensor is not None:
            self.backend.free(self.tensor)
            self.tensor = None

    def _copy_rows(self, src: DeviceTensor, src_rows: np.ndarray, dst: DeviceTensor, dst_rows: np.ndarray) -> None:
        """dst[dst_rows] = src[src_rows] on the device, one copy per run consecutive on both sides."""
        breaks = np.flatnonzero((np.diff(src_rows) != 1) | (np.diff(dst_rows) != 1)) + 1
        for start, end in zip([0, *breaks], [*breaks, src_rows.size]):
            if end > start:
                self.backend.copy(self.backend.rows(src, int(src_rows[start]), int(end - start)),
                                  self.backend.rows(dst, int(dst_rows[start]), int(end - start)))

    def _replace(self, tensor: DeviceTensor) -> None:
        old, self.tensor = self.tensor, tensor
        self.backend.free(old)


def select_closest_cond_frames(frame: int, cond: dict, max_num: int) -> tuple[dict, dict]:
    """(selected, unselected) conditioning frames of ``cond`` (frame -> memory) for ``frame``, as SAM 2's
    select_closest_cond_frames (both families): all when ``max_num`` is -1 or not exceeded; else the closest
    before, the closest at or after, then the nearest others, in that order."""
    if max_num == -1 or len(cond) <= max_num:
        return dict(cond), {}
    selected = {}
    before = max((t for t in cond if t < frame), default=None)
    if before is not None:
        selected[before] = cond[before]
    after = min((t for t in cond if t >= frame), default=None)
    if after is not None:
        selected[after] = cond[after]
    rest = sorted((t for t in cond if t not in selected), key=lambda t: abs(t - frame))
    for t in rest[: max_num - len(selected)]:
        selected[t] = cond[t]
    return selected, {t: v for t, v in cond.items() if t not in selected}


# names that moved into the SAM 3 family, served with a DeprecationWarning (sam3track/moved.py)
_MOVED = {name: 'sam3track.families.sam3.memory' for name in ('MemoryBank', 'MemoryEntry', 'ObjectMemory', 'MemoryQuery')}


def __getattr__(name: str):
    from .moved import moved_attribute

    return moved_attribute(__name__, name, _MOVED)
