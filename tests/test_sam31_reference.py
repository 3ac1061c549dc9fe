"""The SAM 3.1 reference harness (reference/sam31/, graphs/sam31/reference.py) checked from the main env.

These tests check the harness itself, not our SAM 3.1 runtime (which does not exist yet): the seeded
checkpoint is in Meta's layout and loads with plain torch.load here; the scenario outputs carry every
official key with the right dtypes and shapes, match the pixels our own decoder produces, and are
reproducible across processes; the two-bucket scenario really tracks more than 16 objects.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pytest

from graphs.sam31 import reference as ref

from .conftest import CLIPS, REPO, sam31_reference_or_skip

pytestmark = pytest.mark.slow  # the full tier: Meta's SAM 3.1 reference harness (a live rerun included)

SCENARIOS = ("text_one_bucket", "text_two_buckets", "text_cap16", "confirmation_gating", "hotstart_removal",
             "births_after_frame0", "clicks", "remove_object", "forward_backward")


def _pattern(key: str) -> str:
    return ".".join("#" if p.isdigit() else p for p in key.split("."))


# ------------------------------------------------------------------------------------------ no env needed
def test_missing_env_skips_or_fails_with_the_build_command(monkeypatch, tmp_path):
    monkeypatch.setenv("SAM3TRACK_SAM31_REFERENCE_HOME", str(tmp_path / "empty-home"))
    monkeypatch.delenv(ref.REQUIRE_VAR, raising=False)
    with pytest.raises(pytest.skip.Exception, match=re.escape(ref.BUILD_COMMAND)):
        sam31_reference_or_skip()
    monkeypatch.setenv(ref.REQUIRE_VAR, "1")
    with pytest.raises(pytest.fail.Exception, match=re.escape(ref.BUILD_COMMAND)):
        sam31_reference_or_skip()


def test_env_and_output_keys_follow_their_sources(monkeypatch, tmp_path):
    be = ref._build_env()
    key = be.env_key()
    assert re.fullmatch(r"[0-9a-f]{16}", key)
    monkeypatch.setenv("SAM3TRACK_SAM31_REFERENCE_HOME", str(tmp_path))
    assert be.env_dir() == tmp_path / f"env-{key}"
    # a different pinned requirement means a different env
    lock = tmp_path / "requirements.lock"
    lock.write_text(be.REQUIREMENTS.read_text() + "\n# changed\n")
    monkeypatch.setattr(be, "ENV_SOURCES", (lock,) + tuple(be.ENV_SOURCES[1:]))
    assert be.env_key() != key
    # outputs are keyed by their arguments too
    assert ref.outputs_key("scenarios", {"a": 1}) != ref.outputs_key("scenarios", {"a": 2})


def test_half_built_env_is_not_used(monkeypatch, tmp_path):
    be = ref._build_env()
    monkeypatch.setenv("SAM3TRACK_SAM31_REFERENCE_HOME", str(tmp_path))
    d = be.env_dir()
    (d / "venv" / "bin").mkdir(parents=True)
    (d / "venv" / "bin" / "python").write_text("")
    assert be.find_env() is None                     # no marker: never used
    (d / be.MARKER).write_text(json.dumps({"key": "someone-else"}))
    assert be.find_env() is None                     # a marker for another key
    (d / be.MARKER).write_text(json.dumps({"key": be.env_key()}))
    assert be.find_env() == d


# ------------------------------------------------------------------------------------------ checkpoint
def test_checkpoint_is_metas_layout_and_loads_with_plain_torch(sam31_reference):
    import torch

    sd = torch.load(sam31_reference.checkpoint, map_location="cpu", weights_only=True)
    assert type(sd) is dict and sd
    assert all(type(v) is torch.Tensor for v in sd.values())
    assert {k.split(".")[0] for k in sd} == {"detector", "tracker"}
    assert all(k.startswith("tracker.model.") for k in sd if k.startswith("tracker"))
    # the same key layout as the full-size model (numeric indices collapsed): only sizes differ
    full = {ln for ln in (REPO / "reference/sam31/full_key_patterns.txt").read_text().splitlines()
            if ln and not ln.startswith("#")}
    ours = {_pattern(k) for k in sd}
    assert ours == full, (sorted(ours - full)[:10], sorted(full - ours)[:10])
    # fp32 throughout; the ViT's RoPE tables are Meta's complex64 buffers
    odd = {k: str(v.dtype) for k, v in sd.items() if v.dtype != torch.float32}
    assert odd and all(k.endswith("attn.freqs_cis") and d == "torch.complex64" for k, d in odd.items())
    info = json.loads((sam31_reference.checkpoint_dir / "checkpoint_info.json").read_text())
    assert info["num_keys"] == len(sd)
    assert info["sha256"] == hashlib.sha256(sam31_reference.checkpoint.read_bytes()).hexdigest()
    v = info["verification"]
    assert v["ok"] and v["identical_outputs"] and not v["loader_reported_missing"]
    cfg = json.loads((sam31_reference.checkpoint_dir / "small_config.json").read_text())
    assert cfg["image_size"] == 224 and cfg["derived"]["multiplex_count"] == 16
    assert sd["detector.backbone.vision_backbone.trunk.patch_embed.proj.weight"].shape == (
        cfg["vit_embed_dim"], 3, 14, 14)
    assert (sam31_reference.checkpoint_dir / "bpe_simple_vocab_16e6.txt.gz").stat().st_size > 1_000_000


# ------------------------------------------------------------------------------------------ scenarios
@pytest.mark.parametrize("name", SCENARIOS)
def test_scenario_outputs_have_official_keys_dtypes_and_shapes(sam31_reference, name):
    doc, responses = ref.load_scenario(sam31_reference.scenarios, name)
    T, H, W, _ = doc["clip"]["shape_thwc"]
    assert len(doc["clip"]["frame_sha256"]) == T
    assert responses
    with_outputs = [r for r in responses if r["outputs"] is not None]
    assert with_outputs
    for r in with_outputs:
        o = r["outputs"]
        assert set(ref.OFFICIAL_KEYS) <= set(o), (r["i"], sorted(o))
        n = o["out_obj_ids"].shape[0]
        assert o["out_obj_ids"].dtype == np.int64 and o["out_obj_ids"].shape == (n,)
        assert o["out_probs"].dtype == np.float32 and o["out_probs"].shape == (n,)
        assert o["out_boxes_xywh"].dtype == np.float32 and o["out_boxes_xywh"].shape == (n, 4)
        assert o["out_binary_masks"].dtype == np.bool_ and o["out_binary_masks"].shape == (n, H, W)
        assert len(set(o["out_obj_ids"].tolist())) == n
        if n:
            assert np.all((o["out_boxes_xywh"] >= 0) & (o["out_boxes_xywh"] <= 1))
        if r["frame_index"] is not None:
            assert 0 <= r["frame_index"] < T
    # propagation covered every frame of the clip in at least one direction (except cap16: no propagation)
    frames = {r["frame_index"] for r in responses if r["type"] == "propagate_in_video"}
    assert frames == (set() if name == "text_cap16" else set(range(T)))
    # the recorded digest is the digest of exactly these arrays
    assert ref.scenario_digest(sam31_reference.scenarios, name) == doc["digest"]


@pytest.mark.parametrize("clip", ["bikes.mp4", "carphone_pristine.mp4"])
def test_reference_saw_the_pixels_our_decoder_produces(sam31_reference, clip):
    from sam3track.video import open_video

    docs = [ref.load_scenario(sam31_reference.scenarios, n)[0] for n in SCENARIOS]
    docs = [d for d in docs if d["clip"]["file"] == clip]
    assert docs
    with open_video(CLIPS / clip) as v:
        for d in docs:
            shas = [hashlib.sha256(np.ascontiguousarray(v.read(i)).tobytes()).hexdigest()
                    for i in range(d["clip"]["frames"])]
            assert shas == d["clip"]["frame_sha256"], d["scenario"]


def test_two_bucket_scenario_tracks_more_than_16_objects(sam31_reference):
    doc, responses = ref.load_scenario(sam31_reference.scenarios, "text_two_buckets")
    counts = [len(r["outputs"]["out_obj_ids"]) for r in responses if r["outputs"] is not None]
    assert max(counts) > 16
    assert doc["builder_kwargs"] == {"max_num_objects": 32}
    buckets = [len(s["buckets"]) for snap in doc["internals"] for s in snap["tracker_states"]]
    assert max(buckets) >= 2


def test_default_cap_keeps_the_16_best_scored_detections(sam31_reference):
    doc, responses = ref.load_scenario(sam31_reference.scenarios, "text_cap16")
    (r,) = responses
    probs = r["outputs"]["out_probs"]
    assert doc["n_objects_asked"] == 20 and len(probs) == 16
    top = sorted(doc["probe_scores_top"][str(doc["prompt_frame"])], reverse=True)[:16]
    np.testing.assert_allclose(np.sort(probs)[::-1], top, rtol=0, atol=1e-6)


def test_thresholds_are_recorded_and_give_the_asked_count(sam31_reference):
    for name in ("text_one_bucket", "text_two_buckets", "clicks", "remove_object"):
        doc, responses = ref.load_scenario(sam31_reference.scenarios, name)
        t = doc["threshold"]
        assert t["score_n"] > t["threshold"] > t["score_n_plus_1"]
        assert doc["overrides"]["score_threshold_detection"]["value"] == t["threshold"]
        assert doc["overrides"]["score_threshold_detection"]["meta_value"] == 0.4
        first = responses[0]
        assert first["type"] == "add_prompt" and len(first["outputs"]["out_obj_ids"]) == doc["n_objects_asked"]


def test_a_scenario_rerun_in_a_fresh_process_is_byte_identical(sam31_reference, tmp_path):
    ref.run_script(sam31_reference.env, "run_scenarios.py",
                   ["--checkpoint", sam31_reference.checkpoint, "--out", tmp_path, "--scenario", "text_cap16",
                    "--scenario", "remove_object"], timeout=1200)
    for name in ("text_cap16", "remove_object"):
        cached = json.loads((sam31_reference.scenarios / f"{name}.json").read_text())["digest"]
        again = json.loads((tmp_path / f"{name}.json").read_text())["digest"]
        assert again == cached, name
        assert ref.scenario_digest(Path(tmp_path), name) == cached


# ------------------------------------------------------------------------------------------ module dumps
def test_module_dumps_agree_with_the_checkpoint_in_this_env(sam31_reference):
    """Two dumped modules recomputed here (torch 2.13) from the checkpoint's weights, found through the
    module path the dump's index names: the dumps are what those weights compute."""
    import torch
    import torch.nn.functional as F

    folder = sam31_reference.modules()
    dumped = json.loads((folder / "index.json").read_text())
    index, grid = dumped["cases"], dumped["config"]["image_size"] // 14
    sd = torch.load(sam31_reference.checkpoint, map_location="cpu", weights_only=True)

    case = index["obj_ptr_proj_N16"]
    w = {k[len(case["module"]) + 1:]: v for k, v in sd.items() if k.startswith(case["module"] + ".")}
    with np.load(folder / "obj_ptr_proj_N16.npz") as z:
        x, want = torch.from_numpy(z["in/x"]), z["out"]
    for i in range(3):
        x = F.linear(x, w[f"layers.{i}.weight"], w[f"layers.{i}.bias"])
        x = F.relu(x) if i < 2 else x
    np.testing.assert_allclose(x.numpy(), want, rtol=1e-5, atol=1e-5)

    case = index["neck_propagation_convs_2_T1"]
    w = {k[len(case["module"]) + 1:]: v for k, v in sd.items() if k.startswith(case["module"] + ".")}
    with np.load(folder / "neck_propagation_convs_2_T1.npz") as z:
        x, want = torch.from_numpy(z["in/trunk_features"]), z["out"]
    y = F.conv2d(x, w["conv_1x1.weight"], w["conv_1x1.bias"])
    y = F.conv2d(y, w["conv_3x3.weight"], w["conv_3x3.bias"], padding=1)
    assert want.shape == (1, 256, grid, grid)
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-4, atol=1e-4)
