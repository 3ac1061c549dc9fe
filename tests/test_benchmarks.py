"""Smoke test of the benchmark tool (python -m benchmarks.run) at the tiny size: it runs end to end and
writes what it promises. No timing is asserted: the tool measures, the test only checks its outputs."""

from __future__ import annotations

import json

import pytest

from benchmarks.measure import ExclusiveTimer, bf16_cpu, count_overrides, patched
from benchmarks.graph_speed import main as graph_speed_main
from benchmarks.run import main

pytestmark = pytest.mark.slow  # the full tier: the benchmark tools end to end


def test_benchmark_tool_runs_at_tiny_size(tiny_bundle, tmp_path):
    import torch

    threads = torch.get_num_threads()
    out = tmp_path / "out"
    assert main(["--preset", "tiny", "--bundle", str(tiny_bundle), "--objects", "1,2", "--frames", "2", "--reps", "1",
                 "--warmup-frames", "1", "--threads", "1", "--variants", "ort-fp32,openvino-bf16,ort-int8,auto", "--fidelity-frames", "2",
                 "--reference-bf16",
                 "--rss-frames", "3", "--rss-every", "2", "--rss-objects", "2", "--out", str(out),
                 "--cache", str(tmp_path / "cache")]) == 0
    # --threads 1 set torch's process-wide thread count for the reference; it is put back (the parity
    # tests after this one in the same process compare against a reference run at the default count)
    assert torch.get_num_threads() == threads
    for name in ("results.json", "results.md", "ms_per_frame.png", "breakdown.png"):
        assert (out / name).stat().st_size > 0, name
    r = json.loads((out / "results.json").read_text())
    assert r["preset"] == "tiny" and r["settings"]["objects"] == [1, 2]
    for key in ("machine", "settings", "variants", "count_notes", "overrides", "summary", "runs", "ratios", "slopes",
                "fidelity", "rss"):
        assert key in r, key
    assert set(r["machine"]["versions"]) >= {"onnxruntime", "openvino", "torch", "transformers"}
    for side in ("ort-fp32", "reference"):
        assert set(r["summary"][side]) == {"1", "2"}
        for n in ("1", "2"):
            entry = r["summary"][side][n]
            assert entry["ms"]["median"] > 0 and entry["parts_ms"]
            tracked = [c for rep in entry["tracked"] for c in rep]
            assert len(tracked) == 2  # 1 repetition of 2 frames
            # the counts asked for, or the run says they differ
            assert entry["counts_ok"] == all(c == int(n) for c in tracked)
            assert entry["counts_ok"] or "differ" in (out / "results.md").read_text()
        assert len(r["runs"][side]["1"][0]) == 2
    ours = r["summary"]["ort-fp32"]["2"]
    assert any(k.startswith("graph:") for k in ours["parts_ms"]) and "python" in ours["parts_ms"]
    assert {"host_to_device_bytes", "device_to_host_bytes"} <= set(ours["transfers"])
    assert set(r["ratios"]["ort-fp32"]) == {"1", "2"}
    assert "ms_per_object" in r["slopes"]["reference"]
    for name in ("openvino-bf16", "ort-int8"):  # measured, or unavailable with the reason
        v = r["variants"][name]
        assert (v["available"] and name in r["summary"]) or (not v["available"] and v["reason"]), v
        if v["available"]:  # thresholds from the variant's own first-frame scores, by the same rule
            own = r["variant_first_frame_scores"][name]
            for n in ("1", "2"):
                t = r["overrides"][n][name]["score_threshold_detection"]
                assert own[int(n) - 1] > t >= own[int(n)] or own[int(n) - 1] == own[int(n)], (name, n, t, own[:3])
    # the reference under autocast bf16: timed beside the others with its own thresholds, or why not
    asked = r["reference_bf16"]
    assert asked["available"] == (bf16_cpu() is None) and asked["available"] == ("reference-bf16" in r["summary"])
    if asked["available"]:
        own = r["reference_bf16_first_frame_scores"]
        assert set(r["summary"]["reference-bf16"]) == {"1", "2"} and set(r["bf16_ratios"]["ort-fp32"]) == {"1", "2"}
        for n in ("1", "2"):
            t = r["overrides"][n]["reference-bf16"]["score_threshold_detection"]
            assert own[int(n) - 1] > t >= own[int(n)] or own[int(n) - 1] == own[int(n)], (n, t, own[:3])
    assert "best against best" in (out / "results.md").read_text()
    # the default path (backend="auto"; the suite pins it to onnxruntime, conftest.py) and what it took
    assert r["variants"]["auto"]["chose"]["backend"] == "onnxruntime" and "auto" in r["summary"]
    for side in ("ours", "reference"):
        rss = r["rss"][side]
        assert "error" not in rss, rss
        assert rss["frames"] == 3 and rss["peak_mb"] > 0 and [s["frames"] for s in rss["samples"]] == [0, 1, 2, 3]
    md = (out / "results.md").read_text()
    assert "| objects |" in md and "ms per extra object" in md and "RSS" in md


def test_a_reference_bf16_run_that_fails_drops_that_side_only():
    """An autocast failure (an op without a bf16 kernel, say) drops the bf16 reference with the reason; the
    fp32 reference failing still stops the run."""
    from types import SimpleNamespace

    from benchmarks.run import run_reference

    class Broken:
        bf16 = False

        def configure(self, overrides):
            self.configured = overrides

        def run(self, *args, **kwargs):
            raise RuntimeError("no bf16 kernel")

    ref, overrides = Broken(), {"reference": {"a": 1}, "reference-bf16": {"a": 2}}
    args = SimpleNamespace(prompts=["person"])
    assert run_reference(args, (ref, overrides), "reference-bf16", (None, 1, 1, None)) is None
    assert "no bf16 kernel" in ref.bf16_error and set(overrides) == {"reference"} and ref.bf16 is False
    with pytest.raises(RuntimeError, match="no bf16 kernel"):
        run_reference(args, (ref, overrides), "reference", (None, 1, 1, None))


def test_the_bundle_cache_key_changes_with_any_exporter_source(tmp_path, monkeypatch):
    """A cached benchmark bundle is reused only for the same exporter: a change to a family's graphs
    (graphs/sam3/modules.py) must give a new key, or the benchmark measures the old graphs."""
    from benchmarks import bundles

    for rel in ("graphs/export.py", "graphs/sam3/modules.py", "graphs/sam31/tracker_graphs.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x = 1\n")
    monkeypatch.setattr(bundles, "REPO", tmp_path)
    keys = {bundles.exporter_hash()}
    for rel in ("graphs/sam3/modules.py", "graphs/sam31/tracker_graphs.py", "graphs/export.py"):
        (tmp_path / rel).write_text("x = 2\n")
        keys.add(bundles.exporter_hash())
    assert len(keys) == 4


def test_count_overrides_pick_a_threshold_between_the_nth_and_next_score():
    scores = [0.9, 0.8, 0.5, 0.4]
    overrides, note = count_overrides(scores, 2)
    assert overrides["max_num_objects"] == 2 and overrides["hotstart_delay"] == 0
    assert overrides["score_threshold_detection"] == overrides["new_det_thresh"] == pytest.approx(0.65)
    overrides, note = count_overrides(scores, 6)  # more than there are: every detection, and a warning
    assert overrides["score_threshold_detection"] == pytest.approx(0.2) and "warning" in note


def test_timer_counts_nested_calls_exclusively_and_patches_are_undone():
    class Thing:
        def outer(self):
            return self.inner() + 1

        def inner(self):
            return 1

    thing, timer = Thing(), ExclusiveTimer()
    with patched(timer, [(thing, "outer", "outer"), (thing, "inner", "inner")]):
        assert thing.outer() == 2
    assert timer.calls == {"outer": 1, "inner": 1}
    assert "outer" not in vars(thing) and "inner" not in vars(thing)  # back to the class's methods


def test_graph_speed_tool_runs_at_tiny_size(tiny_bundle, tmp_path, capsys):
    """python -m benchmarks.graph_speed: every (runtime, graph, count) timed, a slope per graph, MatMul GFLOPS."""
    out = tmp_path / "rows.json"
    assert graph_speed_main(["--bundles", str(tiny_bundle), "--objects", "1,2", "--reps", "1", "--threads", "1",
                             "--matmul", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    keys = {(row["runtime"], row["graph"], row["objects"]) for row in r["rows"]}
    assert keys == {(rt, g, n) for rt in ("ort", "ov-f32", "ov-bf16", "ov-f32-static", "ov-bf16-static")
                    for g in ("propagation_decoder", "memory_encoder")
                    for n in (1, 2)}
    assert all(row["median_ms"] > 0 and "ms_per_object" in row for row in r["rows"])
    assert isinstance(r["matmul"]["gflops"]["ort"], float)
    assert "ms/extra object" in capsys.readouterr().out


def test_graph_speed_fills_sam31_buckets_of_16():
    """SAM 3.1 decoder inputs: ceil(N / 16) buckets, the first N slots valid, each bucket its own pool rows."""
    from benchmarks.graph_speed import graph_inputs

    def t(name, dtype, *shape):
        return {"name": name, "dtype": dtype, "shape": list(shape)}

    manifest = {"family": "sam3.1", "config": {"geometry": {"grid": 4}}, "graphs": {"propagation_decoder": {"inputs": [
        t("tracker_feat", "float32", 1, 8, 4, 4), t("memory_pool", "float32", "memory_rows", 16, 8),
        t("image_pool", "float32", "image_rows", 16, 8), t("pointer_pool", "float32", "pointer_rows", 16, 8),
        t("memory_index", "int32", "buckets", "memories"), t("memory_valid", "float32", "buckets", "memories"),
        t("pointer_index", "int32", "buckets", "pointers"), t("slot_valid", "float32", "buckets", 16)]}}}
    for n, buckets in ((1, 1), (16, 1), (17, 2), (128, 8)):
        feeds = graph_inputs(manifest, "propagation_decoder", n, memories=3, pointers=2)
        assert feeds["slot_valid"].shape == (buckets, 16) and feeds["slot_valid"].sum() == n
        assert feeds["memory_pool"].shape[0] == buckets * 3 and feeds["pointer_pool"].shape[0] == buckets * 2
        assert sorted(feeds["memory_index"].ravel()) == list(range(buckets * 3))
        assert feeds["memory_valid"].all()


def test_sam31_benchmark_report_states_ratios_counts_and_calls():
    from benchmarks.sam31 import _calls, report, threshold

    assert threshold([0.9, 0.8, 0.7], 2) == pytest.approx(0.75)
    with pytest.raises(SystemExit, match="3 detections; 3 objects need 4"):
        threshold([0.9, 0.8, 0.7], 3)
    run31 = {"frame_calls": [{"backbone": 1}, {"backbone": 1, "propagation_decoder": 1}], "frame_objects": [0, 17]}
    assert _calls(run31) == {"backbone": 1.0, "propagation_decoder": 0.5}

    def side(ms, objects, calls):
        return {"ms_per_frame": {"median": ms, "min": ms, "max": ms}, "objects_per_frame": objects,
                "calls_per_frame": calls}

    results = {"command": "python -m benchmarks.sam31", "started": "now", "frames": 3, "clip": "c.mp4", "text": "x",
               "reps": 1, "threads": None, "counts": {"17": {"sides": {
                   "ours 3.1": side(500.0, [17], {"propagation_decoder": 1.0}),
                   "ours 3.0": side(1000.0, [17], {"propagation_decoder": 1.0}),
                   "Meta 3.1": side(2000.0, [17], None)}}}}
    row = report(results).strip().splitlines()[-1]
    assert row == "| 17 | 500 [500-500] | 1,000 [1,000-1,000] | 2,000 [2,000-2,000] | 0.50 | 0.25 | 17 / 17 / 17 | 1 / 1 |"
    # which path ours took: auto's choice, or the backend the environment named (then not auto's)
    results["counts"]["17"]["paths"] = {"ours 3.1": "openvino"}
    assert 'ours at backend="auto": ours 3.1 ran openvino' in report(results).splitlines()[0]
    results["command"] = "SAM3TRACK_BACKEND=openvino " + results["command"]
    head = report(results).splitlines()[0]
    assert "named by SAM3TRACK_BACKEND: ours 3.1 ran openvino" in head and "auto" not in head


def _matmul_conv_model():
    """x [2, 3, 8, 8] -> Conv (4 out channels, 3x3, pad 1, groups 1, bias) -> [2, 4, 8, 8] -> Reshape [2, 4, 64]
    -> MatMul with w [64, 5] -> [2, 4, 5] -> Relu."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "k"),
             numpy_helper.from_array(np.zeros(4, np.float32), "b"),
             numpy_helper.from_array(np.array([0, 4, 64], np.int64), "shape"),
             numpy_helper.from_array(rng.standard_normal((64, 5)).astype(np.float32), "w")]
    nodes = [helper.make_node("Conv", ["x", "k", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Reshape", ["c", "shape"], ["r"]),
             helper.make_node("MatMul", ["r", "w"], ["m"]),
             helper.make_node("Relu", ["m"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("shapes", ["onnx", "run"])
def test_flop_counter_counts_a_hand_built_graph_exactly(shapes):
    """MatMul + Conv of known shapes: the exact FLOPs, whichever way the shapes are found (ONNX's inference with
    the batch dim bound from the feed, or an ONNX Runtime profile of one run)."""
    import numpy as np

    from benchmarks.flops import count_graph

    x = np.zeros((2, 3, 8, 8), np.float32)
    c = count_graph(_matmul_conv_model(), {"x": x}, shapes=shapes)
    conv = 2 * (2 * 4 * 8 * 8) * (3 * 3 * 3)  # 2 * output elements * Cin/groups * kh * kw
    matmul = 2 * (2 * 4 * 5) * 64  # 2 * M * N * K, batched over 2
    assert c.gemm == conv + matmul == 32_768
    assert c.other == 2 * 4 * 8 * 8 + 2 * 4 * 5  # the conv's bias add, the Relu
    assert c.weight_bytes == (4 * 3 * 3 * 3 + 4 + 64 * 5) * 4 + 3 * 8
    assert c.input_bytes == x.nbytes and c.output_bytes == 2 * 4 * 5 * 4
    assert c.by_op["Conv"]["gemm"] == conv and c.by_op["MatMul"]["gemm"] == matmul and not c.uncounted


def test_flop_counter_knows_conv_transpose_einsum_and_fused_attention():
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from benchmarks.flops import count_graph, node_cost

    deconv = helper.make_node("ConvTranspose", ["x", "w"], ["y"], strides=[2, 2])
    # x [1, 8, 4, 4], w [8, 6, 2, 2] -> y [1, 6, 8, 8]: every input pixel times Cout*kh*kw weights
    assert node_cost(deconv, [[1, 8, 4, 4], [8, 6, 2, 2]], [[1, 6, 8, 8]])[0] == 2 * 8 * 16 * 6 * 4
    # through a profiled run too: ONNX Runtime's profile leaves the prepacked weight out of the node's inputs
    graph = helper.make_graph([deconv], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.ones((8, 6, 2, 2), np.float32), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert count_graph(model, {"x": np.ones((1, 8, 4, 4), np.float32)}, shapes="run").gemm == 2 * 8 * 16 * 6 * 4
    einsum = helper.make_node("Einsum", ["a", "b"], ["c"], equation="bqc,bkc->bqk")
    assert node_cost(einsum, [[2, 3, 5], [2, 7, 5]], [[2, 3, 7]])[0] == 2 * 2 * 3 * 7 * 5
    mha = helper.make_node("MultiHeadAttention", ["q", "k", "v"], ["o"], domain="com.microsoft", num_heads=4)
    gemm, softmax, _ = node_cost(mha, [[2, 10, 32], [2, 30, 16], [2, 30, 32]], [[2, 10, 32]])
    assert gemm == 2 * 2 * 10 * 30 * (32 + 32) and softmax == 5 * 2 * 4 * 10 * 30


def test_roofline_tool_runs_at_tiny_size(tiny_bundle, tmp_path):
    """python -m benchmarks.roofline: every graph counted (FLOPs > 0), timed, put against the measured peaks."""
    from benchmarks.roofline import main as roofline_main

    out = tmp_path / "roof"
    assert roofline_main(["--bundle", str(tiny_bundle), "--objects", "1,2", "--reps", "1", "--threads", "1",
                          "--runtimes", "ort", "--profile-max", "1", "--profile-calls", "1",
                          "--matmul-shape", "256,256,256", "--conv-shape", "16,8,8", "--bandwidth-mib", "8",
                          "--out", str(out)]) == 0
    r = json.loads((out / "results.json").read_text())
    graphs = {"backbone", "text_encoder", "grounding_head", "propagation_decoder", "memory_encoder"}
    assert {c["graph"] for c in r["counts"]} == graphs
    assert all(c["gemm_flops"] > 0 and c["bytes"] > 0 and not c["uncounted"] for c in r["counts"])
    assert {(row["graph"], row["size"]) for row in r["rows"] if row["runtime"] == "ort"} == {
        ("backbone", 1), ("text_encoder", 1), ("grounding_head", 1), ("propagation_decoder", 1),
        ("propagation_decoder", 2), ("memory_encoder", 1), ("memory_encoder", 2)}
    assert r["bandwidth"]["gbps"] > 0 and r["conv"]["shape"] == [16, 8, 8]
    # the peak held to: the higher of the MatMul's and the convolution's by the run's clock (CPU time: one thread)
    assert r["peaks"]["ort"] == max(r["matmul"]["ort"]["cpu_gflops"], r["conv"]["ort"]["cpu_gflops"]) > 0
    for row in r["rows"]:
        assert row["achieved_gflops"] > 0 and (row["fraction"] is None or row["fraction"] > 0), row
    assert "profile" in next(row for row in r["rows"] if row["runtime"] == "ort" and row["size"] == 1)
    assert (out / "roofline.png").stat().st_size > 0 and "| graph | size | runtime |" in (out / "roofline.md").read_text()


def test_full_size_mode_runs_at_tiny_size(tiny_bundle, tmp_path):
    """python -m benchmarks.full_size (the full-size mode, issue 34) on the tiny bundle: cold and warm
    loads of ours, the reference's load, and at each count both sides in processes of their own, each
    with its first frame, timed frames and peak RSS; full.md states them with a per-object RSS slope."""
    from benchmarks.full_size import main as full_size_main

    out = tmp_path / "out"
    assert full_size_main(["--preset", "tiny", "--bundle", str(tiny_bundle), "--objects", "1,2", "--frames", "2",
                           "--threads", "1", "--out", str(out)]) == 0
    for name in ("results.json", "full.md", "scaling.png"):
        assert (out / name).stat().st_size > 0, name
    assert not (out / "compile-cache").exists()  # gigabytes at full size: removed at the end
    r = json.loads((out / "results.json").read_text())
    for kind in ("cold", "warm"):
        (load,) = r["loads"]["auto"][kind]
        assert load["load_s"] > 0 and load["peak_rss_mb"] >= load["rss_after_load_mb"] > 0, load
    assert r["loads"]["reference"]["cold"][0]["load_s"] > 0
    assert r["chose"]["auto"]["backend"] == "onnxruntime"  # the suite pins it (conftest.py)
    md = (out / "full.md").read_text()
    for side in ("auto", "reference"):
        for n in (1, 2):
            (run,) = r["runs"][side][str(n)]
            assert "error" not in run, run
            assert [f["index"] for f in run["records"]] == [0, 1] and all(f["ms"] > 0 for f in run["records"])
            assert run["peak_rss_mb"] >= run["rss_after_load_mb"] > 0
            # the count asked for on every frame, or the table says it differs
            assert all(f["tracked"] == n for f in run["records"]) or "differs from the count asked" in md
        assert f"- {side}: peak RSS grows" in md
    assert "| objects | side | first frame s |" in md and "| cold load s |" in md


def test_full_size_mode_records_a_failed_run_and_goes_on(tmp_path):
    """A child that fails (here: no bundle) is one error entry, never an exception; the report lists it
    as failed and a count never reached as not measured."""
    from benchmarks.full_size import run_child
    from benchmarks.full_size_report import markdown

    spec = {"side": "ours", "variant": "ort-fp32", "task": "load", "bundle": str(tmp_path / "none"),
            "source": str(tmp_path), "threads": 1, "overrides": {}}
    got = run_child(spec, tmp_path / "cache", timeout=600)
    assert got["error"].startswith("exit 1: ") and "none" in got["error"], got
    record = {"index": 0, "ms": 5.0, "tracked": 1}
    results = {"command": "c", "started": "s", "finished": "f", "preset": "tiny", "chose": {},
               "machine": {"cpu_short": "cpu", "cores": 2, "ram_gb": 24, "load_start": "1", "load_end": "1",
                           "versions": {}},
               "code": {"commit": "abc", "dirty": False, "graphs_hash": "h"},
               "bundle": {"graphs_gb": 0.1, "export_seconds": None, "parameters": 1e6},
               "settings": {"objects": [1, 64, 128], "frames": 2, "reps": 1, "threads": 1, "clip": "c.mp4",
                            "start_frame": 0, "prompts": ["x"], "variants": ["auto"]},
               "loads": {"auto": {"cold": [got]}},
               "runs": {"auto": {"1": [{"load_s": 1.0, "rss_after_load_mb": 90.0, "peak_rss_mb": 100.0,
                                        "records": [record, {**record, "index": 1}]}],
                                 "64": [{"error": "killed by SIGKILL (the kernel's out-of-memory killer, most likely)"}]}}}
    md = markdown(results, image="x.png")
    assert "| 64 | auto | failed: killed by SIGKILL" in md
    assert "| 128 | auto | not measured" in md and "| 1 | reference | not measured" in md
    assert "| auto | failed: exit 1: " in md
    results["failed"] = {"reference": "first-frame scores: killed by SIGKILL"}
    assert "| 1 | reference | not measured: first-frame scores: killed by SIGKILL |" in markdown(results, image="x.png")


def test_memory_phases_tool_reports_each_phase_and_each_graph(tiny_bundle, capsys):
    """python -m benchmarks.memory_phases (docs/speed.md, "Memory at full size") on the tiny bundle: RSS and
    peak after the load, the prompt and each frame; per graph, its calls and what they took."""
    from benchmarks.memory_phases import main as memory_main

    assert memory_main([str(tiny_bundle), "--frames", "2", "--per-graph", "--release-text-encoder", "yes"]) == 0
    r = json.loads(capsys.readouterr().out)
    for phase in ("after_load", "after_prompt", "frame0", "frame1", "after_close"):
        assert r[phase]["VmHWM"] >= r[phase]["VmRSS"] > 0, phase
    assert len(r["seconds_per_frame"]) == 2 and r["graph_seconds"]["backbone"] > 0
    assert r["per_graph"]["backbone"]["calls"] == 2 and r["per_graph"]["text_encoder"]["calls"] == 1
    assert r["frame0"]["text_encoder_open"] is False  # released: freed once the frame's graphs ran
    assert all({"peak_rise_mb", "left_mb"} <= set(g) for g in r["per_graph"].values())
    assert memory_main([str(tiny_bundle), "--frames", "2", "--video", "--set", "max_num_objects=1"]) == 0
    r = json.loads(capsys.readouterr().out)  # a video session: a result per frame, at most the one object asked
    assert len(r["seconds_per_frame"]) == 2 and r["frame1"]["objects"] <= 1
