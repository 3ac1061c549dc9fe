"""sam3track.mask_ops against Hugging Face transformers 5.24.0 (modeling_sam3_video.py).

transformers' ``nms_masks`` and ``fill_holes_in_mask_scores`` call two CUDA kernels of
kernels-community/cv-utils (``generic_nms``, ``cc_2d``) and silently skip the work when the
``kernels`` package is absent. The tests install, in their place, slow but obviously correct
pure-Python versions of those kernels (``_SlowCvUtils``) that follow the CUDA sources:

* generic_nms: stable descending sort of the scores, greedy, suppress when
  ``double(iou) > iou_threshold`` (cv-utils/cv_utils/generic_nms.cu, torch_generic_nms);
* cc_2d: even H and W only, 8-connected components of the non-zero pixels, count 0 on zero
  pixels (cv-utils/cv_utils/connected_components.cu, cc_torch).

so the transformers wrappers (padding, thresholds, index bookkeeping) run for real around them.
"""

from __future__ import annotations

import subprocess
import sys
import tracemalloc
from collections import deque

import numpy as np
import pytest

# The reference side must be there: a missing torch or transformers fails the run, never skips.
import torch  # noqa: E402
import transformers.models.sam3_video.modeling_sam3_video as tm  # noqa: E402

from sam3track import mask_ops  # noqa: E402

# --------------------------------------------------------------------------------------------
# Slow references
# --------------------------------------------------------------------------------------------

_NEIGHBOURS_8 = [(-1, -1), (-1, 0), (-1, 1), (0, -1), (0, 1), (1, -1), (1, 0), (1, 1)]


def slow_component_counts(mask2d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Breadth-first flood fill, 8-connectivity over non-zero pixels; zero pixels: label/count 0."""
    h, w = mask2d.shape
    labels = np.zeros((h, w), np.int32)
    counts = np.zeros((h, w), np.int32)
    nxt = 1
    for y in range(h):
        for x in range(w):
            if not mask2d[y, x] or labels[y, x]:
                continue
            labels[y, x] = nxt
            queue = deque([(y, x)])
            members = []
            while queue:
                cy, cx = queue.popleft()
                members.append((cy, cx))
                for dy, dx in _NEIGHBOURS_8:
                    ny, nx = cy + dy, cx + dx
                    if 0 <= ny < h and 0 <= nx < w and mask2d[ny, nx] and not labels[ny, nx]:
                        labels[ny, nx] = nxt
                        queue.append((ny, nx))
            for py, px in members:
                counts[py, px] = len(members)
            nxt += 1
    return labels, counts


def slow_greedy_nms(ious: np.ndarray, scores: np.ndarray, iou_threshold: float) -> list[int]:
    order = sorted(range(len(scores)), key=lambda i: -float(scores[i]))  # Python sort is stable
    removed: set[int] = set()
    kept = []
    for pos, i in enumerate(order):
        if i in removed:
            continue
        kept.append(i)
        for j in order[pos + 1 :]:
            if float(ious[i, j]) > iou_threshold:  # float32 IoU compared in double precision
                removed.add(j)
    return kept


class _SlowCvUtils:
    """Stand-in for the kernels-community/cv-utils kernel object transformers loads."""

    @staticmethod
    def cc_2d(mask: torch.Tensor, get_counts: bool = True):
        n, c, h, w = mask.shape
        assert c == 1 and h % 2 == 0 and w % 2 == 0, "cc_2d only takes even sizes"
        arr = mask.numpy()
        labels = np.zeros(arr.shape, np.int32)
        counts = np.zeros(arr.shape, np.int32)
        for i in range(n):
            labels[i, 0], counts[i, 0] = slow_component_counts(arr[i, 0] != 0)
        return torch.from_numpy(labels), torch.from_numpy(counts)

    @staticmethod
    def generic_nms(ious, scores, iou_threshold, use_iou_matrix=True):
        assert use_iou_matrix
        kept = slow_greedy_nms(ious.numpy(), scores.numpy(), float(iou_threshold))
        return torch.tensor(kept, dtype=torch.int64)


@pytest.fixture
def slow_kernels(monkeypatch):
    monkeypatch.setattr(tm, "cv_utils_kernel", _SlowCvUtils())


class _FakeModel:
    """Just enough of Sam3VideoModel for its mask methods (they only use these attributes)."""

    suppress_overlapping_based_on_recent_occlusion_threshold = 0.7
    _apply_non_overlapping_constraints = tm.Sam3VideoModel._apply_non_overlapping_constraints
    _suppress_shrunk_masks = tm.Sam3VideoModel._suppress_shrunk_masks
    _suppress_object_pw_area_shrinkage = tm.Sam3VideoModel._suppress_object_pw_area_shrinkage
    _suppress_object_pw_area_shrinkage_impl = tm.Sam3VideoModel._suppress_object_pw_area_shrinkage_impl
    _get_objects_to_suppress_based_on_most_recently_occluded = (
        tm.Sam3VideoModel._get_objects_to_suppress_based_on_most_recently_occluded
    )


# --------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------


def _blob_logits(rng, n, h, w):
    """Logits with blobs, holes and sprinkles of many sizes (noise smoothed at random scales)."""
    out = np.empty((n, h, w), np.float32)
    for i in range(n):
        noise = rng.normal(size=(h, w)).astype(np.float32)
        k = int(rng.integers(0, 3)) * 2 + 1
        if k > 1:
            noise = np.asarray(
                torch.nn.functional.avg_pool2d(
                    torch.from_numpy(noise)[None, None], k, stride=1, padding=k // 2, count_include_pad=False
                )[0, 0]
            )
        out[i] = (noise + rng.normal(0, 0.3)) * rng.uniform(1, 5)
    # some exact zeros, which count as background (logit <= 0)
    out[rng.random(out.shape) < 0.03] = 0.0
    return out


def _crafted_masks():
    """Hand-made cases, as {name: float32 [N, H, W] logits}."""
    cases = {}
    cases["empty"] = np.full((2, 7, 9), -3.0, np.float32)
    cases["full"] = np.full((2, 9, 6), 4.0, np.float32)
    m = np.full((1, 9, 11), 2.0, np.float32)
    m[0, 8, 10] = -1  # one-pixel hole in the bottom-right corner of an odd-size mask
    m[0, 8, 3:5] = -1  # hole touching the bottom edge
    m[0, 2:4, 10] = -1  # hole touching the right edge
    m[0, 4, 4] = -1  # interior hole
    cases["holes_at_odd_borders"] = m
    d = np.full((1, 8, 8), -2.0, np.float32)
    d[0, [0, 1, 2, 3], [0, 1, 2, 3]] = 1.0  # diagonal line: one component in 8-connectivity
    d[0, 6, 6] = 1.0  # isolated sprinkle
    d[0, 5:8, 0:3] = 1.0
    d[0, 4, 3] = 1.0  # touches the 3x3 block only diagonally
    cases["diagonals"] = d
    c = np.full((1, 5, 5), 1.0, np.float32)
    c[0, 1:4, 1:4] = -1.0
    c[0, 2, 2] = 1.0  # sprinkle inside a hole inside a ring
    cases["nested"] = c
    cases["one_pixel_fg"] = np.where(np.arange(9).reshape(1, 3, 3) == 4, 1.0, -1.0).astype(np.float32)
    cases["single_row"] = np.array([[[1, -1, 1, 1, -1, -1, 1]]], np.float32)
    cases["single_col"] = np.array([[[1], [-1], [1], [1], [-1]]], np.float32)
    return cases


# --------------------------------------------------------------------------------------------
# Connected components and hole filling
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(1, 1), (1, 6), (5, 1), (7, 9), (8, 8), (13, 10), (10, 13), (15, 15)])
def test_connected_component_areas_match_flood_fill(shape):
    rng = np.random.default_rng(sum(shape))
    for density in (0.2, 0.45, 0.6, 0.85):
        masks = rng.random((3,) + shape) < density
        got = mask_ops.connected_component_areas(masks)
        assert got.dtype == np.int32 and got.shape == masks.shape
        for i in range(3):
            np.testing.assert_array_equal(got[i], slow_component_counts(masks[i])[1])


def test_connected_component_areas_zero_padding_changes_nothing():
    # cc_2d labels only non-zero pixels, so the reference's zero pad row/column (odd sizes)
    # neither joins nor extends components: areas of the padded mask, cropped, are the same.
    rng = np.random.default_rng(3)
    for _ in range(20):
        h, w = (int(v) for v in rng.integers(1, 12, size=2))
        m = rng.random((h, w)) < 0.5
        padded = np.pad(m, ((0, h % 2), (0, w % 2)))
        np.testing.assert_array_equal(
            slow_component_counts(padded)[1][:h, :w], mask_ops.connected_component_areas(m)
        )


def test_connected_component_areas_batches_do_not_touch(monkeypatch):
    # A full mask followed by another full mask must not merge across the stacking seam.
    monkeypatch.setattr(mask_ops, "_CC_BATCH_PIXELS", 50)  # force several OpenCV calls as well
    masks = np.ones((5, 4, 5), bool)
    masks[2] = False
    got = mask_ops.connected_component_areas(masks)
    assert (got[[0, 1, 3, 4]] == 20).all() and (got[2] == 0).all()


def _hf_fill(logits, max_area, fill_holes=True, remove_sprinkles=True):
    out = tm.fill_holes_in_mask_scores(
        torch.from_numpy(logits.copy()).unsqueeze(1), max_area, fill_holes, remove_sprinkles
    )
    return out.squeeze(1).numpy()


@pytest.mark.parametrize("max_area", [-1, 0, 1, 2, 3, 5, 8, 16, 1000])
def test_fill_holes_crafted(slow_kernels, max_area):
    for name, logits in _crafted_masks().items():
        for fh, rs in ((True, True), (True, False), (False, True)):
            got = mask_ops.fill_holes_in_mask_scores(logits, max_area, fh, rs)
            want = _hf_fill(logits, max_area, fh, rs)
            assert got.dtype == np.float32, name
            np.testing.assert_array_equal(got, want, err_msg=f"{name} max_area={max_area} {fh} {rs}")


@pytest.mark.parametrize("shape", [(8, 8), (7, 9), (9, 7), (11, 11), (16, 12), (12, 17)])
def test_fill_holes_random(slow_kernels, shape):
    rng = np.random.default_rng(shape[0] * 100 + shape[1])
    logits = _blob_logits(rng, 6, *shape)
    for max_area in (1, 3, 6, 10, 40):
        got = mask_ops.fill_holes_in_mask_scores(logits, max_area)
        np.testing.assert_array_equal(got, _hf_fill(logits, max_area), err_msg=f"max_area={max_area}")
    # 4-D input, as transformers passes it
    got4 = mask_ops.fill_holes_in_mask_scores(logits[:, None], 6)
    np.testing.assert_array_equal(got4[:, 0], _hf_fill(logits, 6))


def test_fill_holes_uses_8_connectivity():
    # A background pixel diagonally adjacent to a large background region is part of it (not
    # a hole) under 8-connectivity, and would be a 1-pixel hole under 4-connectivity.
    m = np.full((1, 6, 6), 1.0, np.float32)
    m[0, 3:, 3:] = -1.0  # 3 x 3 background region, area 9
    m[0, 2, 2] = -1.0  # touches it only at a corner
    out = mask_ops.fill_holes_in_mask_scores(m, max_area=5, remove_sprinkles=False)
    np.testing.assert_array_equal(out, m)  # region of area 10 > 5: nothing filled
    out = mask_ops.fill_holes_in_mask_scores(m, max_area=10, remove_sprinkles=False)
    assert (out[0, 3:, 3:] == np.float32(0.1)).all() and out[0, 2, 2] == np.float32(0.1)


def test_fill_holes_max_area_nonpositive_is_identity():
    m = np.random.default_rng(0).normal(size=(2, 5, 5)).astype(np.float32)
    assert mask_ops.fill_holes_in_mask_scores(m, 0) is m


# --------------------------------------------------------------------------------------------
# IoU and NMS
# --------------------------------------------------------------------------------------------


def _hf_iou(a, b):
    return tm.mask_iou(torch.from_numpy(a), torch.from_numpy(b)).numpy()


@pytest.mark.parametrize("chunk_bytes", [None, 64])
def test_mask_iou_matches(monkeypatch, chunk_bytes):
    if chunk_bytes is not None:  # many tiny chunks: the int64 accumulation must stay exact
        monkeypatch.setattr(mask_ops, "_CHUNK_BYTES", chunk_bytes)
    rng = np.random.default_rng(1)
    a = rng.random((7, 13, 11)) < rng.uniform(0, 1, size=(7, 1, 1))
    b = rng.random((5, 13, 11)) < rng.uniform(0, 1, size=(5, 1, 1))
    a[0] = False  # empty masks: IoU 0
    b[1] = False
    b[2] = a[3]  # identical masks: IoU 1
    for x, y in ((a, b), (a, a), (b, a)):
        got = mask_ops.mask_iou(x, y)
        assert got.dtype == np.float32 and got.shape == (x.shape[0], y.shape[0])
        np.testing.assert_array_equal(got, _hf_iou(x, y))
    assert mask_ops.mask_iou(a[:0], b).shape == (0, 5)


def _rect_logits(rng, q, h, w, n_bases=6):
    """Q masks drawn around a few base rectangles (so many pairs overlap strongly)."""
    logits = np.full((q, h, w), -1.0, np.float32)
    bases = [
        (int(rng.integers(0, h - 4)), int(rng.integers(0, w - 4)), int(rng.integers(3, h)), int(rng.integers(3, w)))
        for _ in range(n_bases)
    ]
    for i in range(q):
        y, x, hh, ww = bases[int(rng.integers(0, n_bases))]
        y += int(rng.integers(-2, 3))
        x += int(rng.integers(-2, 3))
        hh += int(rng.integers(-2, 3))
        ww += int(rng.integers(-2, 3))
        logits[i, max(y, 0) : max(y + hh, 0), max(x, 0) : max(x + ww, 0)] = rng.uniform(0.5, 3)
    logits[rng.random(logits.shape) < 0.02] *= -1  # a little noise
    logits[rng.random(logits.shape) < 0.01] = 0.0  # exact zeros are outside the mask
    return logits


def _hf_nms(probs, logits, pthr, ithr):
    return tm.nms_masks(torch.from_numpy(probs), torch.from_numpy(logits), pthr, ithr).numpy()


@pytest.mark.parametrize("seed", range(6))
def test_nms_masks_matches(slow_kernels, seed):
    rng = np.random.default_rng(seed)
    q = int(rng.integers(1, 60))
    logits = _rect_logits(rng, q, 24, 20)
    probs = (rng.integers(0, 8, size=q) / 8).astype(np.float32)  # many ties
    if seed % 2:
        probs = rng.random(q).astype(np.float32)
    for pthr in (0.0, 0.3, 0.5, 0.99):
        for ithr in (0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0):
            got = mask_ops.nms_masks(probs, logits, pthr, ithr)
            assert got.dtype == np.bool_ and got.shape == (q,)
            np.testing.assert_array_equal(got, _hf_nms(probs, logits, pthr, ithr), err_msg=f"{pthr} {ithr}")


def test_nms_masks_rules(slow_kernels):
    # IoU exactly equal to the threshold does not suppress; ties keep the lower index.
    h, w = 4, 5
    a = np.full((h, w), -1.0, np.float32)
    a[:, :2] = 1  # area 8
    b = np.full((h, w), -1.0, np.float32)
    b[:, :4] = 1  # area 16, IoU(a, b) = 8 / 16 = 0.5
    logits = np.stack([a, b])
    probs = np.array([0.8, 0.8], np.float32)
    np.testing.assert_array_equal(mask_ops.nms_masks(probs, logits, 0.5, 0.5), [True, True])
    np.testing.assert_array_equal(mask_ops.nms_masks(probs, logits, 0.5, 0.49), [True, False])
    np.testing.assert_array_equal(mask_ops.nms_masks(probs[::-1].copy() + [0, 0.1], logits, 0.5, 0.49), [False, True])
    # float32 IoU 7/10 = 0.69999999 is compared in double with 0.7: not above it, not suppressed
    c = np.full((1, 10), -1.0, np.float32)
    c[0, :10] = 1
    d = np.full((1, 10), -1.0, np.float32)
    d[0, :7] = 1
    two = np.stack([c, d])
    np.testing.assert_array_equal(mask_ops.nms_masks(probs, two, 0.0, 0.7), [True, True])
    for thr in (0.5, 0.7, 0.69):
        np.testing.assert_array_equal(mask_ops.nms_masks(probs, two, 0.0, thr), _hf_nms(probs, two, 0.0, thr))
    # nothing valid
    np.testing.assert_array_equal(mask_ops.nms_masks(probs, logits, 0.9, 0.5), [False, False])
    assert mask_ops.nms_masks(np.zeros(0, np.float32), np.zeros((0, h, w), np.float32), 0.5, 0.5).shape == (0,)


def test_nms_masks_is_vectorised_and_small():
    rng = np.random.default_rng(7)
    q, h, w = 200, 288, 288
    logits = np.full((q, h, w), -1.0, np.float32)
    ys = rng.integers(0, h - 40, size=q)
    xs = rng.integers(0, w - 40, size=q)
    sizes = rng.integers(20, 120, size=q)
    for i in range(q):
        logits[i, ys[i] : ys[i] + sizes[i], xs[i] : xs[i] + sizes[i]] = 1.0
    probs = rng.random(q).astype(np.float32)

    # Vectorised: counted in Python and C calls, not seconds (a per-pair loop makes >= q*(q-1)/2 of them;
    # measured: 102). Small: traced peak memory.
    calls = [0]

    def count(frame, event, arg):
        calls[0] += event in ("call", "c_call")

    tracemalloc.start()
    sys.setprofile(count)
    try:
        keep = mask_ops.nms_masks(probs, logits, 0.0, 0.5)
    finally:
        sys.setprofile(None)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()

    assert peak < 100 * 1024 * 1024, f"peak {peak / 2**20:.1f} MiB"
    assert calls[0] < q * 5, f"{calls[0]} calls for {q} masks: not vectorised"
    # same answer as the greedy reference on the full IoU matrix
    # The reference mask_iou would build a Q x Q x H*W tensor (26 GB here); the masks are
    # squares, so their exact IoUs come from the clipped rectangles instead.
    y0, x0 = ys, xs
    y1, x1 = np.minimum(ys + sizes, h), np.minimum(xs + sizes, w)
    area = (y1 - y0) * (x1 - x0)
    ih = np.clip(np.minimum(y1[:, None], y1[None]) - np.maximum(y0[:, None], y0[None]), 0, None)
    iw = np.clip(np.minimum(x1[:, None], x1[None]) - np.maximum(x0[:, None], x0[None]), 0, None)
    inter = ih * iw
    union = area[:, None] + area[None] - inter
    ious = inter.astype(np.float32) / union.astype(np.float32)
    want = np.zeros(q, bool)
    want[slow_greedy_nms(ious, probs, 0.5)] = True
    np.testing.assert_array_equal(keep, want)


# --------------------------------------------------------------------------------------------
# Non-overlap, shrinkage, occlusion
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
def test_apply_non_overlapping_constraints_matches(seed):
    """Many ties (the first object wins), values beyond -10; seeds 4-5 add NaN and +-inf pixels (torch's
    argmax picks a NaN; ours keeps no object there, which gives the same values)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 7)) if seed < 4 else 5
    x = rng.integers(-4, 5, size=(n, 9, 11)).astype(np.float32) * 4
    if seed >= 4:
        odd = rng.random(x.shape)
        x[odd < 0.05] = np.nan
        x[(odd >= 0.05) & (odd < 0.1)] = np.inf
        x[(odd >= 0.1) & (odd < 0.15)] = -np.inf
    want = _FakeModel()._apply_non_overlapping_constraints(torch.from_numpy(x.copy()).unsqueeze(1))
    got = mask_ops.apply_non_overlapping_constraints(x)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want.squeeze(1).numpy())
    np.testing.assert_array_equal(mask_ops.apply_non_overlapping_constraints(x[:, None])[:, 0], got)
    np.testing.assert_array_equal(mask_ops.apply_non_overlapping_constraints(x[:, 3, 4]), got[:, 3, 4])  # [N]


def test_suppress_shrunk_masks_matches():
    rng = np.random.default_rng(11)
    before = rng.normal(size=(12, 10, 10)).astype(np.float32) * 8
    before[0] = -1  # zero area before
    after = before.copy()
    for i in range(12):
        after[i][rng.random((10, 10)) < rng.uniform(0, 1)] = -20
    before[5] = -1
    before[5].flat[:10] = 1  # ratio exactly 3/10 against the default 0.3 threshold
    after[5] = -1
    after[5].flat[:3] = 1
    for thr in (0.0, 0.3, 0.5, 0.7, 1.0):
        want = _FakeModel()._suppress_shrunk_masks(
            torch.from_numpy(before.copy()).unsqueeze(1), torch.from_numpy(after.copy()).unsqueeze(1), thr
        )
        got = mask_ops.suppress_shrunk_masks(before, after, thr)
        np.testing.assert_array_equal(got, want.squeeze(1).numpy(), err_msg=str(thr))
        # a strided view of the same values: the clamp reads rows through any layout
        flipped = np.ascontiguousarray(before.transpose(0, 2, 1)).transpose(0, 2, 1)
        np.testing.assert_array_equal(mask_ops.suppress_shrunk_masks(flipped, after, thr), got, err_msg=str(thr))


@pytest.mark.parametrize("seed", range(6))
def test_suppress_object_pw_area_shrinkage_matches(seed):
    """Ours finds the areas after the non-overlap from the pixel winners, without the constrained copy;
    seeds 4-5 add NaN and +-inf pixels and ties (values on a grid)."""
    rng = np.random.default_rng(seed + 20)
    n = int(rng.integers(1, 9)) if seed < 4 else 7
    x = (rng.normal(size=(n, 12, 10)) * 5 + rng.normal(size=(n, 1, 1)) * 4).astype(np.float32)
    if seed >= 4:
        x = np.round(x / 4) * 4
        odd = rng.random(x.shape)
        x[odd < 0.05] = np.nan
        x[(odd >= 0.05) & (odd < 0.1)] = np.inf
        x[(odd >= 0.1) & (odd < 0.15)] = -np.inf
    fake = _FakeModel()
    for prompt_ids in (None, [0] * n, list(rng.integers(0, 3, size=n)), list(range(n))[::-1]):
        want = fake._suppress_object_pw_area_shrinkage(
            torch.from_numpy(x.copy()).unsqueeze(1), None if prompt_ids is None else [int(p) for p in prompt_ids]
        )
        got = mask_ops.suppress_object_pw_area_shrinkage(x, prompt_ids)
        np.testing.assert_array_equal(got, want.squeeze(1).numpy(), err_msg=str(prompt_ids))
        # the two-step form it fuses (the non-overlap, then the areas of its copy)
        if prompt_ids is None and n > 1:
            np.testing.assert_array_equal(got, mask_ops.suppress_shrunk_masks(
                x, mask_ops.apply_non_overlapping_constraints(x)))
        # [N]: one pixel per object
        one = x[:, 3, 4].copy()
        want = fake._suppress_object_pw_area_shrinkage(
            torch.from_numpy(one.reshape(n, 1, 1, 1)), None if prompt_ids is None else [int(p) for p in prompt_ids])
        np.testing.assert_array_equal(mask_ops.suppress_object_pw_area_shrinkage(one, prompt_ids),
                                      want.reshape(n).numpy(), err_msg=f"[N], {prompt_ids}")
    with pytest.raises(ValueError):
        mask_ops.suppress_object_pw_area_shrinkage(x, [0] * (n + 1))


@pytest.mark.parametrize("seed", range(5))
def test_objects_to_suppress_by_recent_occlusion_matches(seed):
    rng = np.random.default_rng(seed + 40)
    n = int(rng.integers(1, 10))
    base = rng.random((3, 10, 10)) < 0.5
    masks = base[rng.integers(0, 3, size=n)].copy()
    masks ^= rng.random(masks.shape) < rng.uniform(0, 0.3)  # perturb: IoUs spread around the thresholds
    last = rng.choice(np.array([-1, -1, 0, 2, 2, 5, 100000]), size=n).astype(np.int64)
    fake = _FakeModel()
    for thr in (0.3, 0.5, 0.7, 0.9):
        fake.suppress_overlapping_based_on_recent_occlusion_threshold = thr
        for reverse in (False, True):
            want = fake._get_objects_to_suppress_based_on_most_recently_occluded(
                torch.from_numpy(masks), torch.from_numpy(last), list(range(n)), reverse
            )
            got = mask_ops.objects_to_suppress_by_recent_occlusion(masks, last, thr, reverse)
            assert got.dtype == np.bool_ and got.shape == (n,)
            np.testing.assert_array_equal(got, want.numpy(), err_msg=f"{thr} {reverse}")


def test_occlusion_threshold_compared_in_float32():
    # float32 IoU 7/10 == float32(0.7): ">=" holds in float32 (the reference), not in double.
    a = np.zeros((2, 1, 10), bool)
    a[0, 0, :10] = True
    a[1, 0, :7] = True
    last = np.array([3, 1], np.int64)
    fake = _FakeModel()
    want = fake._get_objects_to_suppress_based_on_most_recently_occluded(
        torch.from_numpy(a), torch.from_numpy(last), [0, 1], False
    ).numpy()
    got = mask_ops.objects_to_suppress_by_recent_occlusion(a, last, 0.7, False)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, [True, False])


def test_runtime_module_does_not_import_torch():
    code = "import sys, sam3track.mask_ops; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
