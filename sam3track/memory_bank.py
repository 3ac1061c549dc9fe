"""The memory bank: every tracked object's spatial memories and object pointers, kept on the device.

Memories and pointers live in two device pools (rows of [HW, Cm] and [C]); graphs write new rows in
place and the propagation decoder gathers each object's rows by index. Python keeps, per object, which
frame owns which row, and applies the reference's selection rules (transformers
`Sam3TrackerVideoModel._gather_memory_frame_outputs` / `_get_object_pointers`):
- spatial memory: up to `max_cond_frame_num` conditioning frames (closest before, closest after, then
  nearest) at the last temporal slot, plus non-conditioning frames 1..num_maskmem-1 away;
- pointers: every conditioning frame at or before the current one (after it, in reverse), plus
  non-conditioning frames 1..max_ptr-1 away.
Rows that no future frame can select are freed, so memory does not grow with video length (pointers of
conditioning frames are kept: the reference attends all of them; they are C floats each).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .backends import Backend, DeviceTensor


class DevicePool:
    """Rows on the device, handed out in contiguous runs so one graph call can write a batch."""

    def __init__(self, backend: Backend, row_shape: tuple[int, ...], dtype=np.float32, capacity: int = 16):
        self.backend = backend
        self.row_shape = tuple(row_shape)
        self.dtype = np.dtype(dtype)
        self.tensor: DeviceTensor = backend.empty((capacity,) + self.row_shape, self.dtype)
        self.free = np.ones(capacity, bool)

    @property
    def capacity(self) -> int:
        return self.tensor.shape[0]

    @property
    def used(self) -> int:
        return int((~self.free).sum())

    def allocate(self, count: int) -> int:
        """First row of `count` free consecutive rows (the pool grows when there is no such run)."""
        if count == 0:
            return 0
        run = np.convolve(self.free.astype(np.int32), np.ones(count, np.int32), mode="valid")
        starts = np.flatnonzero(run == count)
        if starts.size == 0:
            self._grow(max(self.capacity * 2, self.capacity + count))
            return self.allocate(count)
        start = int(starts[0])
        self.free[start:start + count] = False
        return start

    def release(self, rows) -> None:
        for r in rows:
            if r is not None:
                self.free[r] = True

    def view(self, start: int, count: int) -> DeviceTensor:
        return self.backend.rows(self.tensor, start, count)

    def _grow(self, capacity: int) -> None:
        bigger = self.backend.empty((capacity,) + self.row_shape, self.dtype)
        self.backend.copy(self.tensor, self.backend.rows(bigger, 0, self.capacity))  # device to device
        self.tensor = bigger
        self.free = np.concatenate([self.free, np.ones(capacity - self.free.size, bool)])


@dataclass
class MemoryEntry:
    """What one object keeps from one frame."""

    pointer_row: int
    object_score: float  # object score logit of that frame's output
    memory_row: int | None = None  # filled once the memory encoder has run for that frame
    low_res_mask: np.ndarray | None = None  # host copy, reused when a conditioning frame is revisited


@dataclass
class ObjectMemory:
    cond: dict[int, MemoryEntry] = field(default_factory=dict)  # insertion order matters, as in the reference
    non_cond: dict[int, MemoryEntry] = field(default_factory=dict)


@dataclass
class MemoryQuery:
    """Padded per-object indices for one propagation_decoder call."""

    memory_index: np.ndarray  # int64 [N, K]
    memory_slot: np.ndarray  # int64 [N, K]
    memory_valid: np.ndarray  # bool [N, K]
    pointer_index: np.ndarray  # int64 [N, P]
    pointer_offset: np.ndarray  # float32 [N, P]
    pointer_valid: np.ndarray  # bool [N, P]


def select_closest_cond_frames(frame: int, cond: dict, max_num: int) -> tuple[dict, dict]:
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
    def __init__(self, backend: Backend, config):
        self.config = config
        hw = config.feature_grid ** 2
        self.memories = DevicePool(backend, (hw, config.memory_dim))
        self.pointers = DevicePool(backend, (config.hidden_dim,))
        self.objects: dict[int, ObjectMemory] = {}
        self.pinned_frames: set[int] = set()  # frames a later pass will still read ("both" directions)
        # A later backward pass selects the earliest conditioning frames, which a forward pass would
        # free; while set, conditioning memories are kept (one per birth or 16 frames at most).
        self.keep_conditioning = False

    # ------------------------------------------------------------------------------- writing
    def add(self, obj_id: int, frame: int, entry: MemoryEntry, cond: bool) -> None:
        mem = self.objects.setdefault(obj_id, ObjectMemory())
        old = mem.cond.pop(frame, None) or mem.non_cond.pop(frame, None)
        if old is not None:
            self._release(old)
        (mem.cond if cond else mem.non_cond)[frame] = entry

    def entry(self, obj_id: int, frame: int) -> MemoryEntry | None:
        mem = self.objects.get(obj_id)
        if mem is None:
            return None
        return mem.cond.get(frame) or mem.non_cond.get(frame)

    def has_cond(self, obj_id: int, frame: int) -> bool:
        return obj_id in self.objects and frame in self.objects[obj_id].cond

    def promote_to_cond(self, obj_id: int, frame: int) -> None:
        mem = self.objects[obj_id]
        if frame in mem.non_cond:
            mem.cond[frame] = mem.non_cond.pop(frame)

    def set_memory_rows(self, obj_ids: list[int], frame: int, first_row: int) -> None:
        for i, obj_id in enumerate(obj_ids):
            entry = self.entry(obj_id, frame)
            if entry.memory_row is not None:
                self.memories.release([entry.memory_row])
            entry.memory_row = first_row + i

    def remove_object(self, obj_id: int) -> None:
        mem = self.objects.pop(obj_id, None)
        if mem is not None:
            for entry in list(mem.cond.values()) + list(mem.non_cond.values()):
                self._release(entry)

    def clear(self) -> None:
        for obj_id in list(self.objects):
            self.remove_object(obj_id)
        self.pinned_frames.clear()

    def _release(self, entry: MemoryEntry) -> None:
        self.memories.release([entry.memory_row])
        self.pointers.release([entry.pointer_row])
        entry.memory_row = None

    # ------------------------------------------------------------------------------- reading
    def query(self, obj_ids: list[int], frame: int, reverse: bool, num_frames: int | None) -> MemoryQuery:
        per_object = [self._select(self.objects[o], frame, reverse, num_frames) for o in obj_ids]
        n = len(obj_ids)
        k = max(1, max(len(m) for m, _ in per_object))
        p = max(1, max(len(q) for _, q in per_object))
        q = MemoryQuery(np.zeros((n, k), np.int64), np.zeros((n, k), np.int64), np.zeros((n, k), bool),
                        np.zeros((n, p), np.int64), np.zeros((n, p), np.float32), np.zeros((n, p), bool))
        for i, (mems, ptrs) in enumerate(per_object):
            for j, (row, slot) in enumerate(mems):
                q.memory_index[i, j], q.memory_slot[i, j], q.memory_valid[i, j] = row, slot, True
            for j, (row, offset) in enumerate(ptrs):
                q.pointer_index[i, j], q.pointer_offset[i, j], q.pointer_valid[i, j] = row, offset, True
        return q

    def _max_pointers(self, num_frames: int | None) -> int:
        limit = self.config.max_object_pointers_in_encoder
        return limit if num_frames is None else min(num_frames, limit)

    def _select(self, mem: ObjectMemory, frame: int, reverse: bool, num_frames: int | None):
        cfg = self.config
        last_slot = cfg.num_maskmem - 1  # the reference indexes temporal encodings with offset-1; 0 -> -1
        selected, unselected = select_closest_cond_frames(frame, mem.cond, cfg.max_cond_frame_num)
        memories = [(e.memory_row, last_slot) for e in selected.values()]
        for offset in range(cfg.num_maskmem - 1, 0, -1):
            t = frame + offset if reverse else frame - offset
            e = mem.non_cond.get(t, unselected.get(t))
            if e is not None:
                memories.append((e.memory_row, offset - 1))
        if any(row is None for row, _ in memories):
            raise RuntimeError("a memory entry was selected before its memory was encoded")

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
        return memories, [(row, off / scale) for row, off in pointers]

    # ------------------------------------------------------------------------------ eviction
    def evict(self, frame: int, reverse: bool) -> None:
        """Free what no later frame in this direction can select (pinned frames excepted)."""
        cfg = self.config
        keep_memory = cfg.num_maskmem - 1
        keep_pointer = cfg.max_object_pointers_in_encoder - 1
        for mem in self.objects.values():
            for t in list(mem.non_cond):
                behind = (t - frame) if reverse else (frame - t)
                if t in self.pinned_frames:
                    continue
                entry = mem.non_cond[t]
                if behind >= keep_pointer:
                    self._release(entry)
                    del mem.non_cond[t]
                elif behind >= keep_memory and entry.memory_row is not None:
                    self.memories.release([entry.memory_row])
                    entry.memory_row = None
            if self.keep_conditioning:
                continue
            # conditioning frames: only the most recent max_cond_frame_num stay selectable going on
            ordered = sorted(mem.cond, reverse=not reverse)
            for t in ordered[cfg.max_cond_frame_num:]:
                entry = mem.cond[t]
                behind = (t - frame) if reverse else (frame - t)
                # an unselected conditioning frame still serves as a nearby non-conditioning memory
                if behind >= keep_memory and t not in self.pinned_frames and entry.memory_row is not None:
                    self.memories.release([entry.memory_row])
                    entry.memory_row = None

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
