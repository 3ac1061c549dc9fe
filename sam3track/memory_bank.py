"""The memory bank: every tracked object's spatial memories and object pointers, kept on the device.

Memories and pointers live in two device pools (rows of [HW, Cm] and [C]); graphs write new rows in
place and the propagation decoder gathers each object's rows by index. Python keeps, per object, which
frame owns which row, and applies the reference's selection rules (transformers
`Sam3TrackerVideoModel._gather_memory_frame_outputs` / `_get_object_pointers`):
- spatial memory: up to `max_cond_frame_num` conditioning frames (closest before, closest after, then
  nearest) at the last temporal slot, plus non-conditioning frames 1..num_maskmem-1 away;
- pointers: every conditioning frame at or before the current one (after it, in reverse), plus
  non-conditioning frames 1..max_ptr-1 away.

What is kept (the reference keeps every output forever; this keeps what a later frame can read):
- conditioning entries are never demoted or freed by eviction, in any pass or direction; an object
  keeps at most `max_conditioning_frames` of them (the farthest from the current frame goes first;
  0 keeps all, as the reference). In a live stream the spatial memory of a conditioning frame that
  can no longer be selected (older than the `max_cond_frame_num` newest, more than num_maskmem-1
  frames back) is freed: frames only come later there;
- non-conditioning entries are freed once they are too far behind the current frame for the next
  frame in the same direction, or a click on the current frame, to read them. A later call that continues where the last one stopped
  finds what the reference would; frames a later pass of the same call reads are pinned.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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


@dataclass
class MemoryEntry:
    """What one object keeps from one frame."""

    pointer_row: int | None
    object_score: float  # object score logit of that frame's output
    memory_row: int | None = None  # filled once the memory encoder has run for that frame
    low_res_mask: np.ndarray | None = None  # host copy, reused when a conditioning frame is revisited
    user: bool = False  # a conditioning frame made by the user's clicks or box (not by the detector)


@dataclass
class ObjectMemory:
    cond: dict[int, MemoryEntry] = field(default_factory=dict)  # insertion order matters, as in the reference
    non_cond: dict[int, MemoryEntry] = field(default_factory=dict)


@dataclass
class MemoryQuery:
    """Padded per-object indices for one propagation_decoder call (padding points at the zero row)."""

    memory_index: np.ndarray  # int32 [N, K]
    memory_slot: np.ndarray  # int32 [N, K]
    memory_valid: np.ndarray  # float32 [N, K]: 1 real, 0 padding
    pointer_index: np.ndarray  # int32 [N, P]
    pointer_offset: np.ndarray  # float32 [N, P]
    pointer_valid: np.ndarray  # float32 [N, P]

    @property
    def memories(self) -> int:
        return self.memory_index.shape[1]

    @property
    def pointers(self) -> int:
        return self.pointer_index.shape[1]

    def padded(self, start: int, count: int, objects: int, memories: int, pointers: int) -> "MemoryQuery":
        """Objects [start, start + count) at a call's planned sizes. Extra object rows repeat the first
        object (a real query, so the padded rows compute finite values that are then dropped); extra
        memory and pointer columns are padding entries at the zero row."""
        rows = np.arange(start, start + count)
        rows = np.concatenate([rows, np.full(objects - count, start)])

        def take(a: np.ndarray, width: int) -> np.ndarray:
            out = np.zeros((objects, width), a.dtype)
            out[:, :a.shape[1]] = a[rows]
            return out

        return MemoryQuery(take(self.memory_index, memories), take(self.memory_slot, memories),
                           take(self.memory_valid, memories), take(self.pointer_index, pointers),
                           take(self.pointer_offset, pointers), take(self.pointer_valid, pointers))


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


class MemoryBank:
    def __init__(self, backend: Backend, config, memory_rows: int, pointer_rows: int):
        """memory_rows, pointer_rows: the pools' fixed capacities (the zero row included)."""
        self.config = config
        hw = config.feature_grid ** 2
        self.memories = DevicePool(backend, (hw, config.memory_dim), memory_rows, name="memory pool")
        self.pointers = DevicePool(backend, (config.hidden_dim,), pointer_rows, name="pointer pool")
        self.objects: dict[int, ObjectMemory] = {}
        self.pinned_frames: set[int] = set()  # frames a later pass of the same call still reads

    # ------------------------------------------------------------------------------- writing
    def add(self, obj_id: int, frame: int, entry: MemoryEntry, cond: bool) -> None:
        mem = self.objects.setdefault(obj_id, ObjectMemory())
        if not cond and frame in mem.cond:
            raise Sam3TrackError(f"internal error: object {obj_id}'s conditioning memory of frame {frame} would be "
                                 "replaced by a tracked one; please report this")
        old = mem.cond.pop(frame, None) or mem.non_cond.pop(frame, None)
        if old is not None:
            self._release(old)
        (mem.cond if cond else mem.non_cond)[frame] = entry

    def entry(self, obj_id: int, frame: int) -> MemoryEntry | None:
        mem = self.objects.get(obj_id)
        if mem is None:
            return None
        return mem.cond.get(frame) or mem.non_cond.get(frame)

    def cond_entry(self, obj_id: int, frame: int) -> MemoryEntry | None:
        mem = self.objects.get(obj_id)
        return mem.cond.get(frame) if mem is not None else None

    def has_cond(self, obj_id: int, frame: int) -> bool:
        return self.cond_entry(obj_id, frame) is not None

    def promote_to_cond(self, obj_id: int, frame: int) -> None:
        mem = self.objects[obj_id]
        if frame in mem.non_cond:
            mem.cond[frame] = mem.non_cond.pop(frame)

    def set_memory_rows(self, obj_ids: list[int], frame: int, rows: np.ndarray) -> None:
        for obj_id, row in zip(obj_ids, rows):
            entry = self.entry(obj_id, frame)
            if entry.memory_row is not None:
                self.memories.release([entry.memory_row])
            entry.memory_row = int(row)

    def drop_detector_conditioning(self, obj_id: int, frame: int, window: int) -> list[int]:
        """Forget the detector-made conditioning frames of an object within `window` frames of a user
        correction on `frame` (the correction replaces what they said); returns the frames dropped."""
        mem = self.objects.get(obj_id)
        if mem is None or window <= 0:
            return []
        dropped = [t for t, e in mem.cond.items() if not e.user and t != frame and abs(t - frame) < window]
        for t in dropped:
            self._release(mem.cond.pop(t))
        return dropped

    def remove_object(self, obj_id: int) -> None:
        mem = self.objects.pop(obj_id, None)
        if mem is not None:
            for entry in list(mem.cond.values()) + list(mem.non_cond.values()):
                self._release(entry)

    def clear(self) -> None:
        """Forget every object; every pool row is free and zero again."""
        self.objects.clear()
        self.pinned_frames.clear()
        self.memories.reset()
        self.pointers.reset()

    def close(self) -> None:
        self.objects.clear()
        self.memories.close()
        self.pointers.close()

    def _release(self, entry: MemoryEntry) -> None:
        self.memories.release([entry.memory_row])
        self.pointers.release([entry.pointer_row])
        entry.memory_row = entry.pointer_row = None

    # ------------------------------------------------------------------------------- reading
    def query(self, obj_ids: list[int], frame: int, reverse: bool, num_frames: int | None,
              exclude_frame: bool = False, empty: frozenset = frozenset()) -> MemoryQuery:
        """Padded indices of what each object attends to on `frame`. exclude_frame: leave out the
        object's own entry of `frame` (a click refining that frame replaces it); objects in `empty`
        (or not in the bank yet) get padding only.

        A frame visited out of order (a click on a frame tracked earlier, a propagate() starting behind
        where the last one ended) reads the memories still held: those eviction already freed are
        skipped, where the reference, which keeps everything, would read them."""
        per_object = [([], []) if o in empty or o not in self.objects
                      else self._select(o, frame, reverse, num_frames, exclude_frame) for o in obj_ids]
        n = len(obj_ids)
        k = max(1, max(len(m) for m, _ in per_object))
        p = max(1, max(len(q) for _, q in per_object))
        q = MemoryQuery(np.full((n, k), ZERO_ROW, np.int32), np.zeros((n, k), np.int32), np.zeros((n, k), np.float32),
                        np.full((n, p), ZERO_ROW, np.int32), np.zeros((n, p), np.float32), np.zeros((n, p), np.float32))
        for i, (mems, ptrs) in enumerate(per_object):
            for j, (row, slot) in enumerate(mems):
                q.memory_index[i, j], q.memory_slot[i, j], q.memory_valid[i, j] = row, slot, 1.0
            for j, (row, offset) in enumerate(ptrs):
                q.pointer_index[i, j], q.pointer_offset[i, j], q.pointer_valid[i, j] = row, offset, 1.0
        return q

    def _max_pointers(self, num_frames: int | None) -> int:
        limit = self.config.max_object_pointers_in_encoder
        return limit if num_frames is None else min(num_frames, limit)

    def _select(self, obj_id: int, frame: int, reverse: bool, num_frames: int | None, exclude_frame: bool = False):
        cfg = self.config
        mem = self.objects[obj_id]
        if exclude_frame:
            mem = ObjectMemory({t: e for t, e in mem.cond.items() if t != frame},
                               {t: e for t, e in mem.non_cond.items() if t != frame})
        last_slot = cfg.num_maskmem - 1  # the reference indexes temporal encodings with offset-1; 0 -> -1
        selected, unselected = select_closest_cond_frames(frame, mem.cond, cfg.max_cond_frame_num)
        memories = [(t, e.memory_row, last_slot) for t, e in selected.items()]
        for offset in range(cfg.num_maskmem - 1, 0, -1):
            t = frame + offset if reverse else frame - offset
            e = mem.non_cond.get(t, unselected.get(t))
            if e is not None:
                memories.append((t, e.memory_row, offset - 1))
        memories = [m for m in memories if m[1] is not None]  # freed already (see query)

        sign = -1 if reverse else 1
        max_ptr = self._max_pointers(num_frames)
        pointers = []
        for t, e in mem.cond.items():
            if (t >= frame) if reverse else (t <= frame):
                pointers.append((e.pointer_row, (frame - t) * sign))
        for d in range(1, max_ptr):
            t = frame + d if reverse else frame - d
            if t < 0 or (num_frames is not None and t >= num_frames):
                break
            e = mem.non_cond.get(t)
            if e is not None:
                pointers.append((e.pointer_row, d))
        scale = max(max_ptr - 1, 1)  # the reference divides by max_ptr-1 (0/0 only on a 1-frame video)
        return [(row, slot) for _, row, slot in memories], [(row, off / scale) for row, off in pointers]

    # ------------------------------------------------------------------------------ eviction
    def evict(self, frame: int, reverse: bool, streaming: bool) -> None:
        """Free what no later frame can read (see the module docstring)."""
        cfg = self.config
        keep_memory = cfg.num_maskmem - 1
        keep_pointer = cfg.max_object_pointers_in_encoder - 1
        if not streaming:
            # One frame more than the next frame reads: a click on the frame just tracked (a
            # refinement, which reads the frames before it) finds every memory the reference reads.
            keep_memory, keep_pointer = keep_memory + 1, keep_pointer + 1
        for mem in self.objects.values():
            for t in list(mem.non_cond):
                behind = (t - frame) if reverse else (frame - t)
                if t in self.pinned_frames:
                    continue
                entry = mem.non_cond[t]
                if t != frame:  # only the current frame can still be promoted to a conditioning frame
                    entry.low_res_mask = None  # a full-size [288, 288] float mask is 324 KiB of host memory
                if behind >= keep_pointer:
                    self._release(entry)
                    del mem.non_cond[t]
                elif behind >= keep_memory and entry.memory_row is not None:
                    self.memories.release([entry.memory_row])
                    entry.memory_row = None
            self._limit_conditioning(mem, frame)
            if streaming and cfg.max_cond_frame_num != -1:
                newest = sorted(mem.cond, reverse=True)[:cfg.max_cond_frame_num]
                for t, entry in mem.cond.items():
                    if t not in newest and frame - t >= keep_memory and entry.memory_row is not None:
                        self.memories.release([entry.memory_row])
                        entry.memory_row = None

    def _limit_conditioning(self, mem: ObjectMemory, frame: int) -> None:
        limit = self.config.max_conditioning_frames
        if limit <= 0 or len(mem.cond) <= limit:
            return
        farthest = sorted(mem.cond, key=lambda t: (-abs(t - frame), t))[: len(mem.cond) - limit]
        for t in farthest:
            self._release(mem.cond.pop(t))

    # --------------------------------------------------------------------------------- looking in
    def summary(self) -> dict[int, dict[str, list[int]]]:
        """Per object: conditioning frames, frames whose spatial memory is held, frames with pointers."""
        out = {}
        for obj_id, mem in self.objects.items():
            entries = {**mem.non_cond, **mem.cond}
            out[obj_id] = {
                "conditioning": sorted(mem.cond),
                "spatial_memory": sorted(t for t, e in entries.items() if e.memory_row is not None),
                "pointers": sorted(entries),
            }
        return out
