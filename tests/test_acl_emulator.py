"""The acl emulator: a positive end-to-end run per om mode, and a negative test per rule it enforces."""

from __future__ import annotations

import json
import struct
import sys
import threading

import numpy as np
import pytest
from onnx import TensorProto, helper

from sam3track.testing.acl_emulator import EmulatorError, install, pytest_fixture
from sam3track.testing.acl_emulator import constants as C

acl_emu = pytest_fixture()

H2D, D2H, D2D, H2H, DEFAULT = 1, 2, 3, 0, 4
MAGIC = b"SAM3TRACK-FAKE-OM\n"  # written here by hand, so the emulator is held to the contract's format


def _onnx_bytes() -> bytes:
    """a = 2x + 1 over x[N,4]; b = y - 1 over y[K,3]."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["K", 3])
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, None)
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, None)
    consts = [helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]), helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])]
    nodes = [helper.make_node("Mul", ["x", "two"], ["t"], name="mul"),
             helper.make_node("Add", ["t", "one"], ["a"], name="add"),
             helper.make_node("Sub", ["y", "one"], ["b"], name="sub")]
    g = helper.make_graph(nodes, "tiny", [x, y], [a, b], consts)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


ONNX = _onnx_bytes()
MODES = {
    "static": dict(x=[2, 4], y=[3, 3], a=[2, 4], b=[3, 3]),
    "dynamic_batch": dict(x=[-1, 4], y=[-1, 3], a=[4, 4], b=[4, 3], batch_sizes=[1, 2, 4]),
    "dynamic_dims": dict(x=[-1, 4], y=[-1, 3], a=[4, 4], b=[6, 3], dynamic_dims=[[1, 1], [2, 3], [4, 6]]),
    "shape_range": dict(x=[-1, 4], y=[-1, 3], a=[-1, 4], b=[-1, 3], ranges={"x": [[1, 8], 4], "y": [[1, 8], 3]}),
}


def write_om(dirpath, mode: str, x_dtype: str = "float32", soc: str = "Ascend910B2", blob: bytes = ONNX) -> str:
    m = MODES[mode]
    gear = mode in ("dynamic_batch", "dynamic_dims")
    header = {
        "fake_om_version": 1, "soc_version": soc, "mode": mode, "input_format": "ND",
        "precision": {"precision_mode_v2": "origin", "precision_mode": None},
        "inputs": [{"name": "x", "dtype": x_dtype, "dims": m["x"]}, {"name": "y", "dtype": "float32", "dims": m["y"]}],
        "hidden_input": "ascend_mbatch_shape_data" if gear else None,
        "batch_sizes": m.get("batch_sizes"), "dynamic_dims": m.get("dynamic_dims"), "ranges": m.get("ranges"),
        "outputs": [{"name": "add:0:a", "tensor": "a", "dtype": "float32", "dims": m["a"]},
                    {"name": "sub:0:b", "tensor": "b", "dtype": "float32", "dims": m["b"]}],
    }
    h = json.dumps(header).encode()
    path = dirpath / f"tiny_{mode}_{x_dtype}.om"
    path.write_bytes(MAGIC + struct.pack("<Q", len(h)) + h + blob)
    return str(path)


class Rig:
    """The acllite/mmdeploy call sequence, asserting every return code."""

    def __init__(self, acl, path: str | None = None, sizes: dict | None = None):
        self.acl = acl
        assert acl.init() == 0
        assert acl.rt.set_device(0) == 0
        self.ctx, ret = acl.rt.create_context(0)
        assert ret == 0
        self.stream, ret = acl.rt.create_stream()
        assert ret == 0
        self.ptrs, self.bufs, self.model = [], [], None
        if path:
            self.load(path, sizes)

    def malloc(self, n: int) -> int:
        p, ret = self.acl.rt.malloc(n, C.ACL_MEM_MALLOC_HUGE_FIRST)
        assert ret == 0 and p
        self.ptrs.append(p)
        return p

    def buffer(self, n: int) -> tuple[int, int]:
        p = self.malloc(n)
        b = self.acl.create_data_buffer(p, n)
        self.bufs.append(b)
        return p, b

    def load(self, path, sizes=None):
        acl = self.acl
        self.model, ret = acl.mdl.load_from_file(path)
        assert ret == 0, acl.get_recent_err_msg()
        self.desc = acl.mdl.create_desc()
        assert acl.mdl.get_desc(self.desc, self.model) == 0
        self.ins, self.outs = acl.mdl.create_dataset(), acl.mdl.create_dataset()
        self.in_ptrs, self.out_ptrs = [], []
        sizes = sizes or {}
        for i in range(acl.mdl.get_num_inputs(self.desc)):
            p, b = self.buffer(sizes.get(("in", i)) or acl.mdl.get_input_size_by_index(self.desc, i))
            assert acl.mdl.add_dataset_buffer(self.ins, b) == (self.ins, 0)
            self.in_ptrs.append(p)
        for i in range(acl.mdl.get_num_outputs(self.desc)):
            p, b = self.buffer(sizes.get(("out", i)) or acl.mdl.get_output_size_by_index(self.desc, i))
            assert acl.mdl.add_dataset_buffer(self.outs, b) == (self.outs, 0)
            self.out_ptrs.append(p)

    def put(self, i: int, arr: np.ndarray) -> None:
        arr = np.ascontiguousarray(arr)
        assert self.acl.rt.memcpy(self.in_ptrs[i], arr.nbytes, arr.ctypes.data, arr.nbytes, H2D) == 0

    def get(self, i: int, shape, dtype=np.float32) -> np.ndarray:
        out = np.empty(shape, dtype)
        assert self.acl.rt.memcpy(out.ctypes.data, out.nbytes, self.out_ptrs[i], out.nbytes, D2H) == 0
        return out

    def teardown(self) -> list[int]:
        acl, rets = self.acl, []
        if self.model:
            rets += [acl.mdl.unload(self.model), acl.mdl.destroy_desc(self.desc)]
        rets += [acl.destroy_data_buffer(b) for b in self.bufs] + [acl.rt.free(p) for p in self.ptrs]
        if self.model:
            rets += [acl.mdl.destroy_dataset(self.ins), acl.mdl.destroy_dataset(self.outs)]
        rets += [acl.rt.destroy_stream(self.stream), acl.rt.destroy_context(self.ctx),
                 acl.rt.reset_device(0), acl.finalize()]
        return rets


X = np.arange(8, dtype=np.float32).reshape(2, 4)
Y = np.arange(9, dtype=np.float32).reshape(3, 3)


# ------------------------------------------------------------------------------------------ positive


@pytest.mark.parametrize("mode", ["static", "dynamic_batch", "dynamic_dims"])
def test_end_to_end_per_mode(acl_emu, tmp_path, mode):
    import acl

    rig = Rig(acl, write_om(tmp_path, mode))
    d = rig.desc
    gear = mode != "static"
    assert acl.mdl.get_num_inputs(d) == (3 if gear else 2)
    assert acl.mdl.get_num_outputs(d) == 2
    assert acl.mdl.get_input_name_by_index(d, 0) == "x"
    assert acl.mdl.get_input_index_by_name(d, "y") == (1, 0)
    assert acl.mdl.get_output_name_by_index(d, 1) == "sub:0:b"
    assert acl.mdl.get_input_data_type(d, 0) == C.ACL_FLOAT
    dims, ret = acl.mdl.get_input_dims(d, 0)
    assert ret == 0 and dims == {"name": "x", "dimCount": 2, "dims": MODES[mode]["x"]}
    if mode == "static":
        x, y = X, Y
        assert acl.mdl.get_input_size_by_index(d, 0) == 32
        assert acl.mdl.set_dynamic_batch_size(rig.model, rig.ins, 2, 2) == C.ACL_ERROR_MODEL_NOT_DYNAMIC
    elif mode == "dynamic_batch":
        x, y = X, Y[:2]
        assert acl.mdl.get_input_name_by_index(d, 2) == C.HIDDEN_INPUT
        assert acl.mdl.get_input_size_by_index(d, 0) == 4 * 4 * 4  # the largest gear
        assert acl.mdl.get_dynamic_batch(d) == ({"batchCount": 3, "batch": [1, 2, 4]}, 0)
        assert acl.mdl.set_dynamic_batch_size(rig.model, rig.ins, 2, 2) == 0
    else:
        x, y = X, Y
        assert acl.mdl.get_input_size_by_index(d, 1) == 6 * 3 * 4
        count, ret = acl.mdl.get_input_dynamic_gear_count(d, -1)
        assert (count, ret) == (3, 0)
        gears, ret = acl.mdl.get_input_dynamic_dims(d, -1, count)
        assert ret == 0 and gears[1]["dims"] == [2, 4, 3, 3]  # full shapes concatenated
        assert acl.mdl.set_input_dynamic_dims(rig.model, rig.ins, 2, gears[1]) == 0
    rig.put(0, x)
    rig.put(1, y)
    assert acl.mdl.execute(rig.model, rig.ins, rig.outs) == 0, acl.get_recent_err_msg()
    a_dims, ret = acl.mdl.get_cur_output_dims(d, 0)
    b_dims, _ = acl.mdl.get_cur_output_dims(d, 1)
    assert ret == 0 and a_dims["dims"] == list(x.shape) and b_dims["dims"] == list(y.shape)
    np.testing.assert_array_equal(rig.get(0, x.shape), 2 * x + 1)
    np.testing.assert_array_equal(rig.get(1, y.shape), y - 1)
    assert set(rig.teardown()) == {0}, acl_emu.stats.errors
    s = acl_emu.stats
    assert s.leaks == [] and s.live_allocations == 0 and s.live_device_bytes == 0
    assert (s.h2d_count, s.d2h_count, s.d2d_count) == (2, 2, 0)
    assert s.h2d_bytes == x.nbytes + y.nbytes and s.copies[0] == ("H2D", x.nbytes)
    assert s.executes == {f"tiny_{mode}_float32.om": 1}
    assert s.datasets_created == 2 and s.data_buffers_created == (5 if gear else 4)
    assert s.peak_device_bytes > 0 and all("(error 100019)" in e for e in s.errors)


def test_teardown_codes_all_zero(acl_emu, tmp_path):
    import acl

    rig = Rig(acl, write_om(tmp_path, "dynamic_batch"))
    assert acl.mdl.set_dynamic_batch_size(rig.model, rig.ins, 2, 1) == 0
    rig.put(0, X[:1])
    rig.put(1, Y[:1])
    assert acl.mdl.execute(rig.model, rig.ins, rig.outs) == 0
    assert set(rig.teardown()) == {0}
    assert acl_emu.stats.leaks == [] and acl_emu.stats.errors == []


def test_shape_range_end_to_end(acl_emu, tmp_path):
    import acl

    sizes = {("in", 0): 8 * 16, ("in", 1): 8 * 12, ("out", 0): 8 * 16, ("out", 1): 8 * 12}
    rig = Rig(acl, write_om(tmp_path, "shape_range"), sizes)
    d = rig.desc
    assert acl.mdl.get_num_inputs(d) == 2  # no hidden input
    assert acl.mdl.get_input_size_by_index(d, 0) == 0 and acl.mdl.get_output_size_by_index(d, 0) == 0
    rng, ret = acl.mdl.get_input_dims_range(d, 0)
    assert ret == 0 and rng["range"][0] == [1, 8]
    tds = [acl.create_tensor_desc(C.ACL_FLOAT, [2, 4], C.ACL_FORMAT_ND), acl.create_tensor_desc(C.ACL_FLOAT, [3, 3], C.ACL_FORMAT_ND)]
    for i, td in enumerate(tds):
        assert acl.mdl.set_dataset_tensor_desc(rig.ins, td, i) == (rig.ins, 0)
    rig.put(0, X)
    rig.put(1, Y)
    assert acl.mdl.execute(rig.model, rig.ins, rig.outs) == 0, acl.get_recent_err_msg()
    td = acl.mdl.get_dataset_tensor_desc(rig.outs, 1)
    assert acl.get_tensor_desc_num_dims(td) == 2
    assert [acl.get_tensor_desc_dim_v2(td, k) for k in range(2)] == [(3, 0), (3, 0)]
    assert acl.get_tensor_desc_size(td) == 36
    np.testing.assert_array_equal(rig.get(1, (3, 3)), Y - 1)
    assert [acl.destroy_tensor_desc(t) for t in tds] == [None, None]
    assert set(rig.teardown()) == {0} and acl_emu.stats.leaks == []


def test_return_conventions_and_types(acl_emu):
    import acl
    import acl.rt as rt  # importable as a module too

    assert rt is acl.rt
    assert acl.init() == 0 and acl.rt.set_device(0) == 0
    assert acl.rt.get_run_mode() == (C.ACL_HOST, 0)
    ctx, ret = acl.rt.get_context()
    assert isinstance(ctx, int) and ret == 0
    p, ret = acl.rt.malloc(16, 0)
    assert isinstance(p, int) and ret == 0
    assert isinstance(acl.mdl.create_dataset(), int)
    with pytest.raises(TypeError):
        acl.rt.malloc(16.0, 0)  # float where an int is expected
    with pytest.raises(TypeError):
        acl.rt.malloc(16)  # missing argument
    with pytest.raises(TypeError):
        acl.rt.malloc(size=16, policy=0)  # no keyword arguments
    with pytest.raises(TypeError):
        acl.rt.memcpy(p, 16, "x", 16, H2D)
    assert acl.rt.malloc(np.int64(16), 0)[1] == 0  # numpy ints index like ints
    assert isinstance(acl.get_recent_err_msg(), str)


def test_fp16_input_dtype_comes_from_the_om(acl_emu, tmp_path):
    import acl

    rig = Rig(acl, write_om(tmp_path, "static", x_dtype="float16"))
    assert acl.mdl.get_input_data_type(rig.desc, 0) == C.ACL_FLOAT16
    assert acl.mdl.get_input_size_by_index(rig.desc, 0) == 16
    rig.put(0, X.astype(np.float16))
    rig.put(1, Y)
    assert acl.mdl.execute(rig.model, rig.ins, rig.outs) == 0
    np.testing.assert_array_equal(rig.get(0, (2, 4)), 2 * X + 1)
    assert set(rig.teardown()) == {0}


def test_load_from_mem_and_util(acl_emu, tmp_path):
    import acl

    rig = Rig(acl)
    blob = open(write_om(tmp_path, "static"), "rb").read()
    mid, ret = acl.mdl.load_from_mem(acl.util.bytes_to_ptr(blob), len(blob))
    assert ret == 0
    assert acl.util.ptr_to_bytes(acl.util.bytes_to_ptr(blob), 4) == blob[:4]
    arr = np.arange(4, dtype=np.float32)
    view = acl.util.ptr_to_numpy(acl.util.numpy_to_ptr(arr), (4,), np.dtype(np.float32).num)
    np.testing.assert_array_equal(view, arr)
    assert acl.mdl.unload(mid) == 0
    assert set(rig.teardown()) == {0}


def test_install_restores_sys_modules():
    sentinel = object()
    sys.modules["acl"] = sentinel
    try:
        with install() as emu:
            import acl

            assert acl is emu.acl and sys.modules["acl.mdl"] is emu.acl.mdl
        assert sys.modules["acl"] is sentinel and "acl.mdl" not in sys.modules
    finally:
        del sys.modules["acl"]
    with install():
        pass
    assert "acl" not in sys.modules


def test_gear_persists_on_its_hidden_buffer_and_padding_shows(acl_emu, tmp_path):
    import acl

    rig = Rig(acl, write_om(tmp_path, "dynamic_batch"))
    assert acl.mdl.set_dynamic_batch_size(rig.model, rig.ins, 2, 4) == 0
    rig.put(0, X[:2])  # 2 real rows into a gear of 4: rows 2-3 keep the poison
    rig.put(1, Y)
    for _ in range(2):  # set once, execute twice: the gear stays in the hidden buffer
        assert acl.mdl.execute(rig.model, rig.ins, rig.outs) == 0
    a = rig.get(0, (4, 4))
    np.testing.assert_array_equal(a[:2], 2 * X + 1)
    assert np.isnan(a[2:]).all()
    # a fresh hidden buffer swapped in has no gear
    p, b = rig.buffer(8)
    hidden = acl.mdl.get_dataset_buffer(rig.ins, 2)
    assert acl.update_data_buffer(hidden, p, 8) == 0
    assert acl.mdl.execute(rig.model, rig.ins, rig.outs) == C.ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID
    assert acl_emu.stats.executes["tiny_dynamic_batch_float32.om"] == 2


# ------------------------------------------------------------------------------------------ negative: lifecycle


def test_calls_before_init(acl_emu):
    import acl

    assert acl.rt.set_device(0) == C.ACL_ERROR_UNINITIALIZE
    assert acl.rt.malloc(16, 0) == (0, C.ACL_ERROR_UNINITIALIZE)
    assert acl.mdl.create_dataset() == 0
    assert "acl.mdl.create_dataset" in acl.get_recent_err_msg() and "[lifecycle]" in acl.get_recent_err_msg()


def test_init_twice_and_finalize_twice(acl_emu):
    import acl

    assert acl.init() == 0
    assert acl.init() == C.ACL_ERROR_REPEAT_INITIALIZE
    assert acl.finalize() == 0
    assert acl.finalize() == C.ACL_ERROR_REPEAT_FINALIZE


# ------------------------------------------------------------------------------------------ negative: context


def _in_thread(fn):
    box = []
    t = threading.Thread(target=lambda: box.append(fn()))
    t.start()
    t.join()
    return box[0]


@pytest.mark.parametrize("strict", [True, False])
def test_new_thread_needs_set_context(tmp_path, strict):
    with install(strict_context=strict):
        import acl

        rig = Rig(acl)
        got = _in_thread(lambda: acl.rt.malloc(16, 0))
        if strict:
            assert got == (0, C.ACL_ERROR_RT_CONTEXT_NULL)
            assert _in_thread(lambda: (acl.rt.set_context(rig.ctx), acl.rt.malloc(16, 0)[1])) == (0, 0)
        else:
            assert got[1] == 0


def test_model_and_stream_stay_in_their_context(acl_emu, tmp_path):
    import acl

    rig = Rig(acl, write_om(tmp_path, "static"))
    other, _ = acl.rt.create_context(0)  # binds the new context
    assert acl.mdl.execute(rig.model, rig.ins, rig.outs) == C.ACL_ERROR_RT_MODEL_CONTEXT
    assert acl.mdl.unload(rig.model) == C.ACL_ERROR_RT_MODEL_CONTEXT
    assert acl.rt.synchronize_stream(rig.stream) == C.ACL_ERROR_RT_STREAM_CONTEXT
    acl_emu.rules.strict_context = False
    assert acl.rt.synchronize_stream(rig.stream) == 0
    acl_emu.rules.strict_context = True
    assert acl.rt.destroy_context(other) == 0 and acl.rt.set_context(rig.ctx) == 0
    assert set(rig.teardown()) == {0}


# ------------------------------------------------------------------------------------------ negative: memory


def test_malloc_zero(acl_emu):
    import acl

    Rig(acl)
    assert acl.rt.malloc(0, 0) == (0, C.ACL_ERROR_RT_PARAM_INVALID)
    assert acl.rt.malloc_host(0)[1] != 0


def test_count_dest_max_and_bounds_and_interior_pointers(acl_emu):
    import acl

    rig = Rig(acl)
    p = rig.malloc(64)
    h = np.zeros(16, np.float32)
    assert acl.rt.memcpy(p, 32, h.ctypes.data, 64, H2D) != 0  # count > dest_max
    assert "dest_max" in acl.get_recent_err_msg()
    assert acl.rt.memcpy(p + 32, 64, h.ctypes.data, 64, H2D) != 0  # runs past the 64-byte block
    assert "[bounds]" in acl.get_recent_err_msg()
    assert acl.rt.memcpy(p + 32, 32, h.ctypes.data, 32, H2D) == 0  # interior pointer, in bounds
    b = acl.create_data_buffer(p, 64)
    assert acl.update_data_buffer(b, p + 16, 48) == 0
    assert acl.update_data_buffer(b, p + 16, 64) != 0
    assert acl.rt.memcpy(p + 4096, 4, h.ctypes.data, 4, H2D) != 0  # not inside any allocation
    assert acl.rt.memset(p, 64, 0, 64) == 0 and acl.rt.memset(p, 64, 0, 65) != 0
    assert acl.destroy_data_buffer(b) == 0


def test_use_after_free_and_double_free(acl_emu):
    import acl

    Rig(acl)
    p, _ = acl.rt.malloc(64, 0)
    h = np.zeros(16, np.float32)
    assert acl.rt.free(p) == 0
    assert acl.rt.memcpy(p, 64, h.ctypes.data, 64, H2D) != 0
    assert "use after free" in acl.get_recent_err_msg()
    assert acl.rt.free(p) != 0 and "double free" in acl.get_recent_err_msg()
    b = acl.create_data_buffer(0, 0)
    assert acl.destroy_data_buffer(b) == 0 and acl.destroy_data_buffer(b) != 0
    assert acl.get_data_buffer_addr(b) == 0 and "[use_after_free]" in acl.get_recent_err_msg()
    hp, _ = acl.rt.malloc_host(64)
    assert acl.rt.free_host(hp) == 0 and acl.rt.free_host(hp) != 0


@pytest.mark.parametrize("poison", [True, False])
def test_fresh_device_memory_is_poison(poison):
    with install(poison=poison):
        import acl

        rig = Rig(acl)
        p = rig.malloc(16)
        out = np.empty(4, np.float32)
        assert acl.rt.memcpy(out.ctypes.data, 16, p, 16, D2H) == 0
        assert np.isnan(out).all() if poison else (out == 0).all()


def test_host_cannot_read_device_memory(acl_emu):
    import acl

    rig = Rig(acl)
    p = rig.malloc(16)
    with pytest.raises(EmulatorError):
        acl.util.ptr_to_bytes(p, 16)
    with pytest.raises(EmulatorError):
        acl.util.ptr_to_numpy(p, (4,), np.dtype(np.float32).num)


def test_memcpy_kind_must_match_unless_lenient(tmp_path):
    for strict in (True, False):
        with install(strict_kind=strict):
            import acl

            rig = Rig(acl)
            p = rig.malloc(16)
            h = np.zeros(4, np.float32)
            ret = acl.rt.memcpy(p, 16, h.ctypes.data, 16, D2H)  # really H2D
            assert (ret != 0) == strict
            assert acl.rt.memcpy(p, 16, h.ctypes.data, 16, DEFAULT) == 0
            assert acl.rt.memcpy(p, 16, h.ctypes.data, 16, 7) != 0  # not a kind at all


def test_memcpy_async_rules_and_deferred_visibility():
    with install() as emu:
        import acl

        rig = Rig(acl)
        p = rig.malloc(64)
        host = np.arange(16, dtype=np.float32)
        assert acl.rt.memcpy_async(p, 64, host.ctypes.data, 64, H2D, rig.stream) != 0  # numpy, not malloc_host
        assert "[async_host]" in acl.get_recent_err_msg()
        hp, _ = acl.rt.malloc_host(128)
        assert acl.rt.memcpy_async(p, 64, hp + 4, 60, H2D, rig.stream) == C.ACL_ERROR_RT_ADDR_UNALIGNED
        hp2, _ = acl.rt.malloc_host(64)
        assert acl.rt.memcpy_async(hp2, 64, hp, 64, H2H, rig.stream) == C.ACL_ERROR_RT_FEATURE_NOT_SUPPORT
        staged = acl.util.ptr_to_numpy(hp, (16,), np.dtype(np.float32).num)
        staged[:] = host
        assert acl.rt.memcpy_async(p, 64, hp, 64, H2D, rig.stream) == 0
        assert acl.rt.memcpy_async(hp2, 64, p, 64, D2H, rig.stream) == 0
        back = acl.util.ptr_to_numpy(hp2, (16,), np.dtype(np.float32).num)
        assert np.isnan(back).all()  # nothing lands before the sync
        assert acl.rt.destroy_stream(rig.stream) != 0  # pending work
        assert acl.rt.synchronize_stream(rig.stream) == 0
        np.testing.assert_array_equal(back, host)
        emu.rules.strict_async_host = False
        assert acl.rt.memcpy_async(p, 64, host.ctypes.data, 64, H2D, rig.stream) == 0
        assert acl.rt.synchronize_stream(rig.stream) == 0
    with install(deferred_async=False):
        import acl

        rig = Rig(acl)
        p = rig.malloc(64)
        hp, _ = acl.rt.malloc_host(64)
        assert acl.rt.memcpy_async(hp, 64, p, 64, D2H, rig.stream) == 0
        assert acl.util.ptr_to_bytes(hp, 4) == b"\xff" * 4  # landed at once (the poison)


def test_execute_async_lands_at_sync(acl_emu, tmp_path):
    import acl

    rig = Rig(acl, write_om(tmp_path, "static"))
    rig.put(0, X)
    rig.put(1, Y)
    assert acl.mdl.execute_async(rig.model, rig.ins, rig.outs, rig.stream) == 0
    assert np.isnan(rig.get(0, (2, 4))).all()
    assert acl.rt.synchronize_stream(rig.stream) == 0
    np.testing.assert_array_equal(rig.get(0, (2, 4)), 2 * X + 1)
    assert set(rig.teardown()) == {0}


# ------------------------------------------------------------------------------------------ negative: datasets / gears


def test_dataset_counts_include_the_hidden_input(acl_emu, tmp_path):
    import acl

    rig = Rig(acl, write_om(tmp_path, "dynamic_batch"))
    short = acl.mdl.create_dataset()
    for i in range(2):  # forgets ascend_mbatch_shape_data
        acl.mdl.add_dataset_buffer(short, acl.mdl.get_dataset_buffer(rig.ins, i))
    assert acl.mdl.execute(rig.model, short, rig.outs) == C.ACL_ERROR_MODEL_INPUT_NOT_MATCH
    assert acl.mdl.set_dynamic_batch_size(rig.model, short, 2, 1) != 0  # no hidden buffer to write
    one = acl.mdl.create_dataset()
    acl.mdl.add_dataset_buffer(one, acl.mdl.get_dataset_buffer(rig.outs, 0))
    assert acl.mdl.set_dynamic_batch_size(rig.model, rig.ins, 2, 1) == 0
    assert acl.mdl.execute(rig.model, rig.ins, one) == C.ACL_ERROR_MODEL_OUTPUT_NOT_MATCH
    assert acl.mdl.destroy_dataset(short) == 0 and acl.mdl.destroy_dataset(one) == 0


def test_buffer_smaller_than_gear(acl_emu, tmp_path):
    import acl

    rig = Rig(acl, write_om(tmp_path, "dynamic_batch"), {("in", 0): 16 * 2})  # room for 2 rows
    assert acl.mdl.set_dynamic_batch_size(rig.model, rig.ins, 2, 2) == 0
    assert acl.mdl.execute(rig.model, rig.ins, rig.outs) == 0
    assert acl.mdl.set_dynamic_batch_size(rig.model, rig.ins, 2, 4) == 0
    assert acl.mdl.execute(rig.model, rig.ins, rig.outs) == C.ACL_ERROR_MODEL_INPUT_NOT_MATCH
    assert "needs 64 B" in acl.get_recent_err_msg()


def test_gear_rules(acl_emu, tmp_path):
    import acl

    rig = Rig(acl, write_om(tmp_path, "dynamic_batch"))
    assert acl.mdl.execute(rig.model, rig.ins, rig.outs) == C.ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID  # none set
    assert acl.mdl.set_dynamic_batch_size(rig.model, rig.ins, 2, 3) == C.ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID
    assert acl.mdl.set_dynamic_batch_size(rig.model, rig.ins, 1, 2) != 0  # not the hidden index
    assert acl.mdl.set_dynamic_hw_size(rig.model, rig.ins, 2, 8, 8) != 0
    assert "not emulated" in acl.get_recent_err_msg()
    assert acl.mdl.set_input_dynamic_dims(rig.model, rig.ins, 2, {"dimCount": 1, "dims": [2]}) != 0
    dims = Rig.__new__(Rig)
    dims.acl = acl
    dims.ptrs, dims.bufs = [], []
    dims.load(write_om(tmp_path, "dynamic_dims"))
    bad = {"name": "", "dimCount": 4, "dims": [2, 4, 2, 3]}  # (N=2, K=2) was not compiled
    assert acl.mdl.set_input_dynamic_dims(dims.model, dims.ins, 2, bad) == C.ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID
    assert acl.mdl.set_dynamic_batch_size(dims.model, dims.ins, 2, 2) != 0


def test_dims_gear_queries_take_index_minus_one_and_a_count_at_least_the_gears(acl_emu, tmp_path):
    """hicann/ge model_om2.cpp: index must be -1; a gear count below the model's is refused, above it
    accepted (one entry per gear comes back)."""
    import acl

    rig = Rig(acl, write_om(tmp_path, "dynamic_dims"))
    assert acl.mdl.get_input_dynamic_gear_count(rig.desc, -1) == (3, 0)
    assert acl.mdl.get_input_dynamic_gear_count(rig.desc, 2)[1] == C.ACL_ERROR_INVALID_PARAM
    assert acl.mdl.get_input_dynamic_dims(rig.desc, 0, 3)[1] == C.ACL_ERROR_INVALID_PARAM
    assert acl.mdl.get_input_dynamic_dims(rig.desc, -1, 2)[1] == C.ACL_ERROR_INVALID_PARAM
    gears, ret = acl.mdl.get_input_dynamic_dims(rig.desc, -1, 8)
    assert ret == 0 and [g["dims"] for g in gears] == [[1, 4, 1, 3], [2, 4, 3, 3], [4, 4, 6, 3]]
    batch = Rig.__new__(Rig)
    batch.acl, batch.ptrs, batch.bufs = acl, [], []
    batch.load(write_om(tmp_path, "dynamic_batch"))
    assert acl.mdl.get_input_dynamic_gear_count(batch.desc, -1) == (0, 0)  # batch gears are not dims gears


def test_the_gear_is_set_on_the_input_dataset(acl_emu, tmp_path):
    """Another dataset sharing the hidden buffer has no gear of its own; a gear set through it leaves
    the first dataset's gear differing from the buffer's bytes: both fail (145013)."""
    import acl

    rig = Rig(acl, write_om(tmp_path, "dynamic_batch"))
    other = acl.mdl.create_dataset()
    for i in range(3):
        acl.mdl.add_dataset_buffer(other, acl.mdl.get_dataset_buffer(rig.ins, i))
    assert acl.mdl.set_dynamic_batch_size(rig.model, rig.ins, 2, 2) == 0
    assert acl.mdl.execute(rig.model, rig.ins, rig.outs) == 0
    assert acl.mdl.execute(rig.model, other, rig.outs) == C.ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID
    assert "no gear selected on this input dataset" in acl.get_recent_err_msg()
    assert acl.mdl.set_dynamic_batch_size(rig.model, other, 2, 4) == 0
    assert acl.mdl.execute(rig.model, other, rig.outs) == 0
    assert acl.mdl.execute(rig.model, rig.ins, rig.outs) == C.ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID
    assert "differs from the [4]" in acl.get_recent_err_msg()
    assert acl.mdl.destroy_dataset(other) == 0


def test_gear_model_outputs_need_the_largest_gear_and_carry_leftovers_past_the_gear(acl_emu, tmp_path):
    """GE copies an output's largest-gear size into the caller's buffer (davinci_model.cc
    CopyOutputDataLegacy): a buffer sized for the current gear is refused, and the bytes after this
    gear's result are not the result."""
    import acl

    rig = Rig(acl, write_om(tmp_path, "dynamic_batch"), {("out", 0): 2 * 16})  # a: room for gear 2 only
    assert acl.mdl.set_dynamic_batch_size(rig.model, rig.ins, 2, 2) == 0
    assert acl.mdl.execute(rig.model, rig.ins, rig.outs) == C.ACL_ERROR_RT_PARAM_INVALID
    assert "largest gear" in acl.get_recent_err_msg() and "needs 64 B" in acl.get_recent_err_msg()
    full = Rig.__new__(Rig)
    full.acl, full.ptrs, full.bufs = acl, [], []
    full.load(write_om(tmp_path, "dynamic_batch"))
    zeros = np.zeros((4, 4), np.float32)
    assert acl.rt.memcpy(full.out_ptrs[0], zeros.nbytes, zeros.ctypes.data, zeros.nbytes, H2D) == 0
    full.put(0, X)
    assert acl.mdl.set_dynamic_batch_size(full.model, full.ins, 2, 2) == 0
    assert acl.mdl.execute(full.model, full.ins, full.outs) == 0
    a = full.get(0, (4, 4))
    np.testing.assert_array_equal(a[:2], 2 * X + 1)
    assert np.isnan(a[2:]).all()  # what the caller wrote there is gone


def test_output_names_without_the_tensor_name(tmp_path):
    with install(output_tensor_names=False):
        import acl

        rig = Rig(acl, write_om(tmp_path, "static"))
        assert [acl.mdl.get_output_name_by_index(rig.desc, i) for i in range(2)] == ["add:0", "sub:0"]


def test_shape_range_rules(acl_emu, tmp_path):
    import acl

    sizes = {("in", 0): 8 * 16, ("in", 1): 8 * 12, ("out", 0): 8 * 16, ("out", 1): 8 * 12}
    rig = Rig(acl, write_om(tmp_path, "shape_range"), sizes)
    assert acl.mdl.execute(rig.model, rig.ins, rig.outs) == C.ACL_ERROR_GE_SHAPE_INVALID  # no tensor descs
    td = acl.create_tensor_desc(C.ACL_FLOAT, [9, 4], C.ACL_FORMAT_ND)
    td_y = acl.create_tensor_desc(C.ACL_FLOAT, [1, 3], C.ACL_FORMAT_ND)
    acl.mdl.set_dataset_tensor_desc(rig.ins, td, 0)
    acl.mdl.set_dataset_tensor_desc(rig.ins, td_y, 1)
    assert acl.mdl.execute(rig.model, rig.ins, rig.outs) == C.ACL_ERROR_GE_SHAPE_INVALID  # 9 > 8
    assert "outside [1, 8]" in acl.get_recent_err_msg()
    assert acl.mdl.set_dynamic_batch_size(rig.model, rig.ins, 2, 1) == C.ACL_ERROR_MODEL_NOT_DYNAMIC


def test_soc_mismatch_fails_execute(tmp_path):
    with install(soc_version="Ascend910B3"):
        import acl

        rig = Rig(acl, write_om(tmp_path, "static"))
        assert acl.mdl.execute(rig.model, rig.ins, rig.outs) == C.ACL_ERROR_RT_MODEL_EXECUTE


def test_bad_model_files(acl_emu, tmp_path):
    import acl

    Rig(acl)
    assert acl.mdl.load_from_file(str(tmp_path / "missing.om")) == (0, C.ACL_ERROR_INVALID_FILE)
    (tmp_path / "real.om").write_bytes(b"\x00" * 64)
    assert acl.mdl.load_from_file(str(tmp_path / "real.om")) == (0, C.ACL_ERROR_DESERIALIZE_MODEL)
    assert acl.mdl.load_from_file(write_om(tmp_path, "static", blob=b"not onnx"))[1] != 0


# ------------------------------------------------------------------------------------------ negative: leaks / stats


@pytest.mark.parametrize("strict", [True, False])
def test_leaks_reported_at_reset_device(tmp_path, strict):
    with install(strict_leaks=strict) as emu:
        import acl

        rig = Rig(acl, write_om(tmp_path, "static"))
        assert acl.rt.destroy_stream(rig.stream) == 0
        assert acl.rt.set_context(rig.ctx) == 0
        ret = acl.rt.reset_device(0)
        assert (ret == C.EMU_LEAK) == strict and (ret == 0) == (not strict)
        leaks = "\n".join(emu.stats.leaks)
        for what in ("model 1", "device allocation", "dataset", "data buffer", "model desc", "context"):
            assert what in leaks
        assert emu.stats.live_allocations == 0
        assert acl.finalize() == 0


def test_reset_stats(acl_emu):
    import acl

    rig = Rig(acl)
    p = rig.malloc(64)
    h = np.zeros(16, np.float32)
    acl.rt.memcpy(p, 64, h.ctypes.data, 64, H2D)
    q = rig.malloc(64)
    assert acl.rt.memcpy(q, 64, p, 64, D2D) == 0
    s = acl_emu.stats
    assert (s.h2d_count, s.d2d_count, s.d2d_bytes, s.copies) == (1, 1, 64, [("H2D", 64), ("D2D", 64)])
    assert s.peak_device_bytes == 128 and s.live_allocations == 2
    acl_emu.reset_stats()
    assert acl_emu.stats.h2d_count == 0 and acl_emu.stats.copies == []
    assert acl_emu.stats.live_allocations == 2 and acl_emu.stats.peak_device_bytes == 128
