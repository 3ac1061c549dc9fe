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
