"""sam3track.mask_ops against transformers' own NMS / hole-filling code running on ported cv-utils kernels.

transformers 5.24's ``nms_masks`` and ``fill_holes_in_mask_scores`` (and their helper
``_get_connected_components_with_padding``) are run *unmodified*, with the module global
``cv_utils_kernel`` set to :class:`tests.reference_kernels.ReferenceCvUtils` (ports of
kernels-community/cv-utils ``generic_nms`` and ``cc_2d``; the real kernel cannot be installed or run
here, see that module). So the wrappers' own logic (score prefilter, IoU matrix, index bookkeeping,
even-size padding, area thresholds, the 0.1 / -0.1 fills) is the reference, and only the two CUDA
kernels are replaced by ports. Every comparison is exact: these are discrete algorithms.

Every test that relies on the kernel path also asserts the stand-in was called and raised nothing
(transformers swallows kernel exceptions and silently skips the work).
"""

from __future__ import annotations

import numpy as np
import pytest

# The reference side must be there: a missing torch, transformers or scipy fails the run, never skips.
import torch  # noqa: E402
import transformers.models.sam3_video.modeling_sam3_video as tm  # noqa: E402

from sam3track import mask_ops  # noqa: E402

from .reference_kernels import (  # noqa: E402
    ReferenceCvUtils,
    cc_2d_block_union_find,
    cc_2d_reference,
    generic_nms_reference,
    installed_reference_kernels,
)

# --------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------


def _blob_logits(rng: np.random.Generator, n: int, h: int, w: int) -> np.ndarray:
    """float32 [n, h, w] logits of both signs with blobs, holes and sprinkles of many sizes."""
    out = np.empty((n, h, w), np.float32)
    for i in range(n):
        noise = rng.normal(size=(h, w)).astype(np.float32)
        k = int(rng.integers(0, 4)) * 2 + 1
        if k > 1:
            noise = torch.nn.functional.avg_pool2d(
                torch.from_numpy(noise)[None, None], k, stride=1, padding=k // 2, count_include_pad=False
            )[0, 0].numpy()
        out[i] = (noise + rng.normal(0, 0.4)) * rng.uniform(0.5, 6)
    out[rng.random(out.shape) < 0.03] = 0.0  # exact zeros are background (logit <= 0)
    return out


def _detections(rng: np.random.Generator):
    """(probs [Q], logits [Q, H, W]) like a detector's: overlapping, duplicate, empty, full masks."""
    q = int(rng.integers(1, 33))
    h, w = int(rng.integers(3, 26)), int(rng.integers(3, 26))
    logits = _blob_logits(rng, q, h, w)
    for i in range(q):
        kind = rng.random()
        if kind < 0.15 and i > 0:  # exact duplicate of an earlier mask: IoU 1
            logits[i] = logits[int(rng.integers(0, i))]
        elif kind < 0.25 and i > 0:  # shifted copy: high but not total overlap
            logits[i] = np.roll(logits[int(rng.integers(0, i))], int(rng.integers(-2, 3)), axis=1)
        elif kind < 0.32:
            logits[i] = -np.abs(logits[i]) - 0.5  # empty mask
        elif kind < 0.36:
            logits[i] = np.abs(logits[i]) + 0.5  # full mask
    # Probabilities on a coarse grid so ties are frequent, some exactly at the threshold.
    probs = (rng.integers(0, 9, size=q) / 8).astype(np.float32)
    return probs, logits


# --------------------------------------------------------------------------------------------
# The ports themselves
# --------------------------------------------------------------------------------------------


def _random_uint8_masks(rng, n, h, w):
    kind = rng.random()
    if kind < 0.1:
        m = np.zeros((n, 1, h, w), np.uint8)
    elif kind < 0.2:
        m = np.ones((n, 1, h, w), np.uint8)
    elif kind < 0.3:  # checkerboard: only diagonal contacts
        m = np.broadcast_to((np.add.outer(np.arange(h), np.arange(w)) % 2).astype(np.uint8), (n, 1, h, w)).copy()
    else:
        m = (rng.random((n, 1, h, w)) < rng.uniform(0.1, 0.9)).astype(np.uint8)
    m[m != 0] = rng.choice(np.array([1, 7, 255], np.uint8))  # any non-zero byte is foreground
    return torch.from_numpy(m)


@pytest.mark.parametrize("seed", range(40))
def test_cc_2d_reference_equals_literal_block_union_find(seed):
    """The fast port (scipy 8-connected labelling + the kernel's label values) against a literal port
    of the kernel's 2x2-block bitmask merge: labels and counts identical."""
    rng = np.random.default_rng(seed)
    n, h, w = int(rng.integers(1, 4)), 2 * int(rng.integers(1, 9)), 2 * int(rng.integers(1, 9))
    m = _random_uint8_masks(rng, n, h, w)
    fast = cc_2d_reference(m, True)
    slow = cc_2d_block_union_find(m, True)
    assert fast[0].dtype == fast[1].dtype == torch.int32
    assert fast[0].shape == fast[1].shape == m.shape
    assert torch.equal(fast[0], slow[0])
    assert torch.equal(fast[1], slow[1])


def test_cc_2d_reference_semantics():
    m = torch.zeros((1, 1, 4, 6), dtype=torch.uint8)
    m[0, 0, 0, 1] = m[0, 0, 1, 2] = 1  # diagonal contact: one component under 8-connectivity
    m[0, 0, 3, 5] = 1  # isolated pixel in the last block
    labels, counts = cc_2d_reference(m, True)
    assert counts[0, 0].tolist() == [[0, 2, 0, 0, 0, 0], [0, 0, 2, 0, 0, 0], [0] * 6, [0, 0, 0, 0, 0, 1]]
    # label = 1 + raster index of the top-left pixel of the component's first 2x2 block
    assert labels[0, 0, 0, 1] == labels[0, 0, 1, 2] == 1
    assert labels[0, 0, 3, 5] == 2 * 6 + 4 + 1
    assert int(labels[0, 0][m[0, 0] == 0].abs().sum()) == 0
    _, no_counts = cc_2d_reference(m, False)
    assert not no_counts.any()
    empty = cc_2d_reference(torch.zeros((0, 1, 2, 2), dtype=torch.uint8), True)
    assert empty[0].shape == (0, 1, 2, 2)


@pytest.mark.parametrize(
    "bad",
    [
        torch.zeros((1, 1, 3, 4), dtype=torch.uint8),  # odd height
        torch.zeros((1, 1, 4, 5), dtype=torch.uint8),  # odd width
        torch.zeros((1, 1, 4, 4), dtype=torch.bool),  # not uint8
        torch.zeros((1, 2, 4, 4), dtype=torch.uint8),  # C != 1
        torch.zeros((1, 4, 4), dtype=torch.uint8),  # not 4-D
    ],
)
def test_cc_2d_reference_rejects_what_the_kernel_rejects(bad):
    with pytest.raises(RuntimeError):
        cc_2d_reference(bad, True)


def test_generic_nms_reference_rules():
    f = torch.float32
    # ties in score: the lower index comes first (stable descending sort) and suppresses the other
    ious = torch.tensor([[1.0, 0.9], [0.9, 1.0]], dtype=f)
    assert generic_nms_reference(ious, torch.tensor([0.5, 0.5]), 0.5, True).tolist() == [0]
    # strict comparison: IoU exactly at the threshold does not suppress
    half = ious.new_tensor([[1, 0.5], [0.5, 1]])
    assert generic_nms_reference(half, torch.tensor([0.9, 0.8]), 0.5, True).tolist() == [0, 1]
    # the float32 IoU is compared in double: float32(0.1) = 0.10000000149 > 0.1 suppresses
    tenth = torch.tensor(1.0, dtype=f) / torch.tensor(10.0, dtype=f)
    ious = torch.stack([torch.stack([torch.tensor(1.0), tenth]), torch.stack([tenth, torch.tensor(1.0)])])
    assert generic_nms_reference(ious, torch.tensor([0.9, 0.8]), 0.1, True).tolist() == [0]
    # a suppressed detection suppresses nothing: A > B > C, A-B overlap, B-C overlap, A-C not
    ious = torch.tensor([[1, 0.8, 0.0], [0.8, 1, 0.8], [0.0, 0.8, 1]], dtype=f)
    assert generic_nms_reference(ious, torch.tensor([0.9, 0.8, 0.7]), 0.5, True).tolist() == [0, 2]
    # kept indices come in descending-score order
    eye = torch.eye(3, dtype=f)
    assert generic_nms_reference(eye, torch.tensor([0.1, 0.9, 0.5]), 0.5, True).tolist() == [1, 2, 0]
    out = generic_nms_reference(torch.zeros((0, 0)), torch.zeros((0,)), 0.5, True)
    assert out.dtype == torch.int64 and out.numel() == 0
    with pytest.raises(RuntimeError):
        generic_nms_reference(torch.zeros((2, 3)), torch.zeros((2,)), 0.5, True)
    with pytest.raises(RuntimeError):
        generic_nms_reference(torch.eye(2, dtype=torch.bfloat16), torch.zeros((2,)), 0.5, True)


def test_meta_cpu_fallback_would_compare_the_threshold_in_float32():
    """Why the port follows the CUDA kernel and not facebookresearch/sam3's generic_nms_cpu: that
    fallback keeps ``ious_np <= iou_threshold`` with a float32 array, which numpy >= 2 evaluates in
    float32, so an IoU of exactly 1/10 is kept there and suppressed by the kernel (and by us)."""
    tenth = np.float32(1) / np.float32(10)
    assert bool((np.array([tenth]) <= 0.1)[0])  # the CPU fallback's test: kept
    assert float(tenth) > 0.1  # the kernel's static_cast<double>(iou) > threshold: suppressed


# --------------------------------------------------------------------------------------------
# The stand-in is really used by transformers
# --------------------------------------------------------------------------------------------


def test_installed_reference_kernels_sets_and_restores_the_module_global():
    before = tm.cv_utils_kernel
    with installed_reference_kernels() as k:
        assert tm.cv_utils_kernel is k
        assert isinstance(k, ReferenceCvUtils)
    assert tm.cv_utils_kernel is before
    with pytest.raises(KeyError):
        with installed_reference_kernels():
            raise KeyError
    assert tm.cv_utils_kernel is before


def test_transformers_nms_and_fill_holes_take_the_kernel_path_only_when_installed():
    # Two identical detections: NMS must drop one; a 1-pixel hole: filling must close it.
    logits = np.full((2, 6, 6), -1.0, np.float32)
    logits[:, 1:5, 1:5] = 2.0
    probs = torch.tensor([0.9, 0.8])
    hole = np.full((1, 1, 5, 5), 3.0, np.float32)
    hole[0, 0, 2, 2] = -1.0

    previous = tm.cv_utils_kernel
    tm.cv_utils_kernel = False  # what transformers sets when `kernels` is missing: silent skip
    try:
        assert tm.nms_masks(probs, torch.from_numpy(logits), 0.5, 0.5).tolist() == [True, True]
        assert torch.equal(tm.fill_holes_in_mask_scores(torch.from_numpy(hole), 4), torch.from_numpy(hole))
    finally:
        tm.cv_utils_kernel = previous

    with installed_reference_kernels() as k:
        assert tm.nms_masks(probs, torch.from_numpy(logits), 0.5, 0.5).tolist() == [True, False]
        filled = tm.fill_holes_in_mask_scores(torch.from_numpy(hole), 4)
    assert float(filled[0, 0, 2, 2]) == np.float32(0.1)
    assert k.calls["generic_nms"] == 1 and k.calls["cc_2d"] == 2 and not k.errors
    # odd 5x5 masks reached the kernel padded to 6x6, as uint8 [N, 1, H, W]
    cc = [e for e in k.log if e["name"] == "cc_2d"]
    assert all(e["inputs"] == ((1, 1, 6, 6), torch.uint8, "cpu") and e["get_counts"] is True for e in cc)
    nms = [e for e in k.log if e["name"] == "generic_nms"]
    assert nms[0]["dets"] == ((2, 2), torch.float32, "cpu") and nms[0]["scores"] == ((2,), torch.float32, "cpu")
    assert nms[0]["iou_threshold"] == 0.5 and nms[0]["use_iou_matrix"] is True


def test_sam3_video_model_runs_nms_and_hole_filling_with_the_stand_in(tmp_path):
    """A short Sam3VideoModel run (tiny seeded checkpoint, 6 frames of the sample clip, two prompts)
    calls generic_nms from the detector step and cc_2d from hole filling, and nothing fails.

    Measured (tiny seed 0): 1 generic_nms call (3 valid detections -> 1 kept) and 12 cc_2d calls on
    uint8 [1, 1, 32, 32]. On 16 frames: 2 NMS calls (3 -> 1 and 16 -> 1) and 32 cc_2d calls; the
    same run without a kernel (transformers' silent skip) tracks 3, then 16 objects instead of 1."""
    import cv2
    from transformers import Sam3VideoModel
    from transformers.models.sam3_video.modeling_sam3_video import Sam3VideoInferenceSession

    from graphs.sam3.tiny import IMAGE_SIZE, tiny_tokenizer, write_tiny_checkpoint
    from sam3track.video import open_video

    from .conftest import CLIPS

    ckpt = write_tiny_checkpoint(tmp_path / "tiny")
    with open_video(CLIPS / "bikes.mp4") as video:
        frames = np.stack([video.read(i) for i in range(76, 82)])
    pixels = []
    for f in frames:
        img = cv2.resize(f, (IMAGE_SIZE, IMAGE_SIZE), interpolation=cv2.INTER_AREA).astype(np.float32) / 255
        pixels.append(((img - 0.5) / 0.5).transpose(2, 0, 1))
    tok = tiny_tokenizer()
    with installed_reference_kernels() as k:
        model = Sam3VideoModel.from_pretrained(str(ckpt)).eval()
        assert model.det_nms_thresh > 0 and model.fill_hole_area > 0  # both post-processors are on
        session = Sam3VideoInferenceSession(
            video=torch.from_numpy(np.stack(pixels)), video_height=frames.shape[1], video_width=frames.shape[2],
            dtype=torch.float32,
        )
        for text in ("person", "bike"):
            pid = session.add_prompt(text)
            enc = tok(text, padding="max_length", max_length=32, return_tensors="pt")
            session.prompt_input_ids[pid] = enc["input_ids"]
            session.prompt_attention_masks[pid] = enc["attention_mask"]
        with torch.no_grad():
            outs = list(model.propagate_in_video_iterator(session, start_frame_idx=0,
                                                          max_frame_num_to_track=len(frames) - 1))
    assert tm.cv_utils_kernel is not k
    assert len(outs) == len(frames) and any(o.obj_id_to_mask for o in outs)
    assert not k.errors, k.errors
    assert k.calls["generic_nms"] >= 1, k.calls
    assert k.calls["cc_2d"] >= 2 * len(frames), k.calls  # fill holes + remove sprinkles, every frame
    nms = [e for e in k.log if e["name"] == "generic_nms"]
    assert any(e["kept"] < e["dets"][0][0] for e in nms), nms  # NMS really suppressed detections
    low = model.low_res_mask_size
    for e in k.log:
        if e["name"] == "cc_2d":
            assert e["inputs"][1:] == (torch.uint8, "cpu") and e["inputs"][0][1:] == (1, low, low)
        else:
            assert e["iou_threshold"] == model.det_nms_thresh and e["use_iou_matrix"] is True
            assert e["dets"][1] == e["scores"][1] == torch.float32


# --------------------------------------------------------------------------------------------
# sam3track.mask_ops against transformers + ported kernels
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(80))
def test_nms_masks_matches_transformers_with_reference_kernels(seed):
    rng = np.random.default_rng(1000 + seed)
    probs, logits = _detections(rng)
    prob_threshold = float(rng.choice([0.0, 0.2, 0.5]))
    iou_threshold = float(rng.choice([0.1, 0.3, 0.5, 0.7, 0.9]))
    ours = mask_ops.nms_masks(probs, logits, prob_threshold, iou_threshold)
    with installed_reference_kernels() as k:
        ref = tm.nms_masks(torch.from_numpy(probs), torch.from_numpy(logits), prob_threshold, iou_threshold)
    assert not k.errors
    assert k.calls["generic_nms"] == int((probs > prob_threshold).any())
    assert ours.dtype == np.bool_ and ours.shape == probs.shape
    np.testing.assert_array_equal(ours, ref.numpy())


def _nms_crafted_cases():
    cases = {}
    # IoU exactly float32(0.1): |A| = 5, |B| = 6, |A & B| = 1 -> union 10. The kernel suppresses at 0.1.
    a = np.full((2, 4, 6), -1.0, np.float32)
    a[0, 0, 0:5] = 1.0
    a[1, 0, 4] = 1.0
    a[1, 1, 0:5] = 1.0
    cases["iou_exactly_float32_tenth"] = (np.array([0.9, 0.8], np.float32), a, 0.1, [True, False])
    # IoU exactly 0.5 at threshold 0.5: strict, both kept
    b = np.full((2, 4, 4), -1.0, np.float32)
    b[0, 0:2, 0:2] = 1.0
    b[1, 0:2, 0:1] = 1.0
    cases["iou_exactly_threshold"] = (np.array([0.9, 0.8], np.float32), b, 0.5, [True, True])
    # identical masks, identical scores: the lower index survives
    c = np.full((3, 5, 5), -2.0, np.float32)
    c[:, 1:4, 1:4] = 3.0
    cases["tie_keeps_lower_index"] = (np.array([0.7, 0.7, 0.7], np.float32), c, 0.5, [True, False, False])
    # a higher-scored disjoint detection first, then a tie between two identical masks -> index 0 stays
    e = c.copy()
    e[2] = -2.0
    e[2, 0, :] = 3.0
    cases["tie_after_a_disjoint_winner"] = (np.array([0.6, 0.6, 0.9], np.float32), e, 0.95, [True, False, True])
    # empty masks: IoU(empty, anything) = 0, all kept
    cases["empty_masks"] = (np.array([0.9, 0.8, 0.7], np.float32), np.full((3, 4, 4), -1.0, np.float32), 0.1,
                            [True, True, True])
    # probability exactly at the prefilter threshold is not valid (strict >)
    cases["prob_at_threshold"] = (np.array([0.5, 0.75], np.float32), c[:2], 0.9, [False, True])
    # exact zero logits are background
    z = np.zeros((2, 3, 3), np.float32)
    z[0, 0, 0] = 1.0
    cases["zero_logits_are_background"] = (np.array([0.9, 0.8], np.float32), z, 0.1, [True, True])
    # chain: A suppresses B, B would suppress C but is itself suppressed -> C kept
    d = np.full((3, 1, 10), -1.0, np.float32)
    d[0, 0, 0:4] = 1.0
    d[1, 0, 2:6] = 1.0
    d[2, 0, 4:8] = 1.0
    cases["suppressed_suppresses_nothing"] = (np.array([0.9, 0.8, 0.7], np.float32), d, 0.3, [True, False, True])
    return cases


@pytest.mark.parametrize("name", sorted(_nms_crafted_cases()))
def test_nms_masks_crafted_cases(name):
    probs, logits, iou_threshold, expected = _nms_crafted_cases()[name]
    prob_threshold = 0.5 if name == "prob_at_threshold" else 0.0
    with installed_reference_kernels() as k:
        ref = tm.nms_masks(torch.from_numpy(probs), torch.from_numpy(logits), prob_threshold, iou_threshold)
    assert not k.errors and k.calls["generic_nms"] == 1
    assert ref.tolist() == expected  # the reference itself does what the case says
    assert mask_ops.nms_masks(probs, logits, prob_threshold, iou_threshold).tolist() == expected


def _fill_holes_both(logits: np.ndarray, max_area: int, fill_holes: bool, remove_sprinkles: bool):
    ours = mask_ops.fill_holes_in_mask_scores(logits, max_area, fill_holes=fill_holes,
                                              remove_sprinkles=remove_sprinkles)
    with installed_reference_kernels() as k:
        ref = tm.fill_holes_in_mask_scores(torch.from_numpy(logits)[:, None], max_area, fill_holes=fill_holes,
                                           remove_sprinkles=remove_sprinkles)[:, 0].numpy()
    assert not k.errors
    assert k.calls["cc_2d"] == (int(fill_holes) + int(remove_sprinkles) if max_area > 0 else 0)
    return np.asarray(ours), ref


@pytest.mark.parametrize("seed", range(80))
def test_fill_holes_matches_transformers_with_reference_kernels(seed):
    rng = np.random.default_rng(2000 + seed)
    n, h, w = int(rng.integers(1, 5)), int(rng.integers(1, 30)), int(rng.integers(1, 30))
    logits = _blob_logits(rng, n, h, w)
    max_area = int(rng.choice([1, 2, 3, 4, 8, 16, 40]))
    flags = [(True, True), (True, False), (False, True)][seed % 3]
    ours, ref = _fill_holes_both(logits, max_area, *flags)
    assert ours.dtype == np.float32 and ours.shape == ref.shape
    np.testing.assert_array_equal(ours, ref)


def _fill_holes_crafted_cases():
    cases = {}
    # Holes of area max_area (filled) and max_area + 1 (kept) for max_area = 4, odd size (padding).
    m = np.full((1, 11, 13), 2.0, np.float32)
    m[0, 2:4, 2:4] = -1.0  # 4 px: filled
    m[0, 2:3, 6:11] = -1.0  # 5 px: kept
    m[0, 6, 6] = 0.0  # exact zero, 1 px: filled
    m[0, 10, 0:4] = -3.0  # 4 px touching the bottom border (next to the zero pad): filled
    m[0, 7:10, 12] = -3.0  # 3 px touching the right border: filled
    m[0, 0, 12] = -1.0  # corner pixel: filled
    cases["holes_at_the_area_threshold_and_borders"] = (m, 4)
    # Five background pixels touching only diagonally: one 8-connected component of 5 > 4, kept.
    d = np.full((1, 8, 8), 1.0, np.float32)
    d[0, 1, 1] = d[0, 2, 2] = d[0, 3, 3] = d[0, 4, 4] = d[0, 5, 5] = -1.0
    cases["diagonal_hole_is_one_component"] = (d, 4)
    # Sprinkles: total fg 1 + 4 + 9 = 14, threshold min(16, 14 // 2 = 7): the 1 and 4 go, the 9 stays.
    s = np.full((1, 12, 12), -1.0, np.float32)
    s[0, 0, 0] = 1.0
    s[0, 4:6, 4:6] = 1.0
    s[0, 8:11, 8:11] = 1.0
    cases["sprinkles_below_half_the_area"] = (s, 16)
    # Sprinkle threshold exactly at fg_area // 2: two components 4 and 4 -> 8 // 2 = 4: both removed.
    t = np.full((2, 9, 9), -1.0, np.float32)
    t[0, 0:2, 0:2] = 1.0
    t[0, 6:8, 6:8] = 1.0
    t[1, 0:2, 0:2] = 1.0  # second object: 4 and 5 -> 9 // 2 = 4: only the 4 goes
    t[1, 5:6, 4:9] = 1.0
    cases["sprinkles_exactly_at_half_the_area"] = (t, 16)
    # A tiny object alone is not a sprinkle (1 <= min(16, 0) is false)
    o = np.full((1, 6, 6), -4.0, np.float32)
    o[0, 3, 3] = 5.0
    cases["lone_tiny_object"] = (o, 16)
    # Nested: a sprinkle in a hole in a ring (filling the hole first swallows the sprinkle)
    c = np.full((1, 7, 7), 1.0, np.float32)
    c[0, 1:6, 1:6] = -1.0
    c[0, 3, 3] = 1.0
    cases["nested"] = (c, 30)
    cases["all_background"] = (np.full((2, 5, 6), -1.0, np.float32), 16)
    cases["all_foreground"] = (np.full((2, 6, 5), 1.0, np.float32), 16)
    cases["single_row"] = (np.array([[[1, -1, 1, 1, -1, -1, 1]]], np.float32), 1)
    cases["single_column"] = (np.array([[[1], [-1], [1], [1], [-1]]], np.float32), 2)
    cases["one_pixel_image"] = (np.array([[[-1.0]]], np.float32), 1)
    return cases


@pytest.mark.parametrize("name", sorted(_fill_holes_crafted_cases()))
def test_fill_holes_crafted_cases(name):
    logits, max_area = _fill_holes_crafted_cases()[name]
    ours, ref = _fill_holes_both(logits, max_area, True, True)
    np.testing.assert_array_equal(ours, ref)


def test_fill_holes_crafted_reference_behaviour():
    """The crafted cases do what their comments say on the reference side (so they test something)."""
    cases = _fill_holes_crafted_cases()
    _, ref = _fill_holes_both(*cases["holes_at_the_area_threshold_and_borders"], True, True)
    t = np.float32(0.1)
    assert (ref[0, 2:4, 2:4] == t).all() and (ref[0, 2, 6:11] == -1).all()
    assert ref[0, 6, 6] == t and (ref[0, 10, 0:4] == t).all() and (ref[0, 7:10, 12] == t).all()
    assert ref[0, 0, 12] == t
    _, ref = _fill_holes_both(*cases["diagonal_hole_is_one_component"], True, True)
    assert (ref < 0).sum() == 5
    _, ref = _fill_holes_both(*cases["sprinkles_below_half_the_area"], True, True)
    assert (ref > 0).sum() == 9
    _, ref = _fill_holes_both(*cases["sprinkles_exactly_at_half_the_area"], True, True)
    assert (ref[0] > 0).sum() == 0 and (ref[1] > 0).sum() == 5
    _, ref = _fill_holes_both(*cases["lone_tiny_object"], True, True)
    assert (ref > 0).sum() == 1


@pytest.mark.parametrize("max_area", [0, -3])
def test_fill_holes_nonpositive_area_is_identity_on_both_sides(max_area):
    logits = _blob_logits(np.random.default_rng(7), 2, 9, 8)
    ours, ref = _fill_holes_both(logits, max_area, True, True)
    np.testing.assert_array_equal(ours, logits)
    np.testing.assert_array_equal(ref, logits)


def test_fill_holes_accepts_the_reference_layout():
    """[N, 1, H, W] in (the layout transformers passes) gives the same values as [N, H, W]."""
    logits = _blob_logits(np.random.default_rng(11), 3, 13, 10)
    ours4 = mask_ops.fill_holes_in_mask_scores(logits[:, None], 6)
    with installed_reference_kernels():
        ref4 = tm.fill_holes_in_mask_scores(torch.from_numpy(logits[:, None]), 6).numpy()
    np.testing.assert_array_equal(ours4, ref4)


@pytest.mark.parametrize("seed", range(30))
def test_connected_component_areas_match_transformers_padding_helper(seed):
    rng = np.random.default_rng(3000 + seed)
    n, h, w = int(rng.integers(1, 4)), int(rng.integers(1, 24)), int(rng.integers(1, 24))
    masks = rng.random((n, 1, h, w)) < rng.uniform(0.1, 0.9)
    with installed_reference_kernels() as k:
        _, counts = tm._get_connected_components_with_padding(torch.from_numpy(masks))
    assert k.calls["cc_2d"] == 1 and not k.errors
    np.testing.assert_array_equal(mask_ops.connected_component_areas(masks), counts.numpy())


# --------------------------------------------------------------------------------------------
# The comparisons can fail: a plausible wrong kernel is caught on the same inputs
# --------------------------------------------------------------------------------------------


class _FourConnected(ReferenceCvUtils):
    def cc_2d(self, inputs, get_counts):
        from scipy import ndimage

        self.calls["cc_2d"] += 1
        arr = inputs.numpy()[:, 0] != 0
        counts = np.zeros(inputs.shape, np.int32)
        for b in range(arr.shape[0]):
            lab, num = ndimage.label(arr[b])  # default structure: 4-connectivity
            sizes = np.bincount(lab.ravel(), minlength=num + 1)
            counts[b, 0] = np.where(arr[b], sizes[lab], 0)
        return [torch.zeros_like(inputs, dtype=torch.int32), torch.from_numpy(counts)]


class _LessOrEqualNms(ReferenceCvUtils):
    """Meta's CPU-fallback comparison (keep iou <= thr, in float32) instead of the kernel's."""

    def generic_nms(self, dets, scores, iou_threshold, use_iou_matrix):
        self.calls["generic_nms"] += 1
        order = torch.sort(scores, stable=True, descending=True).indices
        ious = dets.numpy()
        kept, alive = [], order.tolist()
        while alive:
            i = alive.pop(0)
            kept.append(i)
            alive = [j for j in alive if ious[i, j] <= np.float32(iou_threshold)]
        return torch.tensor(kept, dtype=torch.int64)


def test_a_four_connected_kernel_would_be_caught():
    cases = _fill_holes_crafted_cases()
    logits, max_area = cases["diagonal_hole_is_one_component"]
    with installed_reference_kernels(_FourConnected()):
        wrong = tm.fill_holes_in_mask_scores(torch.from_numpy(logits)[:, None], max_area)[:, 0].numpy()
    assert not np.array_equal(mask_ops.fill_holes_in_mask_scores(logits, max_area), wrong)


def test_a_float32_less_or_equal_nms_would_be_caught():
    probs, logits, thr, _ = _nms_crafted_cases()["iou_exactly_float32_tenth"]
    with installed_reference_kernels(_LessOrEqualNms()):
        wrong = tm.nms_masks(torch.from_numpy(probs), torch.from_numpy(logits), 0.0, thr).numpy()
    assert not np.array_equal(mask_ops.nms_masks(probs, logits, 0.0, thr), wrong)


class _HigherIndexFirstOnTies(ReferenceCvUtils):
    """Ties broken towards the higher index (what a reversed stable ascending sort gives)."""

    def generic_nms(self, dets, scores, iou_threshold, use_iou_matrix):
        self.calls["generic_nms"] += 1
        order = scores.numpy().argsort(kind="stable")[::-1].tolist()
        ious = dets.numpy()
        kept = []
        while order:
            i = order.pop(0)
            kept.append(i)
            order = [j for j in order if float(ious[i, j]) <= iou_threshold]
        return torch.tensor(kept, dtype=torch.int64)


def test_the_random_suites_would_catch_wrong_kernels():
    """On the seeded random inputs of the tests above, a 4-connected cc_2d and a wrong tie order in
    NMS each change the reference's output in many cases (measured: 44/80 and 28/80)."""
    fill_caught = 0
    for seed in range(80):
        rng = np.random.default_rng(2000 + seed)
        n, h, w = int(rng.integers(1, 5)), int(rng.integers(1, 30)), int(rng.integers(1, 30))
        logits = _blob_logits(rng, n, h, w)
        max_area = int(rng.choice([1, 2, 3, 4, 8, 16, 40]))
        flags = [(True, True), (True, False), (False, True)][seed % 3]
        with installed_reference_kernels(_FourConnected()):
            wrong = tm.fill_holes_in_mask_scores(torch.from_numpy(logits)[:, None], max_area, *flags)[:, 0]
        fill_caught += not np.array_equal(mask_ops.fill_holes_in_mask_scores(logits, max_area, *flags), wrong)
    nms_caught = 0
    for seed in range(80):
        rng = np.random.default_rng(1000 + seed)
        probs, logits = _detections(rng)
        prob_threshold = float(rng.choice([0.0, 0.2, 0.5]))
        iou_threshold = float(rng.choice([0.1, 0.3, 0.5, 0.7, 0.9]))
        with installed_reference_kernels(_HigherIndexFirstOnTies()) as k:
            wrong = tm.nms_masks(torch.from_numpy(probs), torch.from_numpy(logits), prob_threshold, iou_threshold)
        assert not k.errors
        nms_caught += not np.array_equal(mask_ops.nms_masks(probs, logits, prob_threshold, iou_threshold), wrong)
    assert fill_caught >= 20 and nms_caught >= 10, (fill_caught, nms_caught)
