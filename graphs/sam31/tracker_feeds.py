"""Feeds for the SAM 3.1 tracker graphs built from Meta's module dumps, and the outputs they must give.

graphs/sam31/tracker_check.py runs the graphs on these feeds and compares; this module is only the
documented transformation from a dump of one of Meta's composite tracker steps
(reference/sam31/dump_modules.py) to the graph's inputs: the dumped memories, image features and
pointers go into pool rows (shuffled, with junk rows between) and the graph gets the indices that
Meta's selection rules give (``meta_memory_selection``, a re-derivation of
_prepare_memory_conditioned_features that is also the runtime's contract:
sam3track/families/sam31/memory.py); objects go to their (bucket, slot) by Meta's assignment table, and
empty slots get junk that the graph must ignore. Also the feeds the padding and batching checks derive
from others: padded entries appended (``pad_propagation``), one bucket of a call alone
(``single_bucket_feeds``).
"""

from __future__ import annotations

import numpy as np

MAX_COND_FRAMES = 4  # Meta's max_cond_frames_in_attn


def _nchw(seq_first: np.ndarray, grid: int) -> np.ndarray:
    """Meta's (HW, 1, C) features -> the graphs' [1, C, F, F]."""
    return np.ascontiguousarray(seq_first.transpose(1, 2, 0).reshape(1, -1, grid, grid))


def _slots(assignments: np.ndarray) -> list[tuple[int, int]]:
    """(bucket, slot) of each object index, from Meta's assignment table (objects >= 0)."""
    where = {}
    for b, row in enumerate(assignments):
        for s, o in enumerate(row):
            if o >= 0:
                where[int(o)] = (b, s)
    return [where[o] for o in range(len(where))]


# ------------------------------------------------------------------------------- memory selection
def meta_memory_selection(frame_idx: int, cond_frames, non_cond_frames, num_frames: int, reverse: bool,
                          num_maskmem: int = 7, max_cond: int = MAX_COND_FRAMES, max_pointers: int = 16):
    """Which stored frames one propagation step attends to, as Meta's _prepare_memory_conditioned_features
    picks them (memory_temporal_stride 1, no memory selection, pointers of future conditioning frames
    included). Returns (memories, pointers, pointer_scale):
      memories: [(frame, memory_slot)], memory_slot = the maskmem_tpos_enc row (tpos v2): a selected
        conditioning frame at signed distance t_pos = (frame_idx - frame) * (-1 if reverse else 1) gets
        row num_maskmem-1-t_pos when 1 <= t_pos < num_maskmem, else row num_maskmem-1; a non-conditioning
        frame (or an unselected conditioning frame) d = 1..6 frames back in the tracking direction gets row d-1;
      pointers: [(frame, distance)]: every selected conditioning frame (|frame_idx - frame|) and the
        frames d = 1 .. min(num_frames, max_pointers)-1 back that have outputs (non-conditioning or
        unselected conditioning), stopping at the clip's ends;
      pointer_scale: min(num_frames, max_pointers) - 1; pointer_offset = distance / pointer_scale.
    The selected conditioning frames: the closest before frame_idx, the closest at or after, then the
    nearest others (stable order on ties), max_cond in all."""
    cond = list(cond_frames)
    non_cond = set(non_cond_frames)
    if len(cond) <= max_cond:
        selected = list(cond)
    else:
        selected = []
        before = [t for t in cond if t < frame_idx]
        after = [t for t in cond if t >= frame_idx]
        if before:
            selected.append(max(before))
        if after:
            selected.append(min(after))
        rest = sorted((t for t in cond if t not in selected), key=lambda t: abs(t - frame_idx))
        selected += rest[:max_cond - len(selected)]
    unselected = {t for t in cond if t not in selected}
    sign = -1 if reverse else 1
    memories = []
    for t in selected:
        t_pos = (frame_idx - t) * sign
        memories.append((t, num_maskmem - 1 - t_pos if 1 <= t_pos < num_maskmem else num_maskmem - 1))
    for t_pos in range(1, num_maskmem):
        d = num_maskmem - t_pos
        t = frame_idx + d if reverse else frame_idx - d
        if t in non_cond or t in unselected:
            memories.append((t, d - 1))
    window = min(num_frames, max_pointers)
    pointers = [(t, abs(frame_idx - t)) for t in selected]
    for d in range(1, window):
        t = frame_idx + d if reverse else frame_idx - d
        if t < 0 or t >= num_frames:
            break
        if t in non_cond or t in unselected:
            pointers.append((t, d))
    return memories, pointers, window - 1


# ------------------------------------------------------------------------------- propagation
def propagation_feeds(z: dict, grid: int, seed: int = 0):
    """A propagation_step dump -> the graph's feeds and the expected outputs per (bucket, slot).

    Pools: memory_pool row per (stored frame, bucket) = maskmem_features[frame][bucket] as [HW, C];
    image_pool row per frame = image_features[frame][:, 0]; pointer_pool row per (frame, bucket) =
    obj_ptr[frame][bucket] [16, C]; rows shuffled, with junk rows between. Indices from
    meta_memory_selection. Expected: Meta's demuxed per-object outputs put back at their slots; the
    stored (muxed) pointers for object_pointer."""
    rng = np.random.default_rng(seed)
    assignments = z["in/assignments"]
    b, k = assignments.shape
    frames = [int(f) for f in z["in/frames"]]
    is_cond = [bool(c) for c in z["in/is_cond"]]
    mm, img, ptr = z["in/maskmem_features"], z["in/image_features"], z["in/obj_ptr"]
    c, hw = mm.shape[2], grid * grid

    def pool(items):  # items: list of (key, array); returns pool array and key -> row
        junk = len(items) // 2 + 1
        order = rng.permutation(len(items) + junk)
        rows = np.asarray(rng.standard_normal((len(items) + junk,) + items[0][1].shape), np.float32)
        where = {}
        for (key, a), r in zip(items, order):
            rows[r] = a
            where[key] = int(r)
        return rows, where

    memory_pool, mem_row = pool([((f, bk), mm[i, bk].reshape(c, hw).T) for i, f in enumerate(frames) for bk in range(b)])
    image_pool, img_row = pool([(f, img[i, :, 0]) for i, f in enumerate(frames)])
    pointer_pool, ptr_row = pool([((f, bk), ptr[i, bk]) for i, f in enumerate(frames) for bk in range(b)])
    memories, pointers, scale = meta_memory_selection(
        int(z["in/frame_idx"]), [f for f, cd in zip(frames, is_cond) if cd], [f for f, cd in zip(frames, is_cond) if not cd],
        int(z["in/num_frames"]), bool(z["in/reverse"]))
    n, p = len(memories), len(pointers)
    feeds = dict(
        tracker_feat_s0=z["in/high_res_s0"], tracker_feat_s1=z["in/high_res_s1"],
        tracker_feat=_nchw(z["in/current_features"], grid),
        memory_pool=memory_pool, image_pool=image_pool, pointer_pool=pointer_pool,
        memory_index=np.array([[mem_row[(f, bk)] for f, _ in memories] for bk in range(b)]),
        memory_image_index=np.array([[img_row[f] for f, _ in memories]] * b),
        memory_slot=np.array([[s for _, s in memories]] * b), memory_valid=np.ones((b, n)),
        pointer_index=np.array([[ptr_row[(f, bk)] for f, _ in pointers] for bk in range(b)]),
        pointer_offset=np.array([[np.float32(dist) / np.float32(scale) for _, dist in pointers]] * b, np.float32),
        pointer_valid=np.ones((b, p)), slot_valid=(assignments >= 0).astype(np.float32))
    l = z["out.low_res_masks"].shape[-1]
    ref = dict(low_res_masks=np.zeros((b, k, 1, l, l), np.float32), iou_scores=np.zeros((b, k, 3), np.float32),
               object_score_logits=np.zeros((b, k, 1), np.float32), object_pointer=z["out.obj_ptr_stored"])
    for o, (bk, s) in enumerate(_slots(assignments)):
        ref["low_res_masks"][bk, s] = z["out.low_res_masks"][o]
        ref["iou_scores"][bk, s] = z["out.ious"][o]
        ref["object_score_logits"][bk, s] = z["out.object_score_logits"][o]
    valid = assignments >= 0
    masks = {"low_res_masks": np.broadcast_to(valid[:, :, None, None, None], (b, k, 1, l, l)),
             "iou_scores": np.broadcast_to(valid[:, :, None], (b, k, 3)),
             "object_score_logits": valid[:, :, None]}
    return feeds, ref, masks, (n, p)


def pad_propagation(feeds: dict, extra_memories: int, extra_pointers: int, seed: int = 1) -> dict:
    """The feeds with padded entries appended to every bucket (valid 0, random rows, slots, offsets)."""
    rng = np.random.default_rng(seed)
    out = dict(feeds)
    b = feeds["memory_index"].shape[0]
    rows_m, rows_i, rows_p = (feeds[k].shape[0] for k in ("memory_pool", "image_pool", "pointer_pool"))

    def cat(name, extra):
        out[name] = np.concatenate([np.asarray(feeds[name]), extra.astype(np.asarray(feeds[name]).dtype)], axis=1)

    cat("memory_index", rng.integers(0, rows_m, (b, extra_memories)))
    cat("memory_image_index", rng.integers(0, rows_i, (b, extra_memories)))
    cat("memory_slot", rng.integers(0, 7, (b, extra_memories)))
    cat("memory_valid", np.zeros((b, extra_memories)))
    cat("pointer_index", rng.integers(0, rows_p, (b, extra_pointers)))
    cat("pointer_offset", rng.random((b, extra_pointers)))
    cat("pointer_valid", np.zeros((b, extra_pointers)))
    return out


def single_bucket_feeds(feeds: dict, i: int, trim: bool) -> dict:
    """Bucket i of a propagation call alone (trim: without its padding entries)."""
    out = dict(feeds)
    for k in ("memory_index", "memory_image_index", "memory_slot", "memory_valid", "pointer_index", "pointer_offset",
              "pointer_valid", "slot_valid"):
        out[k] = np.asarray(feeds[k])[i:i + 1]
    if trim:
        n = int(np.asarray(feeds["memory_valid"])[i].sum())
        p = int(np.asarray(feeds["pointer_valid"])[i].sum())
        for k in ("memory_index", "memory_image_index", "memory_slot", "memory_valid"):
            out[k] = out[k][:, :n]
        for k in ("pointer_index", "pointer_offset", "pointer_valid"):
            out[k] = out[k][:, :p]
    return out


# ------------------------------------------------------------------------------------- memory encoder
def memory_encoder_feeds(z: dict, grid: int, seed: int = 0):
    """A memory_encoder_step dump -> feeds: each object's mask at its (bucket, slot), its score and
    conditioning flag there; empty slots (padding, holes) get random junk, which must change nothing."""
    rng = np.random.default_rng(seed)
    assignments = z["in/assignments"]
    b, k = assignments.shape
    masks = z["in/pred_masks_high_res"]
    h = masks.shape[-1]
    feeds = dict(tracker_feat=_nchw(z["in/pix_feat"], grid),
                 mask_logits=np.asarray(rng.standard_normal((b, k, h, h)) * 8, np.float32),
                 slot_valid=(assignments >= 0).astype(np.float32),
                 conditioning=(rng.random((b, k)) > 0.5).astype(np.float32),
                 object_score_logits=np.asarray(rng.standard_normal((b, k)) * 5, np.float32))
    cond = set(int(o) for o in z["in/conditioning_objects"])
    for o, (bk, s) in enumerate(_slots(assignments)):
        feeds["mask_logits"][bk, s] = masks[o, 0]
        feeds["object_score_logits"][bk, s] = z["in/object_score_logits"][o, 0]
        feeds["conditioning"][bk, s] = float(o in cond)
    ref = dict(maskmem_features=z["out.maskmem_features"].reshape(b, -1, grid * grid).transpose(0, 2, 1),
               image_features=z["in/pix_feat"].transpose(1, 0, 2))
    return feeds, ref


# ------------------------------------------------------------------------------------ interactive
def interactive_feeds(z: dict):
    """An interactive_step dump -> feeds (all rows take the dump's multimask choice; no mask prompt ->
    use_mask_prompt 0 and a junk prompt) and the expected outputs (a single-mask row's one IoU in every
    column)."""
    n = z["in/point_coords"].shape[0]
    l = z["out.low_res_masks"].shape[-1]
    mask = z.get("in/mask_inputs")
    has_mask = isinstance(mask, np.ndarray)
    feeds = dict(interactive_feat_s0=z["in/high_res_s0"], interactive_feat_s1=z["in/high_res_s1"],
                 interactive_feat=z["in/interactive_feat"], point_coords=z["in/point_coords"],
                 point_labels=z["in/point_labels"],
                 mask_prompt=mask if has_mask else np.random.default_rng(0).standard_normal((n, 1, l, l)) * 10,
                 use_mask_prompt=np.full(n, float(has_mask)), multimask=np.full(n, float(bool(z["out.multimask_output"]))))
    ious = z["out.ious"]
    ref = dict(low_res_masks=z["out.low_res_masks"], iou_scores=np.broadcast_to(ious, (n, 3)) if ious.shape[1] == 1 else ious,
               object_score_logits=z["out.object_score_logits"], object_pointer=z["out.obj_ptr"])
    return feeds, ref
