"""The planning phase: every heuristic decided on host data, nothing mutated.

Port of transformers `Sam3VideoModel.run_tracker_update_planning_phase` and `_process_hotstart`,
`_prepare_recondition_masks`, `_suppress_overlapping_based_on_recent_occlusion`, plus sam3track's own
retirement of long-unseen objects. `plan_frame` reads the registry and this frame's masks and scores
and returns a `FramePlan`; the execution phase (`FrameLoop.execute`) applies it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ... import mask_ops
from .association import Association, associate
from .objects import ALWAYS_OCCLUDED, NEVER_OCCLUDED, ObjectRegistry, TrackedObject

NO_OBJ_LOGIT = -10.0


@dataclass
class Detections:
    """This frame's detections over all prompts, merged in prompt order (host arrays)."""

    masks: np.ndarray  # float32 [D, L, L] logits
    scores: np.ndarray  # float32 [D]
    boxes: np.ndarray  # float32 [D, 4], xyxy in [0, 1]
    prompt_ids: np.ndarray  # int64 [D]

    def __len__(self) -> int:
        return int(self.scores.shape[0])

    @classmethod
    def none(cls, mask_size: int) -> "Detections":
        return cls(np.zeros((0, mask_size, mask_size), np.float32), np.zeros(0, np.float32),
                   np.zeros((0, 4), np.float32), np.zeros(0, np.int64))


@dataclass
class ObjectUpdate:
    """New values of one tracked object's bookkeeping after this frame."""

    keep_alive: int
    unmatched_count: int
    last_occluded: int | None
    last_visible: int
    duplicates: dict[int, int]  # first-born object id -> frames both matched one detection


@dataclass(frozen=True)
class PoolRoom:
    """What the device pools hold, read before planning: births are planned only within it, so that
    the execution phase never runs out of rows halfway."""

    objects: int  # objects tracked at once (pool_objects, or what a compiled bundle's pools hold)
    births: int  # new objects the free rows hold on this frame, after the rows of the objects tracked now


@dataclass(frozen=True)
class BirthsNotMade:
    """New detections over the cap, which become no object (the reference's max_num_objects rule)."""

    count: int
    cap: int  # objects at once that the binding limit allows
    setting: str  # the option that sets that limit: max_num_objects or pool_objects
    by_rows: bool = False  # the pools' free rows bound first (objects holding more rows than their share)


@dataclass
class FramePlan:
    association: Association
    new_det_inds: list[int]
    new_obj_ids: list[int]
    removed_obj_ids: set[int]  # by the hotstart rules (the reference's obj_ids_newly_removed)
    retired_obj_ids: set[int]  # unseen for `retire_unseen_after` frames (sam3track's own rule)
    suppressed_obj_ids: set[int]  # hidden on this frame only (kept alive while unmatched)
    reconditioned_obj_ids: set[int]
    track_masks: np.ndarray  # [N, L, L] tracker masks after overlap suppression (what the frame shows)
    memory_masks: np.ndarray  # [N, L, L] what the memory encoder sees (after the non-overlap shrink rule)
    memory_scores: np.ndarray  # [N] object score logits for memory (+-10 by mask area)
    updates: dict[int, ObjectUpdate] = field(default_factory=dict)  # per tracked object
    births: list[TrackedObject] = field(default_factory=list)
    not_born: BirthsNotMade | None = None  # detections that would be new objects over the cap


def plan_frame(frame: int, reverse: bool, streaming: bool, det: Detections, track_masks: np.ndarray,
               track_scores: np.ndarray, objects: ObjectRegistry, config,
               user_masks: np.ndarray | None = None, room: PoolRoom | None = None) -> FramePlan:
    """`objects` are the objects the heuristics manage; `user_masks` [U, L, L] the logits of this frame's
    user-prompted objects, which the heuristics never touch but which block births over them; `room`
    what the device pools hold (None: no limit but max_num_objects)."""
    obj_ids = objects.obj_ids
    trk_prompts = np.asarray([objects[o].prompt for o in obj_ids], np.int64)
    assoc = associate(det.masks, det.scores, det.prompt_ids, track_masks, obj_ids, trk_prompts, config)

    new_inds = assoc.new_det_inds
    num_user = 0 if user_masks is None else user_masks.shape[0]
    if num_user and new_inds:
        # A detection overlapping a user-prompted object, whatever its prompt, is that object: no
        # duplicate is born (the same IoU rule that stops births over tracked objects of its prompt).
        overlap = mask_ops.mask_iou(det.masks[new_inds] > 0, user_masks > 0).max(axis=1)
        new_inds = [d for d, iou in zip(new_inds, overlap) if iou < config.assoc_iou_thresh]
    new_inds, not_born = _births_under_cap(new_inds, det.scores, len(obj_ids) + num_user, config, room)
    new_ids = objects.new_ids(len(new_inds))
    births = [TrackedObject(obj_id=o, prompt=int(det.prompt_ids[d]), first_frame=frame, score=float(det.scores[d]),
                            keep_alive=config.init_trk_keep_alive, last_visible=frame)
              for o, d in zip(new_ids, new_inds)]

    updates = {o: ObjectUpdate(objects[o].keep_alive, objects[o].unmatched_count, objects[o].last_occluded,
                               objects[o].last_visible, dict(objects[o].duplicate_of)) for o in obj_ids}
    removed, suppressed = _hotstart(frame, reverse, streaming, assoc, births, objects, updates, config)

    reconditioned: set[int] = set()
    recondition_masks: dict[int, np.ndarray] = {}
    if (config.recondition_every_nth_frame > 0 and frame % config.recondition_every_nth_frame == 0
            and assoc.obj_to_high_conf_det):
        for obj_id, d in assoc.obj_to_high_conf_det.items():
            idx = obj_ids.index(obj_id)
            if track_scores[idx] <= config.high_conf_thresh:
                continue
            reconditioned.add(obj_id)
            recondition_masks[idx] = (track_masks[idx] if config.recondition_on_trk_masks
                                      else (det.masks[d] >= 0.5).astype(np.float32))

    track_masks = track_masks.copy()
    memory_masks = track_masks
    memory_scores = np.zeros((0,), np.float32)
    if obj_ids:
        if config.suppress_overlapping_based_on_recent_occlusion_threshold > 0.0:
            _suppress_by_recent_occlusion(frame, reverse, track_masks, obj_ids, removed, objects, updates, config)
        shown = (track_masks > 0).reshape(len(obj_ids), -1).any(axis=1)  # after overlap suppression
        for o, seen in zip(obj_ids, shown):
            if seen:
                updates[o].last_visible = frame
        memory_masks = track_masks.copy()
        for idx, m in recondition_masks.items():
            memory_masks[idx] = m
        memory_masks = mask_ops.suppress_object_pw_area_shrinkage(memory_masks, trk_prompts.tolist())
        memory_scores = np.where((memory_masks > 0).reshape(len(obj_ids), -1).any(axis=1), 10.0, -10.0)
        memory_scores = memory_scores.astype(np.float32)
    retired = _unseen_too_long(frame, updates, removed, config)
    return FramePlan(assoc, new_inds, new_ids, removed, retired, suppressed, reconditioned, track_masks,
                     memory_masks, memory_scores, updates, births, not_born)


def _births_under_cap(new_inds: list[int], scores: np.ndarray, tracked: int, config,
                      room: PoolRoom | None) -> tuple[list[int], BirthsNotMade | None]:
    """The new detections that become objects: all of them while the objects fit under max_num_objects
    and what the pools hold, else the best-scoring ones that fit (the reference's max_num_objects rule,
    which the pools' size joins: a pool that cannot take another object makes no birth, rather than
    failing the frame); and what was left out, naming the limit that binds."""
    cap, setting = config.max_num_objects, "max_num_objects"
    if room is not None and room.objects < cap:
        cap, setting = room.objects, "pool_objects"
    keep, by_rows = cap - tracked, False
    if room is not None and room.births < keep:  # objects holding more rows than their share
        keep, setting, by_rows = room.births, "pool_objects", True
    if len(new_inds) <= keep:
        return new_inds, None
    keep = max(keep, 0)
    order = np.argsort(-scores[new_inds], kind="stable")[:keep]
    return [new_inds[i] for i in order], BirthsNotMade(len(new_inds) - keep, cap, setting, by_rows)


def _hotstart(frame, reverse, streaming, assoc: Association, births: list[TrackedObject], objects: ObjectRegistry,
              updates: dict[int, ObjectUpdate], config) -> tuple[set[int], set[int]]:
    """Objects born recently that stay unmatched, or duplicate an older one, are removed (reference
    `_process_hotstart`); long-unmatched ones are suppressed on this frame. Fills `updates`."""
    newly_removed: set[int] = set()
    suppressed: set[int] = set()
    diff = frame + config.hotstart_delay if reverse else frame - config.hotstart_delay
    first_frame = {o: objects[o].first_frame for o in objects.obj_ids} | {b.obj_id: b.first_frame for b in births}

    def within_hotstart(obj_id):
        return first_frame[obj_id] < diff if reverse else first_frame[obj_id] > diff

    matched = {int(o) for ids in assoc.det_to_matched_obj_ids.values() for o in ids}
    for obj_id in matched:
        u = updates[obj_id]
        u.keep_alive = min(config.max_trk_keep_alive, u.keep_alive + 1)
    for obj_id in assoc.unmatched_obj_ids:
        u = updates[obj_id]
        u.unmatched_count += 1
        u.keep_alive = max(config.min_trk_keep_alive, u.keep_alive - 1)
    if config.decrease_trk_keep_alive_for_empty_masklets:
        for obj_id in assoc.empty_obj_ids:
            u = updates[obj_id]
            u.keep_alive = max(config.min_trk_keep_alive, u.keep_alive - 1)

    if not streaming:  # without future frames the reference never removes
        for obj_id, u in updates.items():
            if u.unmatched_count == 0:  # the reference only looks at objects unmatched at least once
                continue
            if u.unmatched_count >= config.hotstart_unmatch_thresh and within_hotstart(obj_id):
                newly_removed.add(obj_id)
            elif u.keep_alive <= 0 and not config.suppress_unmatched_only_within_hotstart:
                suppressed.add(obj_id)

    for ids in assoc.det_to_matched_obj_ids.values():
        if len(ids) < 2:
            continue
        pick = max if reverse else min
        first = pick(ids, key=lambda x: first_frame[x])
        for obj_id in ids:
            if obj_id != first:
                dup = updates[obj_id].duplicates
                dup[first] = dup.get(first, 0) + 1

    if not streaming:
        for obj_id, u in updates.items():
            if obj_id in newly_removed or not within_hotstart(obj_id):
                continue
            if any(count >= config.hotstart_dup_thresh for count in u.duplicates.values()):
                newly_removed.add(obj_id)
    return newly_removed, suppressed


def _unseen_too_long(frame, updates: dict[int, ObjectUpdate], removed: set[int], config) -> set[int]:
    """Objects whose mask stayed empty (occluded, or suppressed by an overlapping object) for
    `retire_unseen_after` frames (0: never, as the reference)."""
    limit = config.retire_unseen_after
    if limit <= 0:
        return set()
    return {o for o, u in updates.items() if o not in removed and abs(frame - u.last_visible) >= limit}


def _suppress_by_recent_occlusion(frame, reverse, masks, obj_ids, newly_removed, objects: ObjectRegistry,
                                  updates: dict[int, ObjectUpdate], config) -> None:
    """Overlapping tracks of one prompt: the most recently occluded one gives way (in place on `masks`)."""
    binary = masks > 0

    def last_occluded(o):
        known = objects[o].last_occluded
        if known is not None:
            return known
        return ALWAYS_OCCLUDED if o in newly_removed else NEVER_OCCLUDED

    last = np.asarray([last_occluded(o) for o in obj_ids], np.int64)
    prompts = np.asarray([objects[o].prompt for o in obj_ids], np.int64)
    suppress = np.zeros(len(obj_ids), bool)
    for prompt in np.unique(prompts):
        idx = np.flatnonzero(prompts == prompt)
        if idx.size <= 1:
            continue
        suppress[idx] = mask_ops.objects_to_suppress_by_recent_occlusion(
            binary[idx], last[idx], config.suppress_overlapping_based_on_recent_occlusion_threshold, reverse)
    occluded = ~binary.reshape(len(obj_ids), -1).any(axis=1)
    last = np.where(occluded | suppress, frame, last)
    masks[suppress] = NO_OBJ_LOGIT
    for o, t in zip(obj_ids, last):
        updates[o].last_occluded = int(t)
