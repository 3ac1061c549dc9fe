"""om.convert and the fake atc: plans ATC accepts, plans it refuses, the ONNX pre-pass, the OM bundle layout.

Two conversions of the session's tiny bundle: one with the fake atc on PATH covering all four modes
(static backbone, dynamic-batch text encoder, dynamic-dims interactive decoder, shape-range memory
encoder), one with no atc (planned, not compiled). Everything else works on plans or small ONNX models.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from om.convert import convert_bundle, main as convert_main, make_plans, parse_precision
from om.errors import AtcError, ConversionError, PlanError, PrepassError
from om.plan import GraphPlan, TensorPlan, default_capacities, parse_gears, plan_graph
from om.prepass import check_equivalent, make_atc_ready
from sam3track.bundle import Bundle
from sam3track.testing import fake_atc
from sam3track.testing.fake_atc import install_fake_atc, read_fake_om

from .export_cache import cached_conversion

ARCH = platform.machine()
GEARS = {"points": (1, 2, 3, 5)}  # interactive_decoder: dynamic dims over 4 point counts


@pytest.fixture(scope="module")
def fake_bin(tmp_path_factory) -> Path:
    bin_dir = tmp_path_factory.mktemp("fakebin")
    install_fake_atc(bin_dir)
    return bin_dir


@pytest.fixture(scope="module")
def converted(tiny_plain_bundle, fake_bin, tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("om") / "tiny-om"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", f"{fake_bin}{os.pathsep}{os.environ['PATH']}")
        return cached_conversion("om-tiny-gears", tiny_plain_bundle, out, soc="Ascend910B2", gears=GEARS,
                                 shape_range=("memory_encoder",),
                                 precision={"backbone": "mixed_float16", "memory_encoder": "fp16"})


# ------------------------------------------------------------------------------------------- conversion
def test_every_graph_compiles_with_the_fake_atc(converted):
    out, om = converted
    assert om == json.loads((out / "om_manifest.json").read_text())
    assert om["format"] == "sam3track-om" and om["compiled"] is True and om["soc_version"] == "Ascend910B2"
    assert om["family"] == "sam3"
    modes = {g: e["mode"] for g, e in om["graphs"].items()}
    assert modes == {"text_encoder": "dynamic_batch", "backbone": "static", "grounding_head": "dynamic_batch",
                     "propagation_decoder": "dynamic_batch", "interactive_decoder": "dynamic_dims",
                     "memory_encoder": "shape_range", "mask_init": "dynamic_batch"}
    for name, g in om["graphs"].items():
        expected = f"om/{name}_linux_{ARCH}.om" if g["mode"] == "shape_range" else f"om/{name}.om"
        assert g["om_file"] == expected and (out / expected).is_file()
        assert sorted(p.name for p in (out / "om").glob(f"{name}*.om")) == [Path(expected).name]
        script = (out / g["atc_script"]).read_text()
        assert "--input_shape=" in script and f"--model=onnx/{name}.onnx" in script
        assert g["atc_command"][:2] == ["atc", "--framework=5"] and "--log=error" in g["atc_command"]
    assert not (out.parent / (out.name + ".partial")).exists()


def test_the_fake_om_agrees_with_the_om_manifest(converted):
    """What atc compiled (read back from the artefact) is what the converter recorded."""
    out, om = converted
    for name, g in om["graphs"].items():
        header, model_bytes = read_fake_om(out / g["om_file"])
        assert model_bytes == (out / g["onnx"]["file"]).read_bytes()
        assert header["mode"] == g["mode"]
        visible = [i for i in g["inputs"] if not i.get("hidden")]
        assert [(i["name"], i["dtype"], i["dims"]) for i in header["inputs"]] == \
               [(i["name"], i["dtype"], i["shape"]) for i in visible]
        hidden = [i["name"] for i in g["inputs"] if i.get("hidden")]
        assert hidden == ([header["hidden_input"]] if header["hidden_input"] else [])
        if hidden:
            assert g["inputs"][-1] == {"name": "ascend_mbatch_shape_data", "hidden": True}
        assert [o["tensor"] for o in header["outputs"]] == [o["name"] for o in g["outputs"]]
        assert all(o["name"].endswith(":" + o["tensor"]) and o["name"].count(":") >= 2 for o in header["outputs"])
        if g["mode"] != "shape_range":
            assert [o["dims"] for o in header["outputs"]] == [o["shape"] for o in g["outputs"]]
        if g["mode"] == "dynamic_batch":
            assert [[b] for b in header["batch_sizes"]] == g["profiles"]
        if g["mode"] == "dynamic_dims":
            assert header["dynamic_dims"] == g["profiles"]
    assert read_fake_om(out / om["graphs"]["backbone"]["om_file"])[0]["precision"]["precision_mode_v2"] == \
        "mixed_float16"


def test_the_bf16_rounding_becomes_casts_at_reduced_precision(converted, tiny_plain_bundle, tmp_path):
    """memory_encoder's bf16 rounding is float32 arithmetic (a splitter of 65537, inf in float16): at
    origin it reaches ATC as it is; at fp16 (this fixture) the pre-pass turns it into Casts, and its
    equivalence check (onnxruntime, 1e-5) holds."""
    out, om = converted
    names = json.loads((tiny_plain_bundle / "manifest.json").read_text())["graphs"]["memory_encoder"]["bf16_rounding"]
    assert names == [f"bf16_rounding/{part}" for part in ("splitter", "scale", "residual", "result")]

    def ops(path):
        return {n.name: (n.op_type, [a.i for a in n.attribute if a.name == "to"]) for n in onnx.load(str(path)).graph.node}

    fp16 = ops(out / om["graphs"]["memory_encoder"]["onnx"]["file"])
    assert not set(names) & set(fp16)
    assert fp16["bf16_rounding/to_bf16"] == ("Cast", [onnx.TensorProto.BFLOAT16])
    assert fp16["bf16_rounding/to_float"] == ("Cast", [onnx.TensorProto.FLOAT])
    origin = _plans(tiny_plain_bundle)["memory_encoder"]
    manifest = json.loads((tiny_plain_bundle / "manifest.json").read_text())
    make_atc_ready(tiny_plain_bundle / "memory_encoder.onnx", origin, manifest, tmp_path / "origin.onnx")
    assert {n: t for n, (t, _) in ops(tmp_path / "origin.onnx").items() if n.startswith("bf16")} == \
        {names[0]: "Constant", names[1]: "Mul", names[2]: "Sub", names[3]: "Sub"}


def test_plans_recorded_in_the_om_manifest(converted, tiny_plain_bundle):
    out, om = converted
    manifest = json.loads((tiny_plain_bundle / "manifest.json").read_text())
    caps = default_capacities(manifest)
    dec = om["graphs"]["propagation_decoder"]
    assert dec["axes"] == {"memory_rows": [caps["memory_rows"]], "objects": [1, 2, 4, 8, 16],
                           "memories": [caps["memories"]], "pointer_rows": [caps["pointer_rows"]],
                           "pointers": [caps["pointers"]]}
    assert dec["profiles"] == [[1], [2], [4], [8], [16]] and "--dynamic_batch_size=1,2,4,8,16" in dec["atc_command"]
    pool = next(i for i in dec["inputs"] if i["name"] == "memory_pool")
    assert pool["shape"][0] == caps["memory_rows"] and pool["axes"][0] == "memory_rows"
    masks = next(o for o in dec["outputs"] if o["name"] == "low_res_masks")
    assert masks["shape"][0] == 16 and masks["axes"][0] == "objects"
    # clicks: one object per call and the points vary (at dim 1: dynamic dims, one value for points in
    # point_coords and one in point_labels); the pool axes stay at the capacities
    inter = om["graphs"]["interactive_decoder"]
    assert inter["axes"] == {"memory_rows": [caps["memory_rows"]], "objects": [1], "memories": [caps["memories"]],
                             "pointer_rows": [caps["pointer_rows"]], "pointers": [caps["pointers"]],
                             "points": [1, 2, 3, 5]}
    assert inter["profiles"] == [[1, 1], [2, 2], [3, 3], [5, 5]]
    enc = om["graphs"]["memory_encoder"]
    assert enc["ranges"]["mask_logits"][0] == [1, 16] and enc["profiles"] is None
    assert enc["ranges"]["via_image"] == [[1, 16]]
    assert "1~16" in next(a for a in enc["atc_command"] if a.startswith("--input_shape="))
    assert om["graphs"]["backbone"]["profiles"] is None and om["graphs"]["backbone"]["axes"] == {"images": [1]}
    # the plain export rewrote the mask product's Einsum and folded the backbone's shape-only Ifs
    assert om["graphs"]["grounding_head"]["risky_ops"] == {} and om["graphs"]["backbone"]["risky_ops"] == {}
    assert om["graphs"]["interactive_decoder"]["risky_ops"] == {"ScatterND": 4}
    # the objects' masks change layout by Reshapes, never by an If (graphs.ops.objects_as_channels)
    assert om["graphs"]["memory_encoder"]["risky_ops"] == {} and "If" not in om["graphs"]["mask_init"]["risky_ops"]
    assert om["source_bundle"]["manifest_sha256"] and dec["source"]["file"] == "propagation_decoder.onnx"


def test_the_om_bundle_is_a_bundle_of_atc_ready_graphs(converted):
    out, om = converted
    bundle = Bundle.open(out)  # files and sha256 of the rewritten manifest hold
    assert bundle.graph_path("mask_init") == out / "onnx" / "mask_init.onnx"
    assert (out / "tokenizer" / "tokenizer.json").is_file()
    model = onnx.load(str(out / "onnx" / "propagation_decoder.onnx"))
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)]
    dims = {v.name: [d.dim_value or d.dim_param for d in v.type.tensor_type.shape.dim]
            for v in list(model.graph.input) + list(model.graph.output)}
    caps = om["graphs"]["propagation_decoder"]["axes"]
    assert dims["memory_pool"][0] == caps["memory_rows"][0]
    assert dims["memory_index"] == ["objects", caps["memories"][0]]  # a fixed axis reaches ATC as a number
    assert dims["pointer_index"] == ["objects", caps["pointers"][0]]
    assert dims["low_res_masks"] == ["objects", 1, 32, 32]  # the exporter's spurious dim_params are gone


def test_without_atc_the_bundle_is_planned_not_compiled(tiny_plain_bundle, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    out = tmp_path / "planned"
    assert convert_main([str(tiny_plain_bundle), "--soc", "Ascend910B2", "--out", str(out)]) == 0
    assert "planned, not compiled" in capsys.readouterr().out
    om = json.loads((out / "om_manifest.json").read_text())
    assert om["compiled"] is False and all(g["om_file"] is None for g in om["graphs"].values())
    assert not list(out.rglob("*.om"))
    modes = {g: e["mode"] for g, e in om["graphs"].items()}
    assert modes["backbone"] == "static" and modes["propagation_decoder"] == "dynamic_batch"
    assert modes["interactive_decoder"] == "dynamic_dims"
    assert om["graphs"]["text_encoder"]["profiles"] == [[1], [2], [4], [8]]

    from sam3track.cli import main as cli_main

    assert cli_main(["info", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "om bundle       soc Ascend910B2, CANN unknown, planned, not compiled" in shown
    assert "propagation_decoder    dynamic_batch" in shown and "memory_rows=961 (fixed)" in shown

    # an existing OUT is refused without --overwrite, and nothing half-written is left behind
    assert convert_main([str(tiny_plain_bundle), "--soc", "Ascend910B2", "--out", str(out)]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert not (tmp_path / "planned.partial").exists()


def test_cli_refuses_unknown_axes_and_bad_gears(tiny_plain_bundle, tmp_path, capsys):
    out = tmp_path / "x"
    assert convert_main([str(tiny_plain_bundle), "--soc", "Ascend910B2", "--out", str(out), "--gears", "frames=1,2"]) == 2
    assert "unknown axis 'frames'" in capsys.readouterr().err
    assert convert_main([str(tiny_plain_bundle), "--soc", "Ascend910B2", "--out", str(out), "--gears", "objects=0,2"]) == 2
    assert "not a positive integer" in capsys.readouterr().err
    assert convert_main([str(tiny_plain_bundle), "--soc", "Ascend910B2", "--out", str(out),
                         "--gears", "objects=1,2,4,8,16", "memories=1,2,4,8", "pointers=1,2,4,8,16,32"]) == 2
    err = capsys.readouterr().err
    assert "propagation_decoder: 120 --dynamic_dims profiles" in err and "accepts 2 to 100" in err
    assert not out.exists() and not (tmp_path / "x.partial").exists()
    for soc in ("Ascend", "Ascend910B9", "ascend910b2"):  # a real chip name, not any Ascend* string
        assert convert_main([str(tiny_plain_bundle), "--soc", soc, "--out", str(tmp_path / "y")]) == 2
        assert f"--soc {soc!r} is not a SoC ATC knows" in capsys.readouterr().err
    assert not (tmp_path / "y").exists()


# ------------------------------------------------------------------------------------------- plans
def test_default_capacities_follow_the_tracker_config(tiny_plain_bundle):
    manifest = json.loads((tiny_plain_bundle / "manifest.json").read_text())
    trk = manifest["config"]["tracker"]
    trk.update(num_maskmem=7, max_cond_frame_num=4, max_object_pointers_in_encoder=16)
    # K = cond + maskmem - 1, P = 16 + ptrs - 1, rows = 1 + 64 * (n + 8)
    assert default_capacities(manifest) == {"memories": 10, "pointers": 31, "memory_rows": 961,
                                            "pointer_rows": 1537}
    trk.update(max_cond_frame_num=-1, num_maskmem=3, max_object_pointers_in_encoder=4)
    assert default_capacities(manifest) == {"memories": 18, "pointers": 19, "memory_rows": 705,
                                            "pointer_rows": 769}


def test_precision_and_gear_parsing():
    graphs = ["text_encoder", "backbone"]
    assert parse_precision(["fp16", "text_encoder=origin"], graphs) == {"text_encoder": "origin", "backbone": "fp16"}
    assert parse_precision([], graphs) == {"text_encoder": "origin", "backbone": "origin"}
    with pytest.raises(ConversionError, match="'fp8' is not a precision"):
        parse_precision(["fp8"], graphs)
    with pytest.raises(ConversionError, match="no graph 'decoder'"):
        parse_precision(["decoder=fp16"], graphs)
    assert parse_gears(["objects=4,1,2,2"], {"objects"}) == {"objects": (1, 2, 4)}


def _two_input_plan(**options) -> GraphPlan:
    return GraphPlan("g", (TensorPlan("a", "float32", ("n", 3)), TensorPlan("b", "float32", ("n", "k"))),
                     (TensorPlan("c", "float32", ("n", 3)),), {"n": (1, 2, 4), "k": (8, 16)}, **options)


def test_mode_follows_the_varying_axes():
    entry = {"inputs": [{"name": "a", "dtype": "float32", "shape": ["n", 3]},
                        {"name": "b", "dtype": "float32", "shape": ["n", "k"]}],
             "outputs": [{"name": "c", "dtype": "float32", "shape": ["n", 3]}]}
    assert plan_graph("g", entry, {"n": (1,), "k": (8,)}).mode == "static"
    assert plan_graph("g", entry, {"n": (1, 2, 4), "k": (8,)}).batch_sizes == (1, 2, 4)
    dims = plan_graph("g", entry, {"n": (1, 2), "k": (8, 16)})
    # -1s: a[0]=n, b[0]=n, b[1]=k -> each profile repeats n for both inputs
    assert dims.mode == "dynamic_dims" and dims.dynamic_dims == ((1, 1, 8), (1, 1, 16), (2, 2, 8), (2, 2, 16))
    assert dims.input_shape_arg() == "a:-1,3;b:-1,-1"
    assert plan_graph("g", entry, {"n": (1, 4), "k": (8,)}, shape_range=True).input_shape_arg() == "a:1~4,3;b:1~4,8"
    # the axis sits at dim 1 of some input: dynamic_batch is impossible, dynamic_dims it is
    entry["inputs"][1]["shape"] = [2, "n"]
    assert plan_graph("g", entry, {"n": (1, 2, 4), "k": (8,)}).mode == "dynamic_dims"


def test_two_dynamic_options_are_refused():
    plan = _two_input_plan(batch_sizes=(1, 2, 4), dynamic_dims=((1, 1, 8), (2, 2, 16)))
    with pytest.raises(PlanError, match=r"graph g: the plan sets --dynamic_batch_size and --dynamic_dims.*exactly one"):
        plan.validate()


def test_plans_atc_would_refuse_for_their_gears_are_refused(tiny_plain_bundle):
    manifest = json.loads((tiny_plain_bundle / "manifest.json").read_text())
    with pytest.raises(PlanError, match=r"interactive_decoder: 101 --dynamic_dims profiles \(points 101\); ATC "
                                        r"accepts 2 to 100"):
        make_plans(manifest, {"points": tuple(range(1, 102))})
    # varying a pool axis of the decoder puts 9 -1s in each profile: ATC takes 4 [atc_rules D-dims4]
    with pytest.raises(PlanError, match=r"propagation_decoder: --dynamic_dims would need 9 values per profile "
                                        r"\(memory_index\[0\], memory_index\[1\], .*ATC takes at most 4"):
        make_plans(manifest, {"memories": (4, 10)})
    # objects named on the command line leave interactive_decoder at one object per call
    plans = make_plans(manifest, {"objects": (1, 2, 4, 8, 16, 32)})
    assert plans["interactive_decoder"].axes["objects"] == (1,) and len(plans["interactive_decoder"].dynamic_dims) == 11
    assert plans["propagation_decoder"].batch_sizes == (1, 2, 4, 8, 16, 32)


def test_a_profile_missing_an_input_value_is_refused():
    # n appears in both inputs; listing it once (2 values for 3 -1s) is the classic mistake
    plan = _two_input_plan(dynamic_dims=((1, 8), (2, 16)))
    with pytest.raises(PlanError, match=r"profile 1 \[1, 8\] has 2 values for 3 -1 dims \(a\[0\]=n, b\[0\]=n, "
                                        r"b\[1\]=k\); every -1 needs its own value"):
        plan.validate()
    with pytest.raises(PlanError, match="gives axis n both 1 and 2"):
        _two_input_plan(dynamic_dims=((1, 2, 8), (2, 2, 16))).validate()


def test_other_plans_atc_refuses():
    with pytest.raises(PlanError, match=r"1 --dynamic_dims profiles .*ATC accepts 2 to 100"):
        _two_input_plan(dynamic_dims=((1, 1, 8),)).validate()
    with pytest.raises(PlanError, match=r"lists a profile twice"):  # E10039
        _two_input_plan(dynamic_dims=((1, 1, 8), (1, 1, 8))).validate()
    rank5 = GraphPlan("g", (TensorPlan("v", "float32", (1, "k", 2, 2, 2)),), (TensorPlan("c", "float32", (1,)),),
                      {"k": (1, 2)}, dynamic_dims=((1,), (2,)))
    with pytest.raises(PlanError, match=r"input v has rank 5 and a dynamic dim; --dynamic_dims takes inputs of "
                                        r"rank <= 4"):
        rank5.validate()
    tied = plan_graph("g", {"inputs": [{"name": "a", "dtype": "float32", "shape": ["n", 3]},
                                       {"name": "b", "dtype": "float32", "shape": ["k", 3]}],
                            "outputs": [{"name": "c", "dtype": "float32", "shape": ["n", 3]}]},
                      {"n": (1, 2, 4), "k": (1, 2, 4)}, allowed=lambda s: s["n"] == s["k"])
    assert tied.mode == "dynamic_batch" and tied.batch_sizes == (1, 2, 4)  # axes the rule ties: one batch gear
    assert tied.gear_sizes() == [{"n": 1, "k": 1}, {"n": 2, "k": 2}, {"n": 4, "k": 4}]
    with pytest.raises(PlanError, match=r"a dim 0 \(n\) varies .* no dynamic option gives the -1 a value"):
        _two_input_plan().validate()
    with pytest.raises(PlanError, match="axes \\['n', 'k'\\] vary apart"):
        _two_input_plan(batch_sizes=(1, 2, 4)).validate()
    bad = _two_input_plan(batch_sizes=(1, 2, 4))
    bad.axes = {"n": (1, 2, 4), "k": (0,)}
    with pytest.raises(PlanError, match="gears must be positive integers"):
        bad.validate()


# ------------------------------------------------------------------------------------------- pre-pass
def _plans(bundle: Path) -> dict[str, GraphPlan]:
    return make_plans(json.loads((bundle / "manifest.json").read_text()))


def test_prepass_refuses_custom_domain_nodes(tiny_plain_bundle, tmp_path):
    model = onnx.load(str(tiny_plain_bundle / "mask_init.onnx"))
    node = next(n for n in model.graph.node if n.op_type == "LayerNormalization")
    node.domain = "com.microsoft"
    model.opset_import.add(domain="com.microsoft", version=1)
    src = tmp_path / "mask_init.onnx"
    onnx.save(model, str(src))
    manifest = json.loads((tiny_plain_bundle / "manifest.json").read_text())
    with pytest.raises(PrepassError, match=rf"graph mask_init: node '{node.name}' is op LayerNormalization of domain "
                                           r"'com.microsoft'.*E19010"):
        make_atc_ready(src, _plans(tiny_plain_bundle)["mask_init"], manifest, tmp_path / "out.onnx")


def test_prepass_keeps_one_default_opset_and_checks_its_rewrite(tiny_plain_bundle, tmp_path):
    model = onnx.load(str(tiny_plain_bundle / "memory_encoder.onnx"))
    model.opset_import.add(domain="com.microsoft", version=1)  # imported, unused: dropped
    src = tmp_path / "memory_encoder.onnx"
    onnx.save(model, str(src))
    manifest = json.loads((tiny_plain_bundle / "manifest.json").read_text())
    plan = _plans(tiny_plain_bundle)["memory_encoder"]
    report = make_atc_ready(src, plan, manifest, tmp_path / "ready.onnx")
    assert report.check_sizes == {"objects": 2}
    wide = [t.name for t in plan.inputs if t.dtype in ("int64", "bool")]
    assert any(all(n in w for n in wide) for w in report.warnings) if wide else \
        not any("int64/bool" in w for w in report.warnings)
    ready = onnx.load(str(tmp_path / "ready.onnx"))
    assert [(o.domain, o.version) for o in ready.opset_import] == [("", 17)]

    # the equivalence check fails when the "rewrite" computes something else
    weight = next(i for i in ready.graph.initializer if len(i.dims) == 4)
    array = onnx.numpy_helper.to_array(weight) + 0.5
    weight.CopyFrom(onnx.numpy_helper.from_array(array, weight.name))
    onnx.save(ready, str(tmp_path / "broken.onnx"))
    with pytest.raises(PrepassError, match="the ATC-ready rewrite changed output maskmem_features"):
        check_equivalent(src, tmp_path / "broken.onnx", plan, manifest)


# ------------------------------------------------------------------------------------------- fake atc
@pytest.fixture(scope="module")
def small_model(tmp_path_factory) -> Path:
    """a:[N,3] + b:[N,3] -> c, and d:[N,K] summed over K -> e."""
    x = helper.make_tensor_value_info
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["c"], name="add"),
         helper.make_node("ReduceSum", ["d", "axes"], ["e"], name="sum", keepdims=0)],
        "small", [x("a", TensorProto.FLOAT, ["N", 3]), x("b", TensorProto.FLOAT, ["N", 3]),
                  x("d", TensorProto.FLOAT, ["N", "K"])],
        [x("c", TensorProto.FLOAT, ["N", 3]), x("e", TensorProto.FLOAT, ["N"])],
        initializer=[helper.make_tensor("axes", TensorProto.INT64, [1], [1])])
    path = tmp_path_factory.mktemp("small") / "small.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def _atc(tmp_path: Path, model: Path, *extra: str, drop: tuple[str, ...] = ()) -> list[str]:
    base = {"framework": "5", "model": str(model), "output": str(tmp_path / "om" / "small"),
            "soc_version": "Ascend910B2", "input_format": "ND"}
    argv = [f"--{k}={v}" for k, v in base.items() if k not in drop]
    return argv + list(extra)


def _run(argv, capsys) -> tuple[int, str]:
    rc = fake_atc.main(argv)
    return rc, capsys.readouterr().out


GOOD_BATCH = ("--input_shape=a:-1,3;b:-1,3;d:-1,5", "--dynamic_batch_size=1,2,4")


@pytest.mark.parametrize("extra, drop, message", [
    (("--framework=3",) + GOOD_BATCH, ("framework",), "converts ONNX models only"),
    (GOOD_BATCH, ("soc_version",), "[--soc_version] is required"),
    (("--input_shape=a:2,3;b:2,3;e:2,5",), (), "the model has no input e"),
    (("--input_shape=a:2,3;b:2,3",), (), "inputs ['d'] are not listed"),
    (("--input_shape=a:2,3;b:2,3;d:2",), (), "rank 1 but the model's input has rank 2"),
    (("--input_shape=a:2,4;b:2,3;d:2,5",), (), "dim 1 is 4 but the model fixes it at 3"),
    (GOOD_BATCH + ("--dynamic_dims=1,1,1;2,2,2",), (), "E10009: parameters"),
    (("--input_shape=a:-1,3;b:-1,3;d:2,-1", "--dynamic_batch_size=1,2,4"), (), "only dim 0 may be -1"),
    (("--input_shape=a:-1,3;b:-1,3;d:-1,5", "--dynamic_batch_size=4"), (), "E10035: [--dynamic_batch_size] has 1"),
    (("--input_shape=a:-1,3;b:-1,3;d:-1,5", "--dynamic_batch_size=" + ",".join(map(str, range(1, 102)))), (),
     "101 gears; at most 100"),
    (("--input_shape=a:-1,3;b:-1,3;d:-1,5", "--dynamic_batch_size=1,2,2"), (), "E10039: [--dynamic_batch_size]"),
    (("--input_shape=a:-1,3;b:-1,3;d:-1,-1", "--dynamic_dims=1,8;2,16"), (), "E10003: Value [1,8]"),
    (("--input_shape=a:-1,3;b:-1,3;d:-1,-1", "--dynamic_dims=1,1,1,8"), (), "E10035: [--dynamic_dims] has 1"),
    (("--input_shape=a:-1,-1;b:-1,3;d:-1,-1", "--dynamic_dims=1,3,1,1,8;2,3,2,2,16"), (),
     "5 dynamic dims per profile; at most 4"),
    (GOOD_BATCH, ("soc_version",), "[--soc_version] is required"),
    (GOOD_BATCH + ("--soc_version=AscendFoo",), ("soc_version",), "'AscendFoo' is not a SoC ATC knows"),
    (GOOD_BATCH + ("--soc_version=Ascend910b2",), ("soc_version",), "did you mean Ascend910B2"),
    (("--input_format=NCHW", "--input_shape=a:-1,3;b:-1,3;d:-1,-1", "--dynamic_dims=1,1,1,8;2,2,2,8"),
     ("input_format",), "--dynamic_dims requires --input_format=ND"),
    (GOOD_BATCH, ("input_format",), "requires --input_format"),
    (("--input_shape=a:1~4,3;b:-1,3;d:-1,5", "--dynamic_batch_size=1,2,4"), (), "cannot be combined"),
    (GOOD_BATCH + ("--precision_mode=force_fp32", "--precision_mode_v2=origin"), (), "cannot be used together"),
    (GOOD_BATCH + ("--precision_mode_v2=fp32",), (), "Value [fp32] for parameter [--precision_mode_v2]"),
    (GOOD_BATCH + ("--log=verbose",), (), "parameter [--log]"),
    (GOOD_BATCH + ("--dynamic_shape=1",), (), "unknown parameter [--dynamic_shape]"),
    (GOOD_BATCH + ("--input_fp16_nodes=z",), (), "the model has no input z"),
])
def test_fake_atc_refuses(small_model, tmp_path, capsys, extra, drop, message):
    rc, out = _run(_atc(tmp_path, small_model, *extra, drop=drop), capsys)
    assert rc != 0 and message in out and "ATC run failed" in out, out
    assert not list(tmp_path.rglob("*.om"))


def test_fake_atc_refuses_paths(small_model, tmp_path, capsys):
    rc, out = _run(_atc(tmp_path, tmp_path / "missing.onnx", *GOOD_BATCH), capsys)
    assert rc != 0 and "[--model] is invalid. Reason: the file does not exist" in out
    argv = [a for a in _atc(tmp_path, small_model, *GOOD_BATCH) if not a.startswith("--output")]
    rc, out = _run(argv + [f"--output={tmp_path / 'small.om'}"], capsys)
    assert rc != 0 and "without .om" in out


def test_fake_atc_refuses_custom_domain_ops(small_model, tmp_path, capsys):
    model = onnx.load(str(small_model))
    model.graph.node[0].domain = "com.microsoft"
    path = tmp_path / "custom.onnx"
    onnx.save(model, str(path))
    rc, out = _run(_atc(tmp_path, path, *GOOD_BATCH), capsys)
    assert rc != 0 and "E19010: No parser is registered for Op [add, optype [com.microsoft::Add]]" in out


@pytest.mark.parametrize("extra, mode, name, outputs", [
    (("--input_shape=a:2,3;b:2,3;d:2,5",), "static", "small.om", [[2, 3], [2]]),
    (GOOD_BATCH, "dynamic_batch", "small.om", [[4, 3], [4]]),
    (("--input_shape=a:-1,3;b:-1,3;d:-1,-1", "--dynamic_dims=1,1,1,8;2,2,2,16"), "dynamic_dims", "small.om",
     [[2, 3], [2]]),
    (("--input_shape=a:1~8,3;b:1~8,3;d:1~8,5",), "shape_range", f"small_linux_{ARCH}.om", [[8, 3], [8]]),
])
def test_fake_atc_accepts_each_mode(small_model, tmp_path, capsys, extra, mode, name, outputs):
    rc, out = _run(_atc(tmp_path, small_model, *extra, "--precision_mode_v2=origin", "--log=error"), capsys)
    assert rc == 0 and "ATC run success, welcome to the next use" in out, out
    assert [p.name for p in (tmp_path / "om").iterdir()] == [name]
    header, _ = read_fake_om(tmp_path / "om" / name)
    assert header["mode"] == mode and [o["dims"] for o in header["outputs"]] == outputs
    assert [o["name"] for o in header["outputs"]] == ["add:0:c", "sum:0:e"]
    assert header["hidden_input"] == ("ascend_mbatch_shape_data" if mode.startswith("dynamic") else None)


def _one_node(tmp_path, node, inputs, outputs, inits=(), opset=17) -> Path:
    graph = helper.make_graph([node], "one", inputs, outputs, initializer=list(inits))
    path = tmp_path / "one.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), str(path))
    return path


def _static_atc(tmp_path, path, capsys) -> tuple[int, str]:
    model = onnx.load(str(path))
    shape = ";".join(f"{i.name}:" + ",".join(str(d.dim_value) for d in i.type.tensor_type.shape.dim)
                     for i in model.graph.input)
    return _run(_atc(tmp_path, path, f"--input_shape={shape}"), capsys)


F = TensorProto.FLOAT


@pytest.mark.parametrize("node, inputs, inits, message", [
    (helper.make_node("Einsum", ["q", "m"], ["y"], name="e", equation="bqc,bchw->bqhw"),
     [("q", [2, 3, 4]), ("m", [2, 4, 5, 6])], [], "EZ9999: Op [e, optype [Einsum]]: equation 'bqc,bchw->bqhw'"),
    (helper.make_node("Gelu", ["x"], ["y"], name="g"), [("x", [2, 3])], [],
     "E16002: Op [g, optype [Gelu]]: op type [ai.onnx::17::Gelu] has no ONNX parser"),
    (helper.make_node("RoiAlign", ["x", "rois", "idx"], ["y"], name="r", mode="max",
                      coordinate_transformation_mode="output_half_pixel"),
     [("x", [1, 2, 8, 8]), ("rois", [3, 4])], [helper.make_tensor("idx", TensorProto.INT64, [3], [0, 0, 0])],
     "mode='max': the plugin drops `mode`"),
    (helper.make_node("ScatterND", ["x", "i", "u"], ["y"], name="s", reduction="mul"),
     [("x", [4, 3]), ("u", [1, 3])], [helper.make_tensor("i", TensorProto.INT64, [1, 1], [2])],
     "reduction='mul': reduction='mul' is not supported"),
    (helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], name="z", mode="cubic"),
     [("x", [1, 2, 4, 4])], [helper.make_tensor("sizes", TensorProto.INT64, [4], [1, 2, 8, 8])],
     "mode='cubic': only nearest and linear"),
    (helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], name="z", mode="linear"),
     [("x", [1, 2, 4, 4]), ("sizes", [4])], [], "input 3 (sizes) depends on input data"),
])
def test_fake_atc_refuses_ops_outside_the_operator_table(tmp_path, capsys, node, inputs, inits, message):
    """om/onnx_ops.py: what ATC's ONNX parser registers per opset and the limits its kernels take."""
    vi = [helper.make_tensor_value_info(n, TensorProto.INT64 if n == "sizes" else F, d) for n, d in inputs]
    path = _one_node(tmp_path, node, vi, [helper.make_tensor_value_info("y", F, None)], inits)
    rc, out = _static_atc(tmp_path, path, capsys)
    assert rc != 0 and message in out and "ATC run failed" in out, out


def test_fake_atc_takes_the_ops_and_forms_the_table_allows(tmp_path, capsys):
    ok = helper.make_node("Einsum", ["a", "b"], ["y"], name="e", equation="xyz,zuv->xyuv")  # abc,cde->abde
    path = _one_node(tmp_path, ok, [helper.make_tensor_value_info("a", F, [2, 3, 4]),
                                    helper.make_tensor_value_info("b", F, [4, 5, 6])],
                     [helper.make_tensor_value_info("y", F, None)])
    assert _static_atc(tmp_path, path, capsys)[0] == 0
    # Resize sizes computed from the input's shape: constant once --input_shape fixes it
    graph = helper.make_graph(
        [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Mul", ["s", "two"], ["sizes"]),
         helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="linear")],
        "r", [helper.make_tensor_value_info("x", F, [1, 2, 4, 4])], [helper.make_tensor_value_info("y", F, None)],
        initializer=[helper.make_tensor("two", TensorProto.INT64, [4], [1, 1, 2, 2])])
    path = tmp_path / "resize.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    assert _static_atc(tmp_path, path, capsys)[0] == 0


def test_the_prepass_refuses_what_atc_would_refuse_naming_every_node(tmp_path):
    from om.prepass import check_ops

    model = onnx.load(str(_one_node(
        tmp_path, helper.make_node("Einsum", ["q", "m"], ["y"], name="mask_product", equation="bqc,bchw->bqhw"),
        [helper.make_tensor_value_info("q", F, [2, 3, 4]), helper.make_tensor_value_info("m", F, [2, 4, 5, 6])],
        [helper.make_tensor_value_info("y", F, None)])))
    with pytest.raises(PrepassError, match=r"graph g: 1 node\(s\) ATC would refuse .*\n  mask_product \(Einsum\): "
                                           r"EZ9999 equation 'bqc,bchw->bqhw'"):
        check_ops(model, "g")


def test_run_atc_finds_the_linux_arch_name_by_glob(small_model, tmp_path, fake_bin):
    """The shim on disk, run as a subprocess the way om.convert runs the real atc."""
    from om.atc import run_atc

    shutil.copy(small_model, tmp_path / "small.onnx")
    argv = ["atc", "--framework=5", "--model=small.onnx", "--output=om/small", "--soc_version=Ascend910B2",
            "--input_format=ND", "--input_shape=a:1~8,3;b:1~8,3;d:1~8,5"]
    assert run_atc(argv, tmp_path, "small", str(fake_bin / "atc")) == f"om/small_linux_{ARCH}.om"
    with pytest.raises(AtcError, match=r"(?s)graph small: atc exited with status 1\. Its output ends:\n.*"
                                        r"\[--soc_version\] is required"):
        run_atc([a for a in argv if "soc" not in a], tmp_path, "small", str(fake_bin / "atc"))


def test_fake_atc_runs_as_a_module(small_model, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "sam3track.testing.fake_atc",
                           *_atc(tmp_path, small_model, *GOOD_BATCH)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(Path(fake_atc.__file__).resolve().parents[2])})
    assert proc.returncode == 0 and "ATC run success" in proc.stdout
    assert np.frombuffer((tmp_path / "om" / "small.om").read_bytes()[:18], np.uint8).tobytes() == fake_atc.MAGIC


def test_converter_and_fake_atc_never_import_torch():
    code = ("import sys, om.convert, om.prepass, om.atc, sam3track.testing.fake_atc; "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    root = str(Path(fake_atc.__file__).resolve().parents[2])
    assert subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": root}).returncode == 0


def test_a_bundle_with_fused_attention_is_refused_before_any_work(tiny_bundle, tmp_path):
    """The default export fuses attention into com.microsoft MultiHeadAttention, which ATC cannot parse:
    conversion stops at once, names the graphs and the export switch, and writes nothing."""
    out = tmp_path / "om"
    with pytest.raises(ConversionError) as info:
        convert_bundle(tiny_bundle, "Ascend910B2", out, atc=None, log=lambda *_: None)
    message = str(info.value)
    assert "propagation_decoder" in message and "interactive_decoder" in message and "--attention plain" in message
    assert not out.exists() and not list(tmp_path.iterdir())
