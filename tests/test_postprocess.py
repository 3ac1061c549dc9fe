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
