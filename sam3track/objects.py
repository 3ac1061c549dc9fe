"""The object registry: ids, the prompt each came from, and the bookkeeping the heuristics read.

Field names follow transformers' `Sam3VideoInferenceSession`, whose semantics they reproduce.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

NEVER_OCCLUDED = -1
ALWAYS_OCCLUDED = 100000  # larger than any frame index: marks objects removed by hotstart


@dataclass
class ObjectRegistry:
    obj_ids: list[int] = field(default_factory=list)  # tracked objects, in tracker (batch) order
    max_obj_id: int = -1
    prompt_of: dict[int, int] = field(default_factory=dict)  # obj id -> prompt index
    score: dict[int, float] = field(default_factory=dict)  # detection score at birth; -1e4 once removed
    tracker_score: dict[int, dict[int, float]] = field(default_factory=lambda: defaultdict(dict))  # frame -> id -> p
    last_occluded: dict[int, int] = field(default_factory=dict)
    first_frame: dict[int, int] = field(default_factory=dict)
    unmatched_frames: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))
    overlap_pair_frames: dict[tuple[int, int], list[int]] = field(default_factory=lambda: defaultdict(list))
    keep_alive: dict[int, int] = field(default_factory=dict)
    removed: set[int] = field(default_factory=set)  # removed by hotstart heuristics
    hidden: set[int] = field(default_factory=set)  # never shown again (hotstart removals seen so far)
    suppressed: dict[int, set[int]] = field(default_factory=lambda: defaultdict(set))  # frame -> ids

    def new_ids(self, count: int) -> list[int]:
        return list(range(self.max_obj_id + 1, self.max_obj_id + 1 + count))

    def forget(self, obj_id: int) -> None:
        """Drop a user-removed object entirely."""
        if obj_id in self.obj_ids:
            self.obj_ids.remove(obj_id)
        for table in (self.prompt_of, self.last_occluded, self.keep_alive):
            table.pop(obj_id, None)
        self.hidden.add(obj_id)
