"""The object registry: one `TrackedObject` per live id, and the few session-wide counters.

Semantics follow transformers' `Sam3VideoInferenceSession` (field names in comments), but only what a
future frame can read is kept: an object's record is dropped when it is removed (by the hotstart
rules, by retirement or by the user), counters replace the reference's ever-growing frame lists,
and per-frame tables (tracker scores, suppressed ids) live in that frame's output instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field

NEVER_OCCLUDED = -1
# "Occluded after any frame": the reference uses 100000, which a 30 fps stream passes after 55 minutes.
ALWAYS_OCCLUDED = 2**62


@dataclass
class TrackedObject:
    """Everything the heuristics know about one tracked object."""

    obj_id: int
    prompt: int  # index of the text prompt that found it (obj_id_to_prompt_id)
    first_frame: int  # frame of its birth (obj_first_frame_idx)
    score: float  # detection score at birth (obj_id_to_score)
    keep_alive: int  # trk_keep_alive: +1 when matched, -1 when unmatched, clamped
    unmatched_count: int = 0  # frames its non-empty mask matched no detection (len(unmatched_frame_inds))
    # first-born object of the same detection -> frames both matched one detection (overlap_pair_to_frame_inds)
    duplicate_of: dict[int, int] = field(default_factory=dict)
    last_occluded: int | None = None  # obj_id_to_last_occluded; None until its first planning phase
    last_visible: int = -1  # last frame its mask was non-empty (retirement of long-unseen objects)


@dataclass
class ObjectRegistry:
    objects: dict[int, TrackedObject] = field(default_factory=dict)  # live ids in tracker (batch) order
    max_obj_id: int = -1  # ids are never reused, even after removal

    @property
    def obj_ids(self) -> list[int]:
        return list(self.objects)

    def __len__(self) -> int:
        return len(self.objects)

    def __contains__(self, obj_id) -> bool:
        return obj_id in self.objects

    def __getitem__(self, obj_id: int) -> TrackedObject:
        return self.objects[obj_id]

    def new_ids(self, count: int) -> list[int]:
        return list(range(self.max_obj_id + 1, self.max_obj_id + 1 + count))

    def add(self, obj: TrackedObject) -> None:
        self.objects[obj.obj_id] = obj
        self.max_obj_id = max(self.max_obj_id, obj.obj_id)

    def drop(self, obj_id: int) -> None:
        """Forget an object. Duplicate counts that others hold against it stay, frozen, as in the reference."""
        self.objects.pop(obj_id, None)

    def prompt_of(self, obj_id: int, default: int = -1) -> int:
        obj = self.objects.get(obj_id)
        return obj.prompt if obj is not None else default
