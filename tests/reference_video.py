"""The reference side of the text-prompt parity tests (tests/test_parity.py): transformers' Sam3VideoModel.

Driven with pixel values and token ids directly (its processors need torchvision, which does not load
beside torch 2.13 here); its post-processing is re-done in torch following
`Sam3VideoProcessor.postprocess_outputs`. NMS and hole filling run through the test-side ports of the
cv-utils kernel (tests/reference_kernels.py); every run asserts the port was called. Runs are cached by
tests/reference_cache.py, keyed by the weights, these inputs and this code.
"""

from __future__ import annotations

import contextlib
import itertools

import numpy as np

from sam3track.postprocess import to_pixel_values

from .reference_cache import cached_run
from .reference_kernels import installed_reference_kernels

# The reference must be there: without torch this module fails to import and the run fails, never skips.
import torch  # noqa: E402

# Our logits match the reference's to ~1e-4; a pixel whose reference logit is closer than this to the
# 0 threshold, or that two objects claim with tracker scores equal to 1e-4, is a tie. Per-object IoU is
# measured without tie pixels (the mean IoU with them is asserted too). Measured on the streaming run:
# 10 object-frames differed by exactly one pixel, all ties; two were masks of 3 and 16 pixels.
TIE = 1e-3
BOTH_START = 12
# re-propagation: separate propagate calls on one session, each over the whole clip
REPROPAGATION = {"forward,backward": ("forward", "backward"),
                 "forward,backward,forward": ("forward", "backward", "forward")}


def reference_run(bundle, frames: np.ndarray, prompts: list[str], predictor, overrides=None, mode="forward",
                  kernels=True):
    """(results per frame, births, removed ids, conditioning frames per object) of the reference on
    ``frames`` with the text ``prompts``; ``predictor`` (sam3track's, on the same bundle) gives the pixel
    values and token ids. Cached (reference_cache)."""
    pixels = np.concatenate([to_pixel_values(f, predictor.config) for f in frames])
    tokens = [predictor.tokenizer(text) for text in prompts]
    arrays = {"pixels": pixels, **{f"ids{j}": ids for j, (ids, _) in enumerate(tokens)},
              **{f"mask{j}": mask for j, (_, mask) in enumerate(tokens)}}
    params = {"prompts": prompts, "overrides": overrides or {}, "mode": mode, "kernels": kernels,
              "hw": list(frames.shape[1:3])}
    run = cached_run("video", bundle, arrays, params,
                     lambda: _live_run(bundle, pixels, frames.shape[1:3], prompts, tokens, overrides, mode, kernels))
    *outputs, kernel_calls = run
    if kernels:
        assert_kernel_used(kernel_calls)
    return tuple(outputs)


def _live_run(bundle, pixels, hw, prompts, tokens, overrides, mode, kernels):
    if not kernels:  # as transformers runs without the `kernels` package: no NMS, no hole filling
        with kernel_absent():
            return (*_reference_run(bundle, pixels, hw, prompts, tokens, overrides, mode), None)
    with installed_reference_kernels() as kernel:  # NMS and hole filling, as with the real kernel
        outputs = _reference_run(bundle, pixels, hw, prompts, tokens, overrides, mode)
    return (*outputs, {"calls": dict(kernel.calls), "errors": list(map(repr, kernel.errors))})


@contextlib.contextmanager
def kernel_absent():
    from transformers.models.sam3_video import modeling_sam3_video as tm

    previous, tm.cv_utils_kernel = tm.cv_utils_kernel, False  # False: "could not be loaded", skip
    try:
        yield
    finally:
        tm.cv_utils_kernel = previous


def assert_kernel_used(kernel: dict):
    """The reference really ran mask NMS and hole filling (transformers skips both silently when the
    kernel is missing or raises); ``kernel``: the port's recorded calls and errors."""
    assert kernel["calls"].get("generic_nms", 0) > 0 and kernel["calls"].get("cc_2d", 0) > 0, kernel["calls"]
    assert not kernel["errors"], kernel["errors"]
    print(f"reference kernel calls: {kernel['calls']}")


def _reference_run(bundle, pixels: np.ndarray, hw, prompts: list[str], tokens, overrides=None, mode="forward"):
    from transformers import Sam3VideoModel
    from transformers.models.sam3_video.modeling_sam3_video import Sam3VideoInferenceSession

    model = Sam3VideoModel.from_pretrained(str(bundle / "source")).eval()
    for name, value in (overrides or {}).items():  # the heuristics read these attributes
        setattr(model, name, value)
    pixels = torch.from_numpy(pixels)
    (h, w), n = hw, len(pixels)
    video = None if mode == "stream" else pixels
    session = Sam3VideoInferenceSession(video=video, video_height=h, video_width=w, dtype=torch.float32)
    for text, (ids, mask) in zip(prompts, tokens):
        pid = session.add_prompt(text)
        session.prompt_input_ids[pid] = torch.from_numpy(ids)
        session.prompt_attention_masks[pid] = torch.from_numpy(mask)
    results, births, removed = [], {}, set()
    with torch.no_grad():
        if mode == "stream":
            outputs = (model(inference_session=session, frame=pixels[i]) for i in range(n))
        elif mode == "backward":  # the reference's reverse pass starts one frame before start_frame_idx
            outputs = model.propagate_in_video_iterator(session, start_frame_idx=n,
                                                        max_frame_num_to_track=n, reverse=True)
        elif mode == "both":  # forward from BOTH_START, then backward from it, on the same state
            outputs = itertools.chain(
                model.propagate_in_video_iterator(session, start_frame_idx=BOTH_START,
                                                  max_frame_num_to_track=n - 1 - BOTH_START),
                model.propagate_in_video_iterator(session, start_frame_idx=BOTH_START,
                                                  max_frame_num_to_track=n, reverse=True))
        elif mode in REPROPAGATION:  # separate calls on one session: forward, backward from the end, ...
            outputs = itertools.chain.from_iterable(
                model.propagate_in_video_iterator(session, start_frame_idx=0, max_frame_num_to_track=n - 1)
                if direction == "forward" else
                model.propagate_in_video_iterator(session, start_frame_idx=n,
                                                  max_frame_num_to_track=n, reverse=True)
                for direction in REPROPAGATION[mode])
        else:
            outputs = model.propagate_in_video_iterator(session, start_frame_idx=0,
                                                        max_frame_num_to_track=n - 1)
        for out in outputs:
            results.append(_postprocess(session, out, h, w))
            removed |= set(out.removed_obj_ids)
    births = dict(session.obj_first_frame_idx)
    conditioning = {session.obj_idx_to_id(idx): sorted(out["cond_frame_outputs"])
                    for idx, out in session.output_dict_per_obj.items()}
    return results, births, removed, conditioning


def _postprocess(session, out, h, w):
    ids = sorted(out.obj_id_to_mask)
    if not ids:
        return out.frame_idx, [], {}, {}
    low = torch.cat([out.obj_id_to_mask[i] for i in ids]).unsqueeze(1)
    logits = torch.nn.functional.interpolate(low, size=(h, w), mode="bilinear", align_corners=False)[:, 0]
    masks = logits > 0
    hidden = set(out.suppressed_obj_ids or ()) | set(session.hotstart_removed_obj_ids)
    keep = [bool(masks[j].any()) and i not in hidden for j, i in enumerate(ids)]
    kept = torch.tensor(keep, dtype=torch.bool)
    ids = [i for i, k in zip(ids, keep) if k]
    masks = masks[kept]
    ties = list((logits.abs() < TIE)[kept])  # pixels either implementation may threshold either way
    tracker = torch.tensor([out.obj_id_to_tracker_score.get(i, 0.0) for i in ids])
    prompts = [session.obj_id_to_prompt_id[i] for i in ids]
    own_ties = torch.stack(ties) if ids else None
    for p in set(prompts):  # object-wise non-overlap per prompt (processor)
        idx = [j for j, q in enumerate(prompts) if q == p]
        vals = torch.where(masks[idx], tracker[idx, None, None], torch.zeros(()))
        winner = vals.argmax(0)
        if len(idx) > 1:  # claimants whose tracker scores agree to 1e-4, or whose own pixel is a tie
            top = vals.topk(2, dim=0).values
            contested = ((top[0] - top[1] < 1e-4) & (top[1] > 0)) | own_ties[idx].any(0)
            for j in idx:
                ties[j] = ties[j] | contested
        for jj, j in enumerate(idx):
            masks[j] = masks[j] & (winner == jj) & (vals[jj] > 0)
    return out.frame_idx, ids, {i: (masks[j].numpy(), ties[j].numpy()) for j, i in enumerate(ids)}, \
        {i: float(out.obj_id_to_score[i]) for i in ids}


