"""Matching this frame's detections to the tracked objects (transformers `_associate_det_trk`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...mask_ops import mask_iou


@dataclass
class Association:
    new_det_inds: list[int] = field(default_factory=list)  # detections that start new objects
    unmatched_obj_ids: list[int] = field(default_factory=list)  # non-empty tracks no detection matches
    det_to_matched_obj_ids: dict[int, list[int]] = field(default_factory=dict)
    obj_to_high_conf_det: dict[int, int] = field(default_factory=dict)  # candidates for reconditioning
    empty_obj_ids: list[int] = field(default_factory=list)  # tracks with an empty mask


def associate(det_masks: np.ndarray, det_scores: np.ndarray, det_prompts: np.ndarray, trk_masks: np.ndarray,
              trk_ids: list[int], trk_prompts: np.ndarray, config) -> Association:
    """det_masks [D, L, L] and trk_masks [N, L, L] are logits; IoU is computed on logits > 0."""
    out = Association()
    trk_ids_arr = np.asarray(trk_ids, np.int64)
    if trk_masks.shape[0] == 0:
        out.new_det_inds = list(range(det_masks.shape[0]))
        return out
    trk_binary = trk_masks > 0
    nonempty = trk_binary.reshape(trk_binary.shape[0], -1).any(axis=1)
    if det_masks.shape[0] == 0:
        out.unmatched_obj_ids = trk_ids_arr[nonempty].tolist()
        out.empty_obj_ids = trk_ids_arr[~nonempty].tolist()
        return out

    ious = mask_iou(det_masks > 0, trk_binary)
    ious = np.where(det_prompts[:, None] == trk_prompts[None, :], ious, np.float32(0))  # never across prompts

    matched = (ious >= config.trk_assoc_iou_thresh).any(axis=0)
    out.unmatched_obj_ids = trk_ids_arr[nonempty & ~matched].tolist()
    out.empty_obj_ids = trk_ids_arr[~nonempty].tolist()

    confident = det_scores >= config.new_det_thresh
    if not config.match_reference_quirks:
        # The reference lets any detection start an object while nothing is tracked (the early return
        # above), across all prompts. Per prompt, that rule keeps prompts independent of each other.
        confident |= ~np.isin(det_prompts, trk_prompts)
    is_new = confident & ~(ious >= config.assoc_iou_thresh).any(axis=1)
    out.new_det_inds = np.flatnonzero(is_new).tolist()

    best_trk = ious.argmax(axis=1)
    high = (det_scores >= config.high_conf_thresh) & ~is_new & (ious.max(axis=1) >= config.high_iou_thresh)
    for d in range(det_masks.shape[0]):
        out.det_to_matched_obj_ids[d] = trk_ids_arr[ious[d] >= config.assoc_iou_thresh].tolist()
        if high[d]:
            out.obj_to_high_conf_det[int(trk_ids_arr[best_trk[d]])] = d
    return out
