"""Hostile input through the Python API (issue 25), beside the other test_hostile_*.py files. Every mistake a caller can make gets one Sam3TrackError naming what is wrong; the session stays usable."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest

import sam3track
from sam3track.config import ConfigError

PROMPT = "bike"


@pytest.fixture(scope="module")
def predictor(tiny_bundle):
    with sam3track.load(tiny_bundle) as p:
        yield p


@pytest.fixture()
def frames():
    rng = np.random.default_rng(0)
    return rng.integers(0, 255, (4, 64, 80, 3), dtype=np.uint8)


@pytest.mark.parametrize("source, match", [
    (42, "not int"),
    ((f for f in ()), "not generator"),
    (3.5, "not float"),
])
def test_start_session_refuses_what_is_not_a_video(predictor, source, match):
    with pytest.raises(sam3track.VideoError, match=match):
        predictor.start_session(source)


@pytest.mark.parametrize("shape", [(0, 0, 3), (1, 1, 3), (8, 200, 3)])
def test_frames_too_small_to_track_are_refused(predictor, shape):
    with pytest.raises(sam3track.VideoError, match="at least 16 pixels"):
        predictor.start_session(np.zeros((2,) + shape, np.uint8))
    with predictor.start_session(None) as live:
        live.add_prompt(text=PROMPT)
        with pytest.raises(sam3track.VideoError, match="at least 16 pixels"):
            live.track(np.zeros(shape, np.uint8))
        assert live.track(np.zeros((32, 32, 3), np.uint8)).frame_index == 0  # still usable


def test_load_needs_a_bundle_path():
    with pytest.raises(sam3track.BundleError, match="path of a bundle directory, not NoneType"):
        sam3track.load(None)


@pytest.mark.parametrize("kwargs, match", [
    ({"max_frames": 0}, "max_frames must be a whole number >= 1"),
    ({"max_frames": -1}, "max_frames must be a whole number >= 1"),
    ({"max_frames": 2.5}, r"max_frames must be a whole number \(int\), not float 2.5"),  # a TypeError (issue 25)
    ({"max_frames": True}, r"max_frames must be a whole number \(int\), not bool True"),
    ({"direction": "sideways"}, "direction must be one of 'forward', 'backward', 'both', not 'sideways'"),
    ({"direction": None}, "direction must be one of"),
    ({"start_frame": 1.0}, r"start_frame must be a whole number \(int\), not float 1.0"),
    ({"start_frame": 4}, r"start_frame 4 is out of range: the video has 4 frames \(0..3\)"),
])
def test_propagate_arguments_are_checked_before_any_work(predictor, frames, kwargs, match):
    with predictor.start_session(frames) as s:
        s.add_prompt(text=PROMPT)
        with pytest.raises(sam3track.Sam3TrackError, match=match):
            s.propagate(**kwargs)  # raised by the call itself, not on the first next()
        assert len(list(s.propagate())) == 4


@pytest.mark.parametrize("text, match", [
    (123, "prompt 123 is of type int; give the words as a str"),
    (b"dog", "prompt b'dog' is of type bytes"),
    ("   ", "is empty"),
    ("", "is empty"),
])
def test_bad_prompts(predictor, frames, text, match):
    with predictor.start_session(frames) as s:
        with pytest.raises(sam3track.PromptError, match=match):
            s.add_prompt(text=text)
        assert s.add_prompt(text=PROMPT) == 0


def test_a_huge_prompt_is_refused_without_echoing_it_whole(predictor, frames):
    with predictor.start_session(frames) as s:
        with pytest.raises(sam3track.PromptError) as caught:
            s.add_prompt(text="dog " * 2500)
        message = str(caught.value)
        assert "tokens long" in message and len(message) < 300


@pytest.mark.parametrize("index", [-1, 4])
def test_bad_prompt_frames(predictor, frames, index):
    with predictor.start_session(frames) as s:
        with pytest.raises(sam3track.FrameIndexError, match="out of range"):
            s.add_prompt(frame_index=index, text=PROMPT)


@pytest.mark.parametrize("index", [1.5, "0", None])
def test_a_frame_index_of_the_wrong_type_is_a_type_error(predictor, frames, index):
    """Not "out of range" (issue 25): the argument is named with the type it takes, and the error is both
    a FrameIndexError and a TypeError."""
    with predictor.start_session(frames) as s:
        with pytest.raises(sam3track.FrameIndexError, match=r"must be a whole number \(int\), not") as caught:
            s.add_prompt(frame_index=index, text=PROMPT)
        assert isinstance(caught.value, TypeError)


def test_unknown_object_ids(predictor, frames):
    with predictor.start_session(frames) as s:
        for obj_id in (12345, "x" * 500):
            with pytest.raises(sam3track.ObjectIdError) as caught:
                s.remove_object(obj_id)
            assert len(str(caught.value)) < 200


# ------------------------------------------------------------------------------- configuration
@pytest.mark.parametrize("override, match", [
    ({"hotstart_delay": -1}, "hotstart_delay in the override must be at least 0"),
    ({"new_det_thresh": math.nan}, "new_det_thresh in the override takes a number from 0 to 1"),
    ({"new_det_thresh": 1.5}, "takes a number from 0 to 1"),
    ({"max_num_objects": 0}, "max_num_objects in the override must be at least 1"),
    ({"max_num_objects": 2.0}, "takes a whole number"),
    ({"fill_holes": "yes"}, "takes true or false"),
    ({"image_size": 224}, "image_size is fixed by the exported graphs"),
    ({"feature_grid": 4}, "feature_grid is fixed by the exported graphs"),
    ({"multimask_max_pt_num": 3}, "multimask_max_pt_num is fixed by the exported graphs"),
    ({"max_cond_frame_num": 0}, "must be -1 \\(no limit\\) or at least 1"),
    ({"retire_unseen_after": -5}, "must be at least 0"),
    ({"no_such_option": 1}, "unknown configuration options"),
])
def test_configuration_overrides_are_validated(tiny_bundle, override, match):
    with pytest.raises(ConfigError, match=match):
        sam3track.load(tiny_bundle, **override)


# ------------------------------------------------------------------------------------- bundles
def _copy(tiny_bundle, tmp_path, name):
    target = tmp_path / name
    shutil.copytree(tiny_bundle, target, ignore=shutil.ignore_patterns("source"))
    return target


def _edit_manifest(bundle, edit):
    manifest = json.loads((bundle / "manifest.json").read_text())
    edit(manifest)
    (bundle / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("edit, match", [
    (lambda m: m.update(format_version="1"), "format_version '1', not a whole number"),
    (lambda m: m.pop("format_version"), "format_version None, not a whole number"),
    (lambda m: m.update(format_version=0), "format 0, older than this sam3track reads"),
    # format 2 has no interactive_decoder and no via_image: refused, not half-used
    (lambda m: m.update(format_version=2), r"format 2, older than this sam3track reads \(3\); export the bundle again"),
    (lambda m: m["config"]["tracker"].pop("multimask_max_pt_num"), "has no config.tracker.multimask_max_pt_num"),
    (lambda m: m.update(format_version=99), "format 99, newer than this sam3track reads"),
    (lambda m: m["preprocessing"].pop("image_size"), "has no preprocessing.image_size"),
    (lambda m: m["config"]["tracker"].pop("feature_grid"), "has no config.tracker.feature_grid"),
    (lambda m: m["preprocessing"].update(image_size=224), "geometry gives backbone.pixel_values size 224"),
    (lambda m: m["config"]["tracker"].update(hidden_dim=256), "geometry gives backbone.tracker_feat size 256"),
    (lambda m: m["config"]["heuristics"].update(new_det_thresh=float("nan")), "new_det_thresh in the bundle's"),
    (lambda m: m["graphs"].pop("mask_init"), "lists no complete graph 'mask_init'"),
    (lambda m: m["graphs"].pop("interactive_decoder"), "lists no complete graph 'interactive_decoder'"),
])
def test_bad_manifests(tiny_bundle, tmp_path, edit, match):
    bundle = _copy(tiny_bundle, tmp_path, "b")
    _edit_manifest(bundle, edit)
    with pytest.raises(sam3track.Sam3TrackError, match=match):
        sam3track.load(bundle)


def test_a_manifest_that_describes_other_graphs_is_refused_by_their_own_shapes(tiny_bundle, tmp_path):
    """The manifest is consistent with itself, but the graph files have other sizes."""
    bundle = _copy(tiny_bundle, tmp_path, "b")

    def edit(m):
        m["preprocessing"]["image_size"] = 224
        for t in m["graphs"]["backbone"]["inputs"]:
            if t["name"] == "pixel_values":
                t["shape"][2:] = [224, 224]

    _edit_manifest(bundle, edit)
    with pytest.raises(sam3track.BundleError, match="pixel_values has size 112 on axis 2, the manifest says 224"):
        sam3track.load(bundle)
