"""SAM 3.1 sessions on backend="acl" (the strict pyacl emulator): the tiny SAM 3.1 bundle converted by
om.convert with its default plan (fake atc on PATH: buckets at gears 1, 2, 4, memory / pointer entries
fixed at Meta's most, pools fixed at 64 objects' rows) tracks what ONNX Runtime on the plain bundle
tracks, over more frames than the fixed pools could hold without eviction: the same ids, probabilities
and masks (per-mask IoU without ties: pixels where a logit on ONNX Runtime is within 1e-3 of 0, which
the padded batches of the OM gears may threshold the other way).

Thresholds and the object cap are those of Meta's recorded text_two_buckets scenario (two buckets on
frame 0), run here over 32 frames of the same clip: both tests read one run of each backend.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

import sam3track
from graphs.sam31 import reference as ref
from sam3track.testing.acl_emulator import install

from .conftest import CLIPS, mask_iou, rounding_xfail
from .export_cache import cached_conversion
from .reference_video import TIE  # a logit this close to 0 may threshold either way

pytestmark = pytest.mark.slow  # the full tier: SAM 3.1 on the acl emulator over 32 frames against ONNX Runtime

FRAMES = 32  # 2 buckets x 32 frames > the 60 memory rows compiled: the pools must evict to keep up


@pytest.fixture(scope="module")
def bundles(sam31_plain_bundle, fake_atc_path, tmp_path_factory):
    """(plain SAM 3.1 bundle, its OM bundle)."""
    plain, out = sam31_plain_bundle, tmp_path_factory.mktemp("sam31-acl") / "om"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", fake_atc_path)
        out, om = cached_conversion("om-sam31-default", plain, out, soc="Ascend910B2")
    assert om["compiled"]
    return plain, out


@pytest.fixture(scope="module")
def scenario(sam31_reference):
    from sam3track.video import open_video

    doc, _ = ref.load_scenario(sam31_reference.scenarios, "text_two_buckets")
    options = {k: v["value"] for k, v in doc["overrides"].items()}
    options.update(doc.get("builder_kwargs", {}))
    with open_video(CLIPS / doc["clip"]["file"]) as video:
        frames = np.stack([video.read(i) for i in range(FRAMES)])
    return doc["text"], options, frames


@contextlib.contextmanager
def recording_ties():
    """[(frame, bool [H, W])], one per output the session builds, in the order it yields them (frame 0
    twice: add_prompt's and the propagation's): the pixels where some object's video-resolution logit
    (the bilinear resize of Meta's build_outputs, recomputed from the same inputs) is within TIE of 0,
    so that either backend may threshold it either way, for that object or for the non-overlap rule
    between objects. (A prompt frame's new masks also pass Meta's add_new_masks thresholds at 16F,
    whose ties this does not see.)"""
    from sam3track.families.sam31 import tracker as trk

    ties, original = [], trk.Sam31Tracker.outputs

    def outputs(self, frame, det, tracked, plan):
        h, w = self.video_hw
        near = np.zeros((h, w), bool)
        for logits in (plan.track_masks if tracked.obj_ids.size else None,
                       det.masks[plan.new_inds] if plan.new_ids.size else None):
            if logits is not None:
                near |= (np.abs(trk.bilinear(logits, h, w)) < TIE).any(0)
        ties.append((frame, near))
        return original(self, frame, det, tracked, plan)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(trk.Sam31Tracker, "outputs", outputs)
        yield ties


def _track(bundle, text, options, frames, boxes=None, on_frame=None, **load):
    """(results, graph call counts, the tracker's memory); ``on_frame(session)`` after each frame."""
    predictor = sam3track.load(bundle, **options, **load)
    try:
        session = predictor.start_session(frames)
        results = [session.add_prompt(0, text=text, boxes=boxes)]
        for result in session.propagate("forward"):
            results.append(result)
            if on_frame:
                on_frame(session)
        if boxes is not None:  # the size the box call ran at
            _track.box_gear = predictor.backend.plan(predictor.graphs["box_grounding_head"], "boxes", len(boxes))
        return results, predictor.backend.calls.copy(), session.tracker.memory
    finally:
        predictor.close()


@pytest.fixture(scope="module")
def runs(bundles, scenario):
    """The text scenario over FRAMES frames on ONNX Runtime (plain bundle) and on acl (OM bundle), once
    for the tests below; on acl, per frame: (rows used in the memory pool, buckets)."""
    plain, om = bundles
    text, options, frames = scenario
    with recording_ties() as ties:
        want, _, grown = _track(plain, text, options, frames)
    usage = []

    def record(session):
        pool = session.tracker.memory.memories
        usage.append((pool.used, sum(s.registry.num_buckets for s in session.tracker.states), pool.capacity))

    with install() as emu:
        got, calls, fixed = _track(om, text, options, frames, on_frame=record, backend="acl", device="npu:0")
        stats = emu.stats
        assert stats.live_allocations == 0 and not stats.leaks
    return want, grown, got, calls, fixed, usage, ties


def _assert_same(want, got, ties):
    """Same ids; mask IoU mean >= 0.99 with and without the tie pixels of ``want``'s run (``ties``), min
    >= 0.95 without them (tests/test_parity.py's bounds); tracker probabilities within 1e-3."""
    assert [f for f, _ in ties] == [a.frame_index for a in want], "one recorded output per result"
    ious, solid_ious, score_diff = [], [], 0.0
    for a, b, (_, tie) in zip(want, got, ties):
        assert a.frame_index == b.frame_index
        assert a.object_ids.tolist() == b.object_ids.tolist(), a.frame_index
        for m, n in zip(a.masks, b.masks):
            ious.append(mask_iou(m, n))
            solid_ious.append(mask_iou(m & ~tie, n & ~tie))
        if a.object_ids.size:
            score_diff = max(score_diff, float(np.abs(a.tracker_probs - b.tracker_probs).max()))
    stats = (np.mean(ious), np.mean(solid_ious), min(solid_ious), score_diff)
    assert min(stats[:2]) >= 0.99 and min(solid_ious) >= 0.95 and score_diff <= 1e-3, stats


def test_text_tracking_on_acl_matches_onnxruntime(runs):
    """Every frame, those after the pools began to evict included (next test)."""
    want, grown, got, calls, fixed, _, ties = runs
    assert grown.fixed is None and fixed.fixed == {"memory_rows": 61, "image_rows": 61, "pointer_rows": 97}
    assert len(got) == len(want) == FRAMES + 1
    assert max(a.object_ids.size for a in want) > 16  # two buckets or more
    _assert_same(want, got, ties)
    # one propagation call per frame (every bucket at one gear), frame 0 reused
    assert calls["propagation_decoder"] == FRAMES - 1


# The OM plan runs the memory encoder one bucket per call (its --dynamic_dims profiles take at most 4
# values: om/sam31.py FIXED); ONNX Runtime's unplanned run encodes both buckets of this scenario in one
# call. The memories then differ by one bf16 step, and a near tie between objects the seeded model
# detects twice (the same pixels, tracker probabilities equal within 6e-8) flips: the object-wise
# non-overlap hands the shared pixels to the other id (ids 8 and 24, 11 and 27: 40-416 pixels on frames
# 1-2). ONNX Runtime forced to the OM bundle's compiled gears (gears="compiled", the next test) gives the
# acl run's masks exactly, so the emulated acl path is right and the difference is the batching's
# rounding. On the seeded checkpoint with its copied tensors told apart (2026-12-07) measured to diverge
# on an AMD EPYC with AVX2 only, on an Intel Xeon with AVX-512 and VNNI, no bf16 (Ice Lake; IoU mean 0.922
# there) and on an AMD EPYC with AVX512-BF16 (Zen 4; IoU mean 0.953 as on AVX2), each with two threads and
# with one; the older checkpoint's outcome on an AMX Xeon (no divergence) is not measured again: non-strict
# there.
BUCKET_CHUNK_MEASURED = ("avx2", "avx2/1-thread", "avx512-vnni", "avx512-vnni/1-thread", "avx512-bf16",
                         "avx512-bf16/1-thread")
BUCKET_CHUNK_ROUNDING = rounding_xfail(
    "one bucket per memory_encoder call rounds the memories differently from ONNX Runtime's two-bucket call; "
    "a near tie between duplicate objects flips on frames 1-2 (IoU mean 0.92-0.95; matches ONNX Runtime at the "
    "compiled gears)", diverges_on=BUCKET_CHUNK_MEASURED, measured_on=BUCKET_CHUNK_MEASURED)


@BUCKET_CHUNK_ROUNDING
def test_a_box_prompt_on_acl_is_padded_to_a_box_gear_and_matches_onnxruntime(bundles, scenario):
    """Three boxes run at the compiled gear 4 (one padding box, box_valid 0) and detect what the three
    give on ONNX Runtime without padding."""
    plain, om = bundles
    text, options, frames = scenario
    frames = frames[:4]
    h, w = frames.shape[1:3]
    boxes = [[0.1 * w, 0.2 * h, 0.5 * w, 0.9 * h], [0.4 * w, 0.1 * h, 0.9 * w, 0.6 * h], [0, 0, 0.3 * w, 0.3 * h]]
    with recording_ties() as ties:
        want, _, _ = _track(plain, text, options, frames, boxes=boxes)
    with install() as emu:
        got, calls, _ = _track(om, text, options, frames, boxes=boxes, backend="acl", device="npu:0")
        assert emu.stats.live_allocations == 0 and not emu.stats.leaks
    assert _track.box_gear == 4 and calls["box_grounding_head"] == 1 and want[0].object_ids.size > 0
    _assert_same(want, got, ties)


def test_a_box_prompt_on_acl_matches_onnxruntime_at_the_compiled_gears(bundles, scenario):
    """The same box prompt with ONNX Runtime running every call at the OM bundle's gears (gears="compiled"):
    the acl run on the emulator gives its masks and scores (what the bucket chunking changes is rounding)."""
    plain, om = bundles
    text, options, frames = scenario
    boxes = [[0.1 * frames.shape[2], 0.2 * frames.shape[1], 0.5 * frames.shape[2], 0.9 * frames.shape[1]],
             [0.4 * frames.shape[2], 0.1 * frames.shape[1], 0.9 * frames.shape[2], 0.6 * frames.shape[1]],
             [0, 0, 0.3 * frames.shape[2], 0.3 * frames.shape[1]]]
    with recording_ties() as ties:
        want, _, _ = _track(om, text, options, frames[:4], boxes=boxes, gears="compiled")
    with install():
        got, _, _ = _track(om, text, options, frames[:4], boxes=boxes, backend="acl", device="npu:0")
    _assert_same(want, got, ties)


def test_fixed_pools_evict_what_the_next_frame_cannot_read(runs):
    """Without eviction FRAMES frames of 2+ buckets need more memory rows than the 60 compiled; with it a
    forward pass holds per bucket the conditioning frame and the 6 frames the next frame reads."""
    *_, usage, _ = runs
    assert len(usage) == FRAMES  # every propagated frame, frame 0 (reused) included
    for frame, (used, buckets, _) in enumerate(usage):
        assert used <= buckets * 8, frame  # cond + 6 recent + this frame
    peak, capacity = max(used for used, _, _ in usage), usage[-1][2]
    assert FRAMES * 2 > capacity - 1 >= peak
