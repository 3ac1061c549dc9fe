"""The multiplex memory bank: per-bucket memories, per-frame image features and per-bucket pointers in
device pools, and Meta's rules for which stored frames a propagation step reads (`select`).

A tracker state owns, per stored frame, ONE memory map and ONE row of 16 slot pointers per bucket, shared
by the bucket's objects. The pools and how this differs from SAM 3: docs/sam31.md, "The multiplex memory
bank".
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...backends import Backend, DeviceTensor
from ...memory_bank import ZERO_ROW, DevicePool, select_closest_cond_frames
from .buckets import BucketRegistry


class GrowingPool(DevicePool):
    """A DevicePool that doubles its capacity (one device copy of the used rows) instead of failing:
    the reference keeps every frame's memories, and so does this runtime for now."""

    def allocate(self, count: int) -> np.ndarray:
        while int(self.free.sum()) < count:
            self._grow()
        return super().allocate(count)

    def _grow(self) -> None:
        old = self.capacity
        bigger = self.backend.zeros((2 * old,) + self.row_shape, self.dtype)
        self.backend.copy(self.tensor, self.backend.rows(bigger, 0, old))
        self._replace(bigger)
        self.free = np.concatenate([self.free, np.ones(old, bool)])


@dataclass
class FrameRecord:
    """What one tracker state stores for one frame (Meta's output_dict[cond|non_cond][frame])."""

    cond: bool
    masks: dict[int, np.ndarray]  # obj_id -> low-res logits [L, L] (pred_masks)
    scores: dict[int, float]  # obj_id -> object score logit
    pointer_rows: list[int] | None  # per bucket, rows of the pointer pool (None: evicted)
    conditioning: set[int] = field(default_factory=set)  # objects flagged in the conditioning channel
    memory_rows: list[int] | None = None  # per bucket, once encoded
    image_row: int | None = None
    consolidated: bool = False  # a birth / prompt frame: revisiting it reuses this record


@dataclass
class TrackerState:
    """One of Meta's sam2_inference_states: a bucket registry and its frames."""

    registry: BucketRegistry
    frames: dict[int, FrameRecord] = field(default_factory=dict)
    tracked: dict[int, bool] = field(default_factory=dict)  # frame -> reverse (frames_already_tracked)
    # Conditioning outputs of frames tracked again. Meta keeps a frame's conditioning and
    # non-conditioning outputs apart; an object extracted from its bucket for a click keeps its old
    # conditioning frames (pointer only, no memory), and tracking such a frame again adds a
    # non-conditioning output beside it: both are read from then on.
    kept_cond: dict[int, FrameRecord] = field(default_factory=dict)
    points: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)  # (obj, frame) -> clicks
    refined: dict[int, set[int]] = field(default_factory=dict)  # obj -> frames refined (user_refined_frames_per_obj)

    @property
    def obj_ids(self) -> list[int]:
        return self.registry.obj_ids

    def records(self):
        """Every stored output of this state (the frames' and the kept conditioning ones)."""
        yield from self.frames.values()
        yield from self.kept_cond.values()


@dataclass
class Selection:
    memories: list[tuple[int, int]]  # (frame, temporal slot)
    pointers: list[tuple[int, int]]  # (frame, distance)
    scale: int  # pointer offset = distance / scale
    memory_records: list[FrameRecord] = field(default_factory=list)  # the records read, in the same order
    pointer_records: list[FrameRecord] = field(default_factory=list)


def select(frame: int, state: TrackerState, num_frames: int, reverse: bool, num_maskmem: int, max_cond: int,
           max_pointers: int) -> Selection:
    """Meta's memory selection for one propagation step of `state` at `frame` (tpos v2 for
    conditioning frames, pointers of future conditioning frames included, stride 1).

    Conditioning outputs at `frame` itself count (Meta does not exclude them: only an extracted
    object's kept conditioning frame can be tracked again, and its pointer is read at distance 0),
    and an output without a memory (extracted ones) gives its pointer but no memory entry, as Meta
    skips a stored frame whose maskmem_features is None."""
    conds = {f: r for f, r in state.frames.items() if r.cond}
    for f, r in state.kept_cond.items():
        conds.setdefault(f, r)
    non_conds = {f: r for f, r in state.frames.items() if not r.cond and f != frame}
    chosen, unselected = select_closest_cond_frames(frame, {t: conds[t] for t in sorted(conds)}, max_cond)
    selected = list(chosen)

    def previous(t: int):  # Meta: non_cond_frame_outputs.get(t, unselected_cond_outputs.get(t))
        return non_conds.get(t, unselected.get(t))

    sign = -1 if reverse else 1
    sel = Selection([], [], 0)

    def add_memory(t: int, slot: int, record: FrameRecord) -> None:
        if record.memory_rows is not None:
            sel.memories.append((t, slot))
            sel.memory_records.append(record)

    for t in selected:
        t_pos = (frame - t) * sign
        # 3.1's tpos v2: a conditioning frame 1..6 frames back gets the distance slot (SAM 3: always the last)
        add_memory(t, num_maskmem - 1 - t_pos if 1 <= t_pos < num_maskmem else num_maskmem - 1, conds[t])
    for t_pos in range(1, num_maskmem):
        d = num_maskmem - t_pos
        t = frame + d if reverse else frame - d
        if previous(t) is not None:
            add_memory(t, d - 1, previous(t))
    window = min(num_frames, max_pointers)
    for t in selected:
        sel.pointers.append((t, abs(frame - t)))
        sel.pointer_records.append(conds[t])
    for d in range(1, window):
        t = frame + d if reverse else frame - d
        if t < 0 or t >= num_frames:
            break
        if previous(t) is not None and previous(t).pointer_rows is not None:  # None: evicted (fixed pools)
            sel.pointers.append((t, d))
            sel.pointer_records.append(previous(t))
    sel.scale = window - 1
    return sel


class MultiplexMemory:
    """The three device pools and the reference counts of image rows.

    fixed: the pools' row counts where the propagation decoder was compiled for them (an OM bundle:
    om.sam31.capacities), None to grow as needed. Fixed pools cannot hold every frame, so their
    owner frees, frame by frame, what no later step of the pass can read (`evict`); growing pools
    keep everything, as Meta's predictor does."""

    SETTING = "pool rows (om.convert --gears memory_rows=N,image_rows=N,pointer_rows=N)"

    def __init__(self, backend: Backend, hw: int, channels: int, slots: int, rows: int = 64,
                 fixed: dict[str, int] | None = None):
        self.backend, self.fixed = backend, fixed
        if fixed:
            def pool(shape, key, name):
                return DevicePool(backend, shape, fixed[key], name=name, setting=self.SETTING)

            self.memories = pool((hw, channels), "memory_rows", "memory pool")
            self.images = pool((hw, channels), "image_rows", "image pool")
            self.pointers = pool((slots, channels), "pointer_rows", "pointer pool")
        else:
            self.memories = GrowingPool(backend, (hw, channels), rows, name="memory pool")
            self.images = GrowingPool(backend, (hw, channels), max(rows // 4, 4), name="image pool")
            self.pointers = GrowingPool(backend, (slots, channels), rows, name="pointer pool")
        self._image_refs: dict[int, int] = {}

    def evict(self, states: list[TrackerState], frame: int, reverse: bool, num_maskmem: int, pointer_window: int,
              pinned=frozenset(), forget: bool = False) -> None:
        """After tracking `frame`: free the memory (and image) rows of non-conditioning frames too far
        behind for the next frame in the same direction to read (num_maskmem - 1 back), and their
        pointer rows past the pointer window. Conditioning outputs and `pinned` frames stay. A later
        pass that starts somewhere else reads less than Meta's predictor, which keeps everything: only
        fixed pools evict, and live streams (frames only come later). forget: also drop the records
        left with neither (a stream never revisits a frame)."""
        for state in states:
            for t, record in state.frames.items():
                if record.cond or t in pinned:
                    continue
                behind = t - frame if reverse else frame - t
                if record.memory_rows is not None and behind >= num_maskmem - 1:
                    self.memories.release(record.memory_rows)
                    record.memory_rows = None
                    self.release_image(record)
                if record.pointer_rows is not None and behind >= pointer_window - 1:
                    self.pointers.release(record.pointer_rows)
                    record.pointer_rows = None
            if forget:
                for t in [t for t, r in state.frames.items()
                          if not r.cond and r.memory_rows is None and r.pointer_rows is None]:
                    del state.frames[t]
                    state.tracked.pop(t, None)

    # ------------------------------------------------------------------------------ images
    def new_image_row(self, features: DeviceTensor) -> int:
        row = int(self.images.allocate(1)[0])
        self.backend.copy(features, self.backend.rows(self.images.tensor, row, 1))
        self._image_refs[row] = 0
        return row

    def hold_image(self, record: FrameRecord, row: int) -> None:
        self.release_image(record)
        record.image_row = row
        self._image_refs[row] += 1

    def release_image(self, record: FrameRecord) -> None:
        row = record.image_row
        if row is None:
            return
        record.image_row = None
        self._image_refs[row] -= 1
        if self._image_refs[row] <= 0:
            del self._image_refs[row]
            self.images.release([row])

    def drop_unreferenced_image(self, row: int) -> None:
        if self._image_refs.get(row) == 0:
            del self._image_refs[row]
            self.images.release([row])

    # ------------------------------------------------------------------------------ records
    def release_record(self, record: FrameRecord) -> None:
        if record.pointer_rows is not None:
            self.pointers.release(record.pointer_rows)
        if record.memory_rows is not None:
            self.memories.release(record.memory_rows)
        self.release_image(record)

    def keep_buckets(self, state: TrackerState, keep: list[int]) -> None:
        """Slice every stored frame of `state` to the buckets kept (Meta's remove_objects slices
        maskmem_features and obj_ptr at bucket granularity only)."""
        for record in state.records():
            if record.pointer_rows is not None:
                self.pointers.release([r for b, r in enumerate(record.pointer_rows) if b not in keep])
                record.pointer_rows = [record.pointer_rows[b] for b in keep]
            if record.memory_rows is not None:
                self.memories.release([r for b, r in enumerate(record.memory_rows) if b not in keep])
                record.memory_rows = [record.memory_rows[b] for b in keep]

    def set_pointer_slots(self, record: FrameRecord, registry: BucketRegistry, pointers: dict[int, np.ndarray]) -> None:
        """Write the given objects' pointers into their slots of the record's pointer rows (births into
        an existing state: Meta appends the new objects' pointers to the muxed ones)."""
        b = self.backend
        rows = np.asarray(record.pointer_rows)
        host = b.to_host(self.pointers.tensor, rows)
        where = registry.positions()
        for o, p in pointers.items():
            bk, s = where[o]
            host[bk, s] = p
        self.write_pointer_rows(rows, host)

    def write_pointer_rows(self, rows, host: np.ndarray) -> None:
        """pointer_pool[rows[i]] = host[i] (one upload, then device copies; the upload is freed)."""
        b = self.backend
        staged = b.upload(np.ascontiguousarray(host, np.float32))
        try:
            for i, r in enumerate(rows):
                b.copy(b.rows(staged, i, 1), b.rows(self.pointers.tensor, int(r), 1))
        finally:
            b.free(staged)

    def close(self) -> None:
        for pool in (self.memories, self.images, self.pointers):
            pool.close()


def propagation_feeds(calls: list[tuple[TrackerState, int, Selection]], plan=None) -> dict[str, np.ndarray]:
    """The index inputs of one propagation_decoder call over every bucket of the given states (each
    with its own selection): memory rows, their frames' image rows and temporal slots, pointer rows and
    offsets, padded per bucket to the longest lists (padding entries: valid 0, row 0, the zero row).
    plan(axis, n): the entry count a call for n entries runs at (a static-shape backend's compiled
    memories / pointers), n when None."""
    n = max((len(sel.memories) for _, _, sel in calls), default=0)
    p = max((len(sel.pointers) for _, _, sel in calls), default=0)
    n, p = max(n, 1), max(p, 1)
    if plan is not None:
        n, p = plan("memories", n), plan("pointers", p)
    cols = {k: [] for k in ("memory_index", "memory_image_index", "memory_slot", "memory_valid", "pointer_index",
                            "pointer_offset", "pointer_valid", "slot_valid")}
    for state, frame, sel in calls:
        for bucket in range(state.registry.num_buckets):
            mi = np.full(n, ZERO_ROW, np.int32)
            ii = np.full(n, ZERO_ROW, np.int32)
            ms = np.zeros(n, np.int32)
            mv = np.zeros(n, np.float32)
            for j, ((_, slot), rec) in enumerate(zip(sel.memories, sel.memory_records)):
                mi[j], ii[j], ms[j], mv[j] = rec.memory_rows[bucket], rec.image_row, slot, 1.0
            pi = np.full(p, ZERO_ROW, np.int32)
            po = np.zeros(p, np.float32)
            pv = np.zeros(p, np.float32)
            for j, ((_, dist), rec) in enumerate(zip(sel.pointers, sel.pointer_records)):
                pi[j] = rec.pointer_rows[bucket]
                po[j] = np.float32(dist) / np.float32(sel.scale)
                pv[j] = 1.0
            for k, v in zip(cols, (mi, ii, ms, mv, pi, po, pv)):
                cols[k].append(v)
        cols["slot_valid"].append(state.registry.slot_valid())
    out = {k: np.stack(v) for k, v in cols.items() if k != "slot_valid"}
    out["slot_valid"] = np.concatenate(cols["slot_valid"]).astype(np.float32)
    return out
