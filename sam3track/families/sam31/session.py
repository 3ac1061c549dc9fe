"""A SAM 3.1 tracking session: the API of Meta's SAM 3.1 video predictor on the runtime's graphs.

    session = predictor.start_session(video)
    first = session.add_prompt(frame_index=0, text="bike")   # runs that frame now: its FrameResult
    for result in session.propagate("forward"): ...           # FrameResults in processing order
    session.remove_object(obj_id)                              # from every frame, cached ones included

Where it follows Meta rather than the SAM 3 session (prompts that start over, directions, replays,
refinements, live streams): docs/sam31.md, "Where the session follows Meta".
"""

from __future__ import annotations

import numpy as np

from ...errors import ObjectIdError, PromptError, VideoError, object_id_argument, shown
from ...postprocess import masks_to_boxes, objectwise_non_overlap
from ...prompts import box_rows, parse_clicks
from ...results import FrameResult
from ...session_base import SessionBase, check_direction, check_max_frames, check_stream_frame, clicked_object_id
from .resize import bilinear_positive
from .tracker import BoxPrompt, FrameOut, Sam31Tracker

# What Meta's SAM 3.1 encodes as the text of a boxes-only add_prompt (reset_state's find_text_batch[0])
BOXES_ONLY_TEXT = "<text placeholder>"


def pixel_values(rgb: np.ndarray, config) -> np.ndarray:
    """RGB uint8 [H, W, 3] -> float32 [1, 3, S, S] as Meta's image-folder loader prepares frames (the
    manifest's preprocessing): PIL bilinear resize to S x S, to_tensor, stored as float16, normalised
    in float16."""
    from PIL import Image

    s = config.image_size
    img = np.asarray(Image.fromarray(np.ascontiguousarray(rgb)).resize((s, s), Image.BILINEAR))
    x = (img.astype(np.float32) / np.float32(255.0)).astype(np.float16).transpose(2, 0, 1)
    mean = np.asarray(config.image_mean, np.float16)[:, None, None]
    std = np.asarray(config.image_std, np.float16)[:, None, None]
    x = ((x - mean).astype(np.float16) / std).astype(np.float16)
    return np.ascontiguousarray(x.astype(np.float32)[None])


def box_prompt_of(predictor, frame: int, boxes, box_labels, height: int, width: int) -> BoxPrompt:
    """Boxes in video pixels -> Meta's normalised cxcywh (xywh first, as its request carries them)."""
    where = f"add_prompt on frame {frame}"
    if "box_grounding_head" not in predictor.graphs:
        raise PromptError(f"{where}: this bundle has no box_grounding_head graph (it was exported before box "
                          "prompts were supported); export it again with python -m graphs.export --family sam3.1")
    xyxy = box_rows(boxes, f"{where}: boxes must be [[x0, y0, x1, y1], ...] in video pixels")
    h, w = height, width
    if not np.isfinite(xyxy).all():
        raise PromptError(f"{where}: boxes {shown(boxes)} are not all finite numbers")
    bad = np.flatnonzero((xyxy[:, 2] < xyxy[:, 0]) | (xyxy[:, 3] < xyxy[:, 1]))
    if bad.size:
        raise PromptError(f"{where}: box {xyxy[bad[0]].tolist()} has x1 < x0 or y1 < y0; give [x0, y0, x1, y1]")
    out = np.flatnonzero((xyxy < 0).any(1) | (xyxy[:, [0, 2]] > w).any(1) | (xyxy[:, [1, 3]] > h).any(1))
    if out.size:
        raise PromptError(f"{where}: box {xyxy[out[0]].tolist()} reaches outside the {w}x{h} frame")
    if box_labels is None:
        labels = np.ones(len(xyxy), np.int32)
    else:
        flat = np.asarray(box_labels).reshape(-1)
        if flat.shape[0] != len(xyxy) or not np.isin(flat, (0, 1)).all():
            raise PromptError(f"{where}: box_labels {shown(box_labels)} must give 1 (positive) or 0 (negative) "
                              f"for each of the {len(xyxy)} boxes")
        labels = flat.astype(np.int32)
    scale = np.asarray([w, h, w, h], np.float64)
    xywh = (np.concatenate([xyxy[:, :2], xyxy[:, 2:] - xyxy[:, :2]], 1) / scale).astype(np.float32)
    half = np.float32(0.5)
    cxcywh = np.concatenate([xywh[:, :2] + half * xywh[:, 2:], xywh[:, 2:]], 1).astype(np.float32)
    return BoxPrompt(np.clip(cxcywh, np.float32(0), np.float32(1)), labels)


def propagation_type(history: list[dict], num_frames: int) -> tuple[str, list[int] | None]:
    """Meta's _parse_action_history_for_propagation: ("propagation_full" | "propagation_partial" |
    "propagation_fetch", the objects a partial propagation tracks)."""
    h = history
    if not h:
        return "propagation_full", None
    last = h[-1]
    if "propagation" in last["type"]:
        if last["type"] == "propagation_fetch":
            return "propagation_fetch", None
        if (len(h) > 1 and h[-2]["type"] in ("propagation_partial", "propagation_full")) or \
                last["frame_idx"] in (0, num_frames - 1):
            return "propagation_fetch", None
        return last["type"], last.get("obj_ids")
    obj_ids = []
    for action in reversed(h):
        if "propagation" in action["type"]:
            break
        if action["type"] in ("add", "refine"):
            obj_ids.extend(action["obj_ids"])
    if obj_ids:
        return "propagation_partial", sorted(set(obj_ids))
    return "propagation_fetch", None  # only removals since the last propagation


# A live stream has no length. Meta's pointer window is min(num_frames, 16) frames: a stream tracks as a
# video of 16 frames or more does.
STREAM_FRAMES = 2 ** 31 - 1


class Sam31Session(SessionBase):
    box_prompts = "detector"  # boxes are detector exemplars (Meta's SAM 3.1), not tracker objects (compat.py)

    def __init__(self, predictor, source=None, owns_source: bool = False, keep_history: bool = True):
        del keep_history  # SAM 3.1 keeps no host store: its corrections read what the device holds
        self.predictor, self.config, self.backend = predictor, predictor.config, predictor.backend
        self.source, self._owns_source = source, owns_source
        # a live stream (source None): the tracker is made at its first frame (the frame size), with
        # hotstart removals off (no later frames to judge by), as in SAM 3's streaming mode
        self.tracker = None if source is None else Sam31Tracker(self.backend, predictor.graphs, self.config,
                                                                (source.height, source.width))
        self.stream_index = 0
        self._stream_size: tuple[int, int] | None = None
        self._stream_ids = None  # the stream's text prompt (token ids)
        self._stream_fresh = False  # the next frame is the first since the text prompt
        self.cached: dict[int, dict[int, np.ndarray]] = {}  # Meta's cached_frame_outputs
        self.suppressed: dict[int, set[int]] = {}  # Meta's suppressed_obj_ids per frame (never filled in 3.1)
        self.history: list[dict] = []  # Meta's action_history
        self.prompted_frames: set[int] = set()  # frames with outputs (previous_stages_out)
        self._running = None
        self.closed = False

    # ------------------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if not self.backend.closed and self.tracker is not None:
            self.tracker.close()
        if self._owns_source:
            self.source.close()

    @property
    def num_frames(self) -> int:
        self._check_video("num_frames")
        return len(self.source)

    def _check_video(self, what: str) -> None:
        if self.source is None:
            raise VideoError(f"{what} needs a video session (start_session(video)); this live stream keeps no "
                             "frames: feed them with session.track(frame)")

    @property
    def object_ids(self) -> list[int]:
        return [] if self.tracker is None else self.tracker.obj_ids

    def frame(self, index: int) -> np.ndarray:
        """RGB frame `index` of the session's video."""
        self._check_open()
        self._check_video("frame()")
        self._check_frame(index)
        return self.source.read(index)

    def _forget(self) -> None:
        if self.tracker is not None:
            self.tracker.reset()
        self.cached.clear()
        self.suppressed.clear()
        self.history.clear()
        self.prompted_frames = set()

    def reset(self) -> None:
        """Start over on the same video: every object, memory and prompt forgotten (Meta's
        reset_session request). A live stream also forgets its text prompt."""
        self._check_open()
        self._check_idle("reset() was called")
        self._forget()
        self._stream_ids, self._stream_fresh = None, False

    def text_prompt_result(self, frame_index: int, text: str) -> FrameResult:
        """The official predictor's text add_prompt: start over, find `text` on `frame_index`, return that
        frame's result (here add_prompt itself, as Meta's SAM 3.1 predictor does)."""
        return self.add_prompt(frame_index=frame_index, text=text)

    def run_frame(self, frame_index: int):
        raise PromptError("run_frame() is not available for SAM 3.1 bundles: a text add_prompt already runs its "
                          "frame and returns its result, as Meta's predictor does")

    # -------------------------------------------------------------------------------- prompts
    def add_prompt(self, frame_index: int = 0, text: str | None = None, points=None, labels=None, boxes=None,
                   box_labels=None, obj_id=None, clear_old_points: bool = True) -> FrameResult:
        """A text and/or boxes prompt: the session starts over (Meta's add_prompt resets it), finds the
        text on `frame_index` and returns that frame's result. boxes: [[x0, y0, x1, y1], ...] in video
        pixels with box_labels (1 positive, the default, 0 negative): exemplars for the detector on that
        frame only, as in Meta's SAM 3.1 (without text, Meta's "<text placeholder>" text goes with them).
        With points= (and obj_id) it adds or refines one object instead."""
        self._check_open()
        self._check_idle("add_prompt() was called")
        if self.source is None:
            return self._stream_prompt(text, points, labels, boxes)
        self._check_frame(frame_index)
        frame = int(frame_index)
        if points is not None or labels is not None:
            if text is not None or boxes is not None:
                raise PromptError("give points= alone in one add_prompt call (Meta's SAM 3.1 takes clicks without "
                                  "text or boxes); text= and boxes= start over with a new detector prompt")
            return self._add_clicks(frame, points, labels, obj_id, clear_old_points)
        if obj_id is not None:
            raise PromptError(f"add_prompt on frame {frame}: obj_id {shown(obj_id)} goes with points=; a text or "
                              "boxes prompt finds its own objects")
        box_prompt = None
        if boxes is not None:
            box_prompt = box_prompt_of(self.predictor, frame, boxes, box_labels, self.source.height,
                                       self.source.width)
        elif box_labels is not None:
            raise PromptError(f"add_prompt on frame {frame}: box_labels {shown(box_labels)} without boxes=")
        if text is None and box_prompt is not None:
            text = BOXES_ONLY_TEXT
        if not isinstance(text, str) or not text.strip():
            raise PromptError(f"add_prompt needs text= (a noun phrase such as 'bike') or boxes=, not {shown(text)}")
        ids, _ = self.predictor.tokenizer(text.strip())
        self._forget()
        self.tracker.set_text(ids)
        self._text = text.strip()
        out = self._run(frame, reverse=False, round_levels=True, boxes=box_prompt)
        self.prompted_frames.add(frame)
        return self._postprocess(out.frame, out.masks, scores=out.scores)

    # ----------------------------------------------------------------------------- live stream
    def _stream_prompt(self, text, points, labels, boxes) -> None:
        """A live stream's text prompt: it starts over (as Meta's add_prompt does) from the next frame
        given to track(). Returns None: there is no frame to show yet."""
        if points is not None or boxes is not None or labels is not None:
            raise VideoError("clicks and boxes need a video session (start_session(video)): a live stream keeps no "
                             "frames to click on")
        if not isinstance(text, str) or not text.strip():
            raise PromptError(f"add_prompt needs text= (a noun phrase such as 'bike'), not {shown(text)}")
        self._stream_ids, _ = self.predictor.tokenizer(text.strip())
        self._text = text.strip()
        self._forget()
        if self.tracker is not None:
            self.tracker.set_text(self._stream_ids)
        self._stream_fresh = True
        return None

    def track(self, frame: np.ndarray) -> FrameResult:
        """Streaming: one RGB frame in, its result out, immediately.

        It gives what the video session gives for the same frames with hotstart_delay 0 (a stream
        cannot hold results back, so no hotstart removals) in a video of 16 frames or more: the first
        frame after the text prompt runs twice, as Meta's add_prompt and then its propagation do.
        Masklet confirmation hides the objects unconfirmed as of this frame (the video session looks
        a few frames ahead). Memories and pointers no later frame can read are freed as it goes."""
        self._check_open()
        self._check_idle("track() was called")
        if self.source is not None:
            raise VideoError("track() feeds a live stream; this session reads a video: use session.propagate()")
        index = self.stream_index
        frame, self._stream_size = check_stream_frame(frame, index, self._stream_size)
        if self._stream_ids is None:
            raise PromptError("no text prompt in this live stream; call session.add_prompt(text=...) before track()")
        if self.tracker is None:
            import dataclasses

            config = dataclasses.replace(self.config, hotstart_delay=0)
            self.tracker = Sam31Tracker(self.backend, self.predictor.graphs, config, self._stream_size)
            self.tracker.set_text(self._stream_ids)
        t = self.tracker
        px = pixel_values(frame, self.config)
        if self._stream_fresh:  # Meta's add_prompt on this frame (single-frame grounding)
            t.step(index, False, STREAM_FRAMES, px, round_levels=True)
            self._stream_fresh = False
        out = t.step(index, False, STREAM_FRAMES, px, round_levels=False)
        hidden = set(out.unconfirmed) if self.config.masklet_confirmation_enable else set()
        result = self._postprocess(index, out.masks, hidden, out.scores)
        t.evict(index, False, STREAM_FRAMES, stream=True)
        self.stream_index += 1
        return result

    def _add_clicks(self, frame: int, points, labels, obj_id, clear_old_points) -> FrameResult:
        """Clicks (Meta's add_sam2_new_points): a new obj_id adds an object in a singleton tracker state
        of its own; a tracked one is refined (extracted from its bucket the first time, see
        Sam31Tracker.refine_object). The result is the frame's cached result with the new mask."""
        where = f"add_prompt on frame {frame}"
        h, w = self.source.height, self.source.width
        click = parse_clicks(points, labels, None, h, w, where)
        t = self.tracker
        obj_id, new = clicked_object_id(obj_id, where, t.obj_ids, t.tracks.max_obj_id, self.config.max_num_objects,
                                        reuse_ids=True)
        refine = not new
        cfg = self.config
        # Meta's points are relative coordinates times the model's image size
        coords = (click.coords.astype(np.float64) / np.asarray([w, h])).astype(np.float32) * np.float32(cfg.image_size)
        labels = click.labels.astype(np.int32)
        px = pixel_values(self.source.read(frame), cfg)
        features = t.encode(px, round_levels=False)  # Meta's batched-grounding features
        if refine:
            # Meta's _has_object_been_refined: any add or refine of this object since the last reset
            first = not any(a["type"] in ("add", "refine") and obj_id in a["obj_ids"] for a in self.history)
            mask = t.refine_object(frame, features, obj_id, coords, labels, keep_old_points=not clear_old_points,
                                   first_interaction=first)
        else:
            mask = t.add_clicked_object(frame, features, obj_id, coords, labels)
        self.history.append({"type": "refine" if refine else "add", "obj_ids": [obj_id], "frame_idx": frame})
        self.prompted_frames.add(frame)
        merged = dict(self.cached.get(frame, {}))
        merged[obj_id] = mask
        self.cached[frame] = merged
        return self._postprocess(frame, merged, self.suppressed.get(frame, ()), prompted=obj_id)

    def _run(self, frame: int, reverse: bool, round_levels: bool, boxes: BoxPrompt | None = None) -> FrameOut:
        px = pixel_values(self.source.read(frame), self.config)
        out = self.tracker.step(frame, reverse, self.num_frames, px, round_levels, boxes)
        self.cached[frame] = dict(out.masks)
        return out

    # ---------------------------------------------------------------------------------- results
    def _postprocess(self, frame: int, obj_id_to_mask: dict[int, np.ndarray], hidden=(), scores=None,
                     prompted: int | None = None) -> FrameResult:
        """Meta's _postprocess_output: sorted ids, empty and hidden masks dropped, object-wise
        non-overlap by tracker probability, boxes from the masks. scores: the obj_id_to_score the
        frame's output carries (Meta snapshots it per frame; fetches read the current one).
        prompted: the object a click call was for, kept even when empty (Meta drops it), so that the
        call's result always names it: `r.object_ids[-1]` after a new object is its id; its
        to_official() leaves it out, as Meta's output does."""
        h, w = (self.source.height, self.source.width) if self.source is not None else self._stream_size
        ids = sorted(obj_id_to_mask)
        if not ids:
            return FrameResult.empty(frame, h, w)
        masks = np.stack([obj_id_to_mask[o] for o in ids])
        frame_scores = self.tracker.frame_tracker_probs.get(frame, {})
        scores = self.tracker.obj_id_to_score if scores is None else scores
        probs = np.asarray([scores[o] for o in ids], np.float32)
        tracker_probs = np.asarray([frame_scores.get(o, 0.0) for o in ids], np.float32)
        keep = masks.reshape(len(ids), -1).any(1) & ~np.isin(ids, list(hidden))
        omits = ()
        if prompted is not None:
            asked = np.asarray(ids) == prompted
            masks[asked & ~keep] = False  # shown, but empty when hidden
            omits = (prompted,) if (asked & ~keep).any() else ()
            keep |= asked
        ids = np.asarray(ids, np.int64)[keep]
        masks, probs, tracker_probs = masks[keep], probs[keep], tracker_probs[keep]
        # Meta's _apply_object_wise_non_overlapping_constraints (background 0) is SAM 3's rule with every
        # object in one group: the argmax over where(mask, probability, 0), in its priority-order form
        masks = objectwise_non_overlap(masks, tracker_probs, [0] * len(ids)) if len(ids) > 1 else masks
        return FrameResult(frame_index=frame, object_ids=ids, scores=probs, boxes_xyxy=masks_to_boxes(masks),
                           masks=masks, prompts=[self.tracker_text] * len(ids), tracker_probs=tracker_probs,
                           official_omits=omits)

    @property
    def tracker_text(self) -> str:
        return getattr(self, "_text", "")

    # ------------------------------------------------------------------------------ propagation
    def propagate(self, direction: str = "forward", start_frame: int | None = None, max_frames: int | None = None):
        """Track through the video, yielding one FrameResult per frame in processing order (Meta's
        propagate_in_video: forward from start_frame, backward from start_frame - 1; "both" runs
        both). start_frame defaults to the first prompted frame."""
        self._check_open()
        self._check_video("propagate()")
        check_direction(direction)
        if start_frame is None:
            if not self.prompted_frames:
                raise PromptError("no prompt in this session; call session.add_prompt(frame_index, text=...) first")
            start_frame = min(self.prompted_frames)
        self._check_frame(start_frame, "start_frame")
        check_max_frames(max_frames)
        if not self.prompted_frames:
            raise PromptError("no prompt in this session; call session.add_prompt(frame_index, text=...) first")
        passes = [False, True] if direction == "both" else [direction == "backward"]
        return self._propagate(passes, int(start_frame), max_frames)

    def _order(self, start: int, max_frames, reverse: bool) -> range:
        """Meta's _get_processing_order (backward starts at start - 1), with max_frames counting the
        frames tracked, as everywhere in sam3track (Meta's max_frame_num_to_track counts one more)."""
        n = self.num_frames
        if reverse:
            stop = -1 if max_frames is None else max(start - 1 - max_frames, -1)
            return range(start - 1, stop, -1)
        stop = n if max_frames is None else min(start + max_frames, n)
        return range(start, stop)

    def _propagate(self, passes, start: int, max_frames):
        self._check_idle("propagate() was called again")
        token = object()
        self._running = token
        try:
            for reverse in passes:
                kind, obj_ids = propagation_type(self.history, self.num_frames)
                self.history.append({"type": kind, "frame_idx": start, "obj_ids": obj_ids})
                order = self._order(start, max_frames, reverse)
                # fixed pools keep, through a first pass, the frames the pass back from start_frame reads
                later = reverse is False and len(passes) > 1
                pinned = frozenset(range(start, start + self.config.max_obj_ptrs_in_encoder)) if later else frozenset()
                if kind == "propagation_fetch":
                    for frame in order:
                        self._check_open()
                        yield self._postprocess(frame, self.cached.get(frame, {}), self.suppressed.get(frame, ()))
                elif kind == "propagation_partial":
                    yield from self._partial_pass(order, reverse, obj_ids, pinned)
                else:
                    yield from self._full_pass(order, reverse, pinned)
        finally:
            if self._running is token:
                self._running = None

    def _full_pass(self, order: range, reverse: bool, pinned=frozenset()):
        """Meta's propagate_in_video: outputs held back hotstart_delay frames, then post-processed in
        batches of postprocess_batch_size (scores and hidden ids are read when a batch is processed)."""
        cfg = self.config
        delay = cfg.hotstart_delay
        last = order[-1] if len(order) else None
        buffer: list[FrameOut] = []
        pending: list[FrameOut] = []
        unconfirmed: dict[int, list[int]] = {}
        for frame in order:
            self._check_open()
            out = self._run(frame, reverse, round_levels=False)
            self.tracker.evict(frame, reverse, self.num_frames, pinned)
            self.prompted_frames.add(frame)
            if cfg.masklet_confirmation_enable:
                unconfirmed[frame] = out.unconfirmed
            buffer.append(out)
            if delay > 0:
                if frame == last:
                    ready, buffer = buffer, []
                elif len(buffer) >= delay:
                    ready, buffer = buffer[:1], buffer[1:]
                else:
                    ready = []
            else:
                ready, buffer = buffer, []
            pending += ready
            while len(pending) >= cfg.postprocess_batch_size:
                batch, pending = pending[:cfg.postprocess_batch_size], pending[cfg.postprocess_batch_size:]
                for item in batch:
                    yield self._yield(item, reverse, unconfirmed)
        for item in pending:
            yield self._yield(item, reverse, unconfirmed)

    def _partial_pass(self, order: range, reverse: bool, obj_ids: list[int], pinned=frozenset()):
        """Meta's propagation_partial: only the added (or refined) objects' states are tracked, each
        frame yielded at once, their masks merged into the frame's cached result (a frame without one
        yields nothing new: Meta's _build_sam2_output returns {} there). The merged tracker score is
        the raw object-score logit, as Meta stores it."""
        t, h, w = self.tracker, self.source.height, self.source.width
        for frame in order:
            self._check_open()
            features = t.encode(pixel_values(self.source.read(frame), self.config), round_levels=False)
            refined = t.propagate_objects(frame, reverse, self.num_frames, features, obj_ids)
            t.evict(frame, reverse, self.num_frames, pinned, obj_ids)
            scores = t.frame_tracker_probs.setdefault(frame, {})
            for o, (score, _) in refined.items():
                scores[o] = score
            if frame in self.cached:
                merged = dict(self.cached[frame])
                for o, (_, low) in refined.items():
                    merged[o] = bilinear_positive(low[None], h, w)[0]
            else:
                merged = {}
            hidden = self.suppressed.get(frame, ())
            self.cached[frame] = {o: m for o, m in merged.items() if o not in hidden}
            self.prompted_frames.add(frame)
            yield self._postprocess(frame, merged, hidden)

    def _yield(self, out: FrameOut, reverse: bool, unconfirmed: dict[int, list[int]]) -> FrameResult:
        cfg = self.config
        lag = cfg.masklet_confirmation_consecutive_det_thresh - 1
        at = out.frame - lag if reverse else out.frame + lag
        at = max(0, min(at, self.num_frames - 1))
        hidden = set(self.suppressed.get(out.frame, ())) | set(unconfirmed.get(at) or ())
        # Meta's cache keeps the frame without its hidden objects (fetches re-play it)
        self.cached[out.frame] = {o: m for o, m in out.masks.items() if o not in hidden}
        return self._postprocess(out.frame, out.masks, hidden, out.scores)

    # ---------------------------------------------------------------------------------- objects
    def remove_object(self, obj_id: int) -> None:
        """Stop tracking an object: it leaves its tracker state (its slot becomes a hole, which
        changes what its bucket-mates attend to from now on) and every cached frame."""
        self._check_open()
        self._check_idle("remove_object() was called")
        if object_id_argument(obj_id) not in self.object_ids:
            raise ObjectIdError(f"object {shown(obj_id)} is not tracked in this session "
                                f"(tracked: {self.object_ids})")
        obj_id = int(obj_id)
        t = self.tracker
        t.remove_objects([obj_id])
        keep = t.tracks.obj_ids != obj_id
        t.tracks.keep_rows(keep)
        t.obj_id_to_score.pop(obj_id, None)
        for frame_cache in self.cached.values():
            frame_cache.pop(obj_id, None)
        self.history.append({"type": "remove", "obj_ids": [obj_id]})
