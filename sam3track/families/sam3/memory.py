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
- non-conditioning entries leave the device once they are too far behind the current frame for the
  next frame in the same direction, or a click on the current frame, to read them. Outside a live
  stream they go to a budgeted host store (sam3track/memory_store.py) and come back, bit for bit,
  when a frame reads them again (a correction on a frame tracked long ago, a pass started in the
  middle): the reference's reads, with the device holding one window (docs/corrections.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...backends import Backend
from ...errors import Sam3TrackError
from ...memory_bank import ZERO_ROW, DevicePool, select_closest_cond_frames
from ...memory_store import HostStore

MIB = 1 << 20


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
    def __init__(self, backend: Backend, config, memory_rows: int, pointer_rows: int, keep_history: bool = True):
        """memory_rows, pointer_rows: the pools' fixed capacities (the zero row included). keep_history
        False: no host store (a one-pass run never reads what it left behind)."""
        self.config = config
        hw = config.feature_grid ** 2
        self.memories = DevicePool(backend, (hw, config.memory_dim), memory_rows, name="memory pool")
        self.pointers = DevicePool(backend, (config.hidden_dim,), pointer_rows, name="pointer pool")
        self.objects: dict[int, ObjectMemory] = {}
        self.pinned_frames: set[int] = set()  # frames a later pass of the same call still reads
        # rows evicted from the pools: ("m" | "p", obj id, frame) -> memory row | pointer row + score
        caps = (config.memory_store_ram_mib * MIB, config.memory_store_disk_mib * MIB) if keep_history else (0, 0)
        self.store = HostStore(*caps)

    # ------------------------------------------------------------------------------- writing
    def add(self, obj_id: int, frame: int, entry: MemoryEntry, cond: bool) -> None:
        mem = self.objects.setdefault(obj_id, ObjectMemory())
        if not cond and frame in mem.cond:
            raise Sam3TrackError(f"internal error: object {obj_id}'s conditioning memory of frame {frame} would be "
                                 "replaced by a tracked one; please report this")
        old = mem.cond.pop(frame, None) or mem.non_cond.pop(frame, None)
        if old is not None:
            self._release(old)
        self._forget_stored(obj_id, frame)  # what the store kept of this frame is replaced
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
            self._forget_stored(obj_id, frame)

    def set_memory_rows(self, obj_ids: list[int], frame: int, rows: np.ndarray) -> None:
        for obj_id, row in zip(obj_ids, rows):
            self.store.discard(("m", obj_id, frame))
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
        self.store.discard_object(obj_id)

    def clear(self) -> None:
        """Forget every object; every pool row is free and zero again."""
        self.objects.clear()
        self.pinned_frames.clear()
        self.store.clear()
        self.memories.reset()
        self.pointers.reset()

    def close(self) -> None:
        self.objects.clear()
        self.store.close()
        self.memories.close()
        self.pointers.close()

    def _forget_stored(self, obj_id: int, frame: int) -> None:
        self.store.discard(("m", obj_id, frame))
        self.store.discard(("p", obj_id, frame))

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
        where the last one ended) first gets back from the store what eviction moved there (`recall`);
        only what the store's caps dropped is skipped, where the reference would read it."""
        self.recall([o for o in obj_ids if o not in empty], frame, reverse, num_frames)
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
        leaving = []  # (obj id, frame, entry, whole entry or only its spatial memory)
        for obj_id, mem in self.objects.items():
            for t in list(mem.non_cond):
                behind = (t - frame) if reverse else (frame - t)
                if t in self.pinned_frames:
                    continue
                entry = mem.non_cond[t]
                if t != frame:  # only the current frame can still be promoted to a conditioning frame
                    entry.low_res_mask = None  # a full-size [288, 288] float mask is 324 KiB of host memory
                if behind >= keep_pointer:
                    leaving.append((obj_id, t, mem.non_cond.pop(t), True))
                elif behind >= keep_memory and entry.memory_row is not None:
                    leaving.append((obj_id, t, entry, False))
            self._limit_conditioning(mem, frame)
            if streaming and cfg.max_cond_frame_num != -1:
                newest = sorted(mem.cond, reverse=True)[:cfg.max_cond_frame_num]
                for t, entry in mem.cond.items():
                    if t not in newest and frame - t >= keep_memory and entry.memory_row is not None:
                        self.memories.release([entry.memory_row])
                        entry.memory_row = None
        self._spill(leaving, keep=not streaming)

    # ------------------------------------------------------------------- the host store
    def _spill(self, leaving: list, keep: bool) -> None:
        """Free the rows of `leaving` (obj id, frame, entry, whole): its spatial memory, and its pointer
        too when whole; with `keep`, copied to the store first (one transfer per pool), unless the
        store holds them already (rows never change while the entry lives)."""
        for pool, kind, attr in ((self.memories, "m", "memory_row"), (self.pointers, "p", "pointer_row")):
            going = [(o, t, e) for o, t, e, whole in leaving
                     if getattr(e, attr) is not None and (whole or kind == "m")]
            new = [(o, t, e) for o, t, e in going if keep and self.store.enabled and (kind, o, t) not in self.store]
            if new:
                host = pool.read(np.asarray([getattr(e, attr) for _, _, e in new]))
                for (o, t, e), row in zip(new, host):
                    self.store.put((kind, o, t), row if kind == "m" else np.append(row, np.float32(e.object_score)))
            pool.release([getattr(e, attr) for _, _, e in going])
            for _, _, e in going:
                setattr(e, attr, None)

    def _window(self, frame: int, reverse: bool, num_frames: int | None) -> tuple[set[int], set[int]]:
        """The non-conditioning frames `frame` reads: (spatial memories, pointers)."""
        step = 1 if reverse else -1

        def frames(count: int) -> set[int]:
            near = (frame + step * d for d in range(1, count))
            return {t for t in near if t >= 0 and (num_frames is None or t < num_frames)}

        return frames(self.config.num_maskmem), frames(self._max_pointers(num_frames))

    def recall(self, obj_ids: list[int], frame: int, reverse: bool, num_frames: int | None) -> None:
        """Put back on the device, from the store, the evicted memories and pointers that `frame` reads
        (transformers reads them from the outputs it keeps forever). Room is made first by moving to
        the store the entries `frame` does not read, when the pools lack it."""
        if not len(self.store):
            return
        memories, pointers = self._window(frame, reverse, num_frames)
        wanted = []  # (obj id, frame, pointer wanted, memory wanted)
        for obj_id in obj_ids:
            mem = self.objects.get(obj_id)
            for t in sorted(memories | pointers) if mem is not None else ():
                entry = mem.non_cond.get(t)
                if t in mem.cond or (entry is None and ("p", obj_id, t) not in self.store):
                    continue
                need_memory = (t in memories and ("m", obj_id, t) in self.store
                               and (entry is None or entry.memory_row is None))
                if entry is None or need_memory:
                    wanted.append((obj_id, t, entry is None, need_memory))
        if not wanted:
            return
        self._make_room(frame, memories | pointers, sum(w[2] for w in wanted), sum(w[3] for w in wanted))
        self._restore(wanted)

    def _make_room(self, frame: int, reads: set[int], pointers: int, memories: int) -> None:
        if self.pointers.free_rows >= pointers and self.memories.free_rows >= memories:
            return
        leaving = []
        for obj_id, mem in self.objects.items():
            for t in [t for t in mem.non_cond if t != frame and t not in reads and t not in self.pinned_frames]:
                leaving.append((obj_id, t, mem.non_cond.pop(t), True))
        self._spill(leaving, keep=True)

    def _restore(self, wanted: list) -> None:
        for pool, kind, index in ((self.pointers, "p", 2), (self.memories, "m", 3)):
            items = [(w[0], w[1]) for w in wanted if w[index]]
            if not items:
                continue
            values = np.stack([self.store.get((kind, o, t)) for o, t in items])
            rows = pool.allocate(len(items))
            pool.write(rows, values[:, :-1] if kind == "p" else values)
            for (o, t), row, value in zip(items, rows, values):
                mem = self.objects[o]
                if kind == "p":
                    mem.non_cond[t] = MemoryEntry(int(row), float(value[-1]))
                else:
                    mem.non_cond[t].memory_row = int(row)

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
