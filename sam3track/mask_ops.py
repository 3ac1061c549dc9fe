"""Mask post-processing of SAM 3 video tracking (NMS, hole filling, non-overlap, shrinkage and
occlusion suppression) in numpy and OpenCV; nothing here imports torch.

Each function reproduces one function of transformers' ``modeling_sam3_video.py`` bit for bit on
float32 inputs (``binary_masks_at``: work avoided around a caller's resize, with the same result).
Pairwise quantities are reduced over pixel chunks, never as an ``N x N x H x W`` array, so memory
stays ``O((N + M) * chunk + N * M)``. The function-by-function map and the CUDA kernels' semantics it
follows (``generic_nms``, ``cc_2d``): docs/architecture.md, "Mask post-processing".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import cv2
import numpy as np

__all__ = [
    "NO_OBJ_LOGIT",
    "mask_iou",
    "nms_masks",
    "connected_component_areas",
    "fill_holes_in_mask_scores",
    "apply_non_overlapping_constraints",
    "suppress_shrunk_masks",
    "suppress_object_pw_area_shrinkage",
    "objects_to_suppress_by_recent_occlusion",
    "binary_masks_at",
]

# Score given to pixels taken away from an object (sigmoid(-10) = 4.54e-05), as in the reference.
NO_OBJ_LOGIT = -10.0
SHRINK_THRESHOLD = 0.3  # the reference's area-shrinkage rule: an object keeping < 30% of its pixels is suppressed

# Pixel columns per chunk of the pairwise products: a chunk of (N + M) rows costs
# (N + M) * chunk * 4 bytes of float32, about 16 MiB for 400 rows.
_CHUNK_BYTES = 16 * 1024 * 1024
# float32 sums of 0/1 products are exact integers up to 2**24; no chunk may be longer.
_MAX_EXACT_F32 = 1 << 24
# Pixels per OpenCV connected-components call: masks are labelled in batches of this size so
# that the int32 label image stays small whatever the number of masks.
_CC_BATCH_PIXELS = 1 << 22


def sigmoid(x, compute_dtype=np.float32) -> np.ndarray:
    """float32 sigmoid of ``x``, computed in ``compute_dtype``: SAM 3's reference computes its tracker
    probabilities in float32, Meta's SAM 3.1 in float64 (the rounding differs in the last bit)."""
    return (1.0 / (1.0 + np.exp(-np.asarray(x, compute_dtype)))).astype(np.float32)


def _flatten(x: np.ndarray) -> np.ndarray:
    """[N, ...] -> [N, P] without copying when ``x`` is contiguous."""
    x = np.asarray(x)
    return x.reshape(x.shape[0], int(np.prod(x.shape[1:], dtype=np.int64)))


def _chunk_len(rows: int, pixels: int) -> int:
    chunk = _CHUNK_BYTES // (4 * max(rows, 1))
    return int(max(1, min(chunk, pixels, _MAX_EXACT_F32)))


def _intersections_and_areas(
    a: np.ndarray,
    b: np.ndarray | None,
    a_rows: np.ndarray | None = None,
    logits: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Exact int64 intersections [N, M] and areas [N], [M] of two flattened mask stacks.

    ``b is None`` means ``b = a`` (one conversion instead of two). ``a_rows`` selects rows of
    ``a`` (so the caller need not copy a whole [K, P] float subset first). With ``logits`` the
    rows are float logits and a pixel belongs to the mask where ``logit > 0``.

    Why chunks: the pairwise intersection is one matrix product of the flattened masks, but
    casting a whole [N, H*W] bool stack to float32 costs 4x its size (66 MB for 200 masks of
    288 x 288); converting a few thousand pixel columns at a time keeps the extra memory at
    ~16 MiB. Each chunk is at most 2**24 long, so its float32 dot products are exact integers
    (sums of 0/1), and they are accumulated in int64, so counts are exact for any mask size.
    """
    n_rows = a.shape[0] if a_rows is None else int(a_rows.shape[0])
    m_rows = n_rows if b is None else b.shape[0]
    pixels = a.shape[1]
    inter = np.zeros((n_rows, m_rows), np.int64)
    area_a = np.zeros((n_rows,), np.int64)
    area_b = area_a if b is None else np.zeros((m_rows,), np.int64)
    if n_rows == 0 or m_rows == 0 or pixels == 0:
        return inter, area_a, area_b

    def rows_f32(x: np.ndarray, rows: np.ndarray | None, c0: int, c1: int) -> np.ndarray:
        part = x[:, c0:c1] if rows is None else x[rows, c0:c1]
        if logits:
            part = part > 0
        elif part.dtype != np.bool_:
            part = part != 0
        return part.astype(np.float32)

    chunk = _chunk_len(n_rows + (0 if b is None else m_rows), pixels)
    for c0 in range(0, pixels, chunk):
        c1 = min(c0 + chunk, pixels)
        fa = rows_f32(a, a_rows, c0, c1)
        fb = fa if b is None else rows_f32(b, None, c0, c1)
        inter += np.rint(fa @ fb.T).astype(np.int64)
        area_a += np.rint(fa.sum(axis=1, dtype=np.float64)).astype(np.int64)
        if b is not None:
            area_b += np.rint(fb.sum(axis=1, dtype=np.float64)).astype(np.int64)
    return inter, area_a, area_b


def _iou_from_counts(inter: np.ndarray, area_a: np.ndarray, area_b: np.ndarray) -> np.ndarray:
    # The reference divides float32 counts: intersection.float() / union.float().clamp(min=1).
    union = area_a[:, None] + area_b[None, :] - inter
    return inter.astype(np.float32) / np.maximum(union, 1).astype(np.float32)


def mask_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pairwise IoU of binary masks: ``a`` bool [N, H, W], ``b`` bool [M, H, W] -> float32 [N, M].

    ``iou = inter / max(union, 1)`` with ``union = area_a + area_b - inter`` (two empty masks have
    IoU 0), computed in float32 from exact integer counts like the reference.
    """
    a2 = _flatten(a)
    b2 = _flatten(b)
    if a2.shape[1] != b2.shape[1]:
        raise ValueError(f"mask_iou: masks of shapes {np.shape(a)} and {np.shape(b)} differ in size")
    same = b is a
    inter, area_a, area_b = _intersections_and_areas(a2, None if same else b2)
    return _iou_from_counts(inter, area_a, area_b)


def nms_masks(
    probs: np.ndarray,
    mask_logits: np.ndarray,
    prob_threshold: float,
    iou_threshold: float,
) -> np.ndarray:
    """Score filter + greedy mask NMS: float32 [Q], float32 [Q, H, W] -> keep bool [Q].

    ``valid = probs > prob_threshold``; the valid detections are visited by descending
    probability (stable: equal probabilities keep their index order); each one not yet
    suppressed is kept and suppresses every later one whose IoU with it (of the masks
    ``logit > 0``) is strictly greater than ``iou_threshold``, the float32 IoU compared in double
    precision like the cv-utils / torch_generic_nms CUDA kernel.
    """
    probs = np.asarray(probs).reshape(-1)
    is_valid = probs > prob_threshold
    valid_idx = np.flatnonzero(is_valid)
    if valid_idx.size == 0:
        return is_valid

    # Only the K valid rows of the logits are binarised, chunk by chunk, inside the product:
    # neither a [K, H, W] float copy nor a K x K x H*W array is ever built.
    logits2 = _flatten(mask_logits)
    inter, areas, _ = _intersections_and_areas(logits2, None, a_rows=valid_idx, logits=True)
    ious = _iou_from_counts(inter, areas, areas).astype(np.float64)

    order = np.argsort(-probs[valid_idx], kind="stable")  # descending, ties by index
    over = ious[np.ix_(order, order)] > float(iou_threshold)  # [K, K], sorted both ways
    k = order.size
    removed = np.zeros(k, np.bool_)
    kept_sorted = np.zeros(k, np.bool_)
    # The greedy pass is inherently sequential over the K candidates, but each step is one
    # vector OR over a row of the K x K matrix: O(K^2) work, negligible next to the IoUs.
    for i in range(k):
        if removed[i]:
            continue
        kept_sorted[i] = True
        removed[i + 1 :] |= over[i, i + 1 :]

    keep = np.zeros_like(is_valid)
    keep[valid_idx[order[kept_sorted]]] = True
    return keep


def connected_component_areas(masks: np.ndarray) -> np.ndarray:
    """Area of the 8-connected component of every non-zero pixel; 0 on zero pixels.

    ``masks`` [..., H, W] (bool or numbers, non-zero = in) -> int32 of the same shape. This is
    the ``counts`` output of the reference's ``_get_connected_components_with_padding``.

    The reference pads odd heights/widths with a zero row/column before its CUDA kernel
    (``cc_2d`` needs even sizes). ``cc_2d`` labels only non-zero pixels, so a zero pad is never
    part of, and never bridges, a component: padding changes nothing and is not reproduced.
    """
    masks = np.asarray(masks)
    shape = masks.shape
    if masks.ndim < 2:
        raise ValueError(f"connected_component_areas: need [..., H, W] masks, got shape {shape}")
    h, w = shape[-2:]
    flat = masks.reshape(-1, h, w)
    n = flat.shape[0]
    out = np.zeros((n, h, w), np.int32)
    if n == 0 or h == 0 or w == 0:
        return out.reshape(shape)

    # Masks are labelled in batches stacked vertically into one image, each followed by a zero
    # row: a zero row separates two masks in 8-connectivity, so one OpenCV call labels a whole
    # batch and the label image (int32) stays bounded by _CC_BATCH_PIXELS.
    per_batch = max(1, _CC_BATCH_PIXELS // ((h + 1) * w))
    for s in range(0, n, per_batch):
        e = min(n, s + per_batch)
        b = e - s
        tall = np.zeros((b, h + 1, w), np.uint8)
        tall[:, :h] = flat[s:e] != 0
        _, labels, stats, _ = cv2.connectedComponentsWithStats(
            tall.reshape(b * (h + 1), w), connectivity=8, ltype=cv2.CV_32S
        )
        areas = stats[:, cv2.CC_STAT_AREA].astype(np.int32)
        areas[0] = 0  # label 0 is OpenCV's background: the zero pixels, count 0 like cc_2d
        out[s:e] = areas[labels].reshape(b, h + 1, w)[:, :h]
    return out.reshape(shape)


def fill_holes_in_mask_scores(
    mask_logits: np.ndarray,
    max_area: int,
    fill_holes: bool = True,
    remove_sprinkles: bool = True,
) -> np.ndarray:
    """Fill small holes and remove small sprinkles of mask logits [N, H, W] (or [N, 1, H, W]).

    1. ``fill_holes``: every 8-connected component of background (``logit <= 0``) with area
       ``<= max_area`` is set to 0.1.
    2. ``remove_sprinkles``: then, per mask, with ``fg_area`` = its number of ``logit > 0``
       pixels after step 1, every 8-connected foreground component with area
       ``<= min(max_area, fg_area // 2)`` is set to -0.1.

    ``max_area <= 0`` returns the input unchanged (the same array). Otherwise a new array.
    """
    mask = np.asarray(mask_logits)
    if max_area <= 0:
        return mask
    dtype = mask.dtype if np.issubdtype(mask.dtype, np.floating) else np.dtype(np.float32)
    out = np.array(mask, dtype=dtype, copy=True)
    if out.ndim < 2:
        raise ValueError(f"fill_holes_in_mask_scores: need [N, H, W] logits, got shape {out.shape}")

    if fill_holes:
        bg = out <= 0
        small_bg = bg & (connected_component_areas(bg) <= max_area)
        out[small_bg] = dtype.type(0.1)

    if remove_sprinkles:
        fg = out > 0
        h, w = out.shape[-2:]
        fg3 = fg.reshape(-1, h, w)
        # fg_area // 2 clamped to max_area, per mask (the reference's int32 floor_divide + clamp).
        thresh = np.minimum(fg3.sum(axis=(1, 2), dtype=np.int64) // 2, max_area)
        areas = connected_component_areas(fg3)
        small_fg = fg3 & (areas <= thresh[:, None, None])
        out[small_fg.reshape(out.shape)] = dtype.type(-0.1)
    return out


def apply_non_overlapping_constraints(mask_logits: np.ndarray) -> np.ndarray:
    """Keep, at every pixel, only the object with the highest logit: [N, ...] -> same shape.

    Every other object's logit there is clamped to at most -10. Ties go to the first object
    (``np.argmax`` returns the first maximum, as ``torch.argmax`` does). One object: unchanged.
    """
    x = np.asarray(mask_logits)
    if x.shape[0] == 1:
        return x
    keep = _pixel_winners(x.reshape(x.shape[0], -1))  # [N, pixels]: also for [N] (one pixel per object)
    return np.where(keep.reshape(x.shape), x, np.minimum(x, x.dtype.type(NO_OBJ_LOGIT)))


def _pixel_winners(rows: np.ndarray) -> np.ndarray:
    """bool [N, pixels]: row n is argmax over the objects at the pixel (ties to the first).

    Found as the first object equal to the pixel's maximum: a max reduction and two boolean passes per
    object are 2-3x faster than argmax over the object axis (which copies the stack to make that axis
    contiguous). Where a pixel has a NaN, max is NaN and no object wins: argmax would pick the NaN, and
    min(NaN, -10) is NaN either way, so the constrained values are the same."""
    top = rows.max(axis=0)
    keep = np.empty(rows.shape, bool)
    found = np.zeros(rows.shape[1:], bool)
    for n in range(rows.shape[0]):
        np.equal(rows[n], top, out=keep[n])
        keep[n] &= ~found
        found |= keep[n]
    return keep


def suppress_shrunk_masks(
    before: np.ndarray,
    after: np.ndarray,
    shrink_threshold: float = SHRINK_THRESHOLD,
) -> np.ndarray:
    """Clamp to <= -10 the objects whose area shrank below ``shrink_threshold`` of their area.

    Area = number of pixels ``> 0`` of each object [N, ...]; an object is kept when
    ``area_after / max(area_before, 1) >= shrink_threshold`` (float32 division and comparison,
    as the reference). Returns ``before`` with the dropped objects clamped.
    """
    before = np.asarray(before)
    after = np.asarray(after)
    area_before = _flatten(before > 0).sum(axis=1, dtype=np.int64)
    area_after = _flatten(after > 0).sum(axis=1, dtype=np.int64)
    return _clamp_rows(before, _area_kept(area_before, area_after, shrink_threshold))


def _area_kept(area_before: np.ndarray, area_after: np.ndarray, threshold: float) -> np.ndarray:
    """bool [N]: area_after / max(area_before, 1) >= threshold, in float32 as the reference divides."""
    ratio = area_after.astype(np.float32) / np.maximum(area_before, 1).astype(np.float32)
    return ratio >= np.float32(threshold)


def _clamp_rows(x: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """A copy of x [N, ...] with the rows not kept clamped to <= NO_OBJ_LOGIT (the others untouched).

    One pass per row, into the new array: a copy of the stack then a masked minimum read and wrote
    each suppressed row three more times (84 of 100 ms of the rule at 128 x 256 x 256 logits)."""
    n = x.shape[0]
    keep = np.asarray(keep, dtype=bool)
    if keep.shape != (n,):  # rows past a short keep would come back unwritten
        raise ValueError(f"keep has shape {keep.shape}, expected ({n},): one flag per row")
    out = np.empty(x.shape, x.dtype)
    if n == 0:
        return out
    src, dst = x.reshape(n, -1), out.reshape(n, -1)
    limit = x.dtype.type(NO_OBJ_LOGIT)
    for row, kept in enumerate(keep):
        if kept:
            dst[row] = src[row]
        else:
            np.minimum(src[row], limit, out=dst[row])
    return out


def _suppress_object_pw_area_shrinkage_impl(mask_logits: np.ndarray) -> np.ndarray:
    """suppress_shrunk_masks(x, apply_non_overlapping_constraints(x)) without the constrained copy:
    a pixel of it is > 0 exactly where its object wins the pixel and x > 0 there (a clamped value is
    <= -10, or NaN), so the areas after come from the winners. The input itself comes back when no
    object is suppressed (as for one object)."""
    x = mask_logits
    if x.shape[0] <= 1:
        return x
    rows = x.reshape(x.shape[0], -1)
    positive = rows > 0
    area_before = positive.sum(axis=1, dtype=np.int64)
    positive &= _pixel_winners(rows)
    keep = _area_kept(area_before, positive.sum(axis=1, dtype=np.int64), SHRINK_THRESHOLD)
    return x if keep.all() else _clamp_rows(x, keep)


def suppress_object_pw_area_shrinkage(
    mask_logits: np.ndarray,
    prompt_ids: Sequence[int] | None = None,
) -> np.ndarray:
    """Suppress objects that lose too much area to pixel-wise non-overlap: [N, ...] -> same.

    The non-overlap is computed among all objects, or, with ``prompt_ids`` (one per object),
    independently inside each group of objects sharing a prompt id. Without ``prompt_ids``, the input
    array itself comes back when no object is suppressed: copy it before writing to it.
    """
    x = np.asarray(mask_logits)
    if prompt_ids is None:
        return _suppress_object_pw_area_shrinkage_impl(x)
    ids = np.asarray(list(prompt_ids), dtype=np.int64)
    if ids.shape[0] != x.shape[0]:
        raise ValueError("prompt_ids must have the same length as pred_masks")
    out = np.array(x, copy=True)
    for pid in np.unique(ids):
        idx = np.flatnonzero(ids == pid)
        out[idx] = _suppress_object_pw_area_shrinkage_impl(out[idx])
    return out


def objects_to_suppress_by_recent_occlusion(
    binary_masks: np.ndarray,
    last_occluded: np.ndarray,
    iou_threshold: float,
    reverse: bool = False,
) -> np.ndarray:
    """Which of N overlapping objects to suppress: the most recently occluded one of each pair.

    For each pair i < j with ``IoU >= iou_threshold`` (float32 comparison, as the reference):
    i is suppressed if ``last_occluded[i] > last_occluded[j]`` and ``last_occluded[j] > -1``;
    j is suppressed if ``last_occluded[j] > last_occluded[i]`` and ``last_occluded[i] > -1``
    (``<`` instead of ``>`` between the two when ``reverse``). -1 means never occluded.
    Returns bool [N]; all False when N <= 1.
    """
    masks = np.asarray(binary_masks)
    n = masks.shape[0]
    if n <= 1:
        return np.zeros((n,), np.bool_)
    last = np.asarray(last_occluded, dtype=np.int64).reshape(-1)
    iou = mask_iou(masks, masks)  # N x N from one chunked matrix product
    overlapping = np.triu(iou >= np.float32(iou_threshold), k=1)
    li = last[:, None]
    lj = last[None, :]
    cmp = np.less if reverse else np.greater
    suppress_i = overlapping & cmp(li, lj) & (lj > -1)
    suppress_j = overlapping & cmp(lj, li) & (li > -1)
    return suppress_i.any(axis=1) | suppress_j.any(axis=0)


def binary_masks_at(low_res: np.ndarray, height: int, width: int,
                    upsample: Callable[[np.ndarray, int, int], np.ndarray]) -> np.ndarray:
    """bool [N, height, width] masks of logits [N, h, w]: ``upsample(logits, height, width)`` (a bilinear
    resize thresholded at 0) for the rows with a logit > 0 (or NaN), all False for the others without
    resizing them. Bilinear weights are >= 0 and sum to 1, so a row whose logits are all <= 0 (an absent
    or occluded object) resizes to values <= 0: a full-size resize of it is work nobody reads."""
    present = ~(low_res <= 0).reshape(low_res.shape[0], -1).all(axis=1)
    if present.all():
        return upsample(low_res, height, width)
    masks = np.zeros((low_res.shape[0], height, width), bool)
    if present.any():
        masks[present] = upsample(low_res[present], height, width)
    return masks
