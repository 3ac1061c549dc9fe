"""Low-res logits to FrameResult: the fast forms of the post-processing steps against their plain forms."""

from __future__ import annotations

import numpy as np
import pytest

from sam3track.postprocess import objectwise_non_overlap


def _non_overlap_by_argmax(masks, scores, prompt_ids):
    """The plain form (as it was written first): per prompt, the argmax over objects of
    where(mask, score, 0), kept where the winner's value is > 0."""
    out = masks.copy()
    prompts = np.asarray(prompt_ids)
    for p in np.unique(prompts[prompts >= 0]):
        idx = np.flatnonzero(prompts == p)
        vals = np.where(masks[idx], np.asarray(scores)[idx, None, None].astype(np.float32), np.float32(0))
        winner = vals.argmax(axis=0)
        for j, i in enumerate(idx):
            out[i] = masks[i] & (winner == j) & (vals[j] > 0)
    return out


@pytest.mark.parametrize("scores", ["random", "ties", "odd"])
def test_objectwise_non_overlap_matches_the_argmax_form(scores):
    """Ties go to the first object, scores <= 0 keep nothing, NaN (argmax's first pick) blocks; user
    objects (group -1) are untouched."""
    rng = np.random.default_rng(0)
    pool = {"random": None, "ties": np.float32([0.25, 0.5, 0.5, 0.9]),
            "odd": np.float32([0.0, -0.0, 0.5, 0.5, -1e4, np.nan, np.inf, -np.inf, 1e-8])}[scores]
    for _ in range(300):
        n, h, w = int(rng.integers(1, 10)), int(rng.integers(1, 16)), int(rng.integers(1, 16))
        masks = rng.random((n, h, w)) < rng.random()
        s = rng.random(n).astype(np.float32) if pool is None else rng.choice(pool, n)
        prompts = rng.integers(-1, 3, n).tolist()
        np.testing.assert_array_equal(objectwise_non_overlap(masks, s, prompts),
                                      _non_overlap_by_argmax(masks, s, prompts))


@pytest.mark.parametrize("family", ["sam3", "sam3.1"])
def test_masks_with_no_positive_logit_are_not_resized_and_come_out_as_resizing_them_gives(family):
    """binary_masks_at skips the full-size resize of objects whose logits are all <= 0 (issue 29, work
    avoided): bilinear weights are >= 0 and sum to 1, so the result is unchanged. Absent objects
    (NO_OBJ_SCORE), -0.0, tiny negatives beside 0, one positive pixel, NaN; sizes up and down."""
    from sam3track.families.sam31.resize import bilinear
    from sam3track.mask_ops import binary_masks_at
    from sam3track.postprocess import upsample_masks

    upsample = upsample_masks if family == "sam3" else (lambda x, h, w: bilinear(x, h, w) > 0)
    rng = np.random.default_rng(1)
    low = rng.normal(0, 4, (7, 24, 24)).astype(np.float32)
    low[0] = -1024.0
    low[1] = -np.abs(low[1])
    low[1, 3, 5] = -0.0
    low[2] = -1e-7
    low[2, 10, 10] = 1e-7  # one positive pixel: resized
    low[3] = -1.0
    low[3, 0, 0] = np.nan
    low[4] = np.float32(-1e-38)
    low[4, 2, 2] = -np.inf
    resized = []

    def counting(x, h, w):
        resized.append(x.shape[0])
        return upsample(x, h, w)

    for h, w in ((97, 130), (16, 11), (12, 12)):  # up, down, an exact 2x down (OpenCV's INTER_AREA path)
        resized.clear()
        got = binary_masks_at(low, h, w, counting)
        np.testing.assert_array_equal(got, upsample(low, h, w))
        assert got.dtype == bool and resized == [4]  # rows 2, 3 (NaN), 5, 6
        assert not got[[0, 1, 4]].any() and (got[2].any() or h < 24)
    resized.clear()
    assert not binary_masks_at(low[[0, 1]], 50, 60, counting).any() and resized == []


@pytest.fixture(params=["windows", "default"])
def window_sizes(request, monkeypatch):
    """The windowed resizes at every plane size ("windows") and at their default, where small planes
    take the whole-stack form."""
    from sam3track.families.sam31 import resize

    if request.param == "windows":
        monkeypatch.setattr(resize, "WINDOW_MIN_PIXELS", 0)
    return request.param


def test_sam31_output_masks_resized_inside_each_object_s_window_equal_the_full_resize(window_sizes):
    """SAM 3.1's video-size masks (resize.bilinear_positive: issue 29, work avoided) are bilinear() > 0
    bit for bit while only the output pixels whose taps reach a value not <= 0 are computed: small
    objects, absent ones, one-pixel ones at the borders, NaN, +-inf, -0, denormals, up and down sizes."""
    from sam3track.families.sam31.resize import bilinear, bilinear_positive

    rng = np.random.default_rng(3)
    odd = np.float32([np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-45, -1e-45, 1e-38])
    for case in range(400):
        n, h, w = int(rng.integers(1, 5)), int(rng.integers(1, 20)), int(rng.integers(1, 20))
        x = (rng.normal(0, 3, (n, h, w)) - rng.uniform(0, 6)).astype(np.float32)
        if case % 3 == 0:  # mostly background: small objects
            x = np.where(rng.random(x.shape) < 0.9, -np.abs(x), x).astype(np.float32)
        if case % 4 == 0:
            spots = rng.random(x.shape) < 0.2
            x[spots] = rng.choice(odd, int(spots.sum()))
        if case % 5 == 0:  # one object pixel at a random place, often a border
            x[:] = -1.0
            x[:, rng.integers(0, h), rng.choice([0, w - 1, int(rng.integers(0, w))])] = 5.0
        height, width = int(rng.integers(1, 60)), int(rng.integers(1, 60))
        with np.errstate(invalid="ignore"):
            got, want = bilinear_positive(x, height, width), bilinear(x, height, width) > 0
        np.testing.assert_array_equal(got, want, err_msg=f"case {case}: {x.shape} -> {height} x {width}")
    assert bilinear_positive(np.zeros((0, 5, 5), np.float32), 300, 400).shape == (0, 300, 400)


def test_sam31_birth_resizes_around_each_object_equal_the_whole_plane_resize(window_sizes):
    """A birth's antialiased resizes to the video size and back (resize.bilinear_antialias_over) give
    bilinear_antialias's values bit for bit (NaN as NaN) while only each object's window is resized:
    backgrounds 0, -0, +-1024 and others, objects at the borders, none, NaN, -0 and inf inside, sizes
    up and down on each axis."""
    from sam3track.families.sam31.resize import bilinear_antialias, bilinear_antialias_over

    rng = np.random.default_rng(5)
    for case in range(300):
        n, h, w = int(rng.integers(1, 4)), int(rng.integers(1, 40)), int(rng.integers(1, 40))
        height, width = int(rng.integers(1, 50)), int(rng.integers(1, 50))
        background = float(rng.choice([0.0, -0.0, -1024.0, 1024.0, 3.5]))
        x = np.full((n, h, w), background, np.float32)
        for i in range(n):
            if rng.random() < 0.2:
                continue  # an absent object: all background
            r, c = int(rng.integers(0, h)), int(rng.integers(0, w))
            dh, dw = int(rng.integers(1, h - r + 1)), int(rng.integers(1, w - c + 1))
            x[i, r:r + dh, c:c + dw] = np.where(rng.random((dh, dw)) < 0.7, -background or 1.0,
                                                rng.normal(0, 100, (dh, dw)))
        if case % 5 == 0:
            odd = rng.random(x.shape)
            x[odd < 0.02], x[(odd >= 0.02) & (odd < 0.04)], x[(odd >= 0.04) & (odd < 0.05)] = np.nan, -0.0, np.inf
        with np.errstate(invalid="ignore"):
            got = bilinear_antialias_over(x, height, width, background)
            want = bilinear_antialias(x, height, width)
        message = f"case {case}: {x.shape} -> {height} x {width} over {background}"
        np.testing.assert_array_equal(got, want, err_msg=message)
        np.testing.assert_array_equal(np.signbit(got[~np.isnan(got)]), np.signbit(want[~np.isnan(want)]), message)
    # -0 is not a background of 0: a plane of -0 resizes to -0
    minus_zero = np.full((1, 9, 7), -0.0, np.float32)
    assert np.signbit(bilinear_antialias_over(minus_zero, 13, 4, 0.0)).all()
    assert bilinear_antialias_over(np.zeros((0, 5, 5), np.float32), 300, 400, 0.0).shape == (0, 300, 400)


def test_build_result_drops_hidden_objects_even_when_shown_and_keeps_shown_empty_ones():
    """build_result resizes only what it returns: a hidden id is left out even when `shown` names it,
    an absent object (all logits <= 0) is left out unless `shown` names it, then with an empty mask."""
    from types import SimpleNamespace

    from sam3track.postprocess import build_result

    low = np.full((4, 16, 16), -1024.0, np.float32)
    low[0, 4:12, 4:12] = 5.0
    low[1, 2:6, 2:6] = 5.0
    out = SimpleNamespace(frame_index=3, masks={i: low[i] for i in range(4)}, suppressed={1},
                          scores={i: 0.9 for i in range(4)}, tracker_scores={i: 0.8 for i in range(4)},
                          prompts={i: 0 for i in range(4)}, user_objects=set())
    r = build_result(out, ["dog"], 32, 48, hidden={2}, shown={1, 2, 3})
    assert r.object_ids.tolist() == [0, 3]
    assert r.masks.shape == (2, 32, 48) and r.masks[0].any() and not r.masks[1].any()
    assert build_result(out, ["dog"], 32, 48, hidden={0, 2, 3}).object_ids.tolist() == []
