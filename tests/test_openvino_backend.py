"""The OpenVINO backend (sam3track/backends/openvino.py): the backend contract on small graphs written
here, its options and errors, and the tiny bundle through it against ONNX Runtime and transformers.

openvino is a test dependency (the `test` extra): without it these tests fail, never skip.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import signal
import sys
from pathlib import Path

import numpy as np
import openvino as ov  # noqa: F401  a missing openvino fails this module, never skips it
import pytest
from onnx import TensorProto, helper

import sam3track
from sam3track.backends import create_backend
from sam3track.backends import openvino as ov_backend
from sam3track.backends import openvino_rows as ov_rows
from sam3track.errors import BackendError, BundleError, CapacityError, Sam3TrackError
from sam3track.video import open_video

from .conftest import CLIPS, CPU_ISA, REPO, rounding_xfail, run_child

F32 = TensorProto.FLOAT
HAS_BF16 = "BF16" in ov_backend.cpu_capabilities()


# ---------------------------------------------------------------------------------- small graphs
def _save(path, nodes, inputs, outputs, initializers=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    path.write_bytes(model.SerializeToString())
    return str(path)


def batch_graph(tmp_path):
    """x [N, 4], bias [4] -> y = 2x + bias [N, 4], score = sum(x) [N, 1], n = shape(x) int64 [2]."""
    two = helper.make_tensor("two", F32, [], [2.0])
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [1])
    return _save(tmp_path / "batch.onnx", [
        helper.make_node("Mul", ["x", "two"], ["x2"]),
        helper.make_node("Add", ["x2", "bias"], ["y"]),
        helper.make_node("ReduceSum", ["x", "axes"], ["score"], keepdims=1),
        helper.make_node("Shape", ["x"], ["n"]),
    ], [helper.make_tensor_value_info("x", F32, ["objects", 4]), helper.make_tensor_value_info("bias", F32, [4])],
        [helper.make_tensor_value_info("y", F32, ["objects", 4]),
         helper.make_tensor_value_info("score", F32, ["objects", 1]),
         helper.make_tensor_value_info("n", TensorProto.INT64, [2])], [two, axes])


def pool_graph(tmp_path):
    """pool [R, 4], index int32 [N] -> picked = pool[index] + 1 [N, 4]: reads the pool it may write into."""
    one = helper.make_tensor("one", F32, [], [1.0])
    return _save(tmp_path / "pool.onnx", [
        helper.make_node("Gather", ["pool", "index"], ["g"], axis=0),
        helper.make_node("Add", ["g", "one"], ["picked"]),
    ], [helper.make_tensor_value_info("pool", F32, ["rows", 4]),
        helper.make_tensor_value_info("index", TensorProto.INT32, ["objects"])],
        [helper.make_tensor_value_info("picked", F32, ["objects", 4])], [one])


def _rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.fixture
def backend():
    b = create_backend("openvino", "cpu")
    yield b
    b.close()


# ---------------------------------------------------------------------------------------- tensors
def test_tensor_ops_views_and_transfers(backend):
    a = _rand(5, 3)
    t = backend.upload(a)
    np.testing.assert_array_equal(backend.to_host(t), a)
    z = backend.zeros((4, 3), np.float32)
    np.testing.assert_array_equal(backend.to_host(z), np.zeros((4, 3), np.float32))
    e = backend.empty((2, 3), np.float32)
    backend.copy(backend.rows(t, 1, 2), e)  # from a view
    np.testing.assert_array_equal(backend.to_host(e), a[1:3])
    backend.copy(e, backend.rows(z, 2, 2))  # into a view: the parent sees it (shared memory)
    np.testing.assert_array_equal(backend.to_host(z)[2:4], a[1:3])
    np.testing.assert_array_equal(backend.to_host(z)[:2], 0)
    np.testing.assert_array_equal(backend.to_host(backend.reshape(t, (15,))), a.reshape(15))
    flat = backend.reshape(t, (15, 1))
    np.testing.assert_array_equal(backend.to_host(backend.rows(flat, 3, 2))[:, 0], a.reshape(15)[3:5])
    assert backend.live_allocations == 3
    ints = backend.upload(np.arange(6, dtype=np.int32).reshape(3, 2))
    flags = backend.upload(np.array([True, False, True]))
    np.testing.assert_array_equal(backend.to_host(backend.rows(ints, 1, 2)), [[2, 3], [4, 5]])
    assert backend.to_host(flags).dtype == np.bool_ and backend.to_host(flags).tolist() == [True, False, True]

    before = backend.transfers.snapshot()
    picked = backend.to_host(t, rows=np.array([4, 0, 2]))
    np.testing.assert_array_equal(picked, a[[4, 0, 2]])
    moved = backend.transfers.since(before)
    assert (moved.device_to_host, moved.device_to_host_bytes) == (1, 3 * 3 * 4)  # one copy, only those rows
    assert backend.to_host(t, rows=np.array([], np.int64)).shape == (0, 3)
    before = backend.transfers.snapshot()
    backend.upload(np.zeros((2, 2), np.float32))
    assert backend.transfers.since(before).host_to_device_bytes == 16


def test_to_host_returns_memory_the_caller_owns(backend):
    t = backend.upload(np.ones((2, 2), np.float32))
    out = backend.to_host(t)
    out[:] = 7
    rows = backend.to_host(t, rows=np.array([1]))
    rows[:] = 8
    np.testing.assert_array_equal(backend.to_host(t), np.ones((2, 2)))


def test_free_and_use_after_free(backend):
    t = backend.upload(_rand(4, 2))
    view = backend.rows(t, 1, 2)
    live = backend.live_allocations
    backend.free(t)
    assert backend.live_allocations == live - 1
    for call in (lambda: backend.to_host(view), lambda: backend.to_host(t),
                 lambda: backend.copy(backend.zeros((2, 2), np.float32), view)):
        with pytest.raises(BackendError, match="after it was freed"):
            call()
    backend.free(t)  # a second free is a no-op
    with pytest.raises(BackendError, match="outside a tensor of 4 rows"):
        backend.rows(backend.zeros((4, 2), np.float32), 3, 2)


# --------------------------------------------------------------------------------------------- run
def test_dynamic_shapes_run_at_each_size_without_recompiling(backend, tmp_path):
    graph = backend.load("batch", batch_graph(tmp_path))
    assert graph.input_names == ("x", "bias") and graph.output_names == ("y", "score", "n")
    assert graph.shapes["x"] == (None, 4) and graph.shapes["bias"] == (4,)
    assert backend.plan(graph, "objects", 3) == 3  # no gears: every call at its own size
    bias = backend.upload(_rand(4, seed=9))
    for n in (3, 1, 5, 3):
        x = _rand(n, 4, seed=n)
        out = backend.run(graph, {"x": x, "bias": bias})
        assert out["y"].shape == (n, 4) and out["score"].shape == (n, 1)
        np.testing.assert_allclose(backend.to_host(out["y"]), 2 * x + backend.to_host(bias), rtol=1e-6)
        np.testing.assert_allclose(backend.to_host(out["score"])[:, 0], x.sum(1), rtol=1e-5)
        assert backend.to_host(out["n"]).tolist() == [n, 4]
    assert backend.calls["batch"] == 4 and backend.seconds["batch"] > 0
    assert list(backend.compile_seconds) == ["batch"]  # compiled once, at load
    with pytest.raises(Sam3TrackError, match="graph batch needs input 'bias'"):
        backend.run(graph, {"x": _rand(2, 4)})
    with pytest.raises(BackendError, match="openvino failed running graph batch"):
        backend.run(graph, {"x": _rand(2, 3), "bias": bias})



def test_static_shapes_compile_once_per_shape_and_give_the_same_results(tmp_path):
    """shapes="static": a graph is compiled at first use for each distinct set of input shapes, the
    compiled model reused when those shapes come again, the least recently used dropped past the cap."""
    b = create_backend("openvino", "cpu", shapes="static")
    graph = b.load("batch", batch_graph(tmp_path))
    assert graph.compiled is None and not graph.static  # nothing compiled before the first call
    assert graph.model is None and graph.keep_static == ov_backend.MAX_STATIC_SHAPES_UNCACHED  # no cache: more kept
    graph.keep_static = 3
    bias = b.upload(_rand(4, seed=9))
    seen = {}
    for n in (3, 1, 5, 3):
        x = _rand(n, 4, seed=n)
        out = b.run(graph, {"x": x, "bias": bias})
        np.testing.assert_allclose(b.to_host(out["y"]), 2 * x + b.to_host(bias), rtol=1e-6)
        np.testing.assert_allclose(b.to_host(out["score"])[:, 0], x.sum(1), rtol=1e-5)
        assert b.to_host(out["n"]).tolist() == [n, 4]
        entry = graph.static[((n, 4), (4,))]
        assert seen.setdefault(n, entry) is entry  # the second call at 3 rows reuses its compiled model
        assert entry[0].inputs[0].get_partial_shape().is_static
    assert list(graph.static) == [((1, 4), (4,)), ((5, 4), (4,)), ((3, 4), (4,))]  # least recently used first
    pool = b.zeros((8, 4), np.float32)  # outputs into a pool view, as in dynamic mode
    x = _rand(2, 4, seed=5)
    b.run(graph, {"x": x, "bias": np.zeros(4, np.float32)}, {"y": b.rows(pool, 3, 2)})
    np.testing.assert_allclose(b.to_host(pool)[3:5], 2 * x, rtol=1e-6)
    graph.keep_static = 2
    b.run(graph, {"x": _rand(7, 4), "bias": bias})
    assert list(graph.static) == [((2, 4), (4,)), ((7, 4), (4,))]
    b.close()
    assert not graph.static
    with pytest.raises(BackendError, match="closed"):
        b.run(graph, {"x": _rand(3, 4), "bias": bias})
    with pytest.raises(Sam3TrackError, match="unknown shapes 'fixed' for openvino; use one of dynamic, rows, static"):
        create_backend("openvino", "cpu", shapes="fixed")
    with pytest.raises(Sam3TrackError, match="shapes= is an openvino option"):
        create_backend("onnxruntime", "cpu", shapes="static")


def points_graph(tmp_path):
    """x [N, P] -> total = sum over P [N, 1]: a row axis (objects) and an inner one that moves (points)."""
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [1])
    return _save(tmp_path / "points.onnx", [helper.make_node("ReduceSum", ["x", "axes"], ["total"], keepdims=1)],
                 [helper.make_tensor_value_info("x", F32, ["objects", "points"])],
                 [helper.make_tensor_value_info("total", F32, ["objects", 1])], [axes])


def test_rows_shapes_compile_a_graph_again_once_its_row_counts_settle(tmp_path, caplog):
    """shapes="rows": calls whose row counts move run on the one dynamic model; a count seen on
    ROWS_SETTLED calls in a row is compiled with the leading axes fixed and every other axis still
    dynamic, and runs there from then on; one such model is kept per graph; one row never is."""
    b = create_backend("openvino", "cpu", shapes="rows", cache_dir=tmp_path / "compiled")
    assert (ov_rows.ROWS_SETTLED, ov_rows.ROWS_MIN, ov_rows.MAX_ROW_MODELS) == (2, 2, 1)
    configs = []  # the properties of each compile, as OpenVINO gets them
    core = b._core

    class RecordingCore:
        def __getattr__(self, name):
            return getattr(core, name)

        def compile_model(self, model, device, config):
            configs.append(config)
            return core.compile_model(model, device, config)

    b._core = RecordingCore()
    graph = b.load("points", points_graph(tmp_path))

    def run(n, p, into=None):
        x = _rand(n, p, seed=10 * n + p)
        out = b.run(graph, {"x": x}, {"total": into} if into is not None else None)
        np.testing.assert_allclose(b.to_host(out["total"])[:, 0], x.sum(1), rtol=1e-5)

    for n in (3, 1, 1, 5):
        run(n, 4)
    assert b.row_compiles["points"] == 0 and not graph.rows.models  # one row twice, no other count twice
    run(5, 4)
    assert b.row_compiles["points"] == 1 and list(graph.rows.models) == [(5,)]
    compiled = graph.rows.models[(5,)][1]
    assert str(compiled.inputs[0].get_partial_shape()) == "[5,?]"  # the rows fixed, the points not
    # the fixed model without OpenVINO's snippets, as measured faster; the dynamic one as loaded. Its
    # blobs in a folder of their own: OpenVINO's blob key leaves compile properties out
    assert [c.get("SNIPPETS_MODE") for c in configs] == [None, "DISABLE"]
    loaded_cache, fixed_cache = Path(configs[0].pop("CACHE_DIR")), Path(configs[1].pop("CACHE_DIR"))
    assert configs[1] == {**configs[0], **ov_rows.FIXED_ROWS_CONFIG}
    assert fixed_cache.parent == loaded_cache and loaded_cache.parent == tmp_path / "compiled"
    assert any(fixed_cache.iterdir())  # the fixed model's blob went there
    run(5, 7)  # another number of points: the same model, no compile
    pool = b.zeros((8, 1), np.float32)
    run(5, 2, into=b.rows(pool, 2, 5))  # outputs straight into a pool view, as with dynamic shapes
    run(2, 3)  # one call at 2 rows: the dynamic model
    assert b.row_compiles["points"] == 1
    run(2, 3)
    assert b.row_compiles["points"] == 2 and list(graph.rows.models) == [(2,)]  # 5's model dropped
    for n in (5, 2, 5, 2, 5, 2):  # a count between settled calls never settles: no compile, no thrash
        run(n, 3)
    assert b.row_compiles["points"] == 2 and list(graph.rows.models) == [(2,)]
    # a graph that fails to compile with its rows fixed runs on with dynamic shapes, and says so once
    def refuse(rows):  # as the backend's compile fails: its advice to change backend, OpenVINO's words under it
        raise BundleError("openvino cannot compile graph points: no such kernel; run it with backend="
                          "'onnxruntime'") from RuntimeError("Exception from src/x.cpp:1:\nno such kernel")

    graph.rows.models.clear()
    graph.rows.compile_rows = refuse
    with caplog.at_level("WARNING", logger="sam3track"):
        for _ in range(3):
            run(4, 3)
    assert "graph points did not compile with its rows fixed at (4,) (no such kernel); it runs on" in caplog.text
    assert "onnxruntime" not in caplog.text  # the graph runs on here: no advice to change backend
    assert graph.rows.leading == () and caplog.text.count("did not compile") == 1
    b.close()
    assert graph.rows.leading == () and not graph.rows.models
    deferred = create_backend("openvino", "cpu", shapes="rows")  # a graph compiled at its first run takes part
    deferred._deferred = frozenset({"points"})
    graph = deferred.load("points", points_graph(tmp_path))
    assert graph.compiled is None
    for _ in range(3):
        deferred.run(graph, {"x": _rand(3, 4)})
    assert deferred.row_compiles["points"] == 1 and list(graph.rows.models) == [(3,)]
    deferred.close()
    plain = create_backend("openvino", "cpu")  # the default, "dynamic": one compile per graph, never again
    graph = plain.load("points", points_graph(tmp_path))
    for _ in range(3):
        plain.run(graph, {"x": _rand(3, 4)})
    assert graph.rows is None and not plain.row_compiles
    plain.close()


def test_static_gears_pad_calls_and_never_refuse_a_size(tmp_path):
    """gears= on OpenVINO: a call runs at the smallest gear that holds it; past the largest one, an axis
    the frame loop splits (objects) runs as chunks of it, and an axis one call must hold (memories) runs
    at its own size rather than being refused as on an OM bundle."""
    from sam3track.call_sizes import chunks, fixed_size, static_gears
    from sam3track.families.sam3.config import TrackerConfig

    b = create_backend("openvino", "cpu", shapes="static", gears={"objects": [1, 2, 4], "memories": [1, 2, 7]})
    graph = b.load("batch", batch_graph(tmp_path))
    assert [b.plan(graph, "objects", n) for n in (1, 3, 4, 9)] == [1, 4, 4, 4]
    assert [(c.count, c.size) for c in chunks(b, graph, "objects", 9)] == [(4, 4), (4, 4), (1, 1)]
    assert [b.plan(graph, "memories", n) for n in (2, 3, 7, 9)] == [2, 7, 7, 9]
    assert fixed_size(b, graph, "memories", 9, "frame 3", "") == 9
    assert b.plan(graph, "points", 5) == 5  # no gears: every call at its own size
    om_fixed = b.load("batch", batch_graph(tmp_path), compiled={"axes": {"memories": [10], "objects": [1, 2, 4]}})
    assert b.plan(om_fixed, "memories", 12) == 10  # an OM graph is static there: refused, as on the device
    with pytest.raises(CapacityError, match="needs 12 memories in one batch call, but the graph was compiled for"):
        fixed_size(b, om_fixed, "memories", 12, "frame 3", "")
    b.close()
    cached = create_backend("openvino", "cpu", shapes="static", cache_dir=tmp_path / "ov-cache")
    assert cached.load("batch", batch_graph(tmp_path)).keep_static == ov_backend.MAX_STATIC_SHAPES
    cached.close()
    with pytest.raises(Sam3TrackError, match="gears must be None, 'compiled' or"):
        create_backend("openvino", "cpu", gears={"objects": [0]})

    manifest = json.loads((Path(sam3track.__file__).parent / "demo_bundle" / "manifest.json").read_text())
    config = dataclasses.replace(TrackerConfig.from_manifest(manifest), num_maskmem=7, max_cond_frame_num=4,
                                 max_object_pointers_in_encoder=16, max_conditioning_frames=16)
    gears = static_gears(config)
    assert gears["memories"] == (1, 2, 4, 7, 8, 10)  # powers of two, one conditioning frame's steady state, the cap
    assert gears["pointers"] == (1, 2, 4, 8, 16, 31)
    assert gears["objects"] == (1, 2, 4, 8, 16) and "points" not in gears and "memory_rows" not in gears

def test_outputs_go_straight_into_a_pool_view(backend, tmp_path):
    graph = backend.load("batch", batch_graph(tmp_path))
    pool = backend.zeros((8, 4), np.float32)
    x = _rand(2, 4, seed=5)
    target = backend.rows(pool, 3, 2)
    out = backend.run(graph, {"x": x, "bias": np.zeros(4, np.float32)}, {"y": target})
    assert out["y"] is target
    expected = np.zeros((8, 4), np.float32)
    expected[3:5] = 2 * x
    np.testing.assert_allclose(backend.to_host(pool), expected, rtol=1e-6)
    # the output tensor of the run is the view's memory (OpenVINO wrote there), not a copy made afterwards
    storage, offset = target.handle
    assert graph.request.get_output_tensor(0).data.ctypes.data == storage.tensor.data.ctypes.data + offset
    for rows in (3, 1):  # a view that the output would not fill exactly is an error, never a partial write
        with pytest.raises(BackendError, match="output y is|failed running graph batch"):
            backend.run(graph, {"x": x, "bias": np.zeros(4, np.float32)}, {"y": backend.rows(pool, 0, rows)})


def test_a_graph_writes_into_the_pool_it_reads(backend, tmp_path):
    """As propagation_decoder writes object pointers into rows of the pool it gathers from: rows it
    does not write are left alone, and the input is read before the output lands."""
    graph = backend.load("pool", pool_graph(tmp_path))
    start = _rand(6, 4, seed=3)
    pool = backend.upload(start)
    out = backend.run(graph, {"pool": pool, "index": np.array([0, 1], np.int32)}, {"picked": backend.rows(pool, 4, 2)})
    after = backend.to_host(pool)
    np.testing.assert_array_equal(after[:4], start[:4])
    np.testing.assert_allclose(after[4:], start[:2] + 1, rtol=1e-6)
    assert out["picked"].shape == (2, 4)


def test_results_never_alias_memory_a_later_run_writes(backend, tmp_path):
    graph = backend.load("batch", batch_graph(tmp_path))
    zero = np.zeros(4, np.float32)
    first = backend.run(graph, {"x": np.ones((2, 4), np.float32), "bias": zero})
    kept = backend.to_host(first["y"])
    second = backend.run(graph, {"x": first["y"], "bias": zero})  # a result fed back into the same graph
    np.testing.assert_array_equal(backend.to_host(first["y"]), kept)
    np.testing.assert_array_equal(backend.to_host(second["y"]), 2 * kept)
    backend.run(graph, {"x": np.full((2, 4), 5, np.float32), "bias": zero})
    np.testing.assert_array_equal(backend.to_host(first["y"]), kept)
    backend.free(first["y"])  # allowed on a result
    with pytest.raises(BackendError, match="freed"):
        backend.to_host(first["y"])


def test_close_releases_everything_and_later_use_raises(tmp_path):
    b = create_backend("openvino", "cpu")
    graph = b.load("batch", batch_graph(tmp_path))
    kept = [b.upload(_rand(3, 4)), b.zeros((5, 4), np.float32)]
    kept.append(b.run(graph, {"x": _rand(3, 4), "bias": np.zeros(4, np.float32)})["y"])
    assert b.live_allocations >= 3
    b.close()
    gc.collect()
    assert b.live_allocations == 0 and graph.request is None
    for call in (lambda: b.upload(np.zeros(3, np.float32)), lambda: b.empty((2,), np.float32),
                 lambda: b.zeros((2,), np.float32), lambda: b.to_host(kept[0]),
                 lambda: b.copy(kept[0], kept[0]), lambda: b.load("batch", batch_graph(tmp_path)),
                 lambda: b.run(graph, {"x": _rand(3, 4), "bias": np.zeros(4, np.float32)})):
        with pytest.raises(BackendError, match="closed"):
            call()
    b.close()  # idempotent



def test_signals_still_reach_python_after_backends_close_in_any_order(tmp_path):
    """Two OpenVINO backends closed in the order they were opened, then Ctrl-C and SIGTERM: Python's
    handlers run. With one ov.Core per backend, OpenVINO's CPU plugin left the thread on a freed signal
    stack and the signal killed the process with SIGSEGV (this suite crashed so at a later signal test);
    the backends now share one Core (shared_core). Run in a child so a crash fails this test only."""
    graph = batch_graph(tmp_path)
    script = f"""
import gc, os, signal, numpy as np
from sam3track.backends import create_backend
backends = [create_backend("openvino", "cpu") for _ in range(2)]
for b in backends:
    g = b.load("batch", {graph!r})
    b.to_host(b.run(g, {{"x": np.ones((3, 4), np.float32), "bias": np.zeros(4, np.float32)}})["y"])
del g, b  # the list holds the only references
while backends:
    backends.pop(0).close()  # the first opened is closed, and released, first
    gc.collect()
seen = []
for s in (signal.SIGINT, signal.SIGTERM):
    signal.signal(s, lambda signum, frame: seen.append(signum))
    os.kill(os.getpid(), s)
print("handled", seen)
"""
    proc = run_child([sys.executable, "-c", script], "OpenVINO signal-handling child", cwd=REPO)
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-2000:]}"
    assert f"handled [{int(signal.SIGINT)}, {int(signal.SIGTERM)}]" in proc.stdout

def test_counters_match_onnxruntime_on_a_session(tiny_bundle, bikes_frames):
    """calls and transfers count the same things as the ONNX Runtime backend's; seconds per graph."""
    counted = {}
    for name in ("onnxruntime", "openvino"):
        with sam3track.load(tiny_bundle, backend=name) as p:
            s = p.start_session(bikes_frames[:6])
            s.add_prompt(text="person")
            list(s.propagate())
            counted[name] = (dict(p.backend.calls), vars(p.backend.transfers.snapshot()))
            assert set(p.backend.seconds) == set(p.backend.calls)
            assert p.backend.live_allocations >= 3  # two pools and the prompt pool, at least
            s.close()
            gc.collect()
            assert p.backend.live_allocations == 0  # the session's pools went with it
        assert p.backend.live_allocations == 0
    assert counted["openvino"] == counted["onnxruntime"]


# ------------------------------------------------------------------------------- options and errors
def test_precision_threads_and_device_errors(monkeypatch):
    for bad, why in [(dict(precision="fp16"), "unknown precision 'fp16' for openvino; use one of fp32, bf16"),
                     (dict(precision="int8"), "unknown precision"),
                     (dict(threads=0), "threads must be a whole number >= 1"),
                     (dict(threads=1.5), "threads must be a whole number >= 1"),
                     (dict(gear={"objects": [1]}), "the openvino backend takes no option 'gear'")]:
        with pytest.raises(Sam3TrackError, match=why):
            create_backend("openvino", "cpu", **bad)
    with pytest.raises(Sam3TrackError, match="unknown device 'cuda:0' for openvino"):
        create_backend("openvino", "cuda:0")
    with pytest.raises(Sam3TrackError, match="precision= is an openvino option"):
        create_backend("onnxruntime", "cpu", precision="bf16")
    with pytest.raises(Sam3TrackError, match="precision= is an openvino option"):
        create_backend("acl", "npu:0", precision="fp32")
    with pytest.raises(Sam3TrackError, match="unknown backend 'tensorrt'; available here: onnxruntime, openvino, acl"):
        create_backend("tensorrt")
    monkeypatch.setattr(ov_backend, "cpu_capabilities", lambda core: ["FP32", "INT8"])
    with pytest.raises(Sam3TrackError, match=r"precision='bf16' needs a CPU with bf16 support .* use precision='fp32'"):
        create_backend("openvino", "cpu", precision="bf16")


def test_onnxruntime_default_threads_follow_the_affinity_mask(monkeypatch):
    """ONNX Runtime alone ignores the mask (a pool thread per physical core, pinned outside it): the
    backend's default is the mask's size when it is narrower than the machine, else ONNX Runtime's own."""
    from sam3track.backends import onnxruntime as ort_backend

    monkeypatch.setattr(ort_backend, "DEFAULT_THREADS", None)  # as in any process but a test worker
    monkeypatch.setattr(ort_backend.os, "cpu_count", lambda: 8)
    monkeypatch.setattr(ort_backend.os, "sched_getaffinity", lambda pid: {2, 3, 5}, raising=False)
    assert create_backend("onnxruntime")._sessions.threads == 3
    assert create_backend("onnxruntime", threads=2)._sessions.threads == 2  # asked: it wins
    monkeypatch.setattr(ort_backend.os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    assert create_backend("onnxruntime")._sessions.threads == 0  # 0: ONNX Runtime's default


def test_load_passes_precision_and_threads(tiny_bundle):
    with sam3track.load(tiny_bundle, backend="openvino", threads=1) as p:
        compiled = p.graphs["backbone"].compiled
        assert compiled.get_property("INFERENCE_PRECISION_HINT") == ov.Type.f32  # set, not OpenVINO's bf16 default
        assert compiled.get_property("INFERENCE_NUM_THREADS") == 1
        assert p.backend.precision == "fp32"
    with sam3track.load(tiny_bundle, backend="openvino", threads=1, shapes="static") as p:
        assert p.backend.shapes == "static" and p.graphs["backbone"].compiled is None
        with p.start_session(np.zeros((1, 64, 96, 3), np.uint8)) as s:
            s.add_prompt(text="person")
            s.run_frame(0)
        (compiled, _), = p.graphs["backbone"].static.values()  # one frame: one shape
        assert compiled.get_property("INFERENCE_PRECISION_HINT") == ov.Type.f32
        assert compiled.get_property("INFERENCE_NUM_THREADS") == 1
    with sam3track.load(tiny_bundle, backend="onnxruntime", threads=1) as p:
        assert p.graphs["backbone"].session.get_session_options().intra_op_num_threads == 1
    with pytest.raises(Sam3TrackError, match="precision= is an openvino option"):
        sam3track.load(tiny_bundle, precision="bf16")
    with pytest.raises(Sam3TrackError, match="shapes= is an openvino option"):
        sam3track.load(tiny_bundle, shapes="static")
    with pytest.raises(Sam3TrackError, match="threads must be"):
        sam3track.load(tiny_bundle, backend="openvino", threads=-2)


def test_fp16_weights_are_stored_in_fp16_and_keep_what_fp16_cannot_hold(tmp_path, monkeypatch):
    """What weights="fp16" compiles: each weight as fp16 plus a Convert (half the memory), a constant
    outside fp16's range kept fp32. Checked on any CPU by compiling the stored model at fp32: y is
    exactly x @ fp16(w), z keeps 1e6."""
    from onnx import numpy_helper

    w, big = _rand(64, 64), np.full(4, 1e6, np.float32)
    path = _save(tmp_path / "weights.onnx", [helper.make_node("MatMul", ["x", "w"], ["y"]),
                                             helper.make_node("Mul", ["x4", "big"], ["z"])],
                 [helper.make_tensor_value_info("x", F32, ["n", 64]), helper.make_tensor_value_info("x4", F32, [4])],
                 [helper.make_tensor_value_info("y", F32, ["n", 64]), helper.make_tensor_value_info("z", F32, [4])],
                 [numpy_helper.from_array(w, "w"), numpy_helper.from_array(big, "big")])
    core = ov_backend.shared_core()
    model = core.read_model(path)
    assert ov_backend.store_weights_in_fp16(model)
    constants = {tuple(op.get_shape()): op.get_element_type() for op in model.get_ordered_ops()
                 if op.get_type_name() == "Constant"}
    assert constants == {(64, 64): ov.Type.f16, (4,): ov.Type.f32}
    x = _rand(3, 64, seed=1)
    out = core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})({"x": x, "x4": np.ones(4, np.float32)})
    np.testing.assert_allclose(out["y"], x @ w.astype(np.float16).astype(np.float32), rtol=1e-5, atol=1e-5)
    assert not np.allclose(out["y"], x @ w, rtol=1e-6, atol=1e-6)  # the rounding happened
    np.testing.assert_array_equal(out["z"], big)
    stored = []  # which loads go through it: weights="fp16" only, at either precision
    monkeypatch.setattr(ov_backend, "store_weights_in_fp16", lambda m: stored.append(m.get_friendly_name()) or True)
    for precision in ("fp32", "bf16") if HAS_BF16 else ("fp32",):
        for weights in ("fp32", "fp16"):
            loaded = create_backend("openvino", "cpu", precision=precision, weights=weights)
            try:
                loaded.load(weights, path)
            finally:
                loaded.close()
    assert len(stored) == (2 if HAS_BF16 else 1)


@pytest.mark.skipif(not HAS_BF16, reason="this CPU has no BF16 in OpenVINO's OPTIMIZATION_CAPABILITIES")
def test_bf16_runs_the_clip(tiny_bundle, bikes_frames):
    """bf16 guarantees that it runs, not the same objects: measured against ONNX Runtime fp32 and printed
    (pytest -s), never asserted."""
    runs = {}
    for name, precision in (("onnxruntime", None), ("openvino", "bf16")):
        with sam3track.load(tiny_bundle, backend=name, precision=precision) as p:
            if precision:
                assert p.graphs["backbone"].compiled.get_property("INFERENCE_PRECISION_HINT") == ov.Type.bf16
            s = p.start_session(bikes_frames)
            for text in ("person", "bike"):
                s.add_prompt(text=text)
            runs[name] = list(s.propagate())
    bf16 = runs["openvino"]
    assert [r.frame_index for r in bf16] == list(range(len(bikes_frames)))
    assert all(r.masks.shape[0] == r.object_ids.shape[0] for r in bf16)
    same, ious = _compare(runs["onnxruntime"], bf16)
    print(f"bf16 vs onnxruntime fp32: same ids on {same}/{len(bf16)} frames; mask IoU over {len(ious)} "
          f"object-frames mean {np.mean(ious) if ious else float('nan'):.4f} min {min(ious, default=float('nan')):.4f}")


def test_quantised_and_fp16_graphs_load_or_fail_naming_the_graph(tmp_path, tiny_bundle):
    """What OpenVINO's ONNX frontend takes of a graph stored at lower precision (the module docstring
    lists the findings): each either loads and runs, or is a BundleError that names the graph."""
    import onnx
    import onnxruntime as ort
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_dynamic, quantize_static
    from onnxruntime.transformers.float16 import convert_float_to_float16

    src = str(tiny_bundle / "backbone.onnx")
    x = _rand(1, 3, 112, 112, seed=4)

    class Frames(CalibrationDataReader):
        def __init__(self):
            self.left = [{"pixel_values": _rand(1, 3, 112, 112, seed=i)} for i in range(2)]

        def get_next(self):
            return self.left.pop() if self.left else None

    variants = {"dynamic": tmp_path / "dynamic.onnx", "qdq": tmp_path / "qdq.onnx", "fp16": tmp_path / "fp16.onnx"}
    quantize_dynamic(src, str(variants["dynamic"]))  # DynamicQuantizeLinear + MatMulInteger / ConvInteger
    quantize_static(src, str(variants["qdq"]), Frames(), quant_format=QuantFormat.QDQ)
    onnx.save(convert_float_to_float16(onnx.load(src), keep_io_types=True), str(variants["fp16"]))
    loaded = {}
    b = create_backend("openvino", "cpu")
    try:
        for name, path in variants.items():
            try:
                graph = b.load(f"backbone_{name}", str(path))
            except BundleError as exc:
                assert f"graph backbone_{name}" in str(exc) and "backend='onnxruntime'" in str(exc)
                loaded[name] = str(exc)
                continue
            got = b.to_host(b.run(graph, {"pixel_values": x})["tracker_feat"])
            ref = ort.InferenceSession(str(path)).run(["tracker_feat"], {"pixel_values": x})[0]
            loaded[name] = float(np.abs(got - ref).max() / np.abs(ref).max())
    finally:
        b.close()
    print(loaded)
    assert isinstance(loaded["dynamic"], float) and isinstance(loaded["fp16"], float)
    assert loaded["fp16"] < 1e-2


@rounding_xfail("OpenVINO's dynamic int8 (DynamicQuantizeLinear + MatMulInteger / ConvInteger) on an AVX2 CPU "
                "gives 1.7e-2 of the largest value from ONNX Runtime's (AMD EPYC, no VNNI: other int8 kernels); "
                "on the AVX-512 CPUs measured first it was within 1e-3", diverges_on=("avx2",))
def test_dynamic_int8_graph_on_openvino_matches_onnxruntimes_arithmetic(tmp_path, tiny_bundle):
    import onnxruntime as ort
    from onnxruntime.quantization import quantize_dynamic

    path = tmp_path / "dynamic.onnx"
    quantize_dynamic(str(tiny_bundle / "backbone.onnx"), str(path))
    x = _rand(1, 3, 112, 112, seed=4)
    b = create_backend("openvino", "cpu")
    try:
        got = b.to_host(b.run(b.load("backbone_dynamic", str(path)), {"pixel_values": x})["tracker_feat"])
    finally:
        b.close()
    ref = ort.InferenceSession(str(path)).run(["tracker_feat"], {"pixel_values": x})[0]
    rel = float(np.abs(got - ref).max() / np.abs(ref).max())
    print(f"OpenVINO vs ONNX Runtime, dynamic int8 backbone: {rel:.3g} of the largest value ({CPU_ISA})")
    assert rel < 1e-3


def test_cli_track_passes_backend_precision_and_threads(tmp_path, monkeypatch):
    from sam3track.cli import build_parser

    calls = []

    def run_track(job, **kwargs):
        calls.append(job)
        return 0

    monkeypatch.setattr("sam3track.jobs.track.run_track", run_track)
    args = build_parser().parse_args(["track", "v.mp4", "-p", "person", "--backend", "openvino", "--precision", "bf16",
                                      "--threads", "2", "--shapes", "static"])
    from sam3track.commands.track import cmd_track

    assert cmd_track(args) == 0
    job = calls[0]
    assert job.backend == "openvino" and job.load_options["precision"] == "bf16" and job.load_options["threads"] == 2
    assert job.load_options["shapes"] == "static"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["track", "v.mp4", "-p", "x", "--shapes", "fixed"])
    with pytest.raises(SystemExit):
        build_parser().parse_args(["track", "v.mp4", "-p", "x", "--threads", "0"])
    assert isinstance(args, argparse.Namespace)


# ------------------------------------------------------------------------- the bundle, end to end
@pytest.fixture(scope="module")
def bikes_frames():
    with open_video(CLIPS / "bikes.mp4") as video:
        return np.stack([video.read(i) for i in range(76, 116)])  # the parity tests' shot


def _compare(a, b):
    """Frames whose ids agree, and the IoU of every object-frame where they do."""
    same, ious = 0, []
    for x, y in zip(a, b):
        if x.object_ids.tolist() != y.object_ids.tolist():
            continue
        same += 1
        for m1, m2 in zip(x.masks, y.masks):
            union = (m1 | m2).sum()
            ious.append(1.0 if union == 0 else (m1 & m2).sum() / union)
    return same, ious


# Diagnosis of the mask divergences below (measured with OpenVINO 2026.4.1 on this CPU). Every graph
# agrees with ONNX Runtime to fp32 rounding (<= 2e-6 of the largest value); the memories' bf16 rounding,
# once a Cast that OpenVINO rounds differently, is now float32 arithmetic both runtimes do exactly
# (graphs/bf16_rounding.py), which made the bikes cases match (IoU >= 0.9991). What is left is the
# kernels' own rounding: from frame 9 of the synthetic clip, single pixels whose logits are within
# that rounding of 0 flip (1-4 pixels of masks of 800-35,000), and their memories carry the change
# on. At new_det_thresh 0.85 the worst object-frame is 2 pixels of a 420-pixel mask leaving the
# frame (IoU 0.9952); at the bundle threshold two small objects (ids 5 and 6, 350-460 pixels)
# drift by 150-200 pixels on frames 30-33 (IoU 0.64 at worst). Ids and scores agree on every frame.
# The same mechanism separates the fused and plain exports in tests/test_parity.py.
OV_KERNEL_ROUNDING = ("fp32 rounding differences between OpenVINO's and ONNX Runtime's kernels flip pixels at "
                      "logit 0 on the synthetic clip and the memories carry them on; see the comment above")


def _synthetic():
    from .test_parity import synthetic_frames

    return synthetic_frames()


PARITY_CASES = {  # the parity tests' clips, prompts, settings and directions (tests/test_parity.py)
    "bikes-forward": ("bikes", ["person", "bike"], None, "forward"),
    "bikes-backward": ("bikes", ["person", "bike"], None, "backward"),
    "bikes-both": ("bikes", ["person", "bike"], None, "both"),
    "bikes-stream": ("bikes", ["person", "bike"], None, "stream"),
    "synthetic-0.85": ("synthetic", ["bike", "person"], {"hotstart_delay": 0, "new_det_thresh": 0.85}, "forward"),
    "synthetic-bundle-threshold": ("synthetic", ["bike", "person"], {"hotstart_delay": 0}, "forward"),
}
DIVERGING = {"synthetic-0.85", "synthetic-bundle-threshold"}
_RUNS: dict = {}


def _both_backends(case, tiny_bundle, bikes_frames):
    """The case on ONNX Runtime and on OpenVINO fp32, run once per test session."""
    if case not in _RUNS:
        from .test_parity import sam3track_run

        clip, prompts, overrides, mode = PARITY_CASES[case]
        frames = bikes_frames if clip == "bikes" else _synthetic()
        runs = {}
        for name in ("onnxruntime", "openvino"):
            predictor, _, results = sam3track_run(tiny_bundle, frames, prompts, overrides, mode, backend=name)
            predictor.close()
            runs[name] = results
        _RUNS[case] = runs
    return _RUNS[case]["onnxruntime"], _RUNS[case]["openvino"]


@pytest.mark.slow
@pytest.mark.parametrize("case", list(PARITY_CASES))
def test_openvino_fp32_finds_the_same_objects_as_onnxruntime(case, tiny_bundle, bikes_frames):
    ort_run, ov_run = _both_backends(case, tiny_bundle, bikes_frames)
    assert [r.frame_index for r in ov_run] == [r.frame_index for r in ort_run]
    for a, b in zip(ort_run, ov_run):
        assert b.object_ids.tolist() == a.object_ids.tolist(), f"frame {a.frame_index}"
        np.testing.assert_allclose(b.scores, a.scores, atol=1e-3)  # the parity tests' score tolerance
    assert sum(len(r) for r in ort_run), "the case tracks no object"


# The bikes stream case flips one tie pixel too on AVX2 CPUs (measured on an AMD EPYC without AVX-512),
# where both runtimes take other kernels; on the AVX-512 CPUs it was first measured on it matches, and on
# an Ice Lake Xeon (AVX-512 with VNNI, no bf16) too.
DIVERGING_BY_ISA = {"bikes-stream": ("avx2",)}


def _masks_case(c):
    if c in DIVERGING:
        return pytest.param(c, marks=pytest.mark.xfail(strict=True, reason=OV_KERNEL_ROUNDING))
    if c in DIVERGING_BY_ISA:
        return pytest.param(c, marks=rounding_xfail(OV_KERNEL_ROUNDING, DIVERGING_BY_ISA[c]))
    return c


@pytest.mark.slow
@pytest.mark.parametrize("case", [_masks_case(c) for c in PARITY_CASES])
def test_openvino_fp32_masks_match_onnxruntime(case, tiny_bundle, bikes_frames):
    """Every object-frame's mask IoU >= 0.999 against ONNX Runtime (the issue's bar)."""
    ort_run, ov_run = _both_backends(case, tiny_bundle, bikes_frames)
    same, ious = _compare(ort_run, ov_run)
    assert same == len(ort_run) and ious
    print(f"{case}: {len(ious)} object-frames, IoU mean {np.mean(ious):.6f} min {min(ious):.6f}")
    assert min(ious) >= 0.999, (np.mean(ious), min(ious))



# Measured with calls padded to call_sizes.static_gears (2026-12-07) on AMD Zen 4 (AVX512-BF16), with two
# threads and one: the same pixel; the AMX Xeon was measured before the padding only (so not strict there).
# On an AMD EPYC with AVX2 only, one thread per pool (CI's workers), it matches (two CI runs, 2026-12-07).
# On an Intel Xeon with AVX-512 and VNNI, no bf16 (Ice Lake), with two threads and one: the same pixel.
# Measured: in the stream case one pixel of a 140-pixel mask (object 1, frame 16) differs from ONNX
# Runtime (IoU 0.9929); every other object-frame is within 1 pixel (mean IoU 0.99989). A model compiled
# for static shapes fuses other element-wise ops than the dynamic one, so its fp32 rounding differs and
# flips a pixel at logit 0, as OV_KERNEL_ROUNDING describes; the dynamic model's worst there is 1 pixel
# of 1,144 (0.9991).
STATIC_STREAM_ROUNDING = ("one pixel of a 140-pixel mask flips at logit 0 (fp32 rounding of the static compile's "
                          "fusions), IoU 0.9929 < 0.999; see the comment above")
STATIC_STREAM_DIVERGES = ("avx512-amx", "avx512-bf16", "avx512-vnni")  # every thread count
STATIC_STREAM_MEASURED = ("avx512-bf16", "avx512-bf16/1-thread", "avx512-vnni", "avx512-vnni/1-thread",
                          "avx2/1-thread")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["forward", pytest.param("stream", marks=rounding_xfail(
    STATIC_STREAM_ROUNDING, diverges_on=STATIC_STREAM_DIVERGES, measured_on=STATIC_STREAM_MEASURED))])
def test_static_shapes_track_the_clip_as_onnxruntime(mode, tiny_bundle, bikes_frames, monkeypatch):
    """shapes="static" on the bikes clip: the ids and scores of ONNX Runtime on every frame, masks at
    IoU >= 0.999, each graph compiled once per distinct call shape."""
    from .test_parity import sam3track_run

    ort_run = _both_backends(f"bikes-{mode}", tiny_bundle, bikes_frames)[0]
    compiles, compile = [], ov_backend.OpenVinoBackend._compile

    def recorded(self, name, path, model, where, config=None):
        compiles.append((name, {p.get_node().get_friendly_name(): tuple(p.get_shape()) for p in model.inputs}))
        return compile(self, name, path, model, where, config)

    monkeypatch.setattr(ov_backend.OpenVinoBackend, "_compile", recorded)
    predictor, _, ov_run = sam3track_run(tiny_bundle, bikes_frames, ["person", "bike"], {"shapes": "static"}, mode,
                                         backend="openvino")
    graphs = predictor.graphs
    assert all(g.compiled is None for g in graphs.values())
    assert len(graphs["propagation_decoder"].static) > 1  # objects, memories and pointers changed over the clip
    assert sum(len(g.static) for g in graphs.values()) < sum(predictor.backend.calls.values())
    gears = graphs["propagation_decoder"].sizes  # call_sizes.static_gears: every compile at a planned size
    decoder = [inputs for name, inputs in compiles if name == "propagation_decoder"]
    assert len(decoder) > 1 and all(g.model is None for g in graphs.values())  # read again per shape, not kept
    for inputs in decoder:
        (objects, memories), (_, pointers) = inputs["memory_index"], inputs["pointer_index"]
        assert objects in gears["objects"] and memories in gears["memories"] and pointers in gears["pointers"]
    predictor.close()
    for a, b in zip(ort_run, ov_run):
        assert b.object_ids.tolist() == a.object_ids.tolist(), f"frame {a.frame_index}"
        np.testing.assert_allclose(b.scores, a.scores, atol=1e-3)
    same, ious = _compare(ort_run, ov_run)
    assert same == len(ort_run) == len(ov_run) and ious
    assert min(ious) >= 0.999, (np.mean(ious), min(ious))


@pytest.mark.slow
def test_rows_shapes_track_the_clip_as_onnxruntime(tiny_bundle, bikes_frames):
    """shapes="rows" on the bikes clip: the ids and scores of ONNX Runtime on every frame, masks at
    IoU >= 0.999, with the graphs whose row counts settled run on models compiled for them."""
    from .test_parity import sam3track_run

    ort_run = _both_backends("bikes-forward", tiny_bundle, bikes_frames)[0]
    predictor, _, ov_run = sam3track_run(tiny_bundle, bikes_frames, ["person", "bike"], {"shapes": "rows"},
                                         "forward", backend="openvino")
    compiled = dict(predictor.backend.row_compiles)
    kept = {name: list(g.rows.models) for name, g in predictor.graphs.items() if g.rows is not None and g.rows.models}
    predictor.close()
    # here the two prompts' grounding head settles (the objects' count moves or stays at one), so the
    # detections come from a fixed-rows model from the third frame on
    assert compiled.get("grounding_head") == 1 and kept["grounding_head"] == [(2, 2)], (compiled, kept)
    for a, b in zip(ort_run, ov_run):
        assert b.object_ids.tolist() == a.object_ids.tolist(), f"frame {a.frame_index}"
        np.testing.assert_allclose(b.scores, a.scores, atol=1e-3)
    same, ious = _compare(ort_run, ov_run)
    assert same == len(ort_run) == len(ov_run) and ious
    assert min(ious) >= 0.999, (np.mean(ious), min(ious))


@pytest.mark.slow
def test_parity_with_transformers_through_openvino(tiny_bundle, bikes_frames):
    """The main real-clip parity test (tests/test_parity.py), with sam3track on OpenVINO fp32."""
    from .test_parity import assert_parity

    session, births, removed = assert_parity(tiny_bundle, bikes_frames, ["person", "bike"], backend="openvino")
    assert session.predictor.backend.name == "openvino"
    assert any(frame > 0 for frame in births.values()), f"no object born after frame 0: {births}"
    assert removed, "no object was removed by the hotstart heuristics"
    assert session.events["removed"] == removed
    assert session.events["births"] == births


def test_a_bundle_whose_memory_encoder_openvino_cannot_run_says_what_to_do():
    """SAM 3.1 bundles exported before 2026-12-07 broadcast the frame's projection over the memory encoder's rows;
    OpenVINO's CPU plugin fuses that add into the one-row convolution and fails for two or more rows. The
    error says to export again or use ONNX Runtime (the message as openvino 2026.4.1 gives it)."""
    from sam3track.backends.openvino import _known_fault

    exc = RuntimeError(
        "Exception from src/inference/src/cpp/infer_request.cpp:224:\n[CPU] Reorder node with name "
        "'/memory_encoder/downsampler/downsampler.12/Conv/WithoutBiases___/memory_encoder/pix_feat_proj/Conv/"
        "WithoutBiases' Check 'getShape().isCompatible(dims)' failed\nParameterMismatch: Can not clone with new "
        "dims. Descriptor's shape: {1, 256, 16, 16} is incompatible with provided dimensions: {2, 256, 16, 16}.")
    hint = _known_fault("memory_encoder", exc)
    assert "export the bundle again" in hint and "backend='onnxruntime'" in hint
    assert _known_fault("propagation_decoder", exc) == "" and _known_fault("memory_encoder", RuntimeError("x")) == ""
    mask_init = _known_fault("mask_init", exc)
    assert "mask_init broadcasts" in mask_init and "export the bundle again" in mask_init


@pytest.mark.parametrize("family", ["tiny_bundle", "sam31_bundle"])
def test_every_graph_that_takes_rows_runs_on_openvino_at_any_row_count(family, request):
    """Each graph with a row axis runs on OpenVINO at 1, 3, 20 and again 1 rows (SAM 3.1: buckets) and
    gives ONNX Runtime's outputs. OpenVINO 2026.4.1's CPU plugin fused a [1] + [N] add of two
    convolutions into an in-place sum and refused every call of two or more rows after the first: SAM 3.1's
    memory_encoder (17+ objects) and mask_init (two births on one frame) broadcast one frame's features
    that way until both tiled them."""
    from sam3track.backend_choice import sweep_feeds

    def outputs(side, name, feeds):
        return {k: side.backend.to_host(t) for k, t in side.backend.run(side.graphs[name], feeds).items()}

    bundle = request.getfixturevalue(family)
    checked = set()
    with sam3track.load(bundle, backend="openvino") as ov_side, \
            sam3track.load(bundle, backend="onnxruntime") as ort_side:
        for name in ov_side.graphs:
            # the memory encoders round to bfloat16 inside (measured 2.6e-3 apart: a few ulps of bf16);
            # the other graphs' fp32 kernels differ by about 1e-6
            tolerance = 1e-2 if name == "memory_encoder" else 1e-4
            for rows in (1, 3, 20, 1):
                feeds = sweep_feeds(ov_side, name, rows)
                if feeds is None:
                    break
                want, got = outputs(ort_side, name, feeds), outputs(ov_side, name, feeds)
                for k, w in want.items():
                    assert got[k].shape == w.shape, (name, rows, k)
                    error = np.abs(got[k].astype(np.float64) - w).max()
                    assert error <= tolerance * max(np.abs(w).max(), 1e-6), (name, rows, k, error)
                checked.add(name)
    assert {"propagation_decoder", "memory_encoder", "mask_init", "interactive_decoder"} <= checked
