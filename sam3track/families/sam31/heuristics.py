"""SAM 3.1's detection filtering, association and hotstart rules (Meta's Sam3MultiplexBase), on host arrays.

Where they differ from SAM 3 (sam3track/families/sam3/association.py, planning.py):
- NMS and association measure overlap as IoM (intersection over the smaller mask), not IoU;
- detections whose box centre lies within 2.5% of the image border are dropped;
- hotstart is Meta's position-indexed "GPU" variant: keep-alive moves +-1 for every track (empty masks
  included), unmatched counts are cumulative, duplicate counts are kept per pair of tracks, and the
  keep-alive suppression is computed but never applied;
- removed tracks are not hidden on the frames already buffered (Meta never fills removed_obj_ids).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

HIGH_CONF_THRESH = 0.8  # Meta's constant in _associate_det_trk
BOUNDARY_MARGIN = 0.025
NEVER_OCCLUDED, ALWAYS_OCCLUDED = -1, 100000
UNCONFIRMED, CONFIRMED = 1, 2


def _flat(masks: np.ndarray) -> np.ndarray:
    return masks.reshape(masks.shape[0], -1).astype(np.float32)


def mask_iom(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """bool [N, H, W], [M, H, W] -> float32 [N, M]: intersection / (min area + 1e-8) (train/masks_ops)."""
    fa, fb = _flat(a), _flat(b)
    inter = (fa @ fb.T).astype(np.float32)
    area_a, area_b = fa.sum(1), fb.sum(1)
    return (inter / (np.minimum(area_a[:, None], area_b[None, :]) + np.float32(1e-8))).astype(np.float32)


def nms_iom(probs: np.ndarray, masks: np.ndarray, prob_threshold: float, threshold: float, use_iom: bool) -> np.ndarray:
    """Meta's _batched_generic_nms_mask for one frame: by descending score, a kept valid detection
    suppresses later ones with overlap > threshold. Returns keep bool [Q]."""
    valid = probs > prob_threshold
    binary = masks > 0
    if use_iom:
        overlap = mask_iom(binary, binary)
    else:
        fa = _flat(binary)
        inter = fa @ fa.T
        area = fa.sum(1)
        overlap = inter / (area[:, None] + area[None, :] - inter + np.float32(1e-8))
    order = np.argsort(-probs, kind="stable")
    keep = valid[order].copy()
    over = overlap[np.ix_(order, order)] > threshold
    for i in range(order.size):
        if keep[i]:
            keep[i + 1:] &= ~over[i, i + 1:]
    out = np.zeros_like(valid)
    out[order] = keep
    return out


def std_sort(items, comp):
    """libstdc++'s std::sort (introsort, then a final insertion sort) on a list, in place: what torch's
    CPU sort runs when stability is not asked for (checked against torch.argsort in the tests). The
    depth-limit fallback (heap sort) is approximated by a stable sort; it is reached only for inputs
    far from the bool keys sorted here."""
    n = len(items)
    if n < 2:
        return items
    sorter = _StdSort(items, comp)
    sorter.introsort_loop(0, n, (n.bit_length() - 1) * 2)
    if n > 16:
        sorter.insertion_sort(0, 16)
        for i in range(16, n):
            sorter.unguarded_linear_insert(i)
    else:
        sorter.insertion_sort(0, n)
    return items


class _StdSort:
    """The steps of libstdc++'s std::sort (bits/stl_algo.h), each on ``a[first:last]`` with ``comp``."""

    def __init__(self, a: list, comp):
        self.a, self.comp = a, comp

    def heap_select_sort(self, first, last):
        # partial_sort(first, last, last): make_heap then sort_heap (std::__heap_select + __sort_heap)
        import functools

        comp = self.comp
        sub = self.a[first:last]
        sub.sort(key=functools.cmp_to_key(lambda x, y: -1 if comp(x, y) else (1 if comp(y, x) else 0)))
        self.a[first:last] = sub

    def move_median_to_first(self, result, i, j, k):
        a, comp = self.a, self.comp
        if comp(a[i], a[j]):
            if comp(a[j], a[k]):
                a[result], a[j] = a[j], a[result]
            elif comp(a[i], a[k]):
                a[result], a[k] = a[k], a[result]
            else:
                a[result], a[i] = a[i], a[result]
        elif comp(a[i], a[k]):
            a[result], a[i] = a[i], a[result]
        elif comp(a[j], a[k]):
            a[result], a[k] = a[k], a[result]
        else:
            a[result], a[j] = a[j], a[result]

    def unguarded_partition(self, first, last, pivot):
        a, comp = self.a, self.comp
        while True:
            while comp(a[first], a[pivot]):
                first += 1
            last -= 1
            while comp(a[pivot], a[last]):
                last -= 1
            if not first < last:
                return first
            a[first], a[last] = a[last], a[first]
            first += 1

    def introsort_loop(self, first, last, depth):
        while last - first > 16:
            if depth == 0:
                self.heap_select_sort(first, last)
                return
            depth -= 1
            mid = first + (last - first) // 2
            self.move_median_to_first(first, first + 1, mid, last - 1)
            cut = self.unguarded_partition(first + 1, last, first)
            self.introsort_loop(cut, last, depth)
            last = cut

    def unguarded_linear_insert(self, last):
        a, comp = self.a, self.comp
        val = a[last]
        nxt = last - 1
        while comp(val, a[nxt]):
            a[last] = a[nxt]
            last = nxt
            nxt -= 1
        a[last] = val

    def insertion_sort(self, first, last):
        a, comp = self.a, self.comp
        for i in range(first + 1, last):
            if comp(a[i], a[first]):
                val = a[i]
                a[first + 1:i + 1] = a[first:i]
                a[first] = val
            else:
                self.unguarded_linear_insert(i)


@dataclass
class Detections:
    """One frame's detections, kept ones first (Meta sorts det_keep descending before planning)."""

    scores: np.ndarray  # float32 [Q]
    masks: np.ndarray  # float32 [Q, L, L] low-res logits
    keep: np.ndarray  # bool [Q]


def filter_detections(logits: np.ndarray, boxes: np.ndarray, masks: np.ndarray, config) -> Detections:
    probs = (1.0 / (1.0 + np.exp(-logits.astype(np.float64)))).astype(np.float32)
    masks = masks.astype(np.float32)
    if config.det_nms_thresh > 0.0:
        keep = nms_iom(probs, masks, config.score_threshold_detection, config.det_nms_thresh, config.det_nms_use_iom)
        masks = np.where(keep[:, None, None], masks, np.float32(-1e4))  # Meta: suppressed logits -1e4
        probs = np.where(keep, probs, np.float32(0.0))  # sigmoid(-1e4): exactly 0 in float32
    keep = probs > config.score_threshold_detection
    if config.suppress_det_close_to_boundary:
        xc = (boxes[:, 0] + boxes[:, 2]) / 2
        yc = (boxes[:, 1] + boxes[:, 3]) / 2
        m = BOUNDARY_MARGIN
        keep &= (xc > m) & (xc < 1.0 - m) & (yc > m) & (yc < 1.0 - m)
    # kept first, in the order torch's (unstable) CPU argsort(descending=True) gives: Meta numbers the
    # new objects in this order, so the ids depend on it
    items = [(bool(v), i) for i, v in enumerate(keep)]
    std_sort(items, lambda x, y: x[0] > y[0])
    order = np.asarray([i for _, i in items], np.int64)
    return Detections(probs[order], masks[order], keep[order])


@dataclass
class Association:
    trk_is_unmatched: np.ndarray  # bool [M]
    trk_is_nonempty: np.ndarray  # bool [M]
    is_new_det: np.ndarray  # bool [N]
    im_mask: np.ndarray  # bool [N, M], after the ambiguous pairs are zeroed
    det_to_max_trk: np.ndarray  # int [N]
    det_high_conf_and_iou: np.ndarray  # bool [N]

    def det_to_matched_trk_obj_ids(self, det: Detections, trk_obj_ids: np.ndarray) -> dict[int, np.ndarray]:
        return {d: trk_obj_ids[self.im_mask[d]] for d in range(det.scores.shape[0]) if det.keep[d]}


def associate(det: Detections, trk_masks: np.ndarray, config) -> Association:
    """Meta's _associate_det_trk (+ _associate_det_trk_compilable) with use_iom_recondition."""
    n, m = det.scores.shape[0], trk_masks.shape[0]
    if m == 0:
        # no tracks: Meta tests the score alone here (det_keep is not applied on this path)
        is_new = det.scores >= np.float32(config.new_det_thresh)
        return Association(np.zeros(0, bool), np.zeros(0, bool), is_new, np.zeros((n, 0), bool),
                           np.full(n, -1), np.zeros(n, bool))
    trk_bin = trk_masks > 0
    nonempty = trk_bin.reshape(m, -1).any(1)
    if n == 0:
        return Association(np.ones(m, bool), nonempty, np.zeros(0, bool), np.zeros((0, m), bool),
                           np.zeros(0, int), np.zeros(0, bool))
    det_bin = (det.masks > 0) & det.keep[:, None, None]
    metric = mask_iom(det_bin, trk_bin) if config.use_iom_recondition else _iou(det_bin, trk_bin)
    matched = (metric >= np.float32(config.trk_assoc_iou_thresh)).any(0)
    unmatched = nonempty & ~matched
    is_new = (det.scores >= np.float32(config.new_det_thresh)) & det.keep & ~(
        metric >= np.float32(config.assoc_iou_thresh)).any(1)
    th = np.float32(config.iom_thresh_recondition if config.use_iom_recondition else config.iou_thresh_recondition)
    det_many = (metric >= th).sum(1) > 1
    trk_many = (metric >= th).sum(0) > 1
    metric = np.where(trk_many[None, :], np.float32(0), metric)
    metric = np.where(det_many[:, None], np.float32(0), metric)
    det_to_max = np.argmax(metric, axis=1)
    high_conf = (det.scores >= np.float32(HIGH_CONF_THRESH)) & det.keep & ~is_new
    high_iou = metric.max(1) >= th
    return Association(unmatched, nonempty, is_new, metric >= np.float32(config.assoc_iou_thresh), det_to_max,
                       high_conf & high_iou)


def _iou(a, b):
    fa, fb = _flat(a), _flat(b)
    inter = fa @ fb.T
    union = fa.sum(1)[:, None] + fb.sum(1)[None, :] - inter
    return (inter / np.maximum(union, 1)).astype(np.float32)


@dataclass
class TrackTable:
    """Meta's position-indexed per-track metadata (gpu_metadata), in obj_ids order, plus the
    per-object bookkeeping of tracker_metadata."""

    obj_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    first_frame: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    unmatch_count: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    keep_alive: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    removed: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    overlap: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.int64))
    last_occluded: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    status: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # masklet confirmation
    consecutive_det: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    max_obj_id: int = -1

    def keep_rows(self, keep: np.ndarray) -> None:
        for name in ("obj_ids", "first_frame", "unmatch_count", "keep_alive", "removed", "last_occluded", "status",
                     "consecutive_det"):
            setattr(self, name, getattr(self, name)[keep])
        self.overlap = self.overlap[np.ix_(keep, keep)]

    def append(self, obj_ids: np.ndarray, frame: int, init_keep_alive: int) -> None:
        k = obj_ids.size
        self.obj_ids = np.concatenate([self.obj_ids, obj_ids.astype(np.int64)])
        self.first_frame = np.concatenate([self.first_frame, np.full(k, frame, np.int64)])
        self.unmatch_count = np.concatenate([self.unmatch_count, np.zeros(k, np.int64)])
        self.keep_alive = np.concatenate([self.keep_alive, np.full(k, init_keep_alive, np.int64)])
        self.removed = np.concatenate([self.removed, np.zeros(k, bool)])
        self.last_occluded = np.concatenate([self.last_occluded, np.full(k, NEVER_OCCLUDED, np.int64)])
        self.status = np.concatenate([self.status, np.full(k, UNCONFIRMED, np.int64)])
        self.consecutive_det = np.concatenate([self.consecutive_det, np.zeros(k, np.int64)])
        n = self.overlap.shape[0]
        grown = np.zeros((n + k, n + k), np.int64)
        grown[:n, :n] = self.overlap
        self.overlap = grown
        if k:
            self.max_obj_id = max(self.max_obj_id, int(obj_ids.max()))


def hotstart(frame: int, reverse: bool, assoc: Association, tracks: TrackTable, config) -> np.ndarray:
    """Meta's _process_hotstart_gpu: updates tracks in place, returns to_remove bool [M]."""
    matched = assoc.im_mask.any(0)
    ka = np.where(matched, tracks.keep_alive + 1, tracks.keep_alive - 1)
    ka = np.clip(ka, config.min_trk_keep_alive, config.max_trk_keep_alive)
    if config.decrease_trk_keep_alive_for_empty_masklets:
        ka = np.where(~assoc.trk_is_nonempty, np.maximum(ka - 1, config.min_trk_keep_alive), ka)
    tracks.keep_alive = ka
    tracks.unmatch_count = np.where(assoc.trk_is_unmatched, tracks.unmatch_count + 1, tracks.unmatch_count)
    multi = assoc.im_mask & (assoc.im_mask.sum(1) > 1)[:, None]
    inc = np.einsum("di,dj->ij", multi.astype(np.int64), multi.astype(np.int64))
    tracks.overlap = tracks.overlap + np.triu(inc, 1)
    diff = frame + config.hotstart_delay if reverse else frame - config.hotstart_delay
    within = tracks.first_frame < diff if reverse else tracks.first_frame > diff
    by_unmatch = within & (tracks.unmatch_count >= config.hotstart_unmatch_thresh) & ~tracks.removed
    ff = tracks.first_frame
    earlier = ff[:, None] > ff[None, :] if reverse else ff[:, None] < ff[None, :]
    to_remove = by_unmatch
    if ff.size:
        worst = np.where(earlier, tracks.overlap, 0).max(0)
        to_remove = by_unmatch | (within & (worst >= config.hotstart_dup_thresh) & ~tracks.removed)
    # Meta computes a keep-alive suppression here (keep_alive <= 0) that nothing reads.
    tracks.removed = tracks.removed | to_remove
    return to_remove


def update_confirmation(tracks: TrackTable, prev_ids: np.ndarray, prev_status: np.ndarray, prev_consecutive: np.ndarray,
                        matched_obj_ids: set[int], config) -> None:
    """Meta's update_masklet_confirmation_status over the updated obj_ids."""
    n = tracks.obj_ids.size
    status = np.full(n, UNCONFIRMED, np.int64)
    consecutive = np.zeros(n, np.int64)
    where = {int(o): i for i, o in enumerate(prev_ids)}
    for i, o in enumerate(tracks.obj_ids):
        j = where.get(int(o))
        if j is not None:
            status[i], consecutive[i] = prev_status[j], prev_consecutive[j]
    for i, o in enumerate(tracks.obj_ids):
        consecutive[i] = consecutive[i] + 1 if int(o) in matched_obj_ids else 0
        if consecutive[i] >= config.masklet_confirmation_consecutive_det_thresh:
            status[i] = CONFIRMED
    tracks.status, tracks.consecutive_det = status, consecutive
