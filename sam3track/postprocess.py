"""Frames in, results out: preprocessing to pixel values, and low-res logits to FrameResult."""

from __future__ import annotations

import cv2
import numpy as np

from .results import FrameResult


def to_pixel_values(rgb: np.ndarray, config) -> np.ndarray:
    """RGB uint8 [H, W, 3] -> float32 [1, 3, S, S]: bilinear resize, rescale, normalise (the processor's steps)."""
    s = config.image_size
    img = cv2.resize(rgb.astype(np.float32), (s, s), interpolation=cv2.INTER_LINEAR)
    img = img * np.float32(config.rescale_factor)
    img = (img - np.asarray(config.image_mean, np.float32)) / np.asarray(config.image_std, np.float32)
    return np.ascontiguousarray(img.transpose(2, 0, 1)[None])


def upsample_masks(low_res: np.ndarray, height: int, width: int) -> np.ndarray:
    """[N, L, L] logits -> bool [N, H, W] (bilinear, half-pixel centres, like F.interpolate align_corners=False)."""
    out = np.empty((low_res.shape[0], height, width), bool)
    for i, m in enumerate(low_res):
        out[i] = cv2.resize(m.astype(np.float32), (width, height), interpolation=cv2.INTER_LINEAR) > 0
    return out


def masks_to_boxes(masks: np.ndarray) -> np.ndarray:
    boxes = np.zeros((masks.shape[0], 4), np.float32)
    for i, m in enumerate(masks):
        ys, xs = np.flatnonzero(m.any(axis=1)), np.flatnonzero(m.any(axis=0))
        if ys.size:
            boxes[i] = (xs[0], ys[0], xs[-1], ys[-1])
    return boxes


def objectwise_non_overlap(masks: np.ndarray, scores: np.ndarray, prompt_ids: list[int]) -> np.ndarray:
    """Each pixel goes to the object with the highest tracker score among its prompt's objects."""
    out = masks.copy()
    prompts = np.asarray(prompt_ids)
    for p in np.unique(prompts):
        idx = np.flatnonzero(prompts == p)
        vals = np.where(masks[idx], scores[idx, None, None].astype(np.float32), np.float32(0))
        winner = vals.argmax(axis=0)
        for j, i in enumerate(idx):
            out[i] = masks[i] & (winner == j) & (vals[j] > 0)
    return out


def build_result(output, objects, prompts: list[str], height: int, width: int) -> FrameResult:
    """The reference processor's postprocess_outputs: upsample, drop empty and hidden, boxes, non-overlap."""
    ids = sorted(output.masks)
    if not ids:
        return FrameResult.empty(output.frame_index, height, width)
    low = np.stack([output.masks[i] for i in ids])
    masks = upsample_masks(low, height, width)
    hidden = objects.suppressed.get(output.frame_index, set()) | objects.hidden
    keep = masks.reshape(len(ids), -1).any(axis=1) & np.asarray([i not in hidden for i in ids])
    ids = [i for i, k in zip(ids, keep) if k]
    masks = masks[keep]
    scores = np.asarray([output.scores[i] for i in ids], np.float32)
    tracker = np.asarray([output.tracker_scores.get(i, 0.0) for i in ids], np.float32)
    boxes = masks_to_boxes(masks)
    prompt_ids = [objects.prompt_of.get(i, -1) for i in ids]
    if len(ids) > 1:
        masks = objectwise_non_overlap(masks, tracker, prompt_ids)
    return FrameResult(output.frame_index, np.asarray(ids, np.int64), scores, boxes, masks,
                       [prompts[p] if p >= 0 else "" for p in prompt_ids])
