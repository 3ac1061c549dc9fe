"""SAM 3's memory bank: every tracked object's spatial memories and object pointers, kept on the device.

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

from ...backends import Backend, DeviceTensor
from ...errors import CapacityError, Sam3TrackError

from ...memory_bank import ZERO_ROW, DevicePool, select_closest_cond_frames


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
