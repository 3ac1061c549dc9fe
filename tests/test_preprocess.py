"""Frames to pixel values with the reference processor's semantics (torchvision resize, antialiased)."""

from __future__ import annotations

import numpy as np
import pytest

from sam3track.postprocess import resize_antialiased, to_pixel_values

import torch  # noqa: E402  (the reference side: a missing torch fails the run, never skips)


@pytest.mark.parametrize("size,out", [((272, 640), (1008, 1008)), ((1080, 1920), (1008, 1008)),
                                      ((97, 131), (112, 112)), ((300, 200), (112, 112))])
def test_resize_matches_torchvision_within_one_level(size, out):
    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, size + (3,)).astype(np.uint8)
    ours = resize_antialiased(img, *out).astype(int)
    # torchvision's tvF.resize(antialias=True) on uint8 is this torch kernel (fixed-point weights)
    ref = torch.nn.functional.interpolate(torch.from_numpy(img).permute(2, 0, 1)[None], size=out,
                                          mode="bilinear", antialias=True, align_corners=False)
    diff = np.abs(ours - ref[0].permute(1, 2, 0).numpy().astype(int))
    assert diff.max() <= 1 and diff.mean() < 0.03


def test_pixel_values_are_rescaled_and_normalised():
    class Config:
        image_size, rescale_factor, image_mean, image_std = 112, 1 / 255, (0.5,) * 3, (0.5,) * 3

    white = np.full((50, 80, 3), 255, np.uint8)
    black = np.zeros((50, 80, 3), np.uint8)
    assert to_pixel_values(white, Config).shape == (1, 3, 112, 112)
    assert np.allclose(to_pixel_values(white, Config), 1.0) and np.allclose(to_pixel_values(black, Config), -1.0)


def _resize_one_tap_at_a_time(rgb, height, width):
    """The plain form of resize_antialiased (as it was written first): float32, width then height,
    each output accumulated tap by tap, rounded and clipped between the passes."""
    from sam3track.postprocess import _antialiased_taps

    out = rgb.astype(np.float32)
    for axis, size in ((1, width), (0, height)):
        idx, weights = _antialiased_taps(out.shape[axis], size)
        moved = np.moveaxis(out, axis, 0)
        acc = np.zeros((size,) + moved.shape[1:], np.float32)
        for k in range(idx.shape[1]):
            acc += weights[:, k, None, None] * moved[idx[:, k]]
        out = np.clip(np.rint(np.moveaxis(acc, 0, axis)), 0, 255)
    return out.astype(np.uint8)


@pytest.mark.parametrize("size,out", [((272, 640), (112, 112)), ((97, 131), (112, 112)), ((112, 112), (112, 112)),
                                      ((1, 1), (5, 7)), ((300, 200), (504, 504)), ((61, 45), (13, 200))])
def test_resize_is_bit_identical_to_the_plain_form(size, out):
    """The fast path (cached taps, transposes, whole-row gathers) changes no pixel, only the layout."""
    rng = np.random.default_rng(1)
    for img in (rng.integers(0, 256, size + (3,)).astype(np.uint8),
                (rng.integers(0, 2, size + (3,)) * 255).astype(np.uint8)):
        np.testing.assert_array_equal(resize_antialiased(img, *out), _resize_one_tap_at_a_time(img, *out))


def test_pixel_values_are_contiguous_float32():
    class Config:
        image_size, rescale_factor, image_mean, image_std = 112, 1 / 255, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)

    img = np.random.default_rng(2).integers(0, 256, (90, 160, 3)).astype(np.uint8)
    pixels = to_pixel_values(img, Config)
    assert pixels.dtype == np.float32 and pixels.flags.c_contiguous and pixels.shape == (1, 3, 112, 112)
    plain = _resize_one_tap_at_a_time(img, 112, 112).astype(np.float32) * np.float32(Config.rescale_factor)
    plain = (plain - np.asarray(Config.image_mean, np.float32)) / np.asarray(Config.image_std, np.float32)
    np.testing.assert_array_equal(pixels[0], plain.transpose(2, 0, 1))
