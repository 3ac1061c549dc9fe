"""The acl backend (sam3track/backends/acl.py) on the strict pyacl emulator.

Every model here is a tiny fake OM written by the test itself (notes/om-contract.md: magic + header +
ONNX bytes), in each gear mode, with its om_manifest entry; nothing depends on the om/ converter.
"""

from __future__ import annotations

import json
import sys
import threading

import numpy as np
import pytest
from onnx import TensorProto, helper

from sam3track.backends import DeviceTensor, create_backend
from sam3track.errors import BackendError, BundleError, Sam3TrackError

from sam3track.testing import acl_emulator as emulator  # shipped: never skipped

MAGIC = b"SAM3TRACK-FAKE-OM\n"
HIDDEN = "ascend_mbatch_shape_data"
F32 = TensorProto.FLOAT


# ------------------------------------------------------------------------------- fake OM files
def _onnx(nodes, inputs, outputs, initializers=()) -> bytes:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model.SerializeToString()


def _write_om(root, name: str, onnx_bytes: bytes, mode: str, inputs, outputs, *, batch=None, dims=None,
              axes=None) -> dict:
    """Write om/<name>.om and return its om_manifest entry (+ "root").
    inputs/outputs: [(name, dtype, dims with -1 on gear axes / largest gear, axis names)]."""
    gear = mode != "static"
    header = {
        "fake_om_version": 1, "soc_version": "Ascend910B2", "mode": mode, "input_format": "ND",
        "precision": {"precision_mode_v2": "origin", "precision_mode": None},
        "inputs": [{"name": n, "dtype": t, "dims": list(d)} for n, t, d, _ in inputs],
        "hidden_input": HIDDEN if gear else None,
        "batch_sizes": batch, "dynamic_dims": dims, "ranges": None,
        "outputs": [{"name": f"node_{n}:0:{n}", "tensor": n, "dtype": t, "dims": list(d)} for n, t, d, _ in outputs],
    }
    blob = json.dumps(header).encode()
    (root / "om").mkdir(exist_ok=True)
    (root / "om" / f"{name}.om").write_bytes(MAGIC + len(blob).to_bytes(8, "little") + blob + onnx_bytes)
    return {
        "mode": mode, "axes": axes or {}, "profiles": None, "ranges": None, "precision": "origin",
        "inputs": [{"name": n, "dtype": t, "shape": list(d), "axes": list(a)} for n, t, d, a in inputs]
        + ([{"name": HIDDEN, "hidden": True}] if gear else []),
        "outputs": [{"name": n, "dtype": t, "shape": list(d), "axes": list(a)} for n, t, d, a in outputs],
        "om_file": f"om/{name}.om", "root": str(root),
    }


def static_om(root) -> dict:
    """sum = x + y, twice = 2 x; x, y [2, 3]."""
    onnx_bytes = _onnx(
        [helper.make_node("Add", ["x", "y"], ["sum"]), helper.make_node("Add", ["x", "x"], ["twice"])],
        [helper.make_tensor_value_info("x", F32, [2, 3]), helper.make_tensor_value_info("y", F32, [2, 3])],
        [helper.make_tensor_value_info("sum", F32, [2, 3]), helper.make_tensor_value_info("twice", F32, [2, 3])])
    return _write_om(root, "static", onnx_bytes, "static",
                     [("x", "float32", [2, 3], [None, None]), ("y", "float32", [2, 3], [None, None])],
                     [("sum", "float32", [2, 3], [None, None]), ("twice", "float32", [2, 3], [None, None])])


def batch_om(root) -> dict:
    """y = 2 x + bias + flag[:, None]; score = sum(x, 1). x [N, 4], flag [N], bias [4] (not batched)."""
    onnx_bytes = _onnx(
        [helper.make_node("Add", ["x", "x"], ["x2"]), helper.make_node("Add", ["x2", "bias"], ["xb"]),
         helper.make_node("Unsqueeze", ["flag", "one"], ["flag1"]), helper.make_node("Add", ["xb", "flag1"], ["y"]),
         helper.make_node("ReduceSum", ["x", "one"], ["score"], keepdims=1)],
        [helper.make_tensor_value_info("x", F32, ["N", 4]), helper.make_tensor_value_info("flag", F32, ["N"]),
         helper.make_tensor_value_info("bias", F32, [4])],
        [helper.make_tensor_value_info("y", F32, ["N", 4]), helper.make_tensor_value_info("score", F32, ["N", 1])],
        [helper.make_tensor("one", TensorProto.INT64, [1], [1])])
    return _write_om(root, "batch", onnx_bytes, "dynamic_batch",
                     [("x", "float32", [-1, 4], ["objects", None]), ("flag", "float32", [-1], ["objects"]),
                      ("bias", "float32", [4], [None])],
                     [("y", "float32", [4, 4], ["objects", None]), ("score", "float32", [4, 1], ["objects", None])],
                     batch=[1, 2, 4], axes={"objects": [1, 2, 4]})


def dims_om(root, axes=None) -> dict:
    """scores = (a * mask) @ b.T; a [N, 3], mask [N, 1], b [K, 3] -> [N, K]."""
    onnx_bytes = _onnx(
        [helper.make_node("Mul", ["a", "mask"], ["am"]), helper.make_node("Transpose", ["b"], ["bt"], perm=[1, 0]),
         helper.make_node("MatMul", ["am", "bt"], ["scores"])],
        [helper.make_tensor_value_info("a", F32, ["N", 3]), helper.make_tensor_value_info("mask", F32, ["N", 1]),
         helper.make_tensor_value_info("b", F32, ["K", 3])],
        [helper.make_tensor_value_info("scores", F32, ["N", "K"])])
    return _write_om(root, "dims", onnx_bytes, "dynamic_dims",
                     [("a", "float32", [-1, 3], ["objects", None]), ("mask", "float32", [-1, 1], ["objects", None]),
                      ("b", "float32", [-1, 3], ["memories", None])],
                     [("scores", "float32", [4, 4], ["objects", "memories"])],
                     dims=[[1, 1, 2], [2, 2, 2], [4, 4, 4]], axes=axes or {"objects": [1, 2, 4], "memories": [2, 4]})


# ------------------------------------------------------------------------------------ fixtures
@pytest.fixture
def emu():
    with emulator.install() as emu:
        yield emu


@pytest.fixture
def backend(emu):
    b = create_backend("acl", "npu:0")
    yield b
    b.close()


def _rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _pad(array, rows):
    out = np.zeros((rows,) + array.shape[1:], array.dtype)
    out[:array.shape[0]] = array
    return out


# ---------------------------------------------------------------------------------- creation
def test_device_must_be_npu_n(emu):
    with pytest.raises(Sam3TrackError, match=r"'npu:N'"):
        create_backend("acl", "cuda:0")
    with pytest.raises(Sam3TrackError, match="no option 'gears'"):
        create_backend("acl", "npu:0", gears={"objects": [1, 2]})


def test_missing_pyacl_names_cann_and_the_emulator(monkeypatch):
    monkeypatch.setitem(sys.modules, "acl", None)  # import acl -> ImportError
    with pytest.raises(Sam3TrackError, match="CANN.*set_env.sh.*acl_emulator"):
        create_backend("acl", "npu:0")


def test_load_refuses_plain_and_planned_bundles(backend, tmp_path):
    with pytest.raises(BundleError, match="not an OM bundle: convert it with python -m om.convert"):
        backend.load("backbone", str(tmp_path / "backbone.onnx"), None)
    planned = {**static_om(tmp_path), "om_file": None}
    with pytest.raises(BundleError, match="planned, not compiled: run python -m om.convert on a machine with CANN"):
        backend.load("static", "x.onnx", planned)


def test_graph_attributes_come_from_the_om_by_name(backend, tmp_path):
    graph = backend.load("batch", "batch.onnx", batch_om(tmp_path))
    assert graph.input_names == ("x", "flag", "bias")  # the hidden input is not one of them
    assert graph.output_names == ("y", "score")  # "node_y:0:y" -> "y"
    assert graph.sizes == {"objects": (1, 2, 4)}
    assert graph.shapes["x"] == (None, 4) and graph.shapes["bias"] == (4,)
    assert graph.dims["y"] == ("objects", 4)
    assert backend.plan(graph, "objects", 3) == 4 and backend.plan(graph, "objects", 9) == 4


def test_om_gears_that_disagree_with_the_manifest_are_refused(backend, tmp_path):
    compiled = dims_om(tmp_path, axes={"objects": [1, 2, 4, 8], "memories": [2, 4]})
    with pytest.raises(BundleError, match=r"compiled with sizes \[1, 2, 4\] on axis objects.*\[1, 2, 4, 8\]"):
        backend.load("dims", "dims.onnx", compiled)


def test_outputs_are_bound_by_position_when_the_desc_gives_no_tensor_names(tmp_path):
    """A desc whose output names read "node:index" (ascend.md audit, risk 2): bound in the ONNX output
    order om_manifest.json lists, and a dtype that disagrees with the manifest is refused."""
    with emulator.install(output_tensor_names=False):
        backend = create_backend("acl", "npu:0")
        try:
            graph = backend.load("batch", "batch.onnx", batch_om(tmp_path))
            assert graph.output_names == ("y", "score")
            x = _rand(2, 4, seed=7)
            out = backend.run(graph, {"x": x, "flag": np.zeros(2, np.float32), "bias": np.zeros(4, np.float32)})
            np.testing.assert_allclose(backend.to_host(out["score"])[:, 0], x.sum(1), rtol=1e-5)
            swapped = batch_om(tmp_path)
            swapped["outputs"][0]["dtype"] = "int32"  # what position 0 holds is float32 in the OM
            with pytest.raises(BundleError, match=r"tensor y is float32 in the OM model but int32"):
                backend.load("batch", "batch.onnx", swapped)
        finally:
            backend.close()


def test_a_dims_model_reporting_fewer_gears_than_planned_is_refused(backend, tmp_path):
    compiled = {**dims_om(tmp_path), "profiles": [[1, 1, 2], [2, 2, 2], [4, 4, 4], [4, 4, 2]]}
    with pytest.raises(BundleError, match=r"reports 3 dynamic dims gears, om_manifest.json planned 4"):
        backend.load("dims", "dims.onnx", compiled)


def test_a_placed_output_smaller_than_the_largest_gear_gets_a_device_copy(backend, emu, tmp_path):
    """GE writes the largest gear's size into an output buffer: a pool view sized for this gear is
    never handed to the model; the graph's own buffer is, and its gear-sized prefix is copied in."""
    graph = backend.load("dims", "dims.onnx", dims_om(tmp_path))
    pool = backend.zeros((3, 2, 2), np.float32)
    a, b = _rand(2, 3, seed=1), _rand(2, 3, seed=2)
    before = emu.stats.d2d_count
    out = backend.run(graph, {"a": a, "mask": np.ones((2, 1), np.float32), "b": b},
                      {"scores": _view(backend, pool, 1)})
    assert emu.stats.d2d_count == before + 1
    expected = np.zeros((3, 2, 2), np.float32)
    expected[1] = a @ b.T
    np.testing.assert_allclose(backend.to_host(pool), expected, rtol=1e-5, atol=1e-6)
    assert out["scores"].shape == (2, 2)


def _view(backend, pool, row):
    """Row `row` of a [R, 2, 2] pool as a [2, 2] tensor (the gear (2, 2) of scores; the largest is 4 x 4)."""
    view = backend.rows(pool, row, 1)
    return DeviceTensor((2, 2), view.dtype, view.handle)


def test_an_om_whose_output_size_is_unknown_is_refused_at_load(backend, tmp_path):
    onnx_bytes = _onnx([helper.make_node("Add", ["x", "x"], ["y"])], [helper.make_tensor_value_info("x", F32, [2, 3])],
                       [helper.make_tensor_value_info("y", F32, [2, 3])])
    compiled = _write_om(tmp_path, "unsized", onnx_bytes, "static", [("x", "float32", [2, 3], [None, None])],
                         [("y", "float32", [2, -1], [None, None])])
    with pytest.raises(BundleError, match=r"graph unsized .*output y has dims \[2, -1\] and size 0"):
        backend.load("unsized", "unsized.onnx", compiled)


# ------------------------------------------------------------------------------------ tensors
def test_tensor_ops(backend):
    a = _rand(5, 3)
    t = backend.upload(a)
    np.testing.assert_array_equal(backend.to_host(t), a)
    z = backend.zeros((4, 3), np.float32)  # the emulator poisons fresh memory: zeros must really be zeroed
    np.testing.assert_array_equal(backend.to_host(z), np.zeros((4, 3), np.float32))
    e = backend.empty((2, 3), np.float32)
    backend.copy(backend.rows(t, 1, 2), e)  # device to device, from a view
    np.testing.assert_array_equal(backend.to_host(e), a[1:3])
    backend.copy(e, backend.rows(z, 2, 2))  # into a view
    np.testing.assert_array_equal(backend.to_host(z)[2:4], a[1:3])
    np.testing.assert_array_equal(backend.to_host(backend.reshape(t, (15,))), a.reshape(15))
    np.testing.assert_array_equal(backend.to_host(backend.rows(t, 3, 2)), a[3:5])
    assert backend.live_allocations == 3

    before = backend.transfers.snapshot()
    picked = backend.to_host(t, rows=np.array([0, 1, 3, 4, 2]))
    np.testing.assert_array_equal(picked, a[[0, 1, 3, 4, 2]])
    assert backend.transfers.since(before).device_to_host == 3  # runs 0-1, 3-4, 2
    assert backend.to_host(t, rows=np.array([], np.int64)).shape == (0, 3)

    view = backend.rows(t, 1, 2)
    backend.free(t)
    assert backend.live_allocations == 2
    with pytest.raises(BackendError, match="after its memory .* was freed"):
        backend.to_host(view)
    with pytest.raises(BackendError, match="freed"):
        backend.copy(e, view)
    backend.free(t)  # a second free is a no-op


def test_a_tensor_nobody_references_is_freed_by_the_next_call(backend, emu):
    kept = backend.upload(np.ones(4, np.float32))
    device_blocks = emu.stats.live_allocations
    backend.upload(np.ones(4, np.float32))  # dropped at once, as run(graph, {"x": upload(x)}) drops it
    assert backend.live_allocations == 1
    backend.to_host(kept)  # the next call frees it
    assert emu.stats.live_allocations == device_blocks
    view = backend.rows(backend.upload(np.arange(4, dtype=np.float32)), 1, 2)  # a view keeps its block
    backend.to_host(kept)
    np.testing.assert_array_equal(backend.to_host(view), [1, 2])


def test_to_host_returns_memory_the_caller_owns(backend):
    t = backend.upload(np.ones((2, 2), np.float32))
    out = backend.to_host(t)
    out[:] = 7
    np.testing.assert_array_equal(backend.to_host(t), np.ones((2, 2)))


# ---------------------------------------------------------------------------------------- run
def test_static_run(backend, tmp_path):
    graph = backend.load("static", "static.onnx", static_om(tmp_path))
    x, y = _rand(2, 3, seed=1), _rand(2, 3, seed=2)
    out = backend.run(graph, {"x": backend.upload(x), "y": y})  # a device tensor and a host array
    np.testing.assert_allclose(backend.to_host(out["sum"]), x + y, rtol=1e-6)
    np.testing.assert_allclose(backend.to_host(out["twice"]), 2 * x, rtol=1e-6)
    with pytest.raises(BackendError, match=r"graph static: input y has size 4 on dim 1, .*compiled for 3"):
        backend.run(graph, {"x": x, "y": np.zeros((2, 4), np.float32)})


def test_dynamic_batch_runs_padded_gears(backend, tmp_path):
    graph = backend.load("batch", "batch.onnx", batch_om(tmp_path))
    bias = backend.upload(_rand(4, seed=3))
    bias_host = backend.to_host(bias)
    for n in (3, 1, 2, 4):
        size = backend.plan(graph, "objects", n)
        x, flag = _rand(n, 4, seed=n), (np.arange(n) % 2).astype(bool)
        out = backend.run(graph, {"x": _pad(x, size), "flag": _pad(flag, size), "bias": bias})
        assert out["y"].shape == (size, 4) and out["score"].shape == (size, 1)  # the gear's, not the largest
        np.testing.assert_allclose(backend.to_host(out["y"])[:n], 2 * x + bias_host + flag[:, None], rtol=1e-6)
        np.testing.assert_allclose(backend.to_host(out["score"])[:n, 0], x.sum(1), rtol=1e-5)


def test_a_size_that_is_not_a_gear_is_refused(backend, tmp_path):
    graph = backend.load("batch", "batch.onnx", batch_om(tmp_path))
    with pytest.raises(BackendError, match=r"graph batch: input x has size 3 on axis objects, which is not a "
                                           r"compiled gear \(gears: \[1, 2, 4\]\)"):
        backend.run(graph, {"x": _rand(3, 4), "flag": np.zeros(3, np.float32), "bias": np.zeros(4, np.float32)})
    with pytest.raises(BackendError, match="axis objects has size 2 in x but 4 in flag"):
        backend.run(graph, {"x": _rand(2, 4), "flag": np.zeros(4, np.float32), "bias": np.zeros(4, np.float32)})


def test_dynamic_dims_runs_each_profile(backend, tmp_path):
    graph = backend.load("dims", "dims.onnx", dims_om(tmp_path))
    assert graph.sizes == {"objects": (1, 2, 4), "memories": (2, 4)}
    for n, k in ((2, 2), (3, 4), (1, 2)):
        size_n, size_k = backend.plan(graph, "objects", n), backend.plan(graph, "memories", k)
        a, b = _rand(n, 3, seed=n), _rand(k, 3, seed=10 + k)
        mask = _pad(np.ones((n, 1), np.float32), size_n)
        inputs = {"a": backend.upload(_pad(a, size_n)), "mask": backend.upload(mask),
                  "b": backend.upload(_pad(b, size_k))}
        out = backend.run(graph, inputs)
        assert out["scores"].shape == (size_n, size_k)
        np.testing.assert_allclose(backend.to_host(out["scores"])[:n, :k], a @ b.T, rtol=1e-5, atol=1e-6)
    with pytest.raises(BackendError, match=r"sizes \{'objects': 1, 'memories': 4\} are not one of the compiled"):
        backend.run(graph, {"a": _rand(1, 3), "mask": np.ones((1, 1), np.float32), "b": _rand(4, 3)})


def test_outputs_go_straight_into_a_pool_view(backend, tmp_path):
    graph = backend.load("batch", "batch.onnx", batch_om(tmp_path))
    pool = backend.zeros((8, 4), np.float32)
    x = _rand(2, 4, seed=5)
    target = backend.rows(pool, 3, 2)
    out = backend.run(graph, {"x": x, "flag": np.zeros(2, np.float32), "bias": np.zeros(4, np.float32)},
                      {"y": target})
    assert out["y"] is target
    expected = np.zeros((8, 4), np.float32)
    expected[3:5] = 2 * x
    np.testing.assert_allclose(backend.to_host(pool), expected, rtol=1e-6)
    with pytest.raises(BackendError, match=r"output y at this gear is \(2, 4\) float32, the tensor given for it is "
                                           r"\(3, 4\)"):
        backend.run(graph, {"x": x, "flag": np.zeros(2, np.float32), "bias": np.zeros(4, np.float32)},
                    {"y": backend.rows(pool, 0, 3)})


def test_results_live_in_graph_buffers_until_the_next_run(backend, tmp_path):
    graph = backend.load("static", "static.onnx", static_om(tmp_path))
    live = backend.live_allocations
    first = backend.run(graph, {"x": np.ones((2, 3), np.float32), "y": np.ones((2, 3), np.float32)})
    backend.free(first["sum"])  # a no-op: the buffer is the graph's
    np.testing.assert_array_equal(backend.to_host(first["sum"]), np.full((2, 3), 2.0))
    backend.run(graph, {"x": np.zeros((2, 3), np.float32), "y": np.ones((2, 3), np.float32)})
    np.testing.assert_array_equal(backend.to_host(first["sum"]), np.ones((2, 3)))  # reused buffer
    assert backend.live_allocations == live  # results are not caller allocations


def test_transfers_count_only_what_crosses_and_agree_with_the_emulator(backend, emu, tmp_path):
    graph = backend.load("batch", "batch.onnx", batch_om(tmp_path))
    bias = backend.upload(np.zeros(4, np.float32))  # 1 H2D
    pool = backend.zeros((4, 4), np.float32)  # memset: nothing crosses
    out = backend.run(graph, {"x": _rand(2, 4), "flag": np.zeros(2, np.float32), "bias": bias},  # 2 H2D
                      {"y": backend.rows(pool, 0, 2)})
    backend.to_host(out["score"])  # 1 D2H
    backend.copy(backend.rows(pool, 0, 2), backend.rows(pool, 2, 2))  # D2D: not a transfer
    t = backend.transfers
    assert (t.host_to_device, t.device_to_host) == (3, 1)
    assert (t.host_to_device_bytes, t.device_to_host_bytes) == (16 + 32 + 8, 8)
    stats = _copy_stats(emu)
    assert stats["h2d"] == t.host_to_device and stats["d2h"] == t.device_to_host
    assert stats["h2d_bytes"] == t.host_to_device_bytes and stats["d2h_bytes"] == t.device_to_host_bytes


def test_datasets_are_built_at_load_one_pair_per_gear_and_never_while_running(backend, emu, tmp_path):
    compiled = batch_om(tmp_path)
    before = _dataset_stats(emu)
    graph = backend.load("batch", "batch.onnx", compiled)
    loaded = _dataset_stats(emu)
    assert loaded["datasets"] == before["datasets"] + 2 * len(graph.gears)
    bias = backend.upload(np.zeros(4, np.float32))

    def run(n, seed):
        x = _rand(n, 4, seed=seed)
        out = backend.run(graph, {"x": backend.upload(x), "flag": np.zeros(n, np.float32), "bias": bias})
        np.testing.assert_allclose(backend.to_host(out["y"]), 2 * x, rtol=1e-6)  # re-pointed, not stale

    for n, seed in ((2, 0), (2, 1), (4, 2), (4, 3), (2, 4)):  # gears used in any order, some again
        run(n, seed)
    assert _dataset_stats(emu) == loaded


def test_acl_errors_carry_the_call_the_code_and_the_acl_message(backend, tmp_path):
    compiled = static_om(tmp_path)
    (tmp_path / "om" / "static.om").write_bytes(b"not an om at all")
    with pytest.raises(BackendError, match=r"acl.mdl.load_from_file failed \(graph static, .*static.om\) with acl "
                                           r"error 100012 .*: .*bad magic"):
        backend.load("static", "static.onnx", compiled)


def test_a_thread_without_the_context_works(backend, tmp_path):
    graph = backend.load("static", "static.onnx", static_om(tmp_path))
    x = _rand(2, 3, seed=7)
    got, failed = {}, []

    def work():
        try:
            out = backend.run(graph, {"x": backend.upload(x), "y": np.zeros((2, 3), np.float32)})
            got["sum"] = backend.to_host(out["sum"])
        except Exception as exc:  # noqa: BLE001 - reported below
            failed.append(exc)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert not failed, failed
    np.testing.assert_allclose(got["sum"], x, rtol=1e-6)
    # and back on this thread, whose context the worker's set_context did not change
    np.testing.assert_array_equal(backend.to_host(backend.upload(x)), x)


def test_close_is_idempotent_frees_everything_and_refuses_later_calls(emu, tmp_path):
    backend = create_backend("acl", "npu:0")
    graph = backend.load("batch", "batch.onnx", batch_om(tmp_path))
    dims = backend.load("dims", "dims.onnx", dims_om(tmp_path))
    pool = backend.zeros((8, 4), np.float32)
    kept = backend.upload(np.ones(3, np.float32))  # never freed by the caller: close() frees it
    backend.run(graph, {"x": _rand(2, 4), "flag": np.zeros(2, np.float32), "bias": np.zeros(4, np.float32)},
                {"y": backend.rows(pool, 0, 2)})
    backend.run(dims, {"a": _rand(1, 3), "mask": np.ones((1, 1), np.float32), "b": _rand(2, 3)})
    backend.upload(np.ones(3, np.float32))  # unreferenced, still queued when close() comes
    backend.close()
    backend.close()
    assert _leaks(emu) == []
    assert backend.closed
    backend.free(pool)  # pools close after their predictor: a no-op
    for call in (lambda: backend.upload(np.ones(2, np.float32)), lambda: backend.to_host(pool),
                 lambda: backend.zeros((2,), np.float32), lambda: backend.run(graph, {}),
                 lambda: backend.load("static", "s.onnx", static_om(tmp_path))):
        with pytest.raises(BackendError, match="acl backend was closed"):
            call()


def test_two_backends_share_acl_init(emu, tmp_path):
    first, second = create_backend("acl", "npu:0"), create_backend("acl", "npu:0")
    graph = second.load("static", "static.onnx", static_om(tmp_path))
    first.close()  # acl stays initialised for the second
    out = second.run(graph, {"x": np.ones((2, 3), np.float32), "y": np.ones((2, 3), np.float32)})
    np.testing.assert_array_equal(second.to_host(out["twice"]), np.full((2, 3), 2.0))
    second.close()
    assert _leaks(emu) == []


# ------------------------------------------------------------------------ emulator accessors
def _copy_stats(emu) -> dict:
    st = emu.stats
    return {"h2d": st.h2d_count, "d2h": st.d2h_count, "h2d_bytes": st.h2d_bytes, "d2h_bytes": st.d2h_bytes}


def _dataset_stats(emu) -> dict:
    return {"datasets": emu.stats.datasets_created, "data_buffers": emu.stats.data_buffers_created}


def _leaks(emu) -> list:
    return list(emu.stats.leaks)
