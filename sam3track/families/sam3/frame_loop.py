"""SAM 3's frame: its phases (the reference's `_det_track_one_frame`), run by the shared runner.

`FrameLoop.step` runs one `Sam3Frame` through phases.run_frame, which fixes the order and what each
phase may change; planning.py makes the decisions. A prompt call (`apply_clicks`) is not a tracked frame
and does not go through the phases. SAM 3's part of each phase, and how user-prompted objects go through
them: docs/architecture.md, "A frame's phases".
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np

from ... import mask_ops
from ...backends import Backend, DeviceTensor
from ...call_sizes import chunks, fixed_size, pad_rows
from ...errors import CapacityError, CapacityWarning
from ...phases import FramePhases, run_frame
from .memory import MemoryBank, MemoryEntry
from .objects import ObjectRegistry
from .planning import BirthsNotMade, Detections, FramePlan, PoolRoom, plan_frame

REMOVED_SCORE = -1e4  # what the reference reports for objects its heuristics removed on this frame


@dataclass
class FrameOutput:
    """What the reference's forward() returns for a frame, before post-processing."""

    frame_index: int
    masks: dict[int, np.ndarray]  # obj id -> low-res logits [L, L]
    scores: dict[int, float]  # obj id -> detection score (at birth)
    tracker_scores: dict[int, float]  # obj id -> tracker probability on this frame
    prompts: dict[int, int]  # obj id -> prompt index
    removed: set[int]  # removed on this frame by the hotstart rules or retirement
    suppressed: set[int] = field(default_factory=set)  # hidden on this frame only
    user_objects: set[int] = field(default_factory=set)  # user-prompted: shown as the tracker gives them


@dataclass
class Propagation:
    obj_ids: list[int]
    raw: np.ndarray  # [N, L, L] the tracker's logits (what a conditioning frame keeps)
    masks: np.ndarray  # [N, L, L] after hole filling (what planning reads)
    scores: np.ndarray  # [N] object score logits

    def take(self, obj_ids: list[int]) -> "Propagation":
        row_of = {o: i for i, o in enumerate(self.obj_ids)}
        rows = [row_of[o] for o in obj_ids]
        return Propagation(list(obj_ids), self.raw[rows], self.masks[rows], self.scores[rows])


@dataclass
class Grounded:
    """Phase 1's result: the frame's backbone features and its detections over all text prompts."""

    features: dict[str, DeviceTensor]
    det: Detections


@dataclass
class Tracked:
    """Phase 2's result, and what the outputs report for the objects as they were before the frame."""

    managed: ObjectRegistry  # the text-detected objects the heuristics manage, as before the frame
    detected: Propagation  # their outputs, in managed.obj_ids order
    user: Propagation  # the user-prompted objects' outputs
    prompts: dict[int, int]  # managed obj id -> prompt index before the frame
    scores: dict[int, float]  # managed obj id -> detection score before the frame


@dataclass
class ClickRequest:
    """One object's clicks and box on a frame, ready for the interactive decoder."""

    obj_id: int
    coords: np.ndarray  # float32 [P, 2], model-input pixels
    labels: np.ndarray  # int32 [P]
    use_memory: bool  # refine with the object's memory (a frame it was tracked on), else start afresh
    multimask: bool


class FrameLoop:
    def __init__(self, backend: Backend, graphs, config, bank: MemoryBank, objects: ObjectRegistry):
        # `graphs` is the predictor's own mapping: closing the predictor empties it for everyone
        self.backend, self.graphs, self.config = backend, graphs, config
        self.bank, self.objects = bank, objects

    # ----------------------------------------------------------------- 1. backbone + grounding
    def encode_frame(self, pixels: np.ndarray) -> dict[str, DeviceTensor]:
        b, graph = self.backend, self.graphs["backbone"]
        size = fixed_size(b, graph, "images", 1, "a frame", "convert the bundle with --gears images=1")
        out = b.run(graph, {"pixel_values": pad_rows(pixels, size)})
        return out if size == 1 else {name: b.rows(t, 0, 1) for name, t in out.items()}

    def detect(self, features, text_features: DeviceTensor, text_mask: np.ndarray, num_prompts: int) -> Detections:
        """text_features: the session's prompt pool, laid out by `chunks` over "prompts" (padding rows
        included); text_mask: its host attention masks, row for row."""
        b, cfg, graph = self.backend, self.config, self.graphs["grounding_head"]
        probs, boxes, candidates, masks_of = [], [], [], []
        for chunk in chunks(b, graph, "prompts", num_prompts):
            inputs = {f"detector_fpn{i}": features[f"detector_fpn{i}"] for i in range(3)}
            inputs.update(text_features=b.rows(text_features, chunk.start, chunk.size),
                          text_mask=text_mask[chunk.start:chunk.start + chunk.size])
            out = b.run(graph, inputs)
            real = {name: b.rows(out[name], 0, chunk.count) for name in ("pred_logits", "presence_logits",
                                                                         "pred_boxes", "pred_masks")}
            p = mask_ops.sigmoid(b.to_host(real["pred_logits"])) * mask_ops.sigmoid(b.to_host(real["presence_logits"]))
            probs.append(p)
            boxes.append(b.to_host(real["pred_boxes"]))
            found = [np.flatnonzero(p[k] > cfg.score_threshold_detection) for k in range(chunk.count)]
            candidates += found
            # only candidates above threshold leave the device, a chunk's prompts in one copy
            pred = real["pred_masks"]
            q = pred.shape[1]
            if any(c.size for c in found):
                flat = b.reshape(pred, (chunk.count * q,) + tuple(pred.shape[2:]))
                masks_of.append(b.to_host(flat, rows=np.concatenate([k * q + c for k, c in enumerate(found)])))
        probs, boxes = np.concatenate(probs), np.concatenate(boxes)
        size = cfg.low_res_mask_size
        if not any(c.size for c in candidates):
            return Detections.none(size)
        all_masks = np.concatenate(masks_of)
        masks, scores, box_list, prompt_ids = [], [], [], []
        start = 0
        for k, valid in enumerate(candidates):
            m = all_masks[start:start + valid.size]
            start += valid.size
            if valid.size == 0:
                continue
            keep = np.ones(valid.size, bool)
            if cfg.mask_nms and cfg.det_nms_thresh > 0:
                keep = mask_ops.nms_masks(probs[k, valid], m, cfg.score_threshold_detection, cfg.det_nms_thresh)
            masks.append(m[keep])
            scores.append(probs[k, valid][keep])
            box_list.append(boxes[k, valid][keep])
            prompt_ids.append(np.full(int(keep.sum()), k, np.int64))
        return Detections(np.concatenate(masks), np.concatenate(scores), np.concatenate(box_list),
                          np.concatenate(prompt_ids))

    # ---------------------------------------------------------------------------- 2. propagation
    def check_room(self, frame: int, pointers: int, memories: int) -> None:
        """A CapacityError naming the setting to raise when the pools lack the rows a frame takes, given
        before the frame changes anything: the session stays as it was, and usable. (Births are planned
        within the rows left, so the frame cannot run out later.)"""
        short = [f"{need} rows of the {pool.name} ({pool.free_rows} of its {pool.capacity - 1} are free)"
                 for pool, need in ((self.bank.pointers, pointers), (self.bank.memories, memories))
                 if need > pool.free_rows]
        if short:
            raise CapacityError(
                f"frame {frame} needs {' and '.join(short)}: the {len(self.objects)} objects tracked now hold more "
                "rows than the pools were sized for. Nothing of this frame was applied and the session is usable: "
                "load the bundle with a larger pool_objects (sam3track.load(..., pool_objects=N); for an OM "
                "bundle, convert it again with larger --gears memory_rows/pointer_rows), or remove objects "
                "(session.remove_object) and give the frame again")

    def frame_rows(self, frame: int) -> tuple[int, int]:
        """The (pointer, memory) rows a tracked frame takes before its births: a pointer for each object
        propagated (all but those on a conditioning frame of their own), a memory for each object
        encoded (all but user-prompted objects on their conditioning frames), less the memories that
        propagation frees by replacing the objects' earlier outputs of this frame (a frame tracked again)."""
        bank, objects = self.bank, self.objects
        fresh = [o for o in objects.obj_ids if bank.cond_entry(o, frame) is None]
        encoded = [o for o in objects.obj_ids if not (objects[o].interactive and bank.has_cond(o, frame))]
        earlier = [bank.entry(o, frame) for o in fresh]
        replaced = sum(e is not None and e.memory_row is not None for e in earlier)
        return len(fresh), len(encoded) - replaced

    def click_rows(self, frame: int, obj_id: int) -> tuple[int, int]:
        """The (pointer, memory) rows a prompt call on `frame` takes at most (apply_clicks): the prompted
        object's output and memory, and those of every other object not on a conditioning frame there."""
        others = sum(o != obj_id and self.bank.cond_entry(o, frame) is None for o in self.objects.obj_ids)
        return 1 + others, 1 + others

    def pool_room(self, frame: int, managed: list[int], user: list[int]) -> PoolRoom:
        """What the pools hold for this frame's births, read after propagation: each birth takes a pointer
        and a memory, after the memories of the objects tracked now. (With match_reference_quirks a frame
        with births encodes some of those memories binarized instead, not twice: execute.)"""
        bank = self.bank
        encoded = len(managed) + sum(not bank.has_cond(o, frame) for o in user)
        births = min(bank.pointers.free_rows, bank.memories.free_rows - encoded)
        held = self.config.objects_held(bank.memories.capacity, bank.pointers.capacity)
        return PoolRoom(held, max(births, 0))

    def propagate(self, features, frame: int, reverse: bool, num_frames: int | None) -> Propagation:
        obj_ids = self.objects.obj_ids
        n, size = len(obj_ids), self.config.low_res_mask_size
        raw = np.zeros((n, size, size), np.float32)
        scores = np.zeros(n, np.float32)
        # A frame that is already an object's conditioning frame (its birth, or a reconditioned frame of
        # an earlier pass) keeps that output, as the reference does when it revisits one.
        fresh = []
        for i, obj_id in enumerate(obj_ids):
            entry = self.bank.cond_entry(obj_id, frame)
            if entry is None:
                fresh.append(i)
            else:
                raw[i], scores[i] = entry.low_res_mask, entry.object_score
        if fresh:
            b, bank, graph = self.backend, self.bank, self.graphs["propagation_decoder"]
            fresh = np.asarray(fresh)
            ids = [obj_ids[i] for i in fresh]
            query = bank.query(ids, frame, reverse, num_frames)
            where = f"frame {frame}"
            k = fixed_size(b, graph, "memories", query.memories, where, "lower max_cond_frame_num")
            p = fixed_size(b, graph, "pointers", query.pointers, where, "lower max_conditioning_frames")
            rows = bank.pointers.allocate(len(ids))
            for chunk in chunks(b, graph, "objects", len(ids)):
                inputs = {name: features[name] for name in ("tracker_feat_s0", "tracker_feat_s1", "tracker_feat")}
                inputs.update(memory_pool=bank.memories.tensor, pointer_pool=bank.pointers.tensor)
                inputs.update(vars(query.padded(chunk.start, chunk.count, chunk.size, k, p)))
                chunk_rows = rows[chunk.items]
                target = bank.pointers.target(chunk_rows, chunk.size)
                out = b.run(graph, inputs, {"object_pointer": target})
                bank.pointers.commit(chunk_rows, target)
                raw[fresh[chunk.items]] = b.to_host(b.rows(out["low_res_masks"], 0, chunk.count))[:, 0]
                scores[fresh[chunk.items]] = b.to_host(b.rows(out["object_score_logits"], 0, chunk.count))[:, 0]
            for i, obj_id, row in zip(fresh, ids, rows):
                bank.add(obj_id, frame, MemoryEntry(int(row), float(scores[i]), low_res_mask=raw[i]), cond=False)
                self.objects[obj_id].tracked_frames.add(frame)
        return Propagation(list(obj_ids), raw, self._fill_holes(raw), scores)

    def _fill_holes(self, masks: np.ndarray) -> np.ndarray:
        if not self.config.fill_holes or masks.shape[0] == 0:
            return masks
        return mask_ops.fill_holes_in_mask_scores(masks, self.config.fill_hole_area)

    # --------------------------------------------------------------------------- 4. execution
    def encode_memory(self, features, obj_ids: list[int], frame: int, logits: np.ndarray, scores: np.ndarray,
                      binarize, via_image=False) -> None:
        """binarize, via_image: one flag for all objects or one per object. via_image: the tracker's own
        rule (Sam3TrackerVideoModel), the mask taken through the image size as its high-resolution masks
        are; else Sam3VideoModel's, straight from the low-res logits."""
        n = len(obj_ids)
        if n == 0:
            return
        b, pool, graph = self.backend, self.bank.memories, self.graphs["memory_encoder"]
        rows = pool.allocate(n)
        logits = logits.reshape(n, 1, *logits.shape[-2:]).astype(np.float32)
        scores = scores.reshape(n, 1).astype(np.float32)
        binarize = np.broadcast_to(np.asarray(binarize, np.float32), (n,))
        via_image = np.broadcast_to(np.asarray(via_image, np.float32), (n,))
        for chunk in chunks(b, graph, "objects", n):
            chunk_rows = rows[chunk.items]
            target = pool.target(chunk_rows, chunk.size)
            b.run(graph, {
                "tracker_feat": features["tracker_feat"],
                "mask_logits": pad_rows(logits[chunk.items], chunk.size),
                "object_score_logits": pad_rows(scores[chunk.items], chunk.size),
                "binarize": pad_rows(binarize[chunk.items], chunk.size),
                "via_image": pad_rows(via_image[chunk.items], chunk.size),
            }, {"maskmem_features": target})
            pool.commit(chunk_rows, target)
        self.bank.set_memory_rows(obj_ids, frame, rows)

    def add_objects(self, features, obj_ids: list[int], det_masks: np.ndarray, frame: int) -> tuple[np.ndarray, np.ndarray]:
        """Births: the detection mask becomes the object's first (conditioning) output."""
        b, bank, n, graph = self.backend, self.bank, len(obj_ids), self.graphs["mask_init"]
        binary = (det_masks >= 0.5).astype(np.float32)
        rows = bank.pointers.allocate(n)
        low_res = np.zeros(binary.shape, np.float32)
        scores = np.zeros(n, np.float32)
        for chunk in chunks(b, graph, "objects", n):
            chunk_rows = rows[chunk.items]
            target = bank.pointers.target(chunk_rows, chunk.size)
            out = b.run(graph, {"tracker_feat": features["tracker_feat"],
                                "masks": pad_rows(binary[chunk.items, None], chunk.size)},
                        {"object_pointer": target})
            bank.pointers.commit(chunk_rows, target)
            low_res[chunk.items] = b.to_host(b.rows(out["low_res_masks"], 0, chunk.count))[:, 0]
            scores[chunk.items] = b.to_host(b.rows(out["object_score_logits"], 0, chunk.count))[:, 0]
        for i, (obj_id, row) in enumerate(zip(obj_ids, rows)):
            bank.add(obj_id, frame, MemoryEntry(int(row), float(scores[i]), low_res_mask=low_res[i]), cond=True)
        return binary, scores

    def execute(self, features, plan: FramePlan, det: Detections, tracked: Propagation, user: Propagation,
                frame: int) -> None:
        """Apply the plan: memories of this frame, births, the registry's bookkeeping, removals.
        `tracked` holds the objects the plan manages, `user` the user-prompted ones."""
        objects, bank, quirks = self.objects, self.bank, self.config.match_reference_quirks
        old_ids = tracked.obj_ids
        for obj_id in plan.reconditioned_obj_ids:
            bank.promote_to_cond(obj_id, frame)
        # One memory_encoder call for this frame's memories: the planned ones, and those of user-prompted
        # objects, which keep the tracker's own memory (its raw output, through the image size) except on
        # their conditioning frames, which keep the memory made there.
        user = user.take([o for o in user.obj_ids if not bank.has_cond(o, frame)])
        # The reference re-encodes every tracked object's memory of a frame with births from its
        # thresholded mask (a quirk: it couples prompts); otherwise only the new objects are encoded.
        # Those memories replace the planned ones, so the planned ones are not made for them at all.
        again = [i for i, o in enumerate(old_ids) if not bank.has_cond(o, frame)] if plan.new_obj_ids and quirks else []
        planned = np.setdiff1d(np.arange(len(old_ids)), again).astype(np.int64)
        memory_masks = plan.memory_masks.reshape(-1, *user.raw.shape[1:])[planned]
        self.encode_memory(features, [old_ids[i] for i in planned] + user.obj_ids, frame,
                           np.concatenate([memory_masks, user.raw]),
                           np.concatenate([plan.memory_scores[planned], user.scores]), binarize=False,
                           via_image=np.r_[np.zeros(len(planned)), np.ones(len(user.obj_ids))])
        if plan.new_obj_ids:
            new_binary, new_scores = self.add_objects(features, plan.new_obj_ids, det.masks[plan.new_det_inds], frame)
            ids = [old_ids[i] for i in again] + plan.new_obj_ids
            logits = np.concatenate([tracked.raw[again], new_binary * 20.0 - 10.0])
            scores = np.concatenate([tracked.scores[again], new_scores])
            self.encode_memory(features, ids, frame, logits, scores, binarize=True)
        for obj_id, update in plan.updates.items():
            obj = objects[obj_id]
            obj.keep_alive, obj.unmatched_count = update.keep_alive, update.unmatched_count
            obj.last_occluded, obj.last_visible, obj.duplicate_of = (update.last_occluded, update.last_visible,
                                                                     update.duplicates)
        for obj in plan.births:
            objects.add(obj)
        for obj_id in plan.removed_obj_ids | plan.retired_obj_ids:
            objects.drop(obj_id)
            bank.remove_object(obj_id)
        if plan.not_born is not None:
            self._births_not_made(plan.not_born, frame)

    def _births_not_made(self, not_born: BirthsNotMade, frame: int) -> None:
        """Count births over the cap; the first time in a session, one warning names the count and the
        setting (warning every frame would flood a stream that stays over the cap)."""
        objects = self.objects
        first = objects.births_not_made == 0
        objects.births_not_made += not_born.count
        if not first:
            return
        limit = (f"max_num_objects is {not_born.cap}" if not_born.setting == "max_num_objects"
                 else "the device pools' free rows hold no more (pool_objects)" if not_born.by_rows
                 else f"the device pools hold {not_born.cap} objects at once (pool_objects)")
        om = " (an OM bundle: convert it again with larger --gears memory_rows/pointer_rows)" \
            if not_born.setting == "pool_objects" else ""
        warnings.warn(
            f"frame {frame}: {not_born.count} new objects were not made: {len(objects)} objects are tracked and "
            f"{limit}. Births beyond the cap are not made (the reference's max_num_objects rule); tracked objects "
            f"keep their ids. To track more at once, load the bundle with a larger {not_born.setting} "
            f"(sam3track.load(..., {not_born.setting}=N)){om}. Warned once per session: later births over the cap "
            "are left out without a warning", CapacityWarning)

    # ------------------------------------------------------------------------------- the frame
    def step(self, pixels: np.ndarray, text, frame: int, reverse: bool, streaming: bool,
             num_frames: int | None) -> FrameOutput:
        """One frame through the shared phases (phases.run_frame): `pixels` the frame's model input,
        `text` the session's TextPrompts (None without text prompts: the tracker alone)."""
        return run_frame(Sam3Frame(self, pixels, text, frame, reverse, streaming, num_frames))

    def ground(self, pixels: np.ndarray, text) -> Grounded:
        """Phase 1: one backbone call, and one grounding_head call for all text prompts (none without)."""
        features = self.encode_frame(pixels)
        if text is None:
            return Grounded(features, Detections.none(self.config.low_res_mask_size))
        return Grounded(features, self.detect(features, text.pool, text.mask, len(text)))

    def show_user_objects(self, out: FrameOutput, user: Propagation) -> None:
        """User-prompted objects are shown as the tracker outputs them (no hole filling, no heuristics)."""
        for obj_id, raw, p in zip(user.obj_ids, user.raw, mask_ops.sigmoid(user.scores)):
            obj = self.objects[obj_id]
            out.masks[obj_id], out.scores[obj_id] = raw, obj.score
            out.tracker_scores[obj_id], out.prompts[obj_id] = float(p), obj.prompt
            out.user_objects.add(obj_id)

    # ------------------------------------------------------------------------- clicks and boxes
    def check_points(self, count: int, frame: int) -> None:
        """A static-shape backend runs only the point counts compiled in; padding a prompt with fake
        points would change its result, so any other count is a CapacityError."""
        if self.backend.plan(self.graphs["interactive_decoder"], "points", count) != count:
            raise CapacityError(f"a prompt of {count} points (box corners included) on frame {frame}: the "
                                f"interactive_decoder was not compiled for {count} points; convert the bundle "
                                "with --gears points=... including that count")

    def apply_clicks(self, features, frame: int, requests: list[ClickRequest], num_frames: int | None) -> FrameOutput:
        """A prompt call (transformers `Sam3TrackerVideoModel.forward` on a frame with new inputs): the
        prompted objects through the interactive decoder, stored as conditioning frames; every other
        object on the frame is propagated (or its conditioning output reused); then the memories of
        all newly computed outputs, binarised as the reference does when any of them came from points.
        The objects of `requests` must be in the registry."""
        b, bank, graph = self.backend, self.bank, self.graphs["interactive_decoder"]
        size = self.config.low_res_mask_size
        for count in sorted({len(r.labels) for r in requests}):
            group = [r for r in requests if len(r.labels) == count]
            ids = [r.obj_id for r in group]
            self.check_points(count, frame)
            afresh = frozenset(r.obj_id for r in group if not r.use_memory)
            query = bank.query(ids, frame, False, num_frames, exclude_frame=True, empty=afresh)
            where = f"frame {frame}"
            k = fixed_size(b, graph, "memories", query.memories, where, "lower max_cond_frame_num")
            p = fixed_size(b, graph, "pointers", query.pointers, where, "lower max_conditioning_frames")
            coords = np.stack([r.coords for r in group]).astype(np.float32)
            labels = np.stack([r.labels for r in group]).astype(np.int32)
            # a refinement with no memory left to read (all of it freed) starts the object afresh:
            # attention over nothing but padding has no defined result
            held = (query.memory_valid.sum(axis=1) + query.pointer_valid.sum(axis=1)) > 0
            use_memory = np.asarray([r.use_memory for r in group], np.float32) * held
            multimask = np.asarray([r.multimask for r in group], np.float32)
            rows = bank.pointers.allocate(len(ids))
            raw = np.zeros((len(ids), size, size), np.float32)
            scores = np.zeros(len(ids), np.float32)
            for chunk in chunks(b, graph, "objects", len(ids)):
                inputs = {name: features[name] for name in ("tracker_feat_s0", "tracker_feat_s1", "tracker_feat")}
                inputs.update(memory_pool=bank.memories.tensor, pointer_pool=bank.pointers.tensor)
                inputs.update(vars(query.padded(chunk.start, chunk.count, chunk.size, k, p)))
                inputs.update(use_memory=pad_rows(use_memory[chunk.items], chunk.size),
                              point_coords=pad_rows(coords[chunk.items], chunk.size),
                              point_labels=pad_rows(labels[chunk.items], chunk.size),
                              multimask=pad_rows(multimask[chunk.items], chunk.size))
                chunk_rows = rows[chunk.items]
                target = bank.pointers.target(chunk_rows, chunk.size)
                out = b.run(graph, inputs, {"object_pointer": target})
                bank.pointers.commit(chunk_rows, target)
                raw[chunk.items] = b.to_host(b.rows(out["low_res_masks"], 0, chunk.count))[:, 0]
                scores[chunk.items] = b.to_host(b.rows(out["object_score_logits"], 0, chunk.count))[:, 0]
            for i, (obj_id, row) in enumerate(zip(ids, rows)):
                bank.add(obj_id, frame, MemoryEntry(int(row), float(scores[i]), low_res_mask=raw[i], user=True),
                         cond=True)
        prompted = [r.obj_id for r in requests]
        # The other objects: conditioning outputs reused, the rest tracked with their memory. The
        # prompted objects now have a conditioning output here, so they are reused as they are.
        before = {o for o in self.objects.obj_ids if bank.has_cond(o, frame)} - set(prompted)
        everything = self.propagate(features, frame, False, num_frames)
        encoded = everything.take([o for o in everything.obj_ids if o not in before])
        self.encode_memory(features, encoded.obj_ids, frame, encoded.raw, encoded.scores, binarize=True,
                           via_image=True)
        out = FrameOutput(frame, {}, {}, {}, {}, set())
        self.show_user_objects(out, everything.take([o for o in everything.obj_ids if self.objects[o].interactive]))
        detected = everything.take([o for o in everything.obj_ids if not self.objects[o].interactive])
        for obj_id, raw, p in zip(detected.obj_ids, detected.masks, mask_ops.sigmoid(detected.scores)):
            obj = self.objects[obj_id]  # text-detected objects as propagation shows them (holes filled)
            out.masks[obj_id], out.scores[obj_id] = raw, obj.score
            out.tracker_scores[obj_id], out.prompts[obj_id] = float(p), obj.prompt
        return out

    # ----------------------------------------------------------------------------------- 5. outputs
    def frame_output(self, plan: FramePlan, det: Detections, tracked: Propagation, frame: int, old_ids: list[int],
                old_prompts: dict[int, int], old_scores: dict[int, float]) -> FrameOutput:
        gone = plan.removed_obj_ids | plan.retired_obj_ids
        # The reference pairs the updated id list (new ids appended, removed ones dropped) with the old
        # frame's masks by position; only match_reference_quirks reproduces that.
        ids_after = [o for o in old_ids + plan.new_obj_ids if o not in gone]
        paired_ids = ids_after if self.config.match_reference_quirks else old_ids
        masks = {int(o): m for o, m in zip(paired_ids, plan.track_masks)}
        prompts = dict(old_prompts)
        scores = {o: (REMOVED_SCORE if o in gone else s) for o, s in old_scores.items()}
        tracker = {o: float(p) for o, p in zip(paired_ids, mask_ops.sigmoid(tracked.scores))}
        if plan.new_obj_ids:
            births = self._fill_holes(det.masks[plan.new_det_inds])
            for obj, m in zip(plan.births, births):
                masks[obj.obj_id] = m
                prompts[obj.obj_id] = obj.prompt
                scores[obj.obj_id] = obj.score
                tracker.setdefault(obj.obj_id, REMOVED_SCORE if obj.obj_id in gone else obj.score)
        for obj_id in gone:
            tracker.setdefault(obj_id, REMOVED_SCORE)
        for obj_id in plan.reconditioned_obj_ids:
            masks[int(obj_id)] = det.masks[plan.association.obj_to_high_conf_det[obj_id]]
        hidden = plan.suppressed_obj_ids | gone
        return FrameOutput(frame, masks, scores, tracker, prompts, set(gone), hidden)


@dataclass
class Sam3Frame(FramePhases[Grounded, Tracked, FramePlan, FrameOutput]):
    """One SAM 3 frame as the shared phases: each phase is the FrameLoop operation of that name."""

    loop: FrameLoop
    pixels: np.ndarray  # the frame's model input
    text: object  # the session's TextPrompts, or None (clicks and boxes only: the tracker alone)
    frame: int
    reverse: bool
    streaming: bool
    num_frames: int | None

    def ground(self) -> Grounded:
        return self.loop.ground(self.pixels, self.text)

    def propagate(self, grounded: Grounded) -> Tracked:
        objects = self.loop.objects
        self.loop.check_room(self.frame, *self.loop.frame_rows(self.frame))  # before anything changes
        managed = objects.detector_view()  # taken before propagation, as the reference's frame starts
        old_ids = managed.obj_ids
        user_ids = [o for o in objects.obj_ids if objects[o].interactive]
        prompts = {o: objects[o].prompt for o in old_ids}
        scores = {o: objects[o].score for o in old_ids}
        everything = self.loop.propagate(grounded.features, self.frame, self.reverse, self.num_frames)
        return Tracked(managed, everything.take(old_ids), everything.take(user_ids), prompts, scores)

    def plan(self, grounded: Grounded, tracked: Tracked) -> FramePlan:
        detected = tracked.detected
        room = self.loop.pool_room(self.frame, detected.obj_ids, tracked.user.obj_ids)
        return plan_frame(self.frame, self.reverse, self.streaming, grounded.det, detected.masks, detected.scores,
                          tracked.managed, self.loop.config, user_masks=tracked.user.raw, room=room)

    def execute(self, grounded: Grounded, tracked: Tracked, plan: FramePlan) -> None:
        self.loop.execute(grounded.features, plan, grounded.det, tracked.detected, tracked.user, self.frame)

    def outputs(self, grounded: Grounded, tracked: Tracked, plan: FramePlan) -> FrameOutput:
        out = self.loop.frame_output(plan, grounded.det, tracked.detected, self.frame, tracked.detected.obj_ids,
                                tracked.prompts, tracked.scores)
        self.loop.show_user_objects(out, tracked.user)
        return out
