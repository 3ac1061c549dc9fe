"""SAM 3.1's tracker and its frame as the shared phases, with Meta's multiplex rules in each phase
(Sam3MultiplexBase._det_track_one_frame_impl and the VideoTrackingMultiplexDemo tracker states).

`Sam31Tracker.step` runs one `Sam31Frame` through phases.run_frame; births and reconditioning live in
mask_inputs.py, clicks in clicks.py. How Meta's planning is kept free of changes, and the graph calls per
frame: docs/sam31.md, "The runtime's frame".
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np

from ...call_sizes import chunks, fixed_size, pad_rows
from ...errors import CapacityError, PromptError
from ...mask_ops import (fill_holes_in_mask_scores, objects_to_suppress_by_recent_occlusion,
                         sigmoid, suppress_object_pw_area_shrinkage)
from ...phases import FramePhases, run_frame
from . import heuristics
from .clicks import ClickPrompts
from .mask_inputs import MaskInputs
from .memory import FrameRecord, MultiplexMemory, TrackerState, propagation_feeds, select
from .resize import bilinear, bilinear_positive

MASK_SCORE = 10.0  # Meta's +-10 object scores by mask area
REMOVED_SCORE = -1e4
POOL_AXES = ("memory_rows", "image_rows", "pointer_rows")
BUCKET_INPUTS = ("memory_index", "memory_image_index", "memory_slot", "memory_valid", "pointer_index",
                 "pointer_offset", "pointer_valid", "slot_valid")


@dataclass
class Sam31Grounded:
    """The backbone + grounding phase's result."""

    features: dict  # the backbone's device tensors of the frame
    det: heuristics.Detections


@dataclass(frozen=True)
class BoxPrompt:
    """The boxes of a boxes add_prompt, as Meta's detector reads them (_get_visual_prompt)."""

    cxcywh: np.ndarray  # float32 [K, 4], normalised to the frame
    labels: np.ndarray  # int32 [K]: 1 positive, 0 negative


@dataclass
class Sam31Tracked:
    """The propagation phase's result: every tracked object, sorted by id."""

    obj_ids: np.ndarray  # int64 [M]
    masks: np.ndarray  # float32 [M, L, L] low-res logits
    scores: np.ndarray  # float32 [M] object score logits


@dataclass
class Sam31FramePlan:
    """The planning phase's decisions for one frame (SAM 3: planning.FramePlan)."""

    track_masks: np.ndarray  # the tracked objects' logits after occlusion suppression (memories read them)
    new_inds: np.ndarray  # detections that become objects, in id order
    new_ids: np.ndarray
    removed_ids: set[int]  # removed by the hotstart rule
    unconfirmed: list[int]
    dropped: int  # new detections over max_num_objects
    tracks: heuristics.TrackTable  # the metadata after this frame (hotstart counters, rows, confirmation)
    scores: dict[int, float]  # obj_id_to_score entries this frame sets: new objects, removed ones
    recondition: dict[int, int]  # tracked obj_id -> the detection that reconditions it (Meta's dict order)


@dataclass
class FrameOut:
    """One frame's output before post-processing (Meta's _run_single_frame_inference result)."""

    frame: int
    masks: dict[int, np.ndarray]  # obj_id -> bool [H, W] at video resolution
    unconfirmed: list[int] = field(default_factory=list)
    removed: set[int] = field(default_factory=set)  # removed by the hotstart rule on this frame
    stats: dict = field(default_factory=dict)
    scores: dict[int, float] = field(default_factory=dict)  # Meta's obj_id_to_score as of this frame


class Sam31Tracker(MaskInputs, ClickPrompts):
    """Everything one session tracks: tracker states, per-object metadata, the memory bank."""

    def __init__(self, backend, graphs, config, video_hw: tuple[int, int]):
        self.backend, self.graphs, self.config = backend, graphs, config
        self.video_hw = video_hw
        g = config.feature_grid
        decoder = graphs["propagation_decoder"]
        # an OM bundle's propagation decoder is compiled for fixed pools: the pools take its sizes
        fixed = {a: decoder.sizes[a][-1] for a in POOL_AXES if decoder.sizes.get(a)}
        if fixed and set(fixed) != set(POOL_AXES):
            raise CapacityError(f"the propagation_decoder fixes only {sorted(fixed)} of its pool axes {POOL_AXES}; "
                                "convert the bundle again with om.convert (it fixes all three)")
        self.memory = MultiplexMemory(backend, g * g, config.hidden_dim, config.multiplex_count, fixed=fixed or None)
        self.reset()

    # ------------------------------------------------------------------------------------ state
    def reset(self) -> None:
        """Meta's reset_state: forget every state, object and score."""
        if getattr(self, "states", None):
            for state in self.states:
                for record in state.records():
                    self.memory.release_record(record)
        self.states: list[TrackerState] = []
        self.tracks = heuristics.TrackTable()
        self.obj_id_to_score: dict[int, float] = {}
        self.frame_tracker_probs: dict[int, dict[int, float]] = {}  # frame -> obj_id -> tracker probability
        self.text = None  # (features host [1, T, D], mask int32 [1, T])

    @property
    def obj_ids(self) -> list[int]:
        return [int(o) for o in self.tracks.obj_ids]

    def close(self) -> None:
        self.reset()
        self.memory.close()

    # --------------------------------------------------------------------- 1. backbone, grounding
    def encode(self, pixel_values: np.ndarray, round_levels: bool) -> dict:
        """The backbone (ViT, detector neck, propagation neck) of one frame. round_levels: the tracker
        levels rounded to bfloat16, as Meta's single-frame grounding of a text add_prompt leaves them
        (its batched grounding during propagate_in_video keeps them in float32)."""
        self._round = np.asarray([1.0 if round_levels else 0.0], np.float32)
        return self.backend.run(self.graphs["backbone"], {"pixel_values": pixel_values, "round_levels": self._round})

    def interactive(self, features: dict) -> dict:
        """The interactive neck of the same frame (births and clicks read it)."""
        return self.backend.run(self.graphs["interactive_neck"], {"trunk_features": features["trunk_features"],
                                                                  "round_levels": self._round})

    def set_text(self, input_ids: np.ndarray) -> None:
        b = self.backend
        out = b.run(self.graphs["text_encoder"], {"input_ids": input_ids})
        self.text = (b.to_host(out["text_features"]), b.to_host(out["text_mask"]).astype(np.int32))

    def detect(self, features: dict, boxes: "BoxPrompt | None" = None) -> heuristics.Detections:
        """The detector on one frame: the text prompt, and `boxes` as well on the frame of a boxes
        add_prompt (Meta's per_frame_geometric_prompt, which only its single-frame grounding reads)."""
        if self.text is None:
            raise PromptError("no text prompt in this session; call session.add_prompt(frame_index, text=...) first")
        b = self.backend
        feeds = {"detector_fpn0": features["detector_fpn0"], "detector_fpn1": features["detector_fpn1"],
                 "detector_fpn2": features["detector_fpn2"], "text_features": self.text[0], "text_mask": self.text[1]}
        if boxes is None:
            out = b.run(self.graphs["grounding_head"], feeds)
        else:
            graph = self.graphs["box_grounding_head"]
            k = len(boxes.labels)
            size = fixed_size(b, graph, "boxes", k, "this box prompt", "convert the bundle with larger --gears boxes=...")
            pad = size - k  # padding boxes: box_valid 0, so no token attends to them
            out = b.run(graph, {**feeds,
                                "boxes": np.concatenate([boxes.cxcywh, np.full((pad, 4), 0.5, np.float32)])[None],
                                "box_labels": np.concatenate([boxes.labels, np.ones(pad, np.int32)])[None],
                                "box_valid": np.concatenate([np.ones(k, np.int32), np.zeros(pad, np.int32)])[None]})
        return heuristics.filter_detections(b.to_host(out["pred_logits"])[0], b.to_host(out["pred_boxes"])[0],
                                   b.to_host(out["pred_masks"])[0], self.config)

    # --------------------------------------------------------------------------- 2. propagation
    def propagate(self, frame: int, reverse: bool, num_frames: int, features: dict):
        """Every state's objects on `frame`: consolidated frames (births, prompts) reuse their stored
        output; the others run the propagation decoder, all their buckets in one call. Returns
        (obj_ids sorted, low-res logits [M, L, L], object score logits [M])."""
        cfg, b, mem = self.config, self.backend, self.memory
        calls = []
        for state in self.states:
            if not state.obj_ids:
                continue
            record = state.frames.get(frame)
            if record is None or not record.consolidated:
                sel = select(frame, state, num_frames, reverse, cfg.num_maskmem, cfg.max_cond_frames_in_attn,
                             cfg.max_obj_ptrs_in_encoder)
                calls.append((state, frame, sel))
        if calls:
            graph = self.graphs["propagation_decoder"]

            def entries(axis: str, n: int) -> int:
                return fixed_size(b, graph, axis, n, f"frame {frame}", "convert the bundle with larger --gears "
                                  f"{axis} (om.sam31.capacities gives the most Meta's selection reads)")

            feeds = propagation_feeds(calls, entries)
            total = feeds["slot_valid"].shape[0]
            rows = mem.pointers.allocate(total)
            masks, scores = [], []
            # every bucket of every state in one call, or in chunks of the compiled bucket gears
            for chunk in chunks(b, graph, "buckets", total):
                part = rows[chunk.items]
                target = mem.pointers.target(part, chunk.size)
                out = b.run(graph, {
                    "tracker_feat_s0": features["tracker_feat_s0"], "tracker_feat_s1": features["tracker_feat_s1"],
                    "tracker_feat": features["tracker_feat"], "memory_pool": mem.memories.tensor,
                    "image_pool": mem.images.tensor, "pointer_pool": mem.pointers.tensor,
                    **{k: pad_rows(feeds[k][chunk.items], chunk.size) for k in BUCKET_INPUTS}},
                    {"object_pointer": target})
                mem.pointers.commit(part, target)
                masks.append(b.to_host(out["low_res_masks"])[:chunk.count, :, 0])
                scores.append(b.to_host(out["object_score_logits"])[:chunk.count, :, 0])
            masks, scores = np.concatenate(masks), np.concatenate(scores)
            start = 0
            for state, _, _ in calls:
                nb = state.registry.num_buckets
                old = state.frames.pop(frame, None)
                if old is not None and old.cond:
                    state.kept_cond[frame] = old  # an extracted conditioning output stays beside the new one
                elif old is not None:
                    mem.release_record(old)
                state.frames[frame] = FrameRecord(
                    cond=False, masks=state.registry.unpack(masks[start:start + nb]),
                    scores={o: float(s) for o, s in state.registry.unpack(scores[start:start + nb]).items()},
                    pointer_rows=[int(r) for r in rows[start:start + nb]])
                start += nb
        ids, masks, scores = [], [], []
        for state in self.states:
            if not state.obj_ids:
                continue
            state.tracked[frame] = reverse
            record = state.frames[frame]
            for o in state.obj_ids:
                ids.append(o)
                masks.append(record.masks[o])
                scores.append(record.scores[o])
        order = np.argsort(ids, kind="stable")
        size = cfg.low_res_mask_size
        return (np.asarray(ids, np.int64)[order],
                np.asarray(masks, np.float32).reshape(-1, size, size)[order],
                np.asarray(scores, np.float32)[order])

    def evict(self, frame: int, reverse: bool, num_frames: int, pinned=frozenset(), obj_ids=None,
              stream: bool = False) -> None:
        """Fixed pools (an OM bundle) free what the next frame in this direction cannot read, in the
        states this pass tracks (those holding `obj_ids`, all when None); growing pools keep every
        frame's memories, as Meta's predictor does. A live stream always evicts, and forgets the
        frames left with nothing to read (its frames only come later: nothing it drops is read again)."""
        if self.memory.fixed or stream:
            cfg = self.config
            states = [s for s in self.states if obj_ids is None or set(obj_ids) & set(s.obj_ids)]
            self.memory.evict(states, frame, reverse, cfg.num_maskmem, min(num_frames, cfg.max_obj_ptrs_in_encoder),
                              pinned, forget=stream)
        if stream:
            for old in [f for f in self.frame_tracker_probs if f < frame]:
                del self.frame_tracker_probs[old]

    # --------------------------------------------------------------------------------- memories
    def _encode(self, features: dict, items: list[tuple[TrackerState, FrameRecord, dict[int, np.ndarray]]]) -> None:
        """One memory_encoder call for the buckets of several states on one frame: per state its
        record on the frame and the per-object mask logits (all at one side, 14F or 16F)."""
        b, mem, k = self.backend, self.memory, self.config.multiplex_count
        side = next(iter(items[0][2].values())).shape[-1]
        masks, valid, cond, scores = [], [], [], []
        for state, record, per_obj in items:
            reg = state.registry
            masks.append(reg.pack(per_obj))
            valid.append(reg.slot_valid())
            cond.append(reg.pack({o: 1.0 if o in record.conditioning else 0.0 for o in state.obj_ids}))
            scores.append(reg.pack({o: record.scores[o] for o in state.obj_ids}))
        total = sum(v.shape[0] for v in valid)
        rows = mem.memories.allocate(total)
        graph = self.graphs["memory_encoder"]
        feeds = {"mask_logits": np.concatenate(masks).reshape(total, k, side, side),
                 "slot_valid": np.concatenate(valid), "conditioning": np.concatenate(cond).astype(np.float32),
                 "object_score_logits": np.concatenate(scores).astype(np.float32)}
        image_row = None
        for chunk in chunks(b, graph, "buckets", total):
            part = rows[chunk.items]
            target = mem.memories.target(part, chunk.size)
            out = b.run(graph, {"tracker_feat": features["tracker_feat"],
                                **{name: pad_rows(v[chunk.items], chunk.size) for name, v in feeds.items()}},
                        {"maskmem_features": target})
            mem.memories.commit(part, target)
            if image_row is None:  # the frame's image features: the same from every chunk
                image_row = mem.new_image_row(out["image_features"])
        start = 0
        for state, record, _ in items:
            nb = state.registry.num_buckets
            if record.memory_rows is not None:
                mem.memories.release(record.memory_rows)
            record.memory_rows = [int(r) for r in rows[start:start + nb]]
            mem.hold_image(record, image_row)
            start += nb
        mem.drop_unreferenced_image(image_row)

    def update_memories(self, frame: int, features: dict, trk_ids: np.ndarray, trk_masks: np.ndarray) -> None:
        """Meta's _tracker_update_memories: every tracked object's mask (after occlusion suppression)
        at 16F, the area-shrinkage rule over all objects of all states (3.1: globally; SAM 3 per
        prompt), object scores +-10 by area, each state's record on the frame re-encoded."""
        side = self.config.input_mask_size
        high = suppress_object_pw_area_shrinkage(bilinear(trk_masks, side, side))
        by_id = {int(o): high[i] for i, o in enumerate(trk_ids)}
        items = []
        for state in self.states:
            if not state.obj_ids or frame not in state.frames:
                continue
            record = state.frames[frame]
            per_obj = {o: by_id[o] for o in state.obj_ids}
            # the encoder sees +-10 scores by area; the record keeps the tracker's own (Meta stores them)
            saved = record.scores
            record.scores = {o: (MASK_SCORE if (per_obj[o] > 0).any() else -MASK_SCORE) for o in state.obj_ids}
            items.append((state, record, per_obj, saved))
        if items:
            self._encode(features, [(s, r, m) for s, r, m, _ in items])
            for _, record, _, saved in items:
                record.scores = saved

    # ---------------------------------------------------------------------------------- removals
    def remove_objects(self, obj_ids) -> None:
        """Meta's _tracker_remove_objects: holes in the buckets, empty buckets sliced out of every
        stored frame, empty states dropped. The bucket-mates keep the past memories (which still hold
        the removed object) and from now on see its slot as invalid and its pointer as 0."""
        gone = set(int(o) for o in obj_ids)
        kept_states = []
        for state in self.states:
            if not gone & set(state.obj_ids):
                kept_states.append(state)
                continue
            keep = state.registry.remove(gone)
            self.memory.keep_buckets(state, keep)
            for record in state.records():
                for o in gone:
                    record.masks.pop(o, None)
                    record.scores.pop(o, None)
                    record.conditioning.discard(o)
            for key in [k for k in state.points if k[0] in gone]:
                del state.points[key]
            if state.obj_ids:
                kept_states.append(state)
            else:
                for record in state.records():
                    self.memory.release_record(record)
        self.states = kept_states

    def propagate_objects(self, frame: int, reverse: bool, num_frames: int, features: dict,
                          obj_ids: list[int]) -> dict[int, tuple[float, np.ndarray]]:
        """Meta's propagation_partial step: only the states holding `obj_ids` are tracked, each
        encoding its own memory right away (run_mem_encoder=True: the decoder's mask at 14F, its raw
        object score, no conditioning flags, no non-overlap across states). Returns obj_id ->
        (object score logit, low-res logits) for the objects asked for."""
        wanted = set(obj_ids)
        original = list(self.states)
        states = [s for s in original if wanted & set(s.obj_ids)]
        self.states = states
        try:
            fresh = {id(s) for s in states if not (frame in s.frames and s.frames[frame].consolidated)}
            ids, masks, scores = self.propagate(frame, reverse, num_frames, features)
        finally:
            self.states = original
        image = self.config.image_size
        items = []
        for state in states:
            if id(state) not in fresh:
                continue
            record = state.frames[frame]
            high = bilinear(np.stack([record.masks[o] for o in state.obj_ids]), image, image)
            items.append((state, record, {o: high[i] for i, o in enumerate(state.obj_ids)}))
        if items:
            self._encode(features, items)
        return {int(o): (float(s), m) for o, m, s in zip(ids, masks, scores) if int(o) in wanted}

    # ----------------------------------------------------------------------------------- a frame
    def step(self, frame: int, reverse: bool, num_frames: int, pixel_values: np.ndarray,
             round_levels: bool, boxes: "BoxPrompt | None" = None) -> FrameOut:
        """One frame through the shared phases (phases.run_frame), as SAM 3's FrameLoop.step."""
        return run_frame(Sam31Frame(self, frame, reverse, num_frames, pixel_values, round_levels, boxes))

    def plan(self, frame: int, reverse: bool, det: heuristics.Detections, tracked: Sam31Tracked) -> Sam31FramePlan:
        """Meta's run_tracker_update_planning_phase, decided without changing the tracker: IoM
        association, hotstart, occlusion suppression, the new objects under the cap, and the metadata
        after the frame (removed rows out, new rows appended, confirmation), all on a copy of the
        metadata that `execute` installs. Meta also encodes the tracked objects' memories in this phase;
        here `execute` does, first, so the graph calls keep Meta's order (memories, then births)."""
        cfg = self.config
        tracks = copy.deepcopy(self.tracks)  # hotstart and the bookkeeping update it in place
        prev_ids = tracks.obj_ids.copy()
        assoc = heuristics.associate(det, tracked.masks, cfg)
        to_remove = heuristics.hotstart(frame, reverse, assoc, tracks, cfg)
        recondition = self._recondition_plan(frame, det, tracked, assoc, prev_ids)
        trk_masks = tracked.masks
        if recondition:
            # Meta's _recondition_masklets, before the occlusion rule reads the masks: where the detection
            # and the track disagree on a pixel's side, the detection's logit wins
            trk_masks = trk_masks.copy()
            rows = [int(np.flatnonzero(prev_ids == o)[0]) for o in recondition]
            new = det.masks[list(recondition.values())]
            old = trk_masks[rows]
            merged = np.where((new > 0) == (old > 0), old, new)
            trk_masks[rows] = fill_holes_in_mask_scores(merged, cfg.fill_hole_area)
        if prev_ids.size and cfg.suppress_overlapping_based_on_recent_occlusion_threshold > 0.0:
            last = np.where(to_remove, heuristics.ALWAYS_OCCLUDED, tracks.last_occluded)
            binary = trk_masks > 0
            suppress = objects_to_suppress_by_recent_occlusion(
                binary, last, cfg.suppress_overlapping_based_on_recent_occlusion_threshold, reverse) \
                if prev_ids.size > 1 else np.zeros(prev_ids.size, bool)
            occluded = ~binary.reshape(prev_ids.size, -1).any(1) | suppress
            tracks.last_occluded = np.where(occluded, frame, last)
            trk_masks = np.where(suppress[:, None, None], np.float32(-10.0), trk_masks)
        new_inds = np.flatnonzero(assoc.is_new_det)
        dropped = 0
        if prev_ids.size + new_inds.size > cfg.max_num_objects:
            room = cfg.max_num_objects - prev_ids.size
            dropped = new_inds.size - room
            if room <= 0:
                new_inds = new_inds[:0]
            elif room < new_inds.size:  # the top-scoring ones, in descending score order
                new_inds = new_inds[np.argsort(det.scores[new_inds], kind="stable")[::-1][:room]]
        new_ids = np.arange(tracks.max_obj_id + 1, tracks.max_obj_id + 1 + new_inds.size, dtype=np.int64)
        removed_ids = set(int(o) for o in prev_ids[to_remove])
        matched = assoc.det_to_matched_trk_obj_ids(det, prev_ids)
        # metadata: the removed rows go, the new ones are appended (Meta's order)
        prev_status, prev_consecutive = tracks.status, tracks.consecutive_det
        tracks.keep_rows(~to_remove)
        tracks.append(new_ids, frame, cfg.init_trk_keep_alive)
        scores = {int(o): float(det.scores[i]) for o, i in zip(new_ids, new_inds)}
        scores.update({o: REMOVED_SCORE for o in removed_ids})
        unconfirmed = []
        if cfg.masklet_confirmation_enable:
            hit = set(int(o) for o in new_ids)
            for ids in matched.values():
                hit.update(int(o) for o in ids)
            heuristics.update_confirmation(tracks, prev_ids, prev_status, prev_consecutive, hit, cfg)
            unconfirmed = [int(o) for o in tracks.obj_ids[tracks.status == heuristics.UNCONFIRMED]]
        return Sam31FramePlan(trk_masks, new_inds, new_ids, removed_ids, unconfirmed, dropped, tracks, scores,
                         recondition)

    def _recondition_plan(self, frame: int, det: heuristics.Detections, tracked: Sam31Tracked,
                          assoc: heuristics.Association, prev_ids: np.ndarray) -> dict[int, int]:
        """Which tracks Meta reconditions on this frame (its should_recondition_periodic, then the
        filter of _recondition_masklets): on every recondition_every_nth_frame-th frame, each kept,
        confident (>= 0.8), unambiguously overlapping detection names the track it overlaps most (a later
        detection naming the same track wins), and that track is reconditioned if its tracker
        probability is > 0.8. Both 0.8s are constants in Meta's code, not config values."""
        n = self.config.recondition_every_nth_frame
        if not (n > 0 and frame % n == 0 and prev_ids.size):
            return {}
        candidates: dict[int, int] = {}
        for d in np.flatnonzero(det.keep & assoc.det_high_conf_and_iou):
            candidates[int(prev_ids[assoc.det_to_max_trk[d]])] = int(d)
        probs = sigmoid(tracked.scores, np.float64)
        row = {int(o): i for i, o in enumerate(prev_ids)}
        return {o: d for o, d in candidates.items() if probs[row[o]] > np.float32(heuristics.HIGH_CONF_THRESH)}

    def execute(self, frame: int, features: dict, det: heuristics.Detections, tracked: Sam31Tracked,
                plan: Sam31FramePlan) -> None:
        """Apply the plan: reconditioning, the tracked objects' memories (the memory half of Meta's
        planning phase), the metadata and scores, then Meta's run_tracker_update_execution_phase: births
        (all of the frame's in one state), then removals; last the tracker probabilities (Meta's
        build_outputs)."""
        if plan.recondition:
            self.recondition(frame, features, det, plan.recondition)
        if tracked.obj_ids.size:
            self.update_memories(frame, features, tracked.obj_ids, plan.track_masks)
        self.tracks = plan.tracks
        self.obj_id_to_score.update(plan.scores)
        frame_scores = self.frame_tracker_probs.setdefault(frame, {})
        frame_scores.update(plan.scores)
        if plan.new_ids.size:
            self.add_objects(frame, features, [int(o) for o in plan.new_ids], det.masks[plan.new_inds])
        if plan.removed_ids:
            self.remove_objects(plan.removed_ids)
        # tracker probabilities of the tracked objects, set last as Meta does: they override the
        # removal score on the removal frame
        frame_scores.update({int(o): float(p) for o, p in zip(tracked.obj_ids, sigmoid(tracked.scores, np.float64))})

    def outputs(self, frame: int, det: heuristics.Detections, tracked: Sam31Tracked, plan: Sam31FramePlan) -> FrameOut:
        """Meta's build_outputs: the tracked objects (after occlusion suppression; removed ones
        included on their removal frame) and the new objects' detections, at video resolution."""
        h, w = self.video_hw
        masks = {}
        if tracked.obj_ids.size:
            video = bilinear_positive(plan.track_masks, h, w)
            masks.update({int(o): video[i] for i, o in enumerate(tracked.obj_ids)})
        if plan.new_ids.size:
            video = bilinear_positive(det.masks[plan.new_inds], h, w)
            masks.update({int(o): video[i] for i, o in enumerate(plan.new_ids)})
        stats = {"num_obj_tracked": int(self.tracks.obj_ids.size), "num_obj_dropped": int(plan.dropped)}
        return FrameOut(frame, masks, plan.unconfirmed, plan.removed_ids, stats, dict(self.obj_id_to_score))


@dataclass
class Sam31Frame(FramePhases[Sam31Grounded, Sam31Tracked, Sam31FramePlan, FrameOut]):
    """One SAM 3.1 frame as the shared phases: each phase is the Sam31Tracker operation of that name."""

    tracker: Sam31Tracker
    frame: int
    reverse: bool
    num_frames: int
    pixel_values: np.ndarray
    round_levels: bool
    boxes: "BoxPrompt | None" = None

    def ground(self) -> Sam31Grounded:
        features = self.tracker.encode(self.pixel_values, self.round_levels)
        return Sam31Grounded(features, self.tracker.detect(features, self.boxes))

    def propagate(self, grounded: Sam31Grounded) -> Sam31Tracked:
        t = self.tracker
        tracked = Sam31Tracked(*t.propagate(self.frame, self.reverse, self.num_frames, grounded.features))
        assert np.array_equal(tracked.obj_ids, t.tracks.obj_ids), (tracked.obj_ids, t.tracks.obj_ids)
        return tracked

    def plan(self, grounded: Sam31Grounded, tracked: Sam31Tracked) -> Sam31FramePlan:
        return self.tracker.plan(self.frame, self.reverse, grounded.det, tracked)

    def execute(self, grounded: Sam31Grounded, tracked: Sam31Tracked, plan: Sam31FramePlan) -> None:
        self.tracker.execute(self.frame, grounded.features, grounded.det, tracked, plan)

    def outputs(self, grounded: Sam31Grounded, tracked: Sam31Tracked, plan: Sam31FramePlan) -> FrameOut:
        return self.tracker.outputs(self.frame, grounded.det, tracked, plan)
