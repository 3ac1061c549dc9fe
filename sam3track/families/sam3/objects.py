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


class FrameSpans:
    """A set of frame indices kept as sorted [first, last] runs: tracking visits frames in order, so a
    long video or stream costs a few runs, not one entry per frame."""

    def __init__(self):
        self.runs: list[list[int]] = []

    def add(self, frame: int) -> None:
        for i, run in enumerate(self.runs):
            if run[0] - 1 <= frame <= run[1] + 1:
                run[0], run[1] = min(run[0], frame), max(run[1], frame)
                nxt = self.runs[i + 1] if i + 1 < len(self.runs) else None
                if nxt is not None and nxt[0] <= run[1] + 1:  # two runs joined
                    run[1] = max(run[1], nxt[1])
                    del self.runs[i + 1]
                prev = self.runs[i - 1] if i else None
                if prev is not None and run[0] <= prev[1] + 1:
                    prev[1] = max(prev[1], run[1])
                    del self.runs[i]
                return
            if frame < run[0]:
                self.runs.insert(i, [frame, frame])
                return
        self.runs.append([frame, frame])

    def __contains__(self, frame: int) -> bool:
        return any(a <= frame <= b for a, b in self.runs)

    def __eq__(self, other) -> bool:
        return isinstance(other, FrameSpans) and self.runs == other.runs

    def __repr__(self) -> str:
        return f"FrameSpans({self.runs})"


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
    # Prompted by the user (clicked, boxed, or a detected object refined by a click): tracked by the
    # tracker's own rules (transformers Sam3TrackerVideoModel), never removed, suppressed or
    # reconditioned by the detector's heuristics.
    interactive: bool = False
    # frames the tracker has propagated it on (frames_tracked_per_obj): a click there refines the
    # object with its memory; a click on any other frame starts it afresh on that frame
    tracked_frames: FrameSpans = field(default_factory=FrameSpans)


@dataclass
class ObjectRegistry:
    objects: dict[int, TrackedObject] = field(default_factory=dict)  # live ids in tracker (batch) order
    max_obj_id: int = -1  # ids are never reused, even after removal
    births_not_made: int = 0  # new detections over the cap (max_num_objects, pool_objects) left out so far

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

    def detector_view(self) -> "ObjectRegistry":
        """The objects the detector's heuristics manage (not interactive), sharing the id counter."""
        return ObjectRegistry({o: obj for o, obj in self.objects.items() if not obj.interactive}, self.max_obj_id)
