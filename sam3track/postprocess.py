"""Frames in, results out: preprocessing to pixel values, and low-res logits to FrameResult."""

from __future__ import annotations

import functools

import cv2
import numpy as np

from .mask_ops import binary_masks_at
from .results import FrameResult


def _antialiased_taps(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Source indices and weights [out, taps] of an antialiased bilinear resize along one axis.

    The triangle filter is stretched by the scale when shrinking (PIL / torchvision `antialias=True`),
    so a large frame is averaged, not sampled, on its way down to the model's input size.
    """
    scale = in_size / out_size
    support = max(scale, 1.0)
    centers = (np.arange(out_size) + 0.5) * scale
    first = np.maximum((centers - support + 0.5).astype(np.int64), 0)
    last = np.minimum((centers + support + 0.5).astype(np.int64), in_size)
    taps = int((last - first).max())
    idx = first[:, None] + np.arange(taps)[None]
    weights = np.clip(1.0 - np.abs((idx - centers[:, None] + 0.5) / support), 0.0, None)
    weights[idx >= last[:, None]] = 0.0
    weights /= weights.sum(axis=1, keepdims=True)
    return np.minimum(idx, in_size - 1), weights.astype(np.float32)


@functools.lru_cache(maxsize=32)
def _taps_by_column(in_size: int, out_size: int) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    """`_antialiased_taps` as one (source rows [out], weights [out, 1, 1]) pair per tap, cached per size
    pair (a video resizes every frame from the same size)."""
    idx, weights = _antialiased_taps(in_size, out_size)
    columns = []
    for k in range(idx.shape[1]):
        rows, w = np.ascontiguousarray(idx[:, k]), np.ascontiguousarray(weights[:, k]).reshape(-1, 1, 1)
        rows.setflags(write=False)
        w.setflags(write=False)
        columns.append((rows, w))
    return tuple(columns)


def _resize_first_axis(x: np.ndarray, size: int) -> np.ndarray:
    """One pass along axis 0 of a contiguous [n, ...] array: float32 [size, ...], rounded and clipped to
    uint8 levels. Each output is 0 + w0*x0 + w1*x1 + ... in float32, one tap at a time in tap order
    (products rounded before each sum, no fused multiply-add), so the result does not depend on how
    the taps are laid out in memory."""
    acc = np.zeros((size,) + x.shape[1:], np.float32)
    product = np.empty_like(acc)
    for rows, w in _taps_by_column(x.shape[0], size):
        acc += np.multiply(w, x[rows], out=product)  # rows of x: contiguous blocks, no strided gather
    return np.clip(np.rint(acc, out=acc), 0, 255, out=acc)  # torchvision keeps uint8 between passes


def _swap_first_axes(x: np.ndarray) -> np.ndarray:
    """[A, B, C] -> contiguous [B, A, C]: a pure data move (OpenCV's for up to 4 channels, several
    times faster than numpy's for 3-byte pixels)."""
    if x.shape[2] <= 4:
        return cv2.transpose(x).reshape(x.shape[1], x.shape[0], x.shape[2])
    return np.ascontiguousarray(np.swapaxes(x, 0, 1))


def resize_antialiased(rgb: np.ndarray, height: int, width: int) -> np.ndarray:
    """uint8 [H, W, C] -> uint8 [height, width, C], as torchvision's bilinear resize with antialias.

    Width first, then height; each pass runs along the first axis of a contiguous array (the image is
    transposed to [W, H, C] for the first), so every tap gathers whole rows."""
    x = _resize_first_axis(_swap_first_axes(rgb).astype(np.float32), width)  # [width, H, C]
    x = _resize_first_axis(_swap_first_axes(x), height)  # [height, width, C], integral levels in [0, 255]
    return x.astype(np.uint8)


def to_pixel_values(rgb: np.ndarray, config) -> np.ndarray:
    """RGB uint8 [H, W, 3] -> float32 [1, 3, S, S], the processor's steps: antialiased bilinear resize
    of the uint8 image (rounded to uint8, as torchvision does), rescale, normalise (channels first
    before the arithmetic, which is per element: the same values, on contiguous planes)."""
    s = config.image_size
    img = resize_antialiased(rgb, s, s).transpose(2, 0, 1).astype(np.float32, order="C")  # [3, S, S]
    img *= np.float32(config.rescale_factor)
    img -= np.asarray(config.image_mean, np.float32)[:, None, None]
    img /= np.asarray(config.image_std, np.float32)[:, None, None]
    return img[None]


def upsample_masks(low_res: np.ndarray, height: int, width: int) -> np.ndarray:
    """[N, L, L] logits -> bool [N, H, W] (bilinear, half-pixel centres, like F.interpolate align_corners=False).
    One object at a time (OpenCV's multi-channel resize rounds differently), into one reused buffer."""
    out = np.empty((low_res.shape[0], height, width), bool)
    scratch = None
    for i, m in enumerate(low_res):
        scratch = cv2.resize(np.asarray(m, np.float32), (width, height), dst=scratch, interpolation=cv2.INTER_LINEAR)
        np.greater(scratch, 0, out=out[i])
    return out


def masks_to_boxes(masks: np.ndarray) -> np.ndarray:
    boxes = np.zeros((masks.shape[0], 4), np.float32)
    for i, m in enumerate(masks):
        ys, xs = np.flatnonzero(m.any(axis=1)), np.flatnonzero(m.any(axis=0))
        if ys.size:
            boxes[i] = (xs[0], ys[0], xs[-1], ys[-1])
    return boxes


def objectwise_non_overlap(masks: np.ndarray, scores: np.ndarray, prompt_ids: list[int]) -> np.ndarray:
    """Each pixel goes to the object with the highest tracker score among its prompt's objects.
    Objects of group -1 (user-prompted) are left as the tracker gives them, as the reference's tracker
    post-processing does (apply_non_overlapping_constraints=False).

    The rule is the argmax over objects of `where(mask, score, 0)` (float32; ties to the first object),
    a pixel kept by its winner when the winner's value is > 0. Scores are constant per object, so this
    is a priority order: objects by descending score (ties by position) take their pixels not taken
    yet; an object scoring <= 0 keeps nothing and takes nothing from the others; a NaN score (which
    argmax picks first) keeps nothing and blocks the others wherever its mask is. Two boolean
    operations per object instead of an argmax over a float [N, H, W] stack."""
    out = masks.copy()
    _non_overlap_in_place(out, scores, prompt_ids)
    return out


def _non_overlap_in_place(masks: np.ndarray, scores: np.ndarray, prompt_ids: list[int]) -> None:
    prompts = np.asarray(prompt_ids)
    scores = np.asarray(scores).astype(np.float32)
    for p in np.unique(prompts[prompts >= 0]):
        idx = np.flatnonzero(prompts == p)
        s = scores[idx]
        positive = s > 0
        if idx.size == 1 and positive[0]:
            continue  # alone in its group: nothing to give way to
        by_score = np.flatnonzero(positive)
        by_score = by_score[np.argsort(-s[by_score], kind="stable")]
        order = np.concatenate([np.flatnonzero(np.isnan(s)), by_score])
        taken = None  # pixels of the objects before in the order (their masks as given)
        for k, j in enumerate(order):
            m = masks[idx[j]]
            if taken is None:
                taken = m.copy()  # the first keeps its whole mask (a NaN one is cleared below)
                continue
            if positive[j]:
                np.greater(m, taken, out=m)  # a & ~b on booleans: the pixels no one before took
            if k + 1 < order.size:
                taken |= m  # m is now m & ~taken, so this adds exactly m's own pixels
        masks[idx[~positive]] = False  # scores <= 0 and NaN keep nothing


def build_result(output, prompts: list[str], height: int, width: int, hidden: set[int] = frozenset(),
                 shown: set[int] = frozenset()) -> FrameResult:
    """The reference processor's postprocess_outputs: upsample, drop empty and hidden, boxes, non-overlap.

    `hidden`: ids removed after this frame while its result was held back (the frame's own suppressed
    and removed ids are in the output already). `shown`: ids kept even with an empty mask (the object
    a prompt call was for)."""
    hidden = output.suppressed | set(hidden)
    ids = [i for i in sorted(output.masks) if i not in hidden]
    if not ids:
        return FrameResult.empty(output.frame_index, height, width)
    masks = binary_masks_at(np.stack([output.masks[i] for i in ids]), height, width, upsample_masks)
    keep = masks.reshape(len(ids), -1).any(axis=1) | np.asarray([i in shown for i in ids])
    if not keep.all():
        ids = [i for i, k in zip(ids, keep) if k]
        masks = masks[keep]
    scores = np.asarray([output.scores[i] for i in ids], np.float32)
    tracker = np.asarray([output.tracker_scores.get(i, 0.0) for i in ids], np.float32)
    boxes = masks_to_boxes(masks)
    prompt_ids = [output.prompts.get(i, -1) for i in ids]
    if len(ids) > 1:  # user-prompted objects take no part (group -1), as in the reference's tracker
        groups = [-1 if i in output.user_objects else p for i, p in zip(ids, prompt_ids)]
        _non_overlap_in_place(masks, tracker, groups)  # ours (upsampled above); boxes are taken before
    return FrameResult(output.frame_index, np.asarray(ids, np.int64), scores, boxes, masks,
                       [prompts[p] if p >= 0 else "" for p in prompt_ids], tracker)
