"""The planning phase: every heuristic decided on host data before anything is executed.

Port of transformers `Sam3VideoModel.run_tracker_update_planning_phase` and `_process_hotstart`,
`_prepare_recondition_masks`, `_suppress_overlapping_based_on_recent_occlusion`. Nothing here touches
the device: it reads low-resolution masks and scores and writes an `UpdatePlan`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import mask_ops
from .association import Association, associate
from .objects import ALWAYS_OCCLUDED, NEVER_OCCLUDED, ObjectRegistry

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


@dataclass
class UpdatePlan:
    association: Association
    new_det_inds: list[int]
    new_obj_ids: list[int]
    removed_obj_ids: set[int]
    reconditioned_obj_ids: set[int]
    track_masks: np.ndarray  # [N, L, L] tracker masks after overlap suppression (what the frame shows)
    memory_masks: np.ndarray  # [N, L, L] what the memory encoder sees (after the non-overlap shrink rule)
    memory_scores: np.ndarray  # [N] object score logits for memory (+-10 by mask area)
    last_occluded: dict[int, int] = field(default_factory=dict)


def plan_frame(frame: int, reverse: bool, streaming: bool, det: Detections, track_masks: np.ndarray,
               track_scores: np.ndarray, objects: ObjectRegistry, config) -> UpdatePlan:
    obj_ids = list(objects.obj_ids)
    trk_prompts = np.asarray([objects.prompt_of[o] for o in obj_ids], np.int64)
    assoc = associate(det.masks, det.scores, det.prompt_ids, track_masks, obj_ids, trk_prompts, config)

    new_inds = assoc.new_det_inds
    if len(obj_ids) + len(new_inds) > config.max_num_objects:  # keep the best-scoring new detections
        keep = config.max_num_objects - len(obj_ids)
        order = np.argsort(-det.scores[new_inds], kind="stable")[:max(keep, 0)]
        new_inds = [new_inds[i] for i in order]
    new_ids = objects.new_ids(len(new_inds))
    for obj_id, d in zip(new_ids, new_inds):
        objects.prompt_of[obj_id] = int(det.prompt_ids[d])

    removed = _hotstart(frame, reverse, streaming, assoc, new_ids, objects, config)

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
    last_occluded: dict[int, int] = {}
    memory_masks = track_masks
    memory_scores = np.zeros((0,), np.float32)
    if obj_ids:
        if config.suppress_overlapping_based_on_recent_occlusion_threshold > 0.0:
            last_occluded = _suppress_by_recent_occlusion(frame, reverse, track_masks, obj_ids, removed,
                                                          objects, config)
        memory_masks = track_masks.copy()
        for idx, m in recondition_masks.items():
            memory_masks[idx] = m
        memory_masks = mask_ops.suppress_object_pw_area_shrinkage(memory_masks, [objects.prompt_of[o] for o in obj_ids])
        memory_scores = np.where((memory_masks > 0).reshape(len(obj_ids), -1).any(axis=1), 10.0, -10.0)
        memory_scores = memory_scores.astype(np.float32)
    return UpdatePlan(assoc, new_inds, new_ids, removed, reconditioned, track_masks, memory_masks, memory_scores,
                      last_occluded)


def _hotstart(frame, reverse, streaming, assoc: Association, new_ids, objects: ObjectRegistry, config) -> set[int]:
    """Remove objects born recently that stay unmatched, or duplicate an older one (reference `_process_hotstart`)."""
    newly_removed: set[int] = set()
    diff = frame + config.hotstart_delay if reverse else frame - config.hotstart_delay

    def within_hotstart(obj_id):
        first = objects.first_frame[obj_id]
        return first < diff if reverse else first > diff

    for obj_id in new_ids:
        objects.first_frame.setdefault(obj_id, frame)
        objects.keep_alive[obj_id] = config.init_trk_keep_alive
    matched = {int(o) for ids in assoc.det_to_matched_obj_ids.values() for o in ids}
    for obj_id in matched:
        objects.keep_alive[obj_id] = min(config.max_trk_keep_alive, objects.keep_alive[obj_id] + 1)
    for obj_id in assoc.unmatched_obj_ids:
        objects.unmatched_frames[obj_id].append(frame)
        objects.keep_alive[obj_id] = max(config.min_trk_keep_alive, objects.keep_alive[obj_id] - 1)
    if config.decrease_trk_keep_alive_for_empty_masklets:
        for obj_id in assoc.empty_obj_ids:
            objects.keep_alive[obj_id] = max(config.min_trk_keep_alive, objects.keep_alive[obj_id] - 1)

    if not streaming:  # without future frames the reference never removes
        for obj_id, frames in objects.unmatched_frames.items():
            if obj_id in objects.removed or obj_id in newly_removed:
                continue
            if len(frames) >= config.hotstart_unmatch_thresh and within_hotstart(obj_id):
                newly_removed.add(obj_id)
            if (objects.keep_alive.get(obj_id, 0) <= 0 and not config.suppress_unmatched_only_within_hotstart
                    and obj_id not in objects.removed and obj_id not in newly_removed):
                objects.suppressed[frame].add(obj_id)

    for ids in assoc.det_to_matched_obj_ids.values():
        if len(ids) < 2:
            continue
        pick = max if reverse else min
        first = pick(ids, key=lambda x: objects.first_frame[x])
        for obj_id in ids:
            if obj_id != first:
                objects.overlap_pair_frames[(first, obj_id)].append(frame)

    if not streaming:
        for (first, obj_id), frames in objects.overlap_pair_frames.items():
            if obj_id in objects.removed or obj_id in newly_removed:
                continue
            if within_hotstart(obj_id) and len(frames) >= config.hotstart_dup_thresh:
                newly_removed.add(obj_id)
    objects.removed |= newly_removed
    return newly_removed


def _suppress_by_recent_occlusion(frame, reverse, masks, obj_ids, newly_removed, objects: ObjectRegistry,
                                  config) -> dict[int, int]:
    """Overlapping tracks of one prompt: the most recently occluded one gives way (in place on `masks`)."""
    binary = masks > 0
    last = np.asarray([objects.last_occluded.get(o, ALWAYS_OCCLUDED if o in newly_removed else NEVER_OCCLUDED)
                       for o in obj_ids], np.int64)
    prompts = np.asarray([objects.prompt_of[o] for o in obj_ids], np.int64)
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
    return {o: int(t) for o, t in zip(obj_ids, last)}
