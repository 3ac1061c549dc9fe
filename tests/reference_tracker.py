"""The reference side of the interactive (clicks and boxes) parity test: transformers' Sam3TrackerVideoModel.

What runs: `Sam3VideoModel.from_pretrained(bundle / "source").tracker_model` (a Sam3TrackerVideoModel built
without a vision encoder, weights from the same checkpoint as the bundle), fed with exactly the features
Sam3VideoModel's tracker sees: detector ViT trunk (`detector_model.get_vision_features`) -> `tracker_neck` ->
`conv_s0` / `conv_s1` (`Sam3VideoModel.get_vision_features_for_tracker`), one frame at a time (batch 1, as
Sam3VideoModel runs it), all frames pre-cached in a `Sam3TrackerVideoInferenceSession` (cache size = number of
frames; the tracker has no vision encoder, so a cache miss would raise instead of silently recomputing).
Prompts are added as `Sam3TrackerVideoProcessor.add_inputs_to_inference_session` adds them (re-done here: the
processors need torchvision, which does not load beside torch 2.13 here). Pixel values come from
`sam3track.postprocess.to_pixel_values`, as in tests/test_parity.py.

Semantics the runtime must match (transformers 5.24.0; `tv` = models/sam3_tracker_video/modeling_sam3_tracker_video.py,
`tp` = models/sam3_tracker_video/processing_sam3_tracker_video.py, `sv` = models/sam3_video/modeling_sam3_video.py;
line numbers drift between releases):

1. Coordinates (tp:179-207, tp:428-460): video pixels -> model-input pixels, x' = x * (S / W), y' = y * (S / H)
   (S = image_size; the Python-float ratio is applied to a float32 tensor), box corners likewise.
   The prompt encoder then adds +0.5 and divides by S (tv:1287-1310); the tracker always passes boxes as
   points (input_boxes=None), so one pad point (0, 0) with label -1 is always appended (tv:1348).
2. Point order (tp:701-711, tp:718-726): a box becomes two points [x0, y0], [x1, y1] with labels 2, 3 placed
   BEFORE the clicks of the same call. With clear_old_inputs=False the earlier points of that (object, frame)
   come first, then the new call's points (box corners, then clicks). A box with clear_old_inputs=False raises
   ValueError (tp:702): a box always replaces the frame's earlier points of that object. Mask inputs of that
   (object, frame) are dropped (tp:734). `obj_with_new_inputs` is REPLACED by the call's obj_ids (tp:736).
3. Which objects run on `model(inference_session, frame_idx=f)` (tv:1829-1884): every object in the session,
   one at a time with batch 1. An object without new inputs whose frame f is a conditioning frame reuses the
   stored output (no recompute, no memory encoding). Any other object without inputs on f is tracked with
   memory (is_init_cond_frame=False), stored as a NON-conditioning output for f, marked tracked, and its memory
   is encoded: the immediate result of a prompt changes the other objects' state on that frame.
4. is_init_cond_frame (tv:1845-1848): for the prompted object, True iff f is not in
   frames_tracked_per_obj[obj] (frames the object was tracked on by memory; conditioning frames are never
   entered there, tv:1884). True -> current features + no_memory_embedding, memory ignored (tv:2525-2532), and
   the output is stored as a conditioning output. False -> memory-conditioned features, `reverse` is whatever
   `model()` was called with (default False: forward memory offsets, even if the frame was tracked backward),
   and the output is stored as NON-conditioning (there is no add_all_frames_to_correct_as_cond in transformers,
   and no prev_sam_mask_logits: the earlier mask on that frame is not fed back, tv:2674).
5. Multimask (tv:2580-2588): multimask = multimask_output_in_sam and (is_init_cond_frame or
   multimask_output_for_tracking) and min_pt <= num_points <= max_pt, num_points counting box corners and all
   accumulated clicks (not the pad point). Tiny config (and the default): True, True, 0, 1 -> multimask for
   0 or 1 point (tracking without points and a single click), single mask (with dynamic multimask via
   stability) for >= 2 points, i.e. for any box and any accumulated click pair.
   With multimask the best mask by IoU and its output token (pointer) are taken (tv:2144-2153); single-mask
   with dynamic stability takes mask token 0's output token even if the stability rule picked another mask
   (tv:1566-1573).
6. Object score (tv:2124-2142): low-res masks are set to NO_OBJ_SCORE (-1024) where object_score_logit <= 0;
   high_res_masks = bilinear (align_corners=False) upsample of those low-res logits to S x S.
7. Memory encoding (tv:1873-1878, tv:2753-2815, tv:2697-2751): after all objects ran, one batched
   `_encode_new_memory` over every object that was (re)computed on f, from `high_res_masks` (S x S), resized
   bilinear (antialias=True, align_corners=False) to the mask memory size 4 * L (L = 4 * S // 14: S x S ->
   16 S/14, an UPsample: 112 -> 128 tiny, 1008 -> 1152 full, so antialias changes nothing), binarised (> 0)
   for ALL of them if ANY of them had point/mask inputs on this call (`is_mask_from_pts=any(...)`, tv:2791),
   else sigmoid; then * 20 - 10 (sigmoid_scale/bias_for_mem_enc). Features stored as bf16 as usual.
8. propagate_in_video_iterator (tv:2817-2869): default start frame = the earliest conditioning frame of any
   object (not the earliest prompted frame: a click on an already-tracked frame is not a conditioning frame).
   Forward: start..min(start + max, T - 1), start included. Reverse: start down to max(start - max, 0), start
   INCLUDED (unlike Sam3VideoModel's reverse pass, which starts one frame earlier); reverse from start 0 yields
   NOTHING (not even frame 0). Each frame is `model(frame_idx=t, reverse=reverse)` as in 3.
   (sam3track's contract defaults to the earliest PROMPTED frame: the same unless the earliest prompt is a
   correction on a tracked frame.)
9. A correcting click on a frame the object was already tracked on (4: is_init_cond_frame False) is stored as
   a non-conditioning output. A later propagation that reaches that frame (forward from the default start,
   which is earlier) re-tracks the object there WITHOUT the clicks (no new inputs, no conditioning output:
   tv:1835-1841) and overwrites the correction; only frames processed before that revisit can see it (as a
   non-conditioning memory / pointer). A click on a frame the object was NOT tracked on is a conditioning frame
   and is reused unchanged whenever propagation passes it. Measured (tests/test_interactive_parity.py scenario,
   both clips, both directions): after a two-click correction on frame 20, re-propagating the whole pass gives
   bit-identical outputs to the pass before the correction; a pass started at 21 (forward) or 19 (backward)
   does follow it.
10. Post-processing: the tracker-only model does none (no hole filling, no non-overlap, no suppression, no
    hotstart): all objects are reported on every frame (empty masks included, where the object score <= 0).
    The processor's post_process_masks (defaults; models/sam3/image_processing_sam3.py:632-680) only upsamples the low-res logits bilinear
    (align_corners=False) to the video size and thresholds > 0; non-overlap is off by default.
11. Objects that get their first input on a later frame are still tracked on earlier frames during forward
    propagation (from their conditioning memory, which lies in the future; their conditioning object pointers
    are only used at or after that frame, tv:2385-2390).
12. sam3track keeps a correction of a tracked frame as a conditioning frame (Meta's official predictor,
    add_all_frames_to_correct_as_cond). A prompt step with `as_cond=True` does the same here: the
    prompted object's output of that frame (computed and memory-encoded exactly as in 4 and 7) moves
    from non_cond_frame_outputs to cond_frame_outputs (appended) before the next step that is not
    another click for that object and frame (as the official predictor consolidates its temporary
    outputs, and as sam3track leaves the frame's own output out while clicks on it go on), so later
    prompts and propagations reuse it (3) and read it as a conditioning memory.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np

import torch  # the reference must be there: this module fails to import without it

# a pixel whose reference logit is closer than this to the 0 threshold is a tie (as in tests/test_parity.py)
TIE = 1e-3


@dataclasses.dataclass
class FrameOutput:
    """One `model(...)` call's output, post-processed like the processor (all numpy)."""
    frame_index: int
    object_ids: list[int]            # every object of the session, in insertion order
    masks: np.ndarray                # bool [N, H, W]: bilinear upsample of the low-res logits to H x W, > 0
    ties: np.ndarray                 # bool [N, H, W]: |upsampled logit| < TIE
    low_res_logits: np.ndarray       # float32 [N, L, L] (NO_OBJ_SCORE where the object score <= 0)
    object_score_logits: np.ndarray  # float32 [N]
    object_scores: np.ndarray        # float32 [N]: sigmoid of the above (sam3track's tracker_probs)


@dataclasses.dataclass
class PromptOutput:
    """The immediate result of one prompt step (the frame's output right after the prompt)."""
    step: dict                        # the script step as given
    point_coords: np.ndarray          # float32 [P, 2]: the object's accumulated point inputs on that frame,
    point_labels: np.ndarray          # int32 [P]       model-input pixels (before the encoder's +0.5)
    is_init_cond_frame: bool          # the prompted object's output is a conditioning output
    multimask: bool                   # tv:2580 rule for the prompted object
    result: FrameOutput


@dataclasses.dataclass
class PropagationOutput:
    direction: str
    start_frame: int | None            # as asked (None: the reference's default)
    frames: list[FrameOutput]


@dataclasses.dataclass
class ReferenceRun:
    events: list                       # PromptOutput and PropagationOutput, in script order
    conditioning: dict[int, list[int]]  # obj_id -> conditioning frames at the end
    tracked: dict[int, list[int]]       # obj_id -> frames tracked with memory at the end
    seconds: dict[str, float]           # "features", "prompts", "propagation"

    @property
    def prompts(self) -> list[PromptOutput]:
        return [e for e in self.events if isinstance(e, PromptOutput)]

    @property
    def propagations(self) -> list[PropagationOutput]:
        return [e for e in self.events if isinstance(e, PropagationOutput)]


def load_reference(bundle: Path):
    """Sam3VideoModel from the bundle's checkpoint, eval mode (its tracker_model is the reference)."""
    from transformers import Sam3VideoModel

    return Sam3VideoModel.from_pretrained(str(Path(bundle) / "source")).eval()


def tracker_features(model, pixel_values: torch.Tensor):
    """One frame [1, 3, S, S] -> (vision_feats, vision_pos_embeds) exactly as Sam3VideoModel caches them for
    its tracker (sv:1613-1631): detector ViT trunk, tracker_neck, conv_s0/conv_s1, flattened to HW x 1 x C."""
    vision_embeds = model.detector_model.get_vision_features(pixel_values=pixel_values)
    return model.get_vision_features_for_tracker(vision_embeds=vision_embeds)


def normalize_coords(xy, video_hw, image_size) -> torch.Tensor:
    """Video pixels [..., 2] -> model-input pixels, as Sam3TrackerVideoProcessor._normalize_coordinates."""
    old_h, old_w = video_hw
    coords = torch.as_tensor(np.asarray(xy, np.float64), dtype=torch.float32).clone()
    coords[..., 0] = coords[..., 0] * (image_size / old_w)
    coords[..., 1] = coords[..., 1] * (image_size / old_h)
    return coords


def add_inputs(session, frame: int, obj_id: int, points=None, labels=None, box=None, clear_old=False,
               image_size: int = None):
    """One object's points and/or box on one frame, as
    Sam3TrackerVideoProcessor.add_inputs_to_inference_session(session, frame, obj_ids=obj_id,
    input_points=[[points]], input_labels=[[labels]], input_boxes=[[box]], clear_old_inputs=clear_old)."""
    if points is None and box is None:
        raise ValueError("at least one of points or box")
    hw = (session.video_height, session.video_width)
    if points is not None:
        points = np.asarray(points, np.float64).reshape(-1, 2)
        labels = np.ones(len(points), np.int64) if labels is None else np.asarray(labels, np.int64).reshape(-1)
        if len(labels) != len(points):
            raise ValueError("points and labels must have the same length")
        coords = normalize_coords(points, hw, image_size).reshape(1, 1, -1, 2)
        labs = torch.from_numpy(labels).reshape(1, 1, -1)  # int64, as the processor builds them
    else:
        coords = torch.zeros(1, 1, 0, 2, dtype=torch.float32)
        labs = torch.zeros(1, 1, 0, dtype=torch.int32)
    if box is not None:
        if not clear_old:
            raise ValueError("cannot add box without clearing old points (transformers' processor, tp:702)")
        corners = normalize_coords(np.asarray(box, np.float64).reshape(2, 2), hw, image_size).reshape(1, 1, 2, 2)
        coords = torch.cat([corners, coords], dim=2)
        labs = torch.cat([torch.tensor([2, 3], dtype=torch.int32).reshape(1, 1, 2), labs], dim=2)
    obj_idx = session.obj_id_to_idx(obj_id)
    if not clear_old:
        existing = session.point_inputs_per_obj[obj_idx].get(frame)
        if existing is not None:
            coords = torch.cat([existing["point_coords"], coords], dim=2)
            labs = torch.cat([existing["point_labels"], labs], dim=2)
    session.add_point_inputs(obj_idx, frame, {"point_coords": coords, "point_labels": labs})
    session.remove_mask_inputs(obj_idx, frame)
    session.obj_with_new_inputs = [obj_id]


def postprocess(out, video_hw) -> FrameOutput:
    """Processor-style: low-res logits -> bilinear (align_corners=False) to the video size -> > 0."""
    low = out.pred_masks.float()
    if low.dim() == 3:
        low = low.unsqueeze(1)
    logits = torch.nn.functional.interpolate(low, size=tuple(video_hw), mode="bilinear", align_corners=False)[:, 0]
    scores = out.object_score_logits.float().reshape(-1)
    return FrameOutput(
        frame_index=int(out.frame_idx),
        object_ids=[int(i) for i in out.object_ids],
        masks=(logits > 0).numpy(),
        ties=(logits.abs() < TIE).numpy(),
        low_res_logits=low[:, 0].numpy().astype(np.float32),
        object_score_logits=scores.numpy().astype(np.float32),
        object_scores=torch.sigmoid(scores).numpy().astype(np.float32),
    )


def make_session(model, frames: np.ndarray, predictor):
    """An inference session over the frames' pixel values with every frame's tracker features cached."""
    from transformers.models.sam3_tracker_video.modeling_sam3_tracker_video import Sam3TrackerVideoInferenceSession

    from sam3track.postprocess import to_pixel_values

    pixels = torch.from_numpy(np.concatenate([to_pixel_values(f, predictor.config) for f in frames]))
    h, w = frames.shape[1:3]
    session = Sam3TrackerVideoInferenceSession(video=pixels, video_height=h, video_width=w, dtype=torch.float32,
                                               max_vision_features_cache_size=len(frames))
    with torch.no_grad():
        for t in range(len(frames)):
            feats, pos = tracker_features(model, pixels[t:t + 1])
            session.cache.cache_vision_features(t, {"vision_feats": feats, "vision_pos_embeds": pos})
    return session


def run_reference_tracker(bundle, frames: np.ndarray, script: list[dict], predictor,
                          directions=(), model=None) -> ReferenceRun:
    """Drive transformers' tracker through `script`, then propagate in each of `directions`.

    frames: uint8 [T, H, W, 3]. predictor: `sam3track.load(bundle)`, used only for its config (pixel values).
    script steps, in order:
    - a prompt: dict(frame=f, obj_id=i, points=[[x, y], ...] | None, labels=[1, 0, ...] | None,
      box=[x0, y0, x1, y1] | None, clear_old=False, as_cond=False), video pixels; a box needs
      clear_old=True (tp:702). Adds the inputs (processor semantics) and calls `tracker(session,
      frame_idx=f)`: the immediate result; as_cond: see 12 in the module docstring.
    - a propagation: dict(propagate="forward" | "backward", start_frame=None, max_frames=None):
      `propagate_in_video_iterator(session, start_frame_idx, max_frame_num_to_track, reverse)`.
    `directions` ("forward", "backward") are propagations with the defaults appended to the script.
    Returns a ReferenceRun (events in order: PromptOutput / PropagationOutput, all numpy).
    """
    model = load_reference(bundle) if model is None else model
    tracker = model.tracker_model
    image_size = int(predictor.config.image_size)
    assert image_size == tracker.image_size, (image_size, tracker.image_size)
    hw = frames.shape[1:3]
    seconds = {"features": 0.0, "prompts": 0.0, "propagation": 0.0}
    t0 = time.perf_counter()
    session = make_session(model, frames, predictor)
    seconds["features"] = time.perf_counter() - t0
    steps = list(script) + [{"propagate": d} for d in directions]
    events = []
    pending = []  # (obj_idx, frame) corrections to move to the conditioning outputs (12)

    def consolidate(step=None):
        for obj_idx, frame in list(pending):
            if step is None or (step.get("frame"), step.get("obj_id")) != (frame, session.obj_idx_to_id(obj_idx)):
                kept = session.output_dict_per_obj[obj_idx]
                kept["cond_frame_outputs"][frame] = kept["non_cond_frame_outputs"].pop(frame)
                pending.remove((obj_idx, frame))

    with torch.no_grad():
        for step in steps:
            consolidate(step)
            t0 = time.perf_counter()
            if "propagate" in step:
                direction = step["propagate"]
                if direction not in ("forward", "backward"):
                    raise ValueError(f"unknown direction {direction!r}")
                outs = tracker.propagate_in_video_iterator(
                    session, start_frame_idx=step.get("start_frame"),
                    max_frame_num_to_track=step.get("max_frames"), reverse=direction == "backward")
                events.append(PropagationOutput(direction, step.get("start_frame"),
                                                [postprocess(o, hw) for o in outs]))
                seconds["propagation"] += time.perf_counter() - t0
                continue
            frame, obj_id = int(step["frame"]), int(step["obj_id"])
            add_inputs(session, frame, obj_id, step.get("points"), step.get("labels"), step.get("box"),
                       bool(step.get("clear_old", False)), image_size)
            obj_idx = session.obj_id_to_idx(obj_id)
            init = frame not in session.frames_tracked_per_obj[obj_idx]
            inputs = session.point_inputs_per_obj[obj_idx][frame]
            multimask = bool(tracker._use_multimask(init, inputs))
            out = tracker(inference_session=session, frame_idx=frame)
            if step.get("as_cond") and not init and (obj_idx, frame) not in pending:
                pending.append((obj_idx, frame))  # 12: the correction becomes a conditioning frame
            events.append(PromptOutput(
                step=dict(step),
                point_coords=inputs["point_coords"][0, 0].numpy().astype(np.float32),
                point_labels=inputs["point_labels"][0, 0].numpy().astype(np.int32),
                is_init_cond_frame=init, multimask=multimask, result=postprocess(out, hw)))
            seconds["prompts"] += time.perf_counter() - t0
        consolidate()
    conditioning = {session.obj_idx_to_id(i): sorted(o["cond_frame_outputs"])
                    for i, o in session.output_dict_per_obj.items()}
    tracked = {session.obj_idx_to_id(i): sorted(f) for i, f in session.frames_tracked_per_obj.items()}
    run = ReferenceRun(events, conditioning, tracked, seconds)
    run.session = session  # for tests that look inside (not part of the plain-numpy result)
    return run


def cached_reference_tracker(bundle, frames: np.ndarray, script: list[dict], predictor, model=None,
                             directions=()) -> ReferenceRun:
    """``run_reference_tracker`` through tests/reference_cache.py: keyed by the weights, the pixel values,
    the script and this code (a cached run has no ``.session``)."""
    from sam3track.postprocess import to_pixel_values

    from .reference_cache import cached_run

    pixels = np.concatenate([to_pixel_values(f, predictor.config) for f in frames])
    params = {"script": script, "directions": list(directions), "hw": list(frames.shape[1:3]),
              "image_size": int(predictor.config.image_size)}
    return cached_run("tracker", bundle, {"pixels": pixels}, params,
                      lambda: run_reference_tracker(bundle, frames, script, predictor, directions, model))
