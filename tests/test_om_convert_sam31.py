"""om.convert on a SAM 3.1 bundle: the plan per graph, the refusal of a fused bundle, and every converted
graph run through the acl backend on the strict pyacl emulator against ONNX Runtime on the source graph.

One tiny SAM 3.1 bundle (--attention plain) is converted once with the fake atc on PATH and --gears
images=1,2 (every graph gets two gears or more; the default keeps the backbone static at one image)
and smaller pool capacities (a faster decoder); the default plan is checked without converting. The
fused bundle is the session's default SAM 3.1 export (conftest's sam31_bundle, shared with
test_sam31_export).

Parity: each case gives the source graph its own sizes (ONNX Runtime, every axis symbolic) and the OM
graph the compiled gear those sizes plan to, padded the way a SAM 3.1 runtime pads: batch axes
(buckets, objects, prompts, images) repeat their first row, memory / pointer entries beyond the real
ones are index 0 with *_valid 0, pool rows beyond the used ones hold junk that no index points at.
The real rows must agree within the fp32 tolerance of graphs.check (bf16-rounded outputs: one bf16
step).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from graphs.comparison import FP32_TOL, relative_error, within_one_bf16_step
from om import sam31
from om.convert import convert_bundle, main as convert_main, make_plans
from om.errors import ConversionError, PlanError
from om.prepass import sample_inputs
from sam3track.backends import create_backend
from sam3track.bundle import Bundle
from sam3track.testing.acl_emulator import install
from sam3track.testing.fake_atc import read_fake_om

from .export_cache import cached_conversion

pytestmark = pytest.mark.slow  # the full tier: a SAM 3.1 bundle converted and every graph run on the emulator

# images 1, 2: every graph gets two gears or more. Pool capacities below the defaults (checked on the
# plan; the converter takes them from --gears like any other size) keep the decoder's runs short.
CAPACITIES = {"memories": 4, "pointers": 6, "memory_rows": 9, "image_rows": 7, "pointer_rows": 11}
GEARS = {"images": (1, 2), **{a: (n,) for a, n in CAPACITIES.items()}}
BATCH_AXES = ("buckets", "objects", "prompts", "images")
ENTRY_AXES = ("memories", "pointers", "boxes")  # padded with zeros: their *_valid input masks them out
POOL_AXES = ("memory_rows", "image_rows", "pointer_rows")
GRID = 16  # the backbone grid of Meta's small config (reference/sam31/shim.py SMALL: 224 px / 14)


@pytest.fixture(scope="module")
def bundles(sam31_plain_bundle, fake_atc_path, tmp_path_factory):
    """(plain bundle, its OM bundle, the om_manifest)."""
    plain = sam31_plain_bundle
    out = tmp_path_factory.mktemp("sam31-om") / "plain-om"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", fake_atc_path)
        out, om = cached_conversion("om-sam31-gears", plain, out, soc="Ascend910B2", gears=GEARS)
    return plain, out, om


def _manifest(path: Path) -> dict:
    return json.loads((path / "manifest.json").read_text())


# ------------------------------------------------------------------------------------------- plans
def test_every_graph_compiles_with_its_mode_and_the_family_is_recorded(bundles):
    plain, out, om = bundles
    assert om == json.loads((out / "om_manifest.json").read_text())
    assert om["compiled"] and om["family"] == "sam3.1" and _manifest(out)["family"] == "sam3.1"
    modes = {g: e["mode"] for g, e in om["graphs"].items()}
    assert modes == {"text_encoder": "dynamic_batch", "backbone": "dynamic_batch", "interactive_neck": "dynamic_batch",
                     "grounding_head": "dynamic_batch", "box_grounding_head": "dynamic_dims",
                     "propagation_decoder": "dynamic_batch",
                     "memory_encoder": "dynamic_dims", "interactive_decoder": "dynamic_dims",
                     "mask_init": "dynamic_batch"}
    for name, g in om["graphs"].items():
        assert g["om_file"] == f"om/{name}.om" and (out / g["om_file"]).is_file()
        header, model_bytes = read_fake_om(out / g["om_file"])
        assert header["mode"] == g["mode"] and model_bytes == (out / g["onnx"]["file"]).read_bytes()
    assert Bundle(out, _manifest(out)).graph_path("mask_init") == out / "onnx" / "mask_init.onnx"
    # births' masks change layout by Reshapes, never by an If (graphs.ops.objects_as_channels)
    assert "If" not in om["graphs"]["mask_init"]["risky_ops"]


def test_the_tracker_graphs_gear_over_buckets_with_the_pools_at_capacity(bundles):
    plain, out, om = bundles
    manifest = _manifest(plain)
    assert manifest["config"]["geometry"]["grid"] == GRID  # the sizes the cases below are written for
    caps = sam31.capacities(manifest)
    # Meta's selection: 4 conditioning + 6 recent memories, 4 + 15 pointer frames; 4 buckets of 16 slots
    assert caps == {"memories": 10, "pointers": 19, "memory_rows": 61, "image_rows": 61, "pointer_rows": 97}
    default = make_plans(manifest)["propagation_decoder"]
    assert default.axes == {"buckets": (1, 2, 4), **{a: (n,) for a, n in caps.items()}}
    assert default.batch_sizes == (1, 2, 4)
    assert f"memory_pool:61,{GRID ** 2},256" in default.input_shape_arg() and "pointer_valid:-1,19" in default.input_shape_arg()

    dec = om["graphs"]["propagation_decoder"]  # converted with CAPACITIES from --gears
    assert dec["axes"] == {"buckets": [1, 2, 4], **{a: [n] for a, n in CAPACITIES.items()}}
    assert dec["profiles"] == [[1], [2], [4]] and "--dynamic_batch_size=1,2,4" in dec["atc_command"]
    shape = next(a for a in dec["atc_command"] if a.startswith("--input_shape="))
    assert f"memory_pool:9,{GRID ** 2},256" in shape and "memory_index:-1,4" in shape and "pointer_valid:-1,6" in shape
    assert "padded with memory_valid / pointer_valid 0" in dec["notes"][0]

    enc = om["graphs"]["memory_encoder"]  # one bucket per call: buckets x sides would need 6 values per profile
    assert enc["axes"] == {"buckets": [1], "mask_side": [14 * GRID, 16 * GRID]}
    assert enc["profiles"] == [[s, s] for s in (14 * GRID, 16 * GRID)]  # mask_logits' two sides
    assert om["graphs"]["mask_init"]["axes"] == {"objects": [1, 2, 4, 8, 16]}
    inter = om["graphs"]["interactive_decoder"]  # one object per call, the points in coords and labels
    assert inter["axes"] == {"objects": [1], "points": [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16]}
    assert inter["profiles"] == [[p, p] for p in (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16)]


def test_detector_graphs_gear_over_images_and_prompts(bundles):
    plain, out, om = bundles
    assert om["graphs"]["text_encoder"]["profiles"] == [[1], [2], [4], [8]]
    assert om["graphs"]["backbone"]["profiles"] == om["graphs"]["interactive_neck"]["profiles"] == [[1], [2]]
    head = om["graphs"]["grounding_head"]
    # rows are image-prompt pairs, prompts = images: one batch gear for both (5 -1s would not fit a
    # --dynamic_dims profile)
    assert head["axes"] == {"images": [1, 2], "prompts": [1, 2]}
    assert head["profiles"] == [[1], [2]] and "--dynamic_batch_size=1,2" in head["atc_command"]
    assert head["checked_at"] == {"images": 2, "prompts": 2} and "image-prompt pairs" in head["notes"][0]
    boxes = om["graphs"]["box_grounding_head"]  # one image and one prompt whatever --gears says; boxes vary
    assert boxes["axes"] == {"images": [1], "prompts": [1], "boxes": list(sam31.BOX_GEARS)}
    assert len(boxes["profiles"]) == len(sam31.BOX_GEARS) and "box_valid 0" in boxes["notes"][0]

    # the default plan: one image per backbone call, the grounding head's rows at the prompt gears
    plans = make_plans(_manifest(plain))
    assert plans["backbone"].mode == plans["interactive_neck"].mode == "static"
    assert plans["grounding_head"].axes == {"images": (1, 2, 4, 8), "prompts": (1, 2, 4, 8)}
    assert plans["grounding_head"].batch_sizes == (1, 2, 4, 8)
    assert plans["propagation_decoder"].mode == "dynamic_batch"
    assert plans["box_grounding_head"].axes == {"images": (1,), "prompts": (1,), "boxes": sam31.BOX_GEARS}
    assert plans["box_grounding_head"].mode == "dynamic_dims"
    # one image per call: one prompt per call (2 prompts for 1 image is no shape the graph runs)
    one = make_plans(_manifest(plain), {"images": (1,)})["grounding_head"]
    assert one.mode == "static" and one.axes == {"images": (1,), "prompts": (1,)}
    # varying memories too would need 12 values per --dynamic_dims profile: refused
    with pytest.raises(PlanError, match=r"propagation_decoder: --dynamic_dims would need 12 values per profile"):
        make_plans(_manifest(plain), {"memories": (4, 10)})


def test_a_fused_bundle_is_refused_naming_the_graphs_and_the_flag(sam31_bundle, tmp_path, capsys):
    fused_out = sam31_bundle  # graphs.export's default: fused attention
    fused_graphs = [g for g, e in _manifest(fused_out)["graphs"].items() if e["attention"] == "fused"]
    assert {"backbone", "grounding_head", "propagation_decoder", "interactive_decoder", "mask_init"} <= set(fused_graphs)
    out = tmp_path / "om"
    assert convert_main([str(fused_out), "--soc", "Ascend910B2", "--out", str(out)]) == 2
    message = capsys.readouterr().err
    assert ", ".join(fused_graphs) in message and "com.microsoft" in message
    assert "python -m graphs.export --family sam3.1 ... --attention plain" in message
    assert not out.exists() and not list(tmp_path.iterdir())  # refused before any work
    with pytest.raises(ConversionError, match="fused attention"):
        convert_bundle(fused_out, "Ascend910B2", out, atc=None, log=lambda *_: None)


# ------------------------------------------------------------------------------------------- parity
# (graph, the source graph's sizes); the OM graph runs at the gear Backend.plan picks for them
CASES = [
    ("text_encoder", {"prompts": 1}),
    ("text_encoder", {"prompts": 3}),  # padded to 4
    ("backbone", {"images": 1}),
    ("backbone", {"images": 2}),
    ("interactive_neck", {"images": 1}),
    ("interactive_neck", {"images": 2}),
    ("grounding_head", {"images": 1, "prompts": 1}),
    ("grounding_head", {"images": 2, "prompts": 2}),
    ("box_grounding_head", {"images": 1, "prompts": 1, "boxes": 2}),
    ("box_grounding_head", {"images": 1, "prompts": 1, "boxes": 3}),  # padded to 4 boxes
    ("propagation_decoder", {"buckets": 1, **CAPACITIES}),  # every compiled size used
    ("propagation_decoder", {"buckets": 3, "memories": 3, "pointers": 5, "memory_rows": 7, "image_rows": 4,
                             "pointer_rows": 6}),  # buckets 3 -> 4; entries and pools padded to capacity
    ("memory_encoder", {"buckets": 1, "mask_side": 16 * GRID}),
    ("memory_encoder", {"buckets": 1, "mask_side": 14 * GRID}),  # one bucket per call (the runtime chunks)
    ("interactive_decoder", {"objects": 1, "points": 2}),
    ("interactive_decoder", {"objects": 1, "points": 5}),  # one object per call
    ("mask_init", {"objects": 1}),
    ("mask_init", {"objects": 5}),  # padded to 8
]


def _pad(array: np.ndarray, axes, sizes: dict, gear: dict, rng) -> np.ndarray:
    """``array`` (at the source sizes) at the gear's sizes, padded as the runtime pads (module doc)."""
    for dim, axis in enumerate(axes):
        if axis is None or gear.get(axis, sizes.get(axis)) == array.shape[dim]:
            continue
        extra = gear[axis] - array.shape[dim]
        assert extra > 0 and axis not in ("points", "mask_side"), (axis, array.shape, gear)
        if axis in BATCH_AXES:
            fill = np.take(array, [0] * extra, axis=dim)
        elif axis in ENTRY_AXES:
            fill = np.zeros(array.shape[:dim] + (extra,) + array.shape[dim + 1:], array.dtype)
        else:  # pool rows nobody indexes
            assert axis in POOL_AXES, axis
            fill = rng.standard_normal(array.shape[:dim] + (extra,) + array.shape[dim + 1:]).astype(array.dtype)
        array = np.concatenate([array, fill], axis=dim)
    return np.ascontiguousarray(array)


@pytest.fixture(scope="module")
def references(bundles):
    """ONNX Runtime on the source bundle's graphs, one session per graph."""
    import onnxruntime as ort

    plain = bundles[0]
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return {name: ort.InferenceSession(str(plain / e["file"]), opts, providers=["CPUExecutionProvider"])
            for name, e in _manifest(plain)["graphs"].items()}


def run_cases(plain: Path, out: Path, om: dict, cases, references, pad=None) -> dict[str, set]:
    """Run ``cases`` on the OM bundle ``out`` through the acl backend on the emulator and compare with
    ``references`` (ONNX Runtime sessions of the source graphs); returns graph -> the gears that ran."""
    pad = pad or _pad
    manifest = _manifest(plain)
    plans = make_plans(manifest, GEARS)
    bundle = Bundle(out, _manifest(out))
    ran: dict[str, set] = {}
    with install() as emu:
        backend = create_backend("acl", "npu:0")
        try:
            graphs = {name: backend.load(name, str(bundle.graph_path(name)), bundle.compiled(name))
                      for name in {name for name, _ in cases}}
            for case, (name, sizes) in enumerate(cases):
                graph, plan, entry = graphs[name], plans[name], om["graphs"][name]
                full = {**plan.sizes_at(min), **sizes}
                gear = {a: backend.plan(graph, a, n) for a, n in full.items()}
                model = onnx.load(str(plain / manifest["graphs"][name]["file"]), load_external_data=False) \
                    if name == "text_encoder" else None  # ids within its vocabulary
                inputs = sample_inputs(plan, full, manifest, model, seed=case)
                if "round_levels" in inputs:  # both of Meta's paths: bf16-rounded levels, then float32 ones
                    inputs["round_levels"] = (np.arange(full["images"]) % 2 == 0).astype(np.float32)
                session = references[name]
                want = dict(zip([o.name for o in session.get_outputs()], session.run(None, inputs)))
                rng = np.random.default_rng(case)
                axes = {t["name"]: t["axes"] for t in entry["inputs"] + entry["outputs"] if not t.get("hidden")}
                got = backend.run(graph, {k: pad(v, axes[k], full, gear, rng) for k, v in inputs.items()})
                bf16 = BF16_OUTPUTS if manifest["graphs"][name]["bf16_rounding"] else set()
                for output, ref in want.items():
                    have = backend.to_host(got[output])
                    assert have.shape == tuple(gear.get(a, d) if a else d for a, d in zip(axes[output], ref.shape))
                    have = have[tuple(slice(0, n) for n in ref.shape)]  # the real rows
                    max_abs, rel = relative_error(have, ref)
                    ok = within_one_bf16_step(have, ref) if output in bf16 else rel <= FP32_TOL
                    assert ok, f"{name} at {sizes} (gear {gear}): {output} max abs {max_abs:.3g}, rel {rel:.3g}"
                ran.setdefault(name, set()).add(tuple(sorted((a, gear[a]) for a in sizes)))
            executes = dict(emu.stats.executes)
        finally:
            backend.close()
        assert emu.stats.live_allocations == 0 and not emu.stats.leaks
    assert all(executes[f"{name}.om"] == sum(1 for n, _ in cases if n == name) for name in ran), executes
    return ran


# outputs rounded to bfloat16 (the memory encoder's memories; the backbone's tracker levels at round_levels 1)
BF16_OUTPUTS = {"maskmem_features", "tracker_feat", "tracker_feat_s0", "tracker_feat_s1"}


def test_every_converted_graph_on_the_emulator_matches_onnxruntime_on_the_source(bundles, references):
    plain, out, om = bundles
    ran = run_cases(plain, out, om, CASES, references)
    assert set(ran) == set(om["graphs"]) and all(len(gears) >= 2 for gears in ran.values()), ran
    # 3 buckets ran at the gear 4, their 3 memories and 5 pointers at the capacities 4 and 6
    assert {"buckets": 4, **CAPACITIES} in [dict(g) for g in ran["propagation_decoder"]]
