"""Masks given to SAM 3.1's tracker (Meta's add_new_masks): births from detections, into a new tracker
state or the free slots of an existing one, and reconditioning, where a confident detection rebuilds a
tracked object's output on the frame. A part of Sam31Tracker kept apart from the frame loop
(tracker.py), as the clicks are (clicks.py): it uses the tracker's graphs, memory and states.
"""

from __future__ import annotations

import numpy as np

from ...call_sizes import chunks, pad_rows
from ...mask_ops import apply_non_overlapping_constraints
from . import heuristics
from .buckets import BucketRegistry
from .memory import FrameRecord, TrackerState
from .resize import bilinear, bilinear_antialias_over, bilinear_positive

NO_OBJ_SCORE = 1024.0  # Meta's -NO_OBJ_SCORE / NO_OBJ_SCORE for user (and birth) masks at video resolution


def state_record_is_cond(state: TrackerState, frame: int) -> bool:
    record = state.frames.get(frame)
    return record is not None and record.cond


class MaskInputs:
    """Sam31Tracker's births and reconditioning (mixed into it)."""

    def _interactive_of(self, features: dict) -> dict:
        """The frame's interactive neck, run once however many of births and reconditioning read it."""
        if "_interactive" not in features:
            features["_interactive"] = self.interactive(features)
        return features["_interactive"]

    def _mask_init(self, features: dict, det_logits: np.ndarray):
        """Meta's _use_mask_as_output on detector masks (its bilinear to 16F, > 0, happens inside the
        graph): per mask the object pointer, the object score logit and the low-res mask."""
        b, graph = self.backend, self.graphs["mask_init"]
        inter = self._interactive_of(features)
        logits = det_logits[:, None].astype(np.float32)
        pointers, scores, low = [], [], []
        for chunk in chunks(b, graph, "objects", logits.shape[0]):
            out = b.run(graph, {"interactive_feat": inter["interactive_feat"],
                                "mask_logits": pad_rows(logits[chunk.items], chunk.size)})
            pointers.append(b.to_host(out["object_pointer"])[:chunk.count])
            scores.append(b.to_host(out["object_score_logits"])[:chunk.count, 0])
            low.append(b.to_host(out["low_res_masks"])[:chunk.count, 0])
        return np.concatenate(pointers), np.concatenate(scores), np.concatenate(low)

    def _input_masks(self, det_logits: np.ndarray) -> np.ndarray:
        """Meta's add_new_masks on detector masks: bilinear to 16F, > 0; at video resolution (antialiased,
        > 0.5) each mask loses the pixels of the others given with it; back to low-res logits from
        +-NO_OBJ_SCORE (what its consolidation stores for them)."""
        cfg = self.config
        side = cfg.input_mask_size
        binary = bilinear_positive(det_logits, side, side)
        h, w = self.video_hw
        # the resizes of these masks are computed around each object only (the rest of a plane is its
        # background's resize): the same values as resizing every plane whole
        video = bilinear_antialias_over(binary.astype(np.float32), h, w, 0.0) > 0.5
        # a pixel stays only in a mask no other mask covers: one count, not N reductions over N - 1 masks
        wiped = video & (video.sum(axis=0, dtype=np.int32) == 1)
        size = cfg.low_res_mask_size
        return bilinear_antialias_over(np.where(wiped, NO_OBJ_SCORE, -NO_OBJ_SCORE).astype(np.float32), size, size,
                                       -NO_OBJ_SCORE)

    def add_objects(self, frame: int, features: dict, obj_ids: list[int], det_logits: np.ndarray) -> None:
        """Meta's _tracker_add_new_objects: the best-fitting state (fewest free slots that still hold
        them all) or a new one; masks from the detector logits (bilinear to 16F, > 0); the pointer from
        mask_init on the interactive features; the masks at video resolution wipe one another
        (add_new_masks); the state's memory of the frame re-encoded from the consolidated masks."""
        cfg, mem = self.config, self.memory
        n = len(obj_ids)
        best = None
        for state in self.states:
            free = state.registry.available_slots
            if free >= n and (best is None or free < best.registry.available_slots):
                best = state
        pointers, init_scores, init_low = self._mask_init(features, det_logits)
        wiped_low = self._input_masks(det_logits)
        if best is None:
            state = TrackerState(BucketRegistry.for_objects(list(obj_ids), cfg.multiplex_count))
            reg = state.registry
            rows = mem.pointers.allocate(reg.num_buckets)
            packed = reg.pack({o: pointers[i] for i, o in enumerate(obj_ids)})
            mem.write_pointer_rows(rows, packed)
            record = FrameRecord(cond=True, masks={o: wiped_low[i] for i, o in enumerate(obj_ids)},
                                 scores={o: float(init_scores[i]) for i, o in enumerate(obj_ids)},
                                 pointer_rows=[int(r) for r in rows], conditioning=set(obj_ids), consolidated=True)
            state.frames[frame] = record
            self.states.append(state)
        elif state_record_is_cond(best, frame):
            # Births into an existing state on one of its conditioning frames (the prompt frame tracked
            # again): Meta adds them to that frame's stored output in place -- masks (mask_init's, not
            # wiped), scores, pointers, conditioning flags -- and its re-encoded consolidation lands in
            # non_cond_frame_outputs, which it then drops (an output on a conditioning frame wins):
            # the frame's memory stays the one encoded before the births.
            state, record = best, best.frames[frame]
            state.registry.add(list(obj_ids))
            for i, o in enumerate(obj_ids):
                record.masks[o] = init_low[i]
                record.scores[o] = float(init_scores[i])
            record.conditioning |= set(obj_ids)
            mem.set_pointer_slots(record, state.registry, {o: pointers[i] for i, o in enumerate(obj_ids)})
            return
        else:
            # Births into an existing state: its empty slots, and the frame stays a NON-conditioning
            # frame (it was tracked already), the newcomers only flagged in the conditioning channel.
            state = best
            record = state.frames[frame]
            state.registry.add(list(obj_ids))
            # the existing objects keep their propagated masks (Meta's consolidation falls back to their
            # per-object outputs of the frame); the newcomers get their wiped video-resolution masks
            for i, o in enumerate(obj_ids):
                record.masks[o] = wiped_low[i]
                record.scores[o] = float(init_scores[i])
            record.conditioning |= set(obj_ids)
            record.consolidated = True
            mem.set_pointer_slots(record, state.registry, {o: pointers[i] for i, o in enumerate(obj_ids)})
        state.tracked.setdefault(frame, False)
        # propagate_in_video_preflight: the consolidated masks at 14F, pixel argmax over the state
        image = cfg.image_size
        ids = state.obj_ids
        high = apply_non_overlapping_constraints(bilinear(np.stack([record.masks[o] for o in ids]), image, image))
        self._encode(features, [(state, record, {o: high[i] for i, o in enumerate(ids)})])

    # ------------------------------------------------------------------------------ reconditioning
    def recondition(self, frame: int, features: dict, det: heuristics.Detections, recondition: dict[int, int]) -> None:
        """Meta's _recondition_masklets after its filter: per tracker state (in the order its objects
        come), add_new_masks(reconditioning=True) with the detections' masks, then
        propagate_in_video_preflight. Each object's slots of the frame's output take mask_init's pointer
        and object score and the object becomes a conditioning object of the frame (the frame itself
        stays what it was); the stored mask is mask_init's on a conditioning frame (Meta edits that
        output in place and drops the consolidation) and the consolidated +-NO_OBJ_SCORE mask on a
        tracked one. The frame's memory is encoded afterwards by update_memories, as Meta's
        _tracker_update_memories overwrites what the preflight encoded."""
        groups: dict[int, tuple[TrackerState, list[int]]] = {}
        for o in recondition:
            state = next(s for s in self.states if o in s.obj_ids)
            groups.setdefault(id(state), (state, []))[1].append(o)
        for state, objs in groups.values():
            logits = det.masks[[recondition[o] for o in objs]]
            pointers, scores, low = self._mask_init(features, logits)
            record = state.frames[frame]
            stored = low if record.cond else self._input_masks(logits)
            for i, o in enumerate(objs):
                record.masks[o] = stored[i]
                record.scores[o] = float(scores[i])
            record.conditioning |= set(objs)
            record.consolidated = True
            self.memory.set_pointer_slots(record, state.registry, {o: pointers[i] for i, o in enumerate(objs)})
