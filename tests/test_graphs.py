"""The export side: a tiny checkpoint exported through the real loading path, checked graph by graph."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from graphs.sam3 import export
from graphs.sam3.check import run_checks
from graphs.comparison import BF16_CRITERION, Row
from graphs.sam3.checkpoint import CheckpointError, validate_checkpoint


def test_every_graph_matches_the_reference_at_every_size(tiny_bundle):
    rows = run_checks(tiny_bundle, log=lambda *_: None)
    failing = [r for r in rows if not r.ok]
    assert not failing, "\n".join(f"{r.graph} {r.case} {r.output} rel={r.rel:.2e} {r.note}" for r in failing)
    cases = {(r.graph, r.case) for r in rows}
    # the sizes the checker promises: N = 1, 3, 8; K memories 1..10; prompts 1, 2, 5
    for n in (1, 3, 8):
        assert any(g == "propagation_decoder" and c.startswith(f"N={n} ") for g, c in cases)
    # K = 4 conditioning + 6 recent memories; P = every kept conditioning frame's pointer (the
    # runtime's cap) + 15 recent ones: the largest call the runtime makes is checked too
    from graphs.sam3.check import max_pointer_conditioning_frames

    p_max = 15 + max_pointer_conditioning_frames()
    assert p_max > 19
    assert {c for g, c in cases if g == "propagation_decoder" and c.startswith("N=3 ")} >= {
        f"N=3 K={k} P={2 * k - 1}" for k in range(1, 11)} | {f"N=3 K=10 P={p_max}"}
    assert {c for g, c in cases if g == "grounding_head"} == {"K=1", "K=2", "K=5"}
    # clicks and boxes: one click, clicks with negatives, a box alone, a box + clicks; 1, 4 and 8 objects;
    # every (use_memory, multimask) combination in every multi-object call, the largest K and P once
    interactive = [c for g, c in cases if g == "interactive_decoder"]
    for prompt in ("click", "clicks", "box", "box+clicks"):
        assert f"{prompt} N=1 K=2 P=3" in {c.rsplit(" ", 1)[0] for c in interactive}
        assert any(c.startswith(f"{prompt} N=4 ") and {"00", "01", "10", "11"} == set(c.split()[-1].split(","))
                   for c in interactive)
    assert {c.split()[-1] for c in interactive if " N=1 " in c} == {"00", "01", "10", "11"}
    assert any(c.startswith(f"box+clicks N=8 K=10 P={p_max} ") for c in interactive)
    encoder = {c for g, c in cases if g == "memory_encoder"}
    assert {"N=3 binarize=1 via_image=1", "N=3 high_res_masks via_image=1"} <= encoder


@pytest.mark.slow
def test_interactive_single_mask_rows_when_the_mask_is_stable(tiny_bundle, tmp_path):
    """The seeded model's single-mask output is never stable (stability < 0.98), so the decoder always
    falls back to the best multimask mask and graphs.check sees only that path for multimask=0 rows.
    With a stability threshold of 0 every single-mask row keeps mask token 0: that path is checked here."""
    ck = tmp_path / "ck"
    shutil.copytree(tiny_bundle / "source", ck)
    cfg = json.loads((ck / "config.json").read_text())
    cfg["tracker_config"]["mask_decoder_config"]["dynamic_multimask_stability_thresh"] = 0.0
    (ck / "config.json").write_text(json.dumps(cfg))
    out = export.export_bundle(ck, tmp_path / "stable", log=lambda *_: None)
    rows = run_checks(out, graphs=["interactive_decoder"], log=lambda *_: None)
    assert rows and all(r.ok for r in rows), [(r.case, r.output, r.rel) for r in rows if not r.ok]


def test_manifest_describes_graphs_tokenizer_and_source(tiny_bundle):
    m = json.loads((tiny_bundle / "manifest.json").read_text())
    assert m["format_version"] == export.FORMAT_VERSION
    assert set(m["graphs"]) == set(export.GRAPHS)
    for name, g in m["graphs"].items():
        assert (tiny_bundle / g["file"]).is_file()
        assert len(g["sha256"][g["file"]]) == 64
        assert g["inputs"] and g["outputs"]
    source_config = json.loads((tiny_bundle / "source" / "config.json").read_text())
    for name in ("new_det_thresh", "hotstart_delay", "score_threshold_detection"):
        assert m["config"]["heuristics"][name] == source_config[name]
    for name in ("multimask_output_in_sam", "multimask_output_for_tracking", "multimask_min_pt_num",
                 "multimask_max_pt_num"):
        assert m["config"]["tracker"][name] == source_config["tracker_config"][name]
    inputs = {g: [t["name"] for t in m["graphs"][g]["inputs"]] for g in ("interactive_decoder", "memory_encoder")}
    assert inputs["interactive_decoder"][-4:] == ["use_memory", "point_coords", "point_labels", "multimask"]
    assert inputs["memory_encoder"][-1] == "via_image"
    assert m["tokenizer"]["max_length"] == 32 and (tiny_bundle / "tokenizer" / "tokenizer.json").is_file()
    assert m["source"]["checkpoint"] == "source" and m["source"]["weights_sha256"]
    assert m["exporter"]["torch"].startswith("2.13.0")


def test_bf16_rounding_is_round_to_nearest_even_in_any_runtime(tiny_bundle):
    """memory_encoder rounds its memories to bfloat16 as the reference stores them (torch's cast: nearest,
    ties to even), with plain float32 arithmetic every runtime does exactly, where a Cast to BFLOAT16
    rounds differently in OpenVINO. Checked on random values and on exact ties, in torch and in the
    exported nodes run by ONNX Runtime and OpenVINO."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    import torch
    from onnx import helper

    from graphs.sam3.modules import round_to_bfloat16
    from sam3track.backends.openvino import shared_core

    rng = np.random.default_rng(0)
    x = (rng.standard_normal(200_000) * rng.choice([1e-4, 1.0, 40.0], 200_000)).astype(np.float32)
    ties = ((x.view(np.uint32) & 0xFFFF0000) | 0x8000).view(np.float32)  # halfway between two bf16 values
    values = np.concatenate([x, ties, np.array([0.0, -0.0, 1e-30, 3e33], np.float32)])
    want = torch.from_numpy(values).to(torch.bfloat16).float().numpy()
    assert np.array_equal(round_to_bfloat16(torch.from_numpy(values)).numpy(), want)

    m = json.loads((tiny_bundle / "manifest.json").read_text())
    names = m["graphs"]["memory_encoder"]["bf16_rounding"]
    assert names == [f"bf16_rounding/{part}" for part in ("splitter", "scale", "residual", "result")]
    assert all(g["bf16_rounding"] == [] for n, g in m["graphs"].items() if n != "memory_encoder")
    graph = onnx.load(str(tiny_bundle / "memory_encoder.onnx")).graph
    assert not [n for n in graph.node if n.op_type == "Cast" and
                any(a.name == "to" and a.i == onnx.TensorProto.BFLOAT16 for a in n.attribute)]
    nodes = {n.name: n for n in graph.node}
    scale, residual, result = (nodes[k] for k in names[1:])
    consts = {i.name: i for i in graph.initializer}
    consts.update({n.output[0]: n.attribute[0].t for n in graph.node if n.op_type == "Constant"})
    split_name = next(i for i in scale.input if i in consts)
    splitter = onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(consts[split_name]), name=split_name)
    # the three nodes alone, on the values above, in both runtimes
    x_name = next(i for i in scale.input if i not in consts)
    vi = helper.make_tensor_value_info
    alone = helper.make_graph([scale, residual, result], "rounding", [vi(x_name, onnx.TensorProto.FLOAT, [None])],
                              [vi(result.output[0], onnx.TensorProto.FLOAT, [None])],
                              initializer=[splitter])
    model = helper.make_model(alone, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    got_ort = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {x_name: values})[0]
    core = shared_core()  # one Core per process (a second one breaks signal delivery: see shared_core)
    compiled = core.compile_model(core.read_model(model, b""), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    got_ov = compiled({x_name: values})[compiled.outputs[0]]
    assert np.array_equal(got_ort, want) and np.array_equal(got_ov, want)


@pytest.mark.slow
def test_tiny_export_is_deterministic(tiny_bundle, tmp_path):
    again = export.export_bundle(None, tmp_path / "again", tiny_seed=0, log=lambda *_: None)
    a = json.loads((tiny_bundle / "manifest.json").read_text())["source"]["weights_sha256"]
    b = json.loads((again / "manifest.json").read_text())["source"]["weights_sha256"]
    assert a == b


def test_missing_checkpoint_directory(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        validate_checkpoint(tmp_path / "nope")


def test_partial_checkpoint_names_the_missing_shard(tiny_bundle, tmp_path):
    ck = tmp_path / "ck"
    shutil.copytree(tiny_bundle / "source", ck)
    (ck / "model.safetensors").rename(ck / "model-00001-of-00002.safetensors")
    (ck / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    with pytest.raises(CheckpointError, match="model-00002-of-00002.safetensors is missing"):
        validate_checkpoint(ck)


def test_other_model_type_is_refused(tiny_bundle, tmp_path):
    ck = tmp_path / "ck"
    shutil.copytree(tiny_bundle / "source", ck)
    cfg = json.loads((ck / "config.json").read_text())
    cfg["model_type"] = "sam2_video"
    (ck / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="'sam2_video'"):
        validate_checkpoint(ck)


def test_cli_reports_bad_input_in_one_line(tmp_path):
    out = subprocess.run([sys.executable, "-m", "graphs.export", "--checkpoint", str(tmp_path / "missing"),
                          "--out", str(tmp_path / "b")], capture_output=True, text=True)
    assert out.returncode == 2
    assert "does not exist" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "b").exists()


def test_unwritable_output_directory(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(export.ExportError, match="cannot write the bundle"):
        export.export_bundle(None, blocker / "bundle", tiny_seed=0, log=lambda *_: None)


def test_failed_export_leaves_nothing_that_looks_like_a_bundle(tmp_path, monkeypatch):
    real = export._export_graph
    calls = []

    def fail_on_third(*args, **kwargs):
        calls.append(args[1])
        if len(calls) == 3:
            raise KeyboardInterrupt  # an interrupted export, mid-way
        return real(*args, **kwargs)

    monkeypatch.setattr(export, "_export_graph", fail_on_third)
    with pytest.raises(KeyboardInterrupt):
        export.export_bundle(None, tmp_path / "bundle", tiny_seed=0, log=lambda *_: None)
    assert list(tmp_path.iterdir()) == []


def test_existing_bundle_is_kept_without_overwrite(tiny_bundle):
    with pytest.raises(export.ExportError, match="already exists"):
        export.export_bundle(None, tiny_bundle, tiny_seed=0, log=lambda *_: None)


@pytest.mark.slow
def test_fp16_graphs_export_and_stay_close(tiny_bundle, tmp_path):
    out = export.export_bundle(Path(tiny_bundle) / "source", tmp_path / "half",
                               fp16=("memory_encoder", "mask_init", "propagation_decoder"), log=lambda *_: None)
    m = json.loads((out / "manifest.json").read_text())
    assert m["graphs"]["mask_init"]["precision"] == "fp16" and m["graphs"]["text_encoder"]["precision"] == "fp32"
    rows = run_checks(out, checkpoint=Path(tiny_bundle) / "source", graphs=["memory_encoder", "mask_init", "propagation_decoder"],
                      log=lambda *_: None)
    assert rows and all(r.ok for r in rows), [(r.case, r.output, r.rel) for r in rows if not r.ok]


def test_check_rows_print_the_criterion_that_decides_them():
    # A bf16-rounded output one rounding step off: rel can exceed 2**-7, yet the step rule passes it.
    within = Row("memory_encoder", "N=8", "maskmem_features", 1.56e-2, 1.56e-2, None,
                 criterion=BF16_CRITERION, criterion_met=True)
    assert within.ok
    assert "1 bf16 step ok" in within.line() and "8e-03" not in within.line()
    beyond = Row("memory_encoder", "N=8", "maskmem_features", 1e-3, 1e-4, None, "beyond one bf16 step",
                 criterion=BF16_CRITERION, criterion_met=False)
    assert not beyond.ok and "1 bf16 step OVER" in beyond.line()
    # Numeric tolerances print the bound that decided.
    assert Row("g", "c", "o", 1.0, 5e-5, 1e-4).line().endswith("1e-04 ok")
    assert "1e-04 OVER" in Row("g", "c", "o", 1.0, 2e-4, 1e-4).line()
    assert not Row("g", "c", "o", float("inf"), float("inf"), 0.0, "FAIL shape (1,) != (2,)").ok


@pytest.mark.slow
def test_int8_graphs_export_and_stay_close(tiny_bundle, tmp_path):
    """--int8: weight MatMuls become dynamically quantised (int8 weights), inputs and outputs keep
    float32, and graphs.check holds them to the int8 bound (their real cost is measured end to end)."""
    import onnx

    out = export.export_bundle(Path(tiny_bundle) / "source", tmp_path / "int8",
                               int8=("backbone", "memory_encoder"), log=lambda *_: None)
    m = json.loads((out / "manifest.json").read_text())
    assert m["graphs"]["backbone"]["precision"] == "int8"
    assert m["graphs"]["propagation_decoder"]["precision"] == "fp32"
    ops = {n.op_type for n in onnx.load(str(out / "backbone.onnx")).graph.node}
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= ops
    assert m["graphs"]["backbone"]["inputs"] == json.loads(
        (Path(tiny_bundle) / "manifest.json").read_text())["graphs"]["backbone"]["inputs"]
    rows = run_checks(out, checkpoint=Path(tiny_bundle) / "source", graphs=["backbone", "memory_encoder"],
                      log=lambda *_: None)
    assert rows and all(r.ok for r in rows), [(r.case, r.output, r.rel) for r in rows if not r.ok]
    with pytest.raises(export.ExportError, match="both --fp16 and --int8"):
        export.export_bundle(None, tmp_path / "x", tiny_seed=0, fp16=("backbone",), int8=("backbone",),
                             log=lambda *_: None)


def test_attention_is_fused_by_default_and_plain_on_request(tiny_bundle, tiny_plain_bundle):
    """The default bundle runs memory attention as com.microsoft MultiHeadAttention; --attention plain
    gives standard ops only (what ATC parses) with the same results; each manifest says which."""
    import onnx

    for bundle, mode in ((tiny_bundle, "fused"), (tiny_plain_bundle, "plain")):
        m = json.loads((Path(bundle) / "manifest.json").read_text())
        assert m["exporter"]["attention"] == mode
        for name in ("propagation_decoder", "interactive_decoder"):
            assert m["graphs"][name]["attention"] == mode
            domains = {n.domain for n in onnx.load(str(Path(bundle) / f"{name}.onnx")).graph.node}
            assert ("com.microsoft" in domains) == (mode == "fused"), (name, domains)
        assert m["graphs"]["memory_encoder"]["attention"] == "plain"  # convolutions only
    # the plain export is in ATC's forms (graphs/onnx_rewrites.py): no unsupported Einsum, no shape-only If
    ops = {name: {n.op_type for n in onnx.load(str(Path(tiny_plain_bundle) / f"{name}.onnx")).graph.node}
           for name in ("backbone", "grounding_head")}
    assert "If" not in ops["backbone"] and "Einsum" not in ops["grounding_head"] and "MatMul" in ops["grounding_head"]
    assert "Einsum" in {n.op_type for n in onnx.load(str(Path(tiny_bundle) / "grounding_head.onnx")).graph.node}
    # ... and graphs.check holds the rewritten graphs against the torch modules as any other
    rows = run_checks(tiny_plain_bundle, graphs=["propagation_decoder", "interactive_decoder", "backbone",
                                                 "grounding_head"], log=lambda *_: None)
    assert rows and all(r.ok for r in rows), [(r.case, r.output, r.rel) for r in rows if not r.ok]
    assert {r.graph for r in rows} >= {"backbone", "grounding_head"}
    with pytest.raises(export.ExportError, match="--attention 'flash'"):
        export.export_bundle(None, Path(tiny_bundle).parent / "never", tiny_seed=0, attention="flash",
                             log=lambda *_: None)


def test_the_atc_rewrites_keep_values_and_keep_ifs_that_depend_on_a_varying_axis():
    """graphs/onnx_rewrites.py on small graphs: Einsum bqc,bchw->bqhw as MatMul gives einsum's values at
    two sizes; an If on a fixed dim is folded to its branch, one on a symbolic (varying) dim is kept."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from graphs.onnx_rewrites import einsum_as_matmul, fold_shape_only_ifs

    f = TensorProto.FLOAT
    einsum = helper.make_model(helper.make_graph(
        [helper.make_node("Einsum", ["q", "m"], ["y"], equation="bqc,bchw->bqhw")], "e",
        [helper.make_tensor_value_info("q", f, ["b", "q", 4]), helper.make_tensor_value_info("m", f, ["b", 4, 5, 6])],
        [helper.make_tensor_value_info("y", f, None)]), opset_imports=[helper.make_opsetid("", 17)])
    assert einsum_as_matmul(einsum) == 1 and "Einsum" not in {n.op_type for n in einsum.graph.node}
    session = ort.InferenceSession(einsum.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for b, q in ((1, 3), (2, 7)):
        qv, mv = rng.standard_normal((b, q, 4)).astype(np.float32), rng.standard_normal((b, 4, 5, 6)).astype(np.float32)
        np.testing.assert_allclose(session.run(None, {"q": qv, "m": mv})[0], np.einsum("bqc,bchw->bqhw", qv, mv),
                                   rtol=1e-5, atol=1e-5)

    def branch(value):
        return helper.make_graph([helper.make_node("Constant", [], ["r"], value=helper.make_tensor(
            "v", f, [1], [value]))], "b", [], [helper.make_tensor_value_info("r", f, [1])])

    def guarded(dim: int):
        nodes = [helper.make_node("Shape", ["x"], ["s"]),
                 helper.make_node("Gather", ["s", "k"], ["d"], axis=0),
                 helper.make_node("Greater", ["d", "three"], ["c"]),
                 helper.make_node("If", ["c"], ["y"], then_branch=branch(1.0), else_branch=branch(2.0))]
        inits = [helper.make_tensor("k", TensorProto.INT64, [], [dim]), helper.make_tensor("three", TensorProto.INT64, [], [3])]
        return helper.make_model(helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", f, ["n", 8])],
                                                   [helper.make_tensor_value_info("y", f, [1])], inits),
                                 opset_imports=[helper.make_opsetid("", 17)])

    fixed = guarded(1)  # x.shape[1] = 8 > 3 at every size: the then branch
    assert fold_shape_only_ifs(fixed) == 1 and "If" not in {n.op_type for n in fixed.graph.node}
    onnx.checker.check_model(fixed)
    out = ort.InferenceSession(fixed.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": np.zeros((5, 8), np.float32)})[0]
    assert out.tolist() == [1.0]
    varying = guarded(0)  # x.shape[0] is the symbolic n: the branch depends on the size a call runs at
    assert fold_shape_only_ifs(varying) == 0 and "If" in {n.op_type for n in varying.graph.node}


def test_the_bf16_criterion_allows_one_rounding_step_or_fp32_noise_and_nothing_more():
    """graphs.check's rule for bf16-rounded outputs (maskmem_features): within one bf16 step of the
    reference, or within the fp32 bound (1e-4 of the largest value) where a step is smaller than that."""
    import numpy as np

    from graphs.comparison import FP32_TOL, within_one_bf16_step

    ref = np.array([8.0, 1.0, 0.01, -0.0035], np.float32)
    assert within_one_bf16_step(ref.copy(), ref)
    one_step = ref.copy()
    one_step[0] += 2.0 ** -4  # the bf16 step at 8 is 2**(3-7)
    assert within_one_bf16_step(one_step, ref)
    two_steps = ref.copy()
    two_steps[0] += 2.0 ** -3
    assert not within_one_bf16_step(two_steps, ref)
    noise = ref.copy()
    noise[3] += 0.9 * FP32_TOL * 8.0  # fp32 noise near zero, many bf16 steps there
    assert within_one_bf16_step(noise, ref)
    noise[3] += 0.2 * FP32_TOL * 8.0
    assert not within_one_bf16_step(noise, ref)
