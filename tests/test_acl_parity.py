"""backend="acl" on the strict pyacl emulator: the tiny bundle converted by `om.convert` (fake atc on
PATH, default gears), run through sam3track/backends/acl.py, gives the ids and masks of ONNX Runtime
running every call at its own size; and it keeps features and memory on the device.

The emulator (sam3track.testing.acl_emulator) enforces pyacl's documented rules and runs each OM's
ONNX at the selected gear's shape, padding bytes included, so a padding or gear bug shows here.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import sam3track
from om.convert import convert_bundle
from sam3track.testing.acl_emulator import install
from sam3track.testing.fake_atc import install_fake_atc

from .test_static_shapes import (MODES, OPTIONS, PROMPTS, assert_same_tracks, bikes_frames, track,  # noqa: F401
                                 unplanned)

from .conftest import CLIPS
from .export_cache import cached_conversion

pytestmark = pytest.mark.slow  # the full tier: the tiny bundle on the acl emulator against ONNX Runtime


@pytest.fixture(scope="module")
def om_bundle(tiny_plain_bundle, tmp_path_factory):
    bin_dir = tmp_path_factory.mktemp("fakebin")
    install_fake_atc(bin_dir)
    out = tmp_path_factory.mktemp("om") / "tiny-om"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        out, om = cached_conversion("om-tiny-default", tiny_plain_bundle, out, soc="Ascend910B2")
    assert om["compiled"]
    return out


@pytest.mark.parametrize("mode", MODES)
def test_acl_on_the_emulator_matches_unplanned_onnxruntime(om_bundle, bikes_frames, unplanned, mode):
    with install() as emu:
        results, calls = track(om_bundle, bikes_frames, PROMPTS, mode, backend="acl", device="npu:0", **OPTIONS)
        assert emu.stats.live_allocations == 0 and not emu.stats.leaks
    assert_same_tracks(results, unplanned[mode][0])
    # calls padded to the default gears (2 objects -> 2, 3 -> 4, one prompt's text -> 1, 2 prompts -> 2)
    assert calls["sizes:propagation_decoder"] <= {1, 2, 4, 8, 16}


def test_onnxruntime_forced_to_the_om_bundle_s_gears_matches_too(om_bundle, bikes_frames, unplanned):
    results, calls = track(om_bundle, bikes_frames, PROMPTS, "forward", gears="compiled", **OPTIONS)
    assert_same_tracks(results, unplanned["forward"][0])
    assert 4 in calls["sizes:propagation_decoder"] or 2 in calls["sizes:propagation_decoder"]


def test_a_60_frame_run_keeps_features_and_memory_on_the_device(om_bundle):
    """Counters of a 60-frame run on the emulator: no host copy of a feature map, a memory or text
    features; one execute per graph per frame whatever the number of objects (up to the largest
    gear); no dataset created after load; nothing left allocated after close()."""
    from sam3track.video import open_video

    with open_video(CLIPS / "bikes.mp4") as video:
        frames = np.stack([video.read(i) for i in range(60, 120)])
    with install() as emu:
        predictor = sam3track.load(om_bundle, backend="acl", device="npu:0", **OPTIONS)
        cfg, backend = predictor.config, predictor.backend
        datasets_at_load = emu.stats.datasets_created
        buffers_at_load = emu.stats.data_buffers_created
        session = predictor.start_session(frames)
        for text in PROMPTS:
            session.add_prompt(text=text)
        tracked = []
        original_step = session.loop.step

        def counting_step(*args, **kwargs):
            tracked.append(len(session.objects.obj_ids))
            return original_step(*args, **kwargs)

        session.loop.step = counting_step
        results = list(session.propagate())
        assert len(results) == 60 and max(tracked) >= 3, tracked

        # nothing feature-, memory- or text-shaped ever came to the host
        hw, t = cfg.feature_grid ** 2, cfg.text_length
        text_width = predictor.bundle.manifest["config"]["detector"]["text_width"]
        big = {(hw, cfg.memory_dim), (t, text_width)}
        for direction, shape in backend.transfer_log:
            if direction == "to_host":
                assert len(shape) < 2 or tuple(shape[-2:]) not in big, shape
                assert len(shape) < 3 or tuple(shape[-3:]) != (cfg.hidden_dim, cfg.feature_grid, cfg.feature_grid)
        t_ = backend.transfers
        assert (emu.stats.d2h_count, emu.stats.d2h_bytes) == (t_.device_to_host, t_.device_to_host_bytes)

        # one execute per graph per frame, however many objects (<= 16, the largest gear)
        assert max(tracked) <= 16
        executes = emu.stats.executes
        assert executes["backbone.om"] == executes["grounding_head.om"] == 60
        assert executes["propagation_decoder.om"] == sum(1 for n in tracked if n)
        assert executes["memory_encoder.om"] <= 2 * 60 and executes["mask_init.om"] <= 60

        assert (emu.stats.datasets_created, emu.stats.data_buffers_created) == (datasets_at_load, buffers_at_load)
        predictor.close()
        predictor.close()  # idempotent
        assert emu.stats.live_allocations == 0 and not emu.stats.leaks


def test_a_plain_bundle_or_a_planned_one_is_refused_by_acl(tiny_bundle, tiny_plain_bundle, om_bundle, tmp_path):
    with install():
        with pytest.raises(sam3track.BundleError, match="om.convert"):
            sam3track.load(tiny_bundle, backend="acl", device="npu:0")
        planned = tmp_path / "planned"
        convert_bundle(tiny_plain_bundle, "Ascend910B2", planned, atc=None, log=lambda *_: None)
        with pytest.raises(sam3track.BundleError, match="planned, not compiled"):
            sam3track.load(planned, backend="acl", device="npu:0")


def test_without_pyacl_the_acl_backend_says_where_it_comes_from(om_bundle):
    with pytest.raises(sam3track.Sam3TrackError, match="CANN.*acl_emulator"):
        sam3track.load(om_bundle, backend="acl", device="npu:0")


def test_64_objects_on_an_om_bundle_compiled_up_to_16_equal_the_unchunked_run(tiny_bundle, om_bundle, bikes_frames):
    """Every query of four prompts becomes an object (thresholds 0, NMS off): 64 objects, four calls of
    the largest gear on the emulator, the results of one unplanned ONNX Runtime call."""
    options = dict(score_threshold_detection=0.0, new_det_thresh=0.0, mask_nms=False, hotstart_delay=0,
                   recondition_every_nth_frame=0)
    prompts, frames = ["person", "bike", "tree", "road"], bikes_frames[:3]
    want, _ = track(tiny_bundle, frames, prompts, **options)
    with install() as emu:
        got, calls = track(om_bundle, frames, prompts, backend="acl", device="npu:0", **options)
        assert emu.stats.executes["propagation_decoder.om"] >= 4 * (len(frames) - 1)  # >= 64 objects a frame
    assert len(want[0]) == 64 and calls["sizes:propagation_decoder"] == {16}
    assert_same_tracks(got, want)


def clicks_run(bundle, frames, **load_options):
    """Clicks, a negative click, a box, a text prompt, a pass and a correction on the frame it ended on:
    every result in order (the prompt calls' own results included)."""
    with sam3track.load(bundle, **load_options) as predictor, predictor.start_session(frames) as s:
        out = [s.add_prompt(frame_index=0, points=[[200, 120], [420, 60]], labels=[1, 0])]
        out.append(s.add_prompt(frame_index=0, points=[[250, 140]], obj_id=0, clear_old_points=False))  # 3 points
        out.append(s.add_prompt(frame_index=5, boxes=[300, 80, 500, 220]))      # 2 points
        s.add_prompt(frame_index=0, text=PROMPTS[1])
        out += list(s.propagate())
        out.append(s.add_prompt(frame_index=len(frames) - 1, points=[[210, 130]], obj_id=0))
        return out, dict(predictor.backend.calls)


def test_clicks_and_boxes_on_the_emulator_match_unplanned_onnxruntime(tiny_bundle, om_bundle, bikes_frames):
    frames = bikes_frames[:12]
    want, _ = clicks_run(tiny_bundle, frames, **OPTIONS)
    with install() as emu:
        got, calls = clicks_run(om_bundle, frames, backend="acl", device="npu:0", **OPTIONS)
        assert emu.stats.live_allocations == 0 and not emu.stats.leaks
    assert calls["interactive_decoder"] == 4
    assert_same_tracks(got, want)


def test_a_prompt_of_more_points_than_any_gear_names_the_gears(om_bundle, bikes_frames):
    with install(), sam3track.load(om_bundle, backend="acl", device="npu:0") as predictor:
        with predictor.start_session(bikes_frames[:3]) as s:
            points = [[10 + 20 * i, 100] for i in range(17)]
            with pytest.raises(sam3track.CapacityError, match="not compiled for 17 points"):
                s.add_prompt(frame_index=0, points=points)
            assert s.add_prompt(frame_index=0, points=points[:2]).frame_index == 0  # still usable
