"""Sanity checks of tests/reference_tracker.py (the reference side of the click/box parity test).

Fast: the tiny bundle and 6 frames of the bikes clip. They check the harness drives transformers' tracker
the way its processor and Sam3VideoModel would, not sam3track.
"""

from __future__ import annotations

import numpy as np
import pytest

import sam3track
from sam3track.video import open_video

from .conftest import CLIPS
from .reference_tracker import (load_reference, make_session, normalize_coords, run_reference_tracker,
                                tracker_features)

import torch  # noqa: E402  (the reference must be there)

CLICK = [[450.0, 140.0]]   # on the cyclist of bikes.mp4 frame 76 (any point works: random weights)
BOX = [400.0, 60.0, 520.0, 270.0]


@pytest.fixture(scope="module")
def frames():
    with open_video(CLIPS / "bikes.mp4") as video:
        return np.stack([video.read(i) for i in range(76, 82)])


@pytest.fixture(scope="module")
def predictor(tiny_bundle):
    return sam3track.load(tiny_bundle)


@pytest.fixture(scope="module")
def model(tiny_bundle):
    return load_reference(tiny_bundle)


def test_one_click_equals_the_tracker_modules_by_hand(tiny_bundle, frames, predictor, model):
    run = run_reference_tracker(tiny_bundle, frames, [dict(frame=2, obj_id=7, points=CLICK, labels=[1])],
                                predictor, model=model)
    (prompt,) = run.prompts
    tracker = model.tracker_model
    s = predictor.config.image_size
    h, w = frames.shape[1:3]
    # the processor's normalisation: x * S / W, y * S / H (model-input pixels, before the encoder's +0.5)
    expected = np.array([[CLICK[0][0] * (s / w), CLICK[0][1] * (s / h)]], np.float32)
    np.testing.assert_allclose(prompt.point_coords, expected, rtol=1e-6)
    assert prompt.point_labels.tolist() == [1]
    assert prompt.is_init_cond_frame and prompt.multimask  # one click on a fresh frame: multimask

    from sam3track.postprocess import to_pixel_values
    with torch.no_grad():
        feats, _ = tracker_features(model, torch.from_numpy(to_pixel_values(frames[2], predictor.config)))
        c = tracker.hidden_dim
        high = [x.permute(1, 2, 0).view(1, x.size(2), *size)
                for x, size in zip(feats[:-1], tracker.backbone_feature_sizes[:-1])]
        top = (feats[-1] + tracker.no_memory_embedding).permute(1, 2, 0).view(1, c, *tracker.backbone_feature_sizes[-1])
        out = tracker._single_frame_forward(input_points=torch.from_numpy(expected).view(1, 1, 1, 2),
                                            input_labels=torch.ones(1, 1, 1, dtype=torch.int64),
                                            image_embeddings=high + [top], multimask_output=True)
    result = prompt.result
    assert result.frame_index == 2 and result.object_ids == [7]
    np.testing.assert_array_equal(result.low_res_logits[0], out.pred_masks.reshape(out.pred_masks.shape[-2:]).numpy())
    logit = float(out.object_score_logits.reshape(()))
    np.testing.assert_allclose(result.object_score_logits, [logit], rtol=1e-6)
    np.testing.assert_allclose(result.object_scores, [1 / (1 + np.exp(-logit))], rtol=1e-6)
    up = torch.nn.functional.interpolate(out.pred_masks.reshape(1, 1, *out.pred_masks.shape[-2:]), size=(h, w),
                                         mode="bilinear", align_corners=False)[0, 0]
    np.testing.assert_array_equal(result.masks[0], (up > 0).numpy())
    assert result.masks.shape == (1, h, w) and result.masks.dtype == bool


def test_features_are_sam3_video_models_tracker_features(frames, predictor, model):
    """The cached features are what Sam3VideoModel caches for its tracker (sv:1613-1631), frame by frame."""
    session = make_session(model, frames[:2], predictor)
    from sam3track.postprocess import to_pixel_values
    with torch.no_grad():
        pixels = torch.from_numpy(to_pixel_values(frames[1], predictor.config))
        embeds = model.detector_model.get_vision_features(pixel_values=pixels)
        feats, pos = model.get_vision_features_for_tracker(vision_embeds=embeds)
    cached = session.cache.get_vision_features(1)
    for a, b in zip(cached["vision_feats"], feats):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert len(session.cache._vision_features) == 2
    assert model.tracker_model.vision_encoder is None  # a cache miss raises, never recomputes differently


def test_box_is_two_corner_points_before_clicks(tiny_bundle, frames, predictor, model):
    s = predictor.config.image_size
    h, w = frames.shape[1:3]
    script = [dict(frame=1, obj_id=3, box=BOX, points=CLICK, labels=[0], clear_old=True),
              dict(frame=1, obj_id=3, points=[[100, 100]], labels=[1])]  # accumulates after them
    run = run_reference_tracker(tiny_bundle, frames, script, predictor, model=model)
    first, second = run.prompts
    corners = normalize_coords(np.reshape(BOX, (2, 2)), (h, w), s).numpy()
    np.testing.assert_allclose(first.point_coords[:2], corners, rtol=1e-6)
    np.testing.assert_allclose(first.point_coords[2], [CLICK[0][0] * s / w, CLICK[0][1] * s / h], rtol=1e-6)
    assert first.point_labels.tolist() == [2, 3, 0]
    assert second.point_labels.tolist() == [2, 3, 0, 1]
    np.testing.assert_allclose(second.point_coords[:3], first.point_coords)
    assert not first.multimask and not second.multimask  # >= 2 points: single mask
    assert first.is_init_cond_frame and second.is_init_cond_frame
    with pytest.raises(ValueError, match="without clearing"):
        run_reference_tracker(tiny_bundle, frames, [dict(frame=1, obj_id=3, box=BOX)], predictor, model=model)


def test_ids_frame_order_and_storage(tiny_bundle, frames, predictor, model):
    """Objects in insertion order on every output; forward from the earliest conditioning frame, reverse
    from a start frame including it; a click on a tracked frame is memory-conditioned and non-conditioning."""
    script = [dict(frame=2, obj_id=5, points=CLICK, labels=[1]),
              dict(frame=3, obj_id=1, box=BOX, clear_old=True),
              dict(propagate="forward"),
              dict(frame=4, obj_id=5, points=[[300, 200]], labels=[0]),
              dict(propagate="backward", start_frame=5),
              dict(propagate="backward")]  # default start: frame 2 (earliest conditioning frame)
    run = run_reference_tracker(tiny_bundle, frames, script, predictor, model=model)
    p0, p1, corr = run.prompts
    fwd, back, back_default = run.propagations
    assert p0.result.object_ids == [5] and p1.result.object_ids == [5, 1]
    assert [f.frame_index for f in fwd.frames] == [2, 3, 4, 5]
    assert [f.frame_index for f in back.frames] == [5, 4, 3, 2, 1, 0]
    assert [f.frame_index for f in back_default.frames] == [2, 1, 0]
    assert all(f.object_ids == [5, 1] for p in run.propagations for f in p.frames)
    assert not corr.is_init_cond_frame and corr.multimask  # 1 click on a tracked frame: memory, multimask
    assert run.conditioning == {5: [2], 1: [3]}  # the correction on frame 4 is not a conditioning frame
    # the prompt frames' outputs are reused unchanged by propagation (conditioning outputs)
    np.testing.assert_array_equal(fwd.frames[0].low_res_logits[0], p0.result.low_res_logits[0])
    np.testing.assert_array_equal(fwd.frames[1].low_res_logits[1], p1.result.low_res_logits[1])
    # object 1 (box on frame 3) is tracked on frame 2 from its (future) conditioning memory
    assert 2 in run.tracked[1] and 3 not in run.tracked[1]
    for f in fwd.frames:
        n = len(f.object_ids)
        assert f.masks.shape[0] == f.ties.shape[0] == f.low_res_logits.shape[0] == n
        assert f.object_scores.shape == f.object_score_logits.shape == (n,)


def test_reverse_from_frame_zero_yields_nothing(tiny_bundle, frames, predictor, model):
    run = run_reference_tracker(tiny_bundle, frames[:3], [dict(frame=0, obj_id=1, points=CLICK)], predictor,
                                directions=("backward",), model=model)
    assert run.propagations[0].frames == []


def test_deterministic(tiny_bundle, frames, predictor, model):
    script = [dict(frame=0, obj_id=1, points=CLICK, labels=[1]), dict(frame=2, obj_id=2, box=BOX, clear_old=True)]
    a = run_reference_tracker(tiny_bundle, frames, script, predictor, directions=("forward",), model=model)
    b = run_reference_tracker(tiny_bundle, frames, script, predictor, directions=("forward",), model=model)
    for x, y in zip(a.propagations[0].frames + [p.result for p in a.prompts],
                    b.propagations[0].frames + [p.result for p in b.prompts]):
        assert x.object_ids == y.object_ids
        np.testing.assert_array_equal(x.low_res_logits, y.low_res_logits)
        np.testing.assert_array_equal(x.object_score_logits, y.object_score_logits)
