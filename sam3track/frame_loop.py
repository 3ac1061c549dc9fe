"""One frame of tracking as named phases (the reference's `_det_track_one_frame`):

1. backbone + grounding: one backbone call, one grounding_head call for all prompts;
2. propagation: one propagation_decoder call for all tracked objects;
3. planning: every heuristic decided on host masks and scores (planning.py);
4. execution: memory encoding, births (mask_init), removals;
5. outputs: low-resolution masks per visible object (post-processing is the session's).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import mask_ops
from .backends import Backend, DeviceTensor
from .memory_bank import MemoryBank, MemoryEntry
from .objects import ObjectRegistry
from .planning import Detections, UpdatePlan, plan_frame


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return (1.0 / (1.0 + np.exp(-x.astype(np.float32)))).astype(np.float32)


@dataclass
class FrameOutput:
    """What the reference's forward() returns for a frame, before post-processing."""

    frame_index: int
    masks: dict[int, np.ndarray]  # obj id -> low-res logits [L, L]
    scores: dict[int, float]  # obj id -> detection score
    tracker_scores: dict[int, float]  # obj id -> tracker probability on this frame
    removed: set[int]


class FrameLoop:
    def __init__(self, backend: Backend, graphs: dict, config, bank: MemoryBank, objects: ObjectRegistry):
        self.backend, self.graphs, self.config = backend, graphs, config
        self.bank, self.objects = bank, objects

    # ----------------------------------------------------------------- 1. backbone + grounding
    def encode_frame(self, pixels: np.ndarray) -> dict[str, DeviceTensor]:
        return self.backend.run(self.graphs["backbone"], {"pixel_values": self.backend.upload(pixels)})

    def detect(self, features, text_features: DeviceTensor, text_mask: DeviceTensor, num_prompts: int) -> Detections:
        b, cfg = self.backend, self.config
        inputs = {f"detector_fpn{i}": features[f"detector_fpn{i}"] for i in range(3)}
        inputs.update(text_features=text_features, text_mask=text_mask)
        out = b.run(self.graphs["grounding_head"], inputs)
        probs = _sigmoid(b.to_host(out["pred_logits"])) * _sigmoid(b.to_host(out["presence_logits"]))
        boxes = b.to_host(out["pred_boxes"])
        q = probs.shape[1]
        pred = out["pred_masks"]
        flat = DeviceTensor((num_prompts * q,) + tuple(pred.shape[2:]), pred.dtype, pred.handle)
        masks, scores, box_list, prompt_ids = [], [], [], []
        for k in range(num_prompts):
            valid = np.flatnonzero(probs[k] > cfg.score_threshold_detection)
            if valid.size == 0:
                continue
            m = b.to_host(flat, rows=k * q + valid)  # only candidates above threshold leave the device
            keep = np.ones(valid.size, bool)
            if cfg.mask_nms and cfg.det_nms_thresh > 0:
                keep = mask_ops.nms_masks(probs[k, valid], m, cfg.score_threshold_detection, cfg.det_nms_thresh)
            masks.append(m[keep])
            scores.append(probs[k, valid][keep])
            box_list.append(boxes[k, valid][keep])
            prompt_ids.append(np.full(int(keep.sum()), k, np.int64))
        size = cfg.low_res_mask_size
        if not masks:
            return Detections(np.zeros((0, size, size), np.float32), np.zeros(0, np.float32),
                              np.zeros((0, 4), np.float32), np.zeros(0, np.int64))
        return Detections(np.concatenate(masks), np.concatenate(scores), np.concatenate(box_list),
                          np.concatenate(prompt_ids))

    # ---------------------------------------------------------------------------- 2. propagation
    def propagate(self, features, frame: int, reverse: bool, num_frames: int | None):
        obj_ids = list(self.objects.obj_ids)
        n, size = len(obj_ids), self.config.low_res_mask_size
        if n == 0:
            return np.zeros((0, size, size), np.float32), np.zeros((0, size, size), np.float32), np.zeros(0, np.float32)
        b, bank = self.backend, self.bank
        query = bank.query(obj_ids, frame, reverse, num_frames)
        first = bank.pointers.allocate(n)  # before reading the pool: allocation may grow it
        inputs = {name: features[name] for name in ("tracker_feat_s0", "tracker_feat_s1", "tracker_feat")}
        inputs.update(memory_pool=bank.memories.tensor, pointer_pool=bank.pointers.tensor)
        for name, value in vars(query).items():
            inputs[name] = b.upload(value)
        out = b.run(self.graphs["propagation_decoder"], inputs, {"object_pointer": bank.pointers.view(first, n)})
        raw = b.to_host(out["low_res_masks"])[:, 0]
        scores = b.to_host(out["object_score_logits"])[:, 0]
        for i, obj_id in enumerate(obj_ids):
            bank.add(obj_id, frame, MemoryEntry(first + i, float(scores[i]), low_res_mask=raw[i]), cond=False)
        masks = self._fill_holes(raw)
        return raw, masks, scores

    def _fill_holes(self, masks: np.ndarray) -> np.ndarray:
        if not self.config.fill_holes or masks.shape[0] == 0:
            return masks
        return mask_ops.fill_holes_in_mask_scores(masks, self.config.fill_hole_area)

    # --------------------------------------------------------------------------- 4. execution
    def encode_memory(self, features, obj_ids: list[int], frame: int, logits: np.ndarray, scores: np.ndarray,
                      binarize: bool) -> None:
        n = len(obj_ids)
        if n == 0:
            return
        b, bank = self.backend, self.bank
        first = bank.memories.allocate(n)
        b.run(self.graphs["memory_encoder"], {
            "tracker_feat": features["tracker_feat"],
            "mask_logits": b.upload(logits.reshape(n, 1, *logits.shape[-2:]).astype(np.float32)),
            "object_score_logits": b.upload(scores.reshape(n, 1).astype(np.float32)),
            "binarize": b.upload(np.full((n,), binarize)),
        }, {"maskmem_features": bank.memories.view(first, n)})
        bank.set_memory_rows(obj_ids, frame, first)

    def add_objects(self, features, obj_ids: list[int], det_masks: np.ndarray, frame: int) -> tuple[np.ndarray, np.ndarray]:
        """Births: the detection mask becomes the object's first (conditioning) output."""
        b, bank, n = self.backend, self.bank, len(obj_ids)
        binary = (det_masks >= 0.5).astype(np.float32)
        first = bank.pointers.allocate(n)
        out = b.run(self.graphs["mask_init"], {"tracker_feat": features["tracker_feat"],
                                               "masks": b.upload(binary[:, None])},
                    {"object_pointer": bank.pointers.view(first, n)})
        low_res = b.to_host(out["low_res_masks"])[:, 0]
        scores = b.to_host(out["object_score_logits"])[:, 0]
        for i, obj_id in enumerate(obj_ids):
            bank.add(obj_id, frame, MemoryEntry(first + i, float(scores[i]), low_res_mask=low_res[i]), cond=True)
        return binary, scores

    # ------------------------------------------------------------------------------- the frame
    def step(self, features, det: Detections, frame: int, reverse: bool, streaming: bool,
             num_frames: int | None) -> FrameOutput:
        objects, cfg = self.objects, self.config
        old_ids = list(objects.obj_ids)
        raw, track_masks, track_scores = self.propagate(features, frame, reverse, num_frames)

        plan: UpdatePlan = plan_frame(frame, reverse, streaming, det, track_masks, track_scores, objects, cfg)

        # planning's memory encoding (all tracked objects, soft masks)
        for obj_id in plan.reconditioned_obj_ids:
            self.bank.promote_to_cond(obj_id, frame)
        self.encode_memory(features, old_ids, frame, plan.memory_masks, plan.memory_scores, binarize=False)

        # execution: births, then (as the reference does on such frames) every object's memory re-encoded
        # from its thresholded raw mask, then removals
        quirks = cfg.match_reference_quirks
        if plan.new_obj_ids:
            new_binary, new_scores = self.add_objects(features, plan.new_obj_ids, det.masks[plan.new_det_inds], frame)
            again = [i for i, o in enumerate(old_ids) if quirks and not self.bank.has_cond(o, frame)]
            ids = [old_ids[i] for i in again] + plan.new_obj_ids
            logits = np.concatenate([raw[again], new_binary * 20.0 - 10.0])
            scores = np.concatenate([track_scores[again], new_scores])
            self.encode_memory(features, ids, frame, logits, scores, binarize=True)
        ids_after = [o for o in old_ids + plan.new_obj_ids if o not in plan.removed_obj_ids]
        for obj_id in plan.removed_obj_ids:
            self.bank.remove_object(obj_id)

        # outputs. Quirk kept for parity: the reference pairs the updated id list (new ids appended,
        # removed ones dropped) with the old frame's masks by position.
        paired_ids = ids_after if quirks else old_ids
        masks = {int(o): m for o, m in zip(paired_ids, plan.track_masks)}
        if plan.new_obj_ids:
            births = self._fill_holes(det.masks[plan.new_det_inds])
            masks.update({int(o): m for o, m in zip(plan.new_obj_ids, births)})
        for obj_id in plan.reconditioned_obj_ids:
            masks[int(obj_id)] = det.masks[plan.association.obj_to_high_conf_det[obj_id]]

        scores = dict(objects.score)
        tracker = objects.tracker_score[frame]
        for obj_id, d in zip(plan.new_obj_ids, plan.new_det_inds):
            scores[obj_id] = float(det.scores[d])
            tracker[obj_id] = float(det.scores[d])
        if plan.new_obj_ids:
            objects.max_obj_id = max(objects.max_obj_id, max(plan.new_obj_ids))
        for obj_id in plan.removed_obj_ids:
            scores[obj_id] = -1e4
            tracker[obj_id] = -1e4
            plan.last_occluded.pop(obj_id, None)
        tracker.update(zip(paired_ids, _sigmoid(track_scores).tolist()))
        objects.score = scores
        objects.last_occluded = plan.last_occluded
        objects.obj_ids = ids_after
        return FrameOutput(frame, masks, scores, dict(tracker), set(objects.removed))
