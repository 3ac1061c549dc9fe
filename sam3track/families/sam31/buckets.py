"""The slot registry of one SAM 3.1 tracker state (Meta's MultiplexState, multiplex_utils.py).

A state holds its objects in buckets of K = 16 slots. SAM 3 has no such thing: each of its objects has
its own memory. Here a bucket is the unit of memory, attention and decoding; the slot fixes the learned
slot embeddings an object gets, so objects never move:

- new objects fill the state's empty slots (-1) in bucket / slot order; a new bucket is added only when
  that is allowed (Meta: a new state is cut into ceil(n / 16) buckets; births into an existing state
  never need one, the best-fit rule guarantees room);
- a removed object's slot becomes a hole (-1116) that is never refilled and counts as used;
- a bucket whose slots are all empty or holes is dropped (its rows of every stored frame go with it);
- pack / unpack (Meta's mux / demux matrices) are index ops: `positions()` maps each object to its
  (bucket, slot).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

EMPTY, REMOVED = -1, -1116  # Meta's padding and _REMOVED_NUM


@dataclass
class BucketRegistry:
    capacity: int  # K slots per bucket
    slots: list[list[int]] = field(default_factory=list)  # per bucket: obj_id, EMPTY or REMOVED

    @classmethod
    def for_objects(cls, obj_ids: list[int], capacity: int) -> "BucketRegistry":
        """Meta's get_state(n): ceil(n / K) buckets filled in order, the last one padded."""
        reg = cls(capacity)
        reg.add(obj_ids, allow_new_buckets=True)
        return reg

    @property
    def num_buckets(self) -> int:
        return len(self.slots)

    @property
    def obj_ids(self) -> list[int]:
        """Objects in bucket / slot order (Meta's object index order inside a state)."""
        return [o for row in self.slots for o in row if o >= 0]

    @property
    def available_slots(self) -> int:
        """Empty slots; holes count as used (Meta's available_slots)."""
        return sum(row.count(EMPTY) for row in self.slots)

    def add(self, obj_ids: list[int], allow_new_buckets: bool = False) -> None:
        todo = list(obj_ids)
        for row in self.slots:
            for s in range(self.capacity):
                if todo and row[s] == EMPTY:
                    row[s] = todo.pop(0)
        if todo and not allow_new_buckets:
            raise ValueError(f"internal error: {len(todo)} objects do not fit the state's empty slots")
        while todo:
            row, todo = todo[:self.capacity], todo[self.capacity:]
            self.slots.append(row + [EMPTY] * (self.capacity - len(row)))

    def remove(self, obj_ids) -> list[int]:
        """Mark the objects' slots as holes, drop buckets left without objects; returns the indices of
        the buckets kept (Meta's buckets_to_keep), in order."""
        gone = set(obj_ids)
        for row in self.slots:
            for s, o in enumerate(row):
                if o in gone:
                    row[s] = REMOVED
        keep = [b for b, row in enumerate(self.slots) if any(o >= 0 for o in row)]
        self.slots = [self.slots[b] for b in keep]
        return keep

    def positions(self) -> dict[int, tuple[int, int]]:
        return {o: (b, s) for b, row in enumerate(self.slots) for s, o in enumerate(row) if o >= 0}

    def slot_valid(self) -> np.ndarray:
        """float32 [B, K]: 1 where a slot holds an object (Meta's get_valid_object_mask)."""
        return np.asarray([[1.0 if o >= 0 else 0.0 for o in row] for row in self.slots], np.float32).reshape(
            -1, self.capacity)

    def pack(self, per_object: dict[int, np.ndarray], fill: float = 0.0, dtype=np.float32) -> np.ndarray:
        """{obj_id: array} -> [B, K, ...] (Meta's mux: fill in empty slots and holes)."""
        sample = next(iter(per_object.values()))
        out = np.full((self.num_buckets, self.capacity) + np.shape(sample), fill, dtype)
        for o, (b, s) in self.positions().items():
            if o in per_object:
                out[b, s] = per_object[o]
        return out

    def unpack(self, packed: np.ndarray) -> dict[int, np.ndarray]:
        """[B, K, ...] -> {obj_id: array} (Meta's demux)."""
        return {o: packed[b, s] for o, (b, s) in self.positions().items()}
