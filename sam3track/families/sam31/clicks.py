"""Clicks on a SAM 3.1 session's objects (Meta's add_sam2_new_points): a new object in a singleton
tracker state of its own, or a tracked one refined (extracted from its bucket the first time). A part
of Sam31Tracker kept apart from the frame loop (tracker.py): it uses the tracker's graphs, memory,
metadata and scores, and adds no state of its own beyond each TrackerState's points and refined frames.
"""

from __future__ import annotations

import numpy as np

from ...errors import CapacityError, PromptError
from . import heuristics
from .buckets import BucketRegistry
from .memory import FrameRecord, TrackerState
from .resize import bilinear, bilinear_antialias


class ClickPrompts:
    """Sam31Tracker's click operations (mixed into it)."""

    def add_clicked_object(self, frame: int, features: dict, obj_id: int, coords: np.ndarray,
                           labels: np.ndarray) -> np.ndarray:
        """Meta's add_sam2_new_points for a new object: a new singleton tracker state (3.1: a clicked
        object never joins an existing bucket; SAM 3 adds it to the one session state) whose
        conditioning frame is the clicked one. Returns the click's mask at video resolution."""
        state = TrackerState(BucketRegistry.for_objects([obj_id], self.config.multiplex_count))
        self.states.append(state)
        mask = self._apply_clicks(state, frame, features, obj_id, coords, labels)
        self.tracks.append(np.asarray([obj_id], np.int64), frame, self.config.init_trk_keep_alive)
        self._score_user_object(frame, obj_id)
        return mask

    def refine_object(self, frame: int, features: dict, obj_id: int, coords: np.ndarray, labels: np.ndarray,
                      keep_old_points: bool, first_interaction: bool) -> np.ndarray:
        """Meta's add_sam2_new_points for a tracked object (refinement). The first click on an object
        that shares its tracker state extracts it into a singleton state of its own
        (_extract_object_to_singleton_state: its slot in the old bucket becomes a hole; it keeps its
        outputs and pointers of every frame, but not its memories, which were its bucket's). The clicks
        (with this frame's earlier ones unless clear_old_points) then go through the interactive
        decoder on memory-free features, as a new object's would (Meta's gap-fill case on a frame
        not tracked in that state, its interaction-only first refinement on a tracked one), and the
        frame becomes a conditioning frame of the state. Returns the mask at video resolution."""
        where = f"add_prompt on frame {frame}"
        state = next(s for s in self.states if obj_id in s.obj_ids)
        if first_interaction and len(state.obj_ids) > 1:
            state = self._extract_to_singleton(state, obj_id)
        if len(state.obj_ids) > 1 or state.registry.positions()[obj_id] != (0, 0):
            # Meta's paths there (a gap fill batched with the state's other objects; a merge that moves the
            # object to slot 0) are not reproduced yet
            why = ("objects born since share its tracker state" if len(state.obj_ids) > 1 else
                   "it is alone in its tracker state but not in its first slot (its bucket-mates were removed)")
            raise PromptError(f"{where}: refining object {obj_id} is not supported for SAM 3.1 bundles when {why}; "
                              "click with a new obj_id to add the object again instead")
        refined = state.refined.setdefault(obj_id, set())
        if frame in state.tracked:
            if frame in refined:
                # Meta would decode the clicks with the previous mask as mask prompt, but its predictor as
                # built fails here (reference scenario refine_again): nothing to be in parity with
                raise PromptError(f"{where}: object {obj_id} was refined on this frame and tracked through it "
                                  "since; Meta's SAM 3.1 predictor cannot refine it there again (its tracker "
                                  "asserts iter_use_prev_mask_pred, which its builder leaves False). Click on "
                                  "another frame, or call reset() and prompt again")
            refined.add(frame)
            del state.tracked[frame]  # the frame is a conditioning frame again (Meta's merge forgets it)
        old = state.points.get((obj_id, frame))
        if keep_old_points and old is not None:
            coords, labels = np.concatenate([old[0], coords]), np.concatenate([old[1], labels])
        mask = self._apply_clicks(state, frame, features, obj_id, coords, labels)
        self._score_user_object(frame, obj_id)
        tracks = self.tracks
        if self.config.masklet_confirmation_enable:
            i = int(np.flatnonzero(tracks.obj_ids == obj_id)[0])
            # Meta writes status 1 here, which is UNCONFIRMED (its comment says it confirms the object)
            tracks.status[i] = heuristics.UNCONFIRMED
            tracks.consecutive_det[i] = self.config.masklet_confirmation_consecutive_det_thresh
        return mask

    def _score_user_object(self, frame: int, obj_id: int) -> None:
        self.obj_id_to_score[obj_id] = 1.0  # Meta scores user-prompted objects 1.0
        self.frame_tracker_probs.setdefault(frame, {})[obj_id] = 1.0

    def _extract_to_singleton(self, source: TrackerState, obj_id: int) -> TrackerState:
        """Meta's _extract_object_to_singleton_state: a new state holding only `obj_id`, with its
        masks, scores, conditioning flags and pointer (moved to slot 0) of every frame the source
        stored for it, and no memories (Meta's demux of the bucket memory fails its shape check and
        leaves None: those frames give pointers only). No frame counts as tracked in the new state.
        The source loses the object as by remove_object."""
        mem = self.memory
        state = TrackerState(BucketRegistry.for_objects([obj_id], self.config.multiplex_count))
        bucket, slot = source.registry.positions()[obj_id]
        moved = []  # (new record, the source's pointer row of the object's bucket)
        for kind, records in (("frames", source.frames), ("kept_cond", source.kept_cond)):
            for f, rec in records.items():
                if obj_id not in rec.masks:
                    continue
                new = FrameRecord(cond=rec.cond, masks={obj_id: rec.masks[obj_id].copy()},
                                  scores={obj_id: rec.scores[obj_id]}, pointer_rows=None,
                                  conditioning={obj_id} & rec.conditioning)
                getattr(state, kind)[f] = new
                if rec.pointer_rows is not None:  # None: evicted (fixed pools)
                    moved.append((new, rec.pointer_rows[bucket]))
        if moved:  # the object's pointers of every frame: one download, one upload
            b = self.backend
            pointers = b.to_host(mem.pointers.tensor, np.asarray([row for _, row in moved]))[:, slot]
            rows = mem.pointers.allocate(len(moved))
            mem.write_pointer_rows(rows, np.stack([state.registry.pack({obj_id: p})[0] for p in pointers]))
            for (new, _), row in zip(moved, rows):
                new.pointer_rows = [int(row)]
        state.points = {k: v for k, v in source.points.items() if k[0] == obj_id}
        self.remove_objects([obj_id])
        self.states.append(state)
        return state

    def _apply_clicks(self, state: TrackerState, frame: int, features: dict, obj_id: int, coords: np.ndarray,
                      labels: np.ndarray) -> np.ndarray:
        """The interactive decoder on the frame's memory-free interactive features for the clicks of
        one object of a one-object state; the result becomes the state's conditioning output on the
        frame (any earlier output there is dropped). Its stored mask takes Meta's trip through the
        video resolution (consolidation), and the memory is encoded from it. Returns the mask at
        video resolution (bool [H, W])."""
        cfg, b, mem = self.config, self.backend, self.memory
        n = len(labels)
        if b.plan(self.graphs["interactive_decoder"], "points", n) != n:
            # a fake point would change the mask, so point counts are never padded
            raise CapacityError(f"a prompt of {n} points on frame {frame}: the interactive_decoder was compiled "
                                f"for other point counts ({self.graphs['interactive_decoder'].sizes.get('points')}); "
                                "click fewer or more points, or convert the bundle with --gears points=...")
        multimask = cfg.multimask_output_in_sam and cfg.multimask_min_pt_num <= n <= cfg.multimask_max_pt_num
        inter = self.interactive(features)
        size = cfg.low_res_mask_size
        out = b.run(self.graphs["interactive_decoder"], {
            "interactive_feat_s0": inter["interactive_feat_s0"], "interactive_feat_s1": inter["interactive_feat_s1"],
            "interactive_feat": inter["interactive_feat"], "point_coords": coords[None].astype(np.float32),
            "point_labels": labels[None].astype(np.int32), "mask_prompt": np.zeros((1, 1, size, size), np.float32),
            "use_mask_prompt": np.zeros(1, np.float32), "multimask": np.asarray([1.0 if multimask else 0.0], np.float32)})
        low = b.to_host(out["low_res_masks"])[:, 0]
        score = float(b.to_host(out["object_score_logits"])[0, 0])
        pointer = b.to_host(out["object_pointer"])[0]
        h, w = self.video_hw
        video = bilinear(low, h, w)  # _get_orig_video_res_output (one object: no non-overlap)
        for records in (state.frames, state.kept_cond):
            old = records.pop(frame, None)
            if old is not None:
                mem.release_record(old)
        rows = mem.pointers.allocate(state.registry.num_buckets)
        mem.write_pointer_rows(rows, state.registry.pack({obj_id: pointer}))
        record = FrameRecord(cond=True, masks={obj_id: bilinear_antialias(video, size, size)[0]},
                             scores={obj_id: score}, pointer_rows=[int(r) for r in rows], conditioning={obj_id},
                             consolidated=True)
        state.frames[frame] = record
        state.points[(obj_id, frame)] = (coords, labels)
        image = cfg.image_size
        self._encode(features, [(state, record, {obj_id: bilinear(record.masks[obj_id][None], image, image)[0]})])
        return video[0] > 0
