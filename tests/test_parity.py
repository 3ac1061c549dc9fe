"""sam3track on ONNX Runtime against transformers' Sam3VideoModel, same weights, same pixels and token ids.

The reference (tests/reference_video.py) is driven with pixel values and token ids directly (its
processors need torchvision, which does not load beside torch 2.13 here); its post-processing is re-done
in torch following `Sam3VideoProcessor.postprocess_outputs`. Its runs are cached on disk, keyed by the
weights, the inputs and the driving code (tests/reference_cache.py); the comparison is always live.

Both sides run mask NMS and hole filling, as users get them: sam3track at its defaults (`mask_nms` and
`fill_holes` on), the reference with its cv-utils kernel. transformers loads that kernel only through
the `kernels` package from the Hugging Face hub and silently skips NMS and hole filling without it;
here it cannot be had (no hub access; `kernels` on the reachable index stops at 0.17.2 while
transformers 5.24 pins 0.18.2 <= kernels < 0.19; and cv-utils is built for CUDA only). The reference
therefore runs with the test-side ports of the two kernels in tests/reference_kernels.py installed
(`installed_reference_kernels()`), and every run asserts the port was called, NMS and connected
components both, without an error, so a comparison can never silently run without them.
`match_reference_quirks=True` on sam3track's side reproduces the reference's cross-prompt coupling,
which is what makes a frame-by-frame comparison possible.
"""

from __future__ import annotations

import numpy as np
import pytest

import sam3track
from sam3track.video import open_video

from .conftest import CLIPS, mask_iou, rounding_xfail
# The reference must be there: without torch this import fails and the run fails, never skips.
from .reference_video import BOTH_START, REPROPAGATION, reference_run

pytestmark = pytest.mark.slow  # the full tier: SAM 3 text tracking against transformers, frame by frame


def record_events(session):
    """Wrap the session's frame loop so births (id -> frame) and hotstart removals are recorded."""
    events = {"births": {}, "removed": set()}
    step = session.loop.step

    def recording(pixels, text, frame, *args):
        before = session.objects.max_obj_id
        out = step(pixels, text, frame, *args)
        events["births"].update({o: frame for o in range(before + 1, session.objects.max_obj_id + 1)})
        events["removed"] |= out.removed
        return out

    session.loop.step = recording
    return events


def sam3track_run(bundle, frames, prompts, overrides=None, mode="forward", kernels=True, backend="onnxruntime"):
    # the reference's cross-prompt quirks are reproduced here: this compares frame by frame; mask NMS
    # and hole filling stay at their defaults (on), as the reference runs them with its kernel
    # (kernels=False switches both off on both sides, as transformers without the `kernels` package)
    off = {} if kernels else {"mask_nms": False, "fill_holes": False}
    predictor = sam3track.load(bundle, backend=backend, match_reference_quirks=True, **off, **(overrides or {}))
    assert predictor.config.mask_nms == predictor.config.fill_holes == kernels
    session = predictor.start_session(None if mode == "stream" else frames)
    session.events = record_events(session)
    for text in prompts:
        session.add_prompt(frame_index=0, text=text)
    if mode == "stream":
        results = [session.track(f) for f in frames]
    elif mode == "backward":
        results = list(session.propagate(direction="backward", start_frame=len(frames) - 1))
    elif mode == "both":
        results = list(session.propagate(direction="both", start_frame=BOTH_START))
    elif mode in REPROPAGATION:
        results = []
        for direction in REPROPAGATION[mode]:
            start = len(frames) - 1 if direction == "backward" else 0
            results += list(session.propagate(direction=direction, start_frame=start))
    else:
        results = list(session.propagate())
    return predictor, session, results


def assert_parity(bundle, frames, prompts, overrides=None, mode="forward", kernels=True, backend="onnxruntime"):
    predictor, session, ours = sam3track_run(bundle, frames, prompts, overrides, mode, kernels, backend)
    ref, births, removed, conditioning = reference_run(bundle, frames, prompts, predictor, overrides, mode,
                                                       kernels)
    session.reference_conditioning = conditioning  # object id -> the reference's conditioning frames
    assert [r.frame_index for r in ours] == [r[0] for r in ref]
    ious, raw_ious = [], []
    for mine, (frame, ids, masks, scores) in zip(ours, ref):
        assert mine.object_ids.tolist() == ids, f"frame {frame}: ids {mine.object_ids.tolist()} != {ids}"
        for j, obj_id in enumerate(ids):
            b, ties = masks[obj_id]
            a = mine.masks[j]
            raw_ious.append(mask_iou(a, b))
            ious.append(mask_iou(a & ~ties, b & ~ties))
            assert abs(mine.scores[j] - scores[obj_id]) <= 1e-3
    assert ious, "no object was tracked: the test clip and thresholds must produce objects"
    assert np.mean(raw_ious) >= 0.99, np.mean(raw_ious)
    assert np.mean(ious) >= 0.99 and np.min(ious) >= 0.95, (np.mean(ious), np.min(ious))
    return session, births, removed


@pytest.fixture(scope="module")
def bikes_frames():
    with open_video(CLIPS / "bikes.mp4") as video:
        return np.stack([video.read(i) for i in range(76, 116)])  # one continuous shot


def test_parity_on_a_real_clip_with_births_and_removals(tiny_bundle, bikes_frames):
    session, births, removed = assert_parity(tiny_bundle, bikes_frames, ["person", "bike"])
    assert any(frame > 0 for frame in births.values()), f"no object born after frame 0: {births}"
    assert removed, "no object was removed by the hotstart heuristics"
    assert session.events["removed"] == removed
    assert session.events["births"] == births


def synthetic_frames():
    """Two coloured blocks crossing a textured background, 40 frames of 192x256."""
    import cv2

    rng = np.random.default_rng(0)
    background = cv2.resize(rng.integers(0, 255, (24, 32, 3)).astype(np.uint8), (256, 192),
                            interpolation=cv2.INTER_CUBIC)
    frames = []
    for t in range(40):
        img = background.copy()
        img[30:90, 10 + 3 * t:60 + 3 * t] = (230, 40, 40)
        img[100:170, 200 - 2 * t:260 - 2 * t] = (30, 220, 60)
        frames.append(img)
    return np.stack(frames)


def test_parity_on_a_synthetic_clip(tiny_bundle):
    """Two coloured blocks crossing a textured background, hotstart removal off on both sides (with
    random weights it removes every object of this clip) and new_det_thresh 0.85 (5 births).

    With many simultaneous objects (15 births at 0.8, 40 at 0.7) the random tracker's speckled masks
    amplify rounding-level ties: measured, one pixel of one object's thresholded memory input at frame
    24 was -6.1e-6 in the reference and +5.5e-6 here (logits agree to 6.7e-5), and later masks of a
    few tens of pixels diverge (min IoU 0, mean 0.949 at 0.7). Ids and scores still match exactly.
    With NMS and hole filling on both sides the bundle's own threshold matches too (next test).
    """
    session, births, _ = assert_parity(tiny_bundle, synthetic_frames(), ["bike", "person"],
                                     {"hotstart_delay": 0, "new_det_thresh": 0.85})
    assert len(births) >= 2 and any(f > 0 for f in births.values())


@pytest.mark.parametrize("attention", [
    pytest.param("fused", marks=pytest.mark.xfail(strict=True, reason=(
        "fused attention's rounding (~1e-6 from the reference, like plain's, but different) flips tie pixels "
        "on frame 34, where 999 pixels of the tiny model's logits are within 1e-3 of 0; the flips enter the "
        "memories and masks drift (raw IoU mean 0.964, ids equal). The plain export matches (below) on "
        "AVX-512 CPUs."))),
    pytest.param("plain", marks=rounding_xfail(
        "on an AVX2 CPU (AMD EPYC, no AVX-512) ONNX Runtime's fp32 kernels round the plain export differently "
        "too: tie pixels flip and the masks drift as with fused attention (measured IoU mean 0.974 < 0.99); "
        "on AMD Zen 4 (AVX512-BF16) with one thread per pool, as CI's two workers run, the same (raw IoU mean "
        "0.982, ids equal; with two threads it matches)",
        diverges_on=("avx2", "avx512-bf16/1-thread"))),
])
def test_parity_on_a_synthetic_clip_at_the_bundle_threshold(tiny_bundle, tiny_plain_bundle, attention):
    """The same clip at the bundle's own new_det_thresh (0.5; hotstart removal off, as above).

    Without NMS and hole filling on either side this diverged (many births, rounding-level ties; see
    above). With both on, as users run it, NMS leaves 9 births (frames 1 and 21..28) and it matches:
    measured, every object-frame has IoU 1 without tie pixels; two object-frames of frame 33 (masks of
    27..48 pixels) differ by 1-2 tie pixels (raw IoU 0.958, 0.964). It is the most rounding-sensitive
    case here: with fused attention (the default export) it diverges from frame 34 on (strict xfail)."""
    bundle = tiny_bundle if attention == "fused" else tiny_plain_bundle
    session, births, _ = assert_parity(bundle, synthetic_frames(), ["bike", "person"], {"hotstart_delay": 0})
    assert len(births) >= 2 and any(f > 0 for f in births.values())


def test_parity_backward(tiny_bundle, bikes_frames):
    session, births, removed = assert_parity(tiny_bundle, bikes_frames, ["person", "bike"], mode="backward")
    assert any(frame < len(bikes_frames) - 1 for frame in births.values())


def test_parity_both_directions(tiny_bundle, bikes_frames):
    session, births, removed = assert_parity(tiny_bundle, bikes_frames, ["person", "bike"], mode="both")
    assert any(frame > BOTH_START for frame in births.values())


def test_parity_streaming(tiny_bundle, bikes_frames):
    """track() against the reference's streaming forward(frame=...): no hotstart removals, no delay."""
    session, births, removed = assert_parity(tiny_bundle, bikes_frames, ["person", "bike"], mode="stream")
    assert not removed and len(births) > 1


@pytest.fixture(scope="module")
def pingpong_frames(bikes_frames):
    """80 frames: the continuous shot forward, then backward (a clip long enough for several
    reconditioning frames, multiples of recondition_every_nth_frame)."""
    return np.concatenate([bikes_frames, bikes_frames[::-1]])


@pytest.fixture(scope="module")
def repropagation(tiny_bundle, pingpong_frames):
    """Three propagate calls on one session, both sides: a full forward pass, a backward pass from the
    last frame, a second full forward pass (the reference: three propagate_in_video_iterator calls on
    one inference session). Run once; the tests below look at different parts of it."""
    session, births, removed = assert_parity(tiny_bundle, pingpong_frames, ["person", "bike"],
                                             mode="forward,backward,forward")
    return session, births, removed


def test_parity_repropagation_forward_backward_forward(repropagation):
    """Every frame of all three passes matches (ids, scores, IoU, as above); objects are born in each
    pass and removed by the hotstart rules in each pass, as in the reference; each surviving object
    ends with the reference's conditioning frames. Measured: 25 births, 24 removals, ids and
    conditioning frames identical."""
    session, births, removed = repropagation
    assert session.events["births"] == births and session.events["removed"] == removed
    assert len(births) > 2 and removed
    ours = {o: entry["conditioning"] for o, entry in session.bank.summary().items()}
    assert ours, "no object survives the three passes"
    assert ours == session.reference_conditioning, (ours, session.reference_conditioning)


# At the bundle's thresholds the tiny random-weight model never reconditions: that needs, on a frame
# that is a multiple of recondition_every_nth_frame (16), a detection scoring >= high_conf_thresh
# (0.8) whose mask IoU with a track is >= high_iou_thresh (0.8), and the random tracker's masks never
# overlap a detection that well (measured: max IoU 0.06 on frames 16..80 of this clip; the same on
# carphone_pristine.mp4 with four prompt sets and on the synthetic clip). These thresholds make every
# detection that matches a track recondition it; both sides get them, and they only decide which
# frames become conditioning frames, which is what this test needs to exist.
RECONDITIONING = {"hotstart_delay": 0, "high_conf_thresh": 0.3, "high_iou_thresh": 0.0}


def test_parity_repropagation_with_reconditioning(tiny_bundle, pingpong_frames):
    """Forward, backward, forward again on one session, with objects reconditioned every 16th frame:
    same results frame by frame, and every object ends with the reference's conditioning frames, which
    include reconditioned ones (none demoted or lost by the later passes)."""
    session, births, removed = assert_parity(tiny_bundle, pingpong_frames, ["bike", "phone"], RECONDITIONING,
                                             mode="forward,backward,forward")
    ours = {o: entry["conditioning"] for o, entry in session.bank.summary().items()}
    reconditioned = {o: [t for t in cond if t != births[o]] for o, cond in ours.items()}
    assert any(reconditioned.values()), f"no frame other than a birth became a conditioning frame: {ours}"
    assert all(t % 16 == 0 for frames in reconditioned.values() for t in frames)
    assert ours == session.reference_conditioning, (ours, session.reference_conditioning)
    for obj_id, held in session.bank.summary().items():  # conditioning memories still on the device
        assert set(held["conditioning"]) <= set(held["spatial_memory"])
