"""Running one side for a few frames and recording, per frame, where the time went.

Ours (a sam3track predictor) and the reference (transformers' Sam3VideoModel) are split by wrapping
their functions for the duration of one run (restored afterwards), each timed exclusively of the timed
calls it makes. Which function goes to which part: docs/benchmarks/README.md.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass

import numpy as np

TRANSFER_FIELDS = ("host_to_device", "host_to_device_bytes", "device_to_host", "device_to_host_bytes")


class ExclusiveTimer:
    """Seconds per category; a timed call inside another counts for its own category only."""

    def __init__(self):
        self.seconds: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()
        self._stack: list[list] = []  # [category, started, time spent in nested timed calls]

    def wrap(self, category: str, fn):
        def timed(*args, **kwargs):
            self._stack.append([category, time.perf_counter(), 0.0])
            try:
                return fn(*args, **kwargs)
            finally:
                cat, started, nested = self._stack.pop()
                elapsed = time.perf_counter() - started
                self.seconds[cat] += elapsed - nested
                self.calls[cat] += 1
                if self._stack:
                    self._stack[-1][2] += elapsed

        timed.__wrapped__ = fn
        return timed


@contextlib.contextmanager
def patched(timer: ExclusiveTimer, targets):
    """targets: (object, attribute, category). Module functions are patched in every sam3track module
    that imported them (they look them up as their own globals)."""
    undo = []
    try:
        for obj, attr, category in targets:
            original = getattr(obj, attr)
            wrapped = timer.wrap(category, original)
            holders = [obj]
            if isinstance(obj, type(sys)):  # a module: patch the name wherever it was imported
                holders = [m for name, m in list(sys.modules.items())
                           if name.split(".")[0] == obj.__name__.split(".")[0] and getattr(m, attr, None) is original]
            for holder in holders:
                in_dict = attr in vars(holder)
                undo.append((holder, attr, original, in_dict))
                setattr(holder, attr, wrapped)
        yield timer
    finally:
        for holder, attr, original, in_dict in reversed(undo):
            if in_dict:
                setattr(holder, attr, original)
            else:  # a method found on the class: drop the instance attribute that shadowed it
                delattr(holder, attr)


@contextlib.contextmanager
def counting(holder, attr: str, count):
    """Record count(result) of every call of holder.attr (a class or instance attribute) in a list."""
    original = getattr(holder, attr)
    seen: list[int] = []

    def observed(*args, **kwargs):
        result = original(*args, **kwargs)
        seen.append(count(result))
        return result

    in_dict = attr in vars(holder)
    setattr(holder, attr, observed)
    try:
        yield seen
    finally:
        if in_dict:
            setattr(holder, attr, original)
        else:
            delattr(holder, attr)


@dataclass
class FrameRecord:
    index: int
    ms: float
    tracked: int  # objects tracked after this frame (the ones the tracker propagates next)
    shown: int  # objects in this frame's result (non-empty, not suppressed)
    detections: int | None  # detections above score_threshold_detection on this frame, all prompts
    parts_ms: dict  # category -> ms (graphs by name for ours; reference categories for it)
    calls: dict
    transfers: dict  # ours only: counts and bytes each way


def _ms(seconds: float) -> float:
    return round(1e3 * seconds, 3)


# ------------------------------------------------------------------------------------------ ours
def run_ours(predictor, frames: np.ndarray, prompts, n_frames: int | None = None) -> list[FrameRecord]:
    """propagate() over `frames` (an RGB array) with every prompt on frame 0; one record per frame."""
    import sam3track.postprocess as post
    from sam3track.families.sam3.frame_loop import FrameLoop

    backend = predictor.backend
    timer = ExclusiveTimer()
    targets = [(post, "to_pixel_values", "preprocess"), (post, "build_result", "results")]
    targets += [(backend, name, "copies") for name in ("upload", "to_host", "copy") if hasattr(backend, name)]
    records = []
    frames = frames if n_frames is None else frames[:n_frames]
    with patched(timer, targets), counting(FrameLoop, "detect", len) as detections:
        session = predictor.start_session(frames)
        try:
            for text in prompts:
                session.add_prompt(frame_index=0, text=text)
            stream = session.propagate()
            for i in range(len(frames)):
                seconds, calls = Counter(backend.seconds), Counter(backend.calls)
                parts, before = Counter(timer.seconds), backend.transfers.snapshot()
                started = time.perf_counter()
                seen = len(detections)
                result = next(stream)
                elapsed = time.perf_counter() - started
                graphs = {g: s - seconds[g] for g, s in backend.seconds.items() if s - seconds[g] > 0}
                mine = {c: s - parts[c] for c, s in timer.seconds.items() if s - parts[c] > 0}
                moved = backend.transfers.since(before)
                breakdown = {f"graph:{g}": _ms(s) for g, s in sorted(graphs.items())}
                breakdown.update({c: _ms(s) for c, s in sorted(mine.items())})
                breakdown["python"] = _ms(elapsed - sum(graphs.values()) - sum(mine.values()))
                records.append(FrameRecord(
                    index=int(result.frame_index), ms=_ms(elapsed), tracked=len(session.object_ids),
                    shown=len(result.object_ids), detections=sum(detections[seen:]) if len(detections) > seen else None,
                    parts_ms=breakdown,
                    calls={g: c - calls[g] for g, c in backend.calls.items() if c - calls[g]},
                    transfers={k: getattr(moved, k) for k in TRANSFER_FIELDS}))
            stream.close()
        finally:
            session.close()
    return records



def ours_detection_scores(predictor, frame: np.ndarray, prompts) -> list[float]:
    """Every detection score of one RGB frame over all prompts as ``predictor`` computes them, highest
    first: what its thresholds compare. A variant at lower precision (bf16, int8) scores detections a
    little differently from the reference, so the thresholds that give it N objects come from these."""
    from sam3track.families.sam3.frame_loop import FrameLoop

    found = []
    original = FrameLoop.detect

    def detect(self, *args, **kwargs):
        det = original(self, *args, **kwargs)
        found.append(det.scores.copy())
        return det

    FrameLoop.detect = detect
    try:
        with predictor.start_session(frame[None]) as session:
            for text in prompts:
                session.add_prompt(frame_index=0, text=text)
            session.run_frame(0)
    finally:
        FrameLoop.detect = original
    return sorted(np.concatenate(found).tolist(), reverse=True)


# Loading a predictor only to read its first-frame scores: every detection passes, none starts an object.
SCORING_OVERRIDES = {"score_threshold_detection": 0.0, "new_det_thresh": 1.0, "mask_nms": False,
                     "fill_holes": False, "hotstart_delay": 0}

# ------------------------------------------------------------------------------------- reference
class Reference:
    """transformers' Sam3VideoModel on the bundle's source checkpoint, driven with our pixel values and
    token ids (as tests/test_parity.py does). Mask NMS and hole filling are off, as transformers runs on
    a CPU: it loads them only as a CUDA kernel from the hub (`kernels` package) and skips both without it."""

    CATEGORIES = ("backbone", "text_encoder", "detector_heads", "tracker", "memory_encoder", "postprocess")

    def __init__(self, source, threads: int | None = None):
        """self.bf16: run under torch.autocast("cpu", dtype=torch.bfloat16), the reference's own fast
        path on a bf16 CPU (set per run by the benchmark; see bf16_cpu)."""
        import torch
        from transformers import Sam3VideoModel
        from transformers.models.sam3_video import modeling_sam3_video as tm
        import importlib

        processing_sam3_video = importlib.import_module("transformers.models.sam3_video.processing_sam3_video")
        Sam3VideoProcessor = processing_sam3_video.Sam3VideoProcessor

        if threads:
            torch.set_num_threads(threads)
        tm.cv_utils_kernel = False  # "could not be loaded": NMS and hole filling skipped, as without `kernels`
        self.torch = torch
        self.model = Sam3VideoModel.from_pretrained(str(source)).eval()
        # postprocess_outputs is the processor's own code; building the processor needs torchvision (its
        # image processor), which does not load here, and postprocess_outputs reads no processor state
        self._processor = object.__new__(Sam3VideoProcessor)
        if "masks_to_boxes" not in vars(processing_sam3_video):  # imported from torchvision, absent here
            processing_sam3_video.masks_to_boxes = _masks_to_boxes
        self.defaults = {}
        self.bf16 = False

    def precision(self):
        """The autocast context of a run: bf16 where self.bf16, else none (fp32)."""
        if not self.bf16:
            return contextlib.nullcontext()
        return self.torch.autocast("cpu", dtype=self.torch.bfloat16)

    def configure(self, overrides: dict) -> None:
        """Set the heuristics' attributes (they are read from the model, as the parity tests set them);
        attributes set by an earlier call go back to the checkpoint's values first."""
        for name, value in self.defaults.items():
            setattr(self.model, name, value)
        self.defaults = {}
        for name, value in overrides.items():
            if not hasattr(self.model, name):
                raise AttributeError(f"Sam3VideoModel has no attribute {name}")
            self.defaults[name] = getattr(self.model, name)
            setattr(self.model, name, value)

    def pixels(self, frames: np.ndarray, config):
        from sam3track.postprocess import to_pixel_values

        return self.torch.from_numpy(np.concatenate([to_pixel_values(f, config) for f in frames]))

    def new_session(self, pixels, height: int, width: int, prompts, tokenizer, streaming: bool = False):
        from transformers.models.sam3_video.modeling_sam3_video import Sam3VideoInferenceSession

        session = Sam3VideoInferenceSession(video=None if streaming else pixels, video_height=height,
                                            video_width=width, dtype=self.torch.float32)
        for text in prompts:
            pid = session.add_prompt(text)
            ids, mask = tokenizer(text)
            session.prompt_input_ids[pid] = self.torch.from_numpy(ids)
            session.prompt_attention_masks[pid] = self.torch.from_numpy(mask)
        return session

    def postprocess(self, session, out):
        with self.torch.inference_mode():
            return self._processor.postprocess_outputs(session, out)

    def _targets(self):
        m = self.model
        return [(m.detector_model, "get_vision_features", "backbone"), (m, "get_vision_features_for_tracker", "backbone"),
                (m.detector_model, "get_text_features", "text_encoder"), (m.detector_model, "forward", "detector_heads"),
                (m.tracker_model, "forward", "tracker"), (m.tracker_model, "_encode_new_memory", "memory_encoder"),
                (self, "postprocess", "postprocess")]

    def run(self, pixels, height: int, width: int, prompts, tokenizer, n_frames: int | None = None) -> list[FrameRecord]:
        """propagate_in_video_iterator over the frames, each output postprocessed; one record per frame."""
        n = len(pixels) if n_frames is None else n_frames
        timer = ExclusiveTimer()
        records = []
        merged = (self.model, "_merge_detections_from_prompts", lambda out: int(len(out[0]["scores"])))
        with patched(timer, self._targets()), counting(*merged) as detections, self.precision():
            session = self.new_session(pixels[:n], height, width, prompts, tokenizer)
            stream = self.model.propagate_in_video_iterator(session, start_frame_idx=0, max_frame_num_to_track=n - 1)
            for _ in range(n):
                parts, seen = Counter(timer.seconds), len(detections)
                started = time.perf_counter()
                out = next(stream)
                shown = self.postprocess(session, out)
                elapsed = time.perf_counter() - started
                mine = {c: s - parts[c] for c, s in timer.seconds.items() if s - parts[c] > 0}
                breakdown = {c: _ms(s) for c, s in sorted(mine.items())}
                breakdown["python"] = _ms(elapsed - sum(mine.values()))
                records.append(FrameRecord(index=int(out.frame_idx), ms=_ms(elapsed), tracked=len(session.obj_ids),
                                           shown=len(shown["object_ids"]),
                                           detections=sum(detections[seen:]) if len(detections) > seen else None,
                                           parts_ms=breakdown, calls={}, transfers={}))
            stream.close()
        return records

    def detection_scores(self, pixel_frame, prompts, tokenizer) -> list[float]:
        """Every detection score of one frame over all prompts (the scores the thresholds compare), as
        run_detection computes them, highest first."""
        torch = self.torch
        det = self.model.detector_model
        scores = []
        with torch.inference_mode(), self.precision():
            vision = det.get_vision_features(pixel_values=pixel_frame[None])
            for text in prompts:
                ids, mask = (torch.from_numpy(a) for a in tokenizer(text))
                text_embeds = det.get_text_features(input_ids=ids, attention_mask=mask, return_dict=True)
                out = det(vision_embeds=vision, text_embeds=text_embeds, attention_mask=mask)
                probs = out.pred_logits.float().sigmoid() * out.presence_logits.float().sigmoid()
                scores += probs[0].reshape(-1).tolist()
        return sorted(scores, reverse=True)


def bf16_cpu() -> str | None:
    """None where this CPU computes bf16 natively (AVX512-BF16 or AMX, as torch's oneDNN needs for the
    autocast reference to be a fast path), else why not."""
    from sam3track.backend_choice import cpu_model_and_flags

    if cpu_model_and_flags()[1] & {"avx512_bf16", "amx_bf16"}:
        return None
    return "this CPU lists neither AVX512-BF16 nor AMX: autocast bf16 would be emulated, not the reference's fast path"


def _masks_to_boxes(masks):
    """torchvision.ops.masks_to_boxes (boxes xyxy of bool masks [N, H, W]), which the processor calls."""
    import torch

    boxes = torch.zeros((masks.shape[0], 4), dtype=torch.float)
    for i, mask in enumerate(masks):
        y, x = torch.where(mask != 0)
        if y.numel():
            boxes[i] = torch.stack([x.min(), y.min(), x.max(), y.max()]).float()
    return boxes


# --------------------------------------------------------------------------------- object counts
def count_overrides(scores: list[float], n: int) -> tuple[dict, dict]:
    """Settings under which exactly `n` objects are tracked from the first frame on, on both sides,
    given the first frame's detection scores (highest first): the detection threshold (and the
    new-object threshold) halfway between the n-th and (n+1)-th score, so that n detections start
    objects on frame 0; max_num_objects = n, so no later detection adds one; hotstart_delay 0, so
    the hotstart rules remove none (their window is empty); det_nms_thresh 0: mask NMS is off on both
    sides, and without its kernel the reference would still compute the detections' pairwise mask IoU
    (quadratic in detections) before discarding it. Returns (overrides, note)."""
    reachable = len(scores)
    k = min(n, reachable)
    low = scores[k] if k < reachable else 0.0
    threshold = (scores[k - 1] + low) / 2
    gap = scores[k - 1] - low
    note = {"asked": n, "reachable": reachable, "threshold": threshold, "score_gap": gap}
    if k < n:
        note["warning"] = f"only {reachable} detections on the first frame: {k} objects at most"
    elif gap < 1e-4:
        note["warning"] = (f"the {k}th and {k + 1}th detection scores differ by {gap:.1e}: rounding may give "
                           "either side another count")
    overrides = {"max_num_objects": n, "score_threshold_detection": threshold, "new_det_thresh": threshold,
                 "hotstart_delay": 0, "det_nms_thresh": 0.0}
    return overrides, note


def summarize(records: list[FrameRecord], skip: int = 1) -> dict:
    """Means over the steady frames (all objects born on frame 0 are tracked; frame 0 is reported apart)."""
    steady = records[skip:] or records
    parts = defaultdict(float)
    for r in steady:
        for k, v in r.parts_ms.items():
            parts[k] += v / len(steady)
    transfers = defaultdict(float)
    for r in steady:
        for k, v in r.transfers.items():
            transfers[k] += v / len(steady)
    return {"ms": float(np.mean([r.ms for r in steady])), "first_frame_ms": records[0].ms,
            "parts_ms": dict(parts), "transfers": dict(transfers),
            "tracked": [r.tracked for r in records], "shown": [r.shown for r in records],
            "detections": [r.detections for r in records]}
