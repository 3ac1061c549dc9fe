"""ONNX Runtime backend: IOBinding with OrtValues, so features and memory stay on the device.

Views into pools are bound by raw pointer (base + row offset), so a graph writes its outputs straight
into the memory bank's pools and reads them back without any copy. Sessions are made by ort_sessions.py
(from the compile cache when the load gives one); the graphs it defers get their session at their first run,
and a released graph is freed after its run and opened again at its next.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from pathlib import Path

import numpy as np

from .. import load_notice
from ..errors import BackendError, BundleError, Sam3TrackError
from .base import Backend, DeviceTensor, Graph, check_gears, graph_gears
from .ort_sessions import SessionMaker, return_freed_heap

# device -> (execution provider, where OrtValues live). CANN keeps tensors in host memory here: its
# provider copies them in per run (IOBinding to "cann" OrtValues is not offered by the public wheel
# [unconfirmed]); for features and memory resident on the NPU use backend="acl".
_DEVICES = {"cpu": ("CPUExecutionProvider", "cpu"), "cuda": ("CUDAExecutionProvider", "cuda"),
            "cann": ("CANNExecutionProvider", "cpu")}
_INSTALL_HINTS = {
    "CUDAExecutionProvider": "install onnxruntime-gpu for device='cuda' or use device='cpu'",
    "CANNExecutionProvider": "install onnxruntime-cann instead of onnxruntime (it needs numpy<2) on a machine "
                             "with the CANN toolkit (source set_env.sh), or use backend='acl' with an OM bundle",
}


WEIGHTS = ("fp32", "fp16")  # how the CPU keeps the weights (fp16_weights.py); computed in fp32 either way

# The intra-op threads of a backend made without threads= (None: threads_within_affinity's rule); a
# process that shares the machine on purpose (a test worker) sets its share here.
DEFAULT_THREADS: int | None = None


def threads_within_affinity() -> int | None:
    """The CPUs this process may run on, when that is fewer than the machine's (taskset, a cpuset, a
    pinned worker); None otherwise. ONNX Runtime's own default ignores the affinity mask: it starts one
    thread per physical core of the machine and pins each to its core, outside the mask (checked with
    taskset -c 0: a pool thread pinned to CPU 1), so processes that share the machine oversubscribe it.
    torch and OpenVINO already size their defaults to the mask (docs/testing.md: what it cost)."""
    try:
        allowed = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity API (macOS, Windows): ONNX Runtime's default
        return None
    return allowed if allowed < (os.cpu_count() or allowed) else None


class OrtGraph(Graph):
    def __init__(self, name: str, session, gears: dict[str, tuple[int, ...]], io: dict | None = None,
                 opener=None, saved: tuple[str, Path] | None = None):
        """session: the graph's InferenceSession; or None for a deferred graph, described by `io`
        (compile_cache._io_of's record) until opener() makes its session at the first run. saved: for a
        released graph (compile_cache.released), its bundle file and its cache entry, from which its
        next run opens it again."""
        self.name = name
        self.session = session
        self.opener = opener
        self.saved = saved
        self.users = 0  # runs of a released graph in flight (under lock): it is freed only at none
        self.lock = threading.Lock()  # one thread makes a deferred session; the others wait for it
        if session is not None:
            io = {"inputs": [[t.name, t.shape] for t in session.get_inputs()],
                  "outputs": [[t.name, t.shape] for t in session.get_outputs()]}
        self.input_names = tuple(n for n, _ in io["inputs"])
        self.output_names = tuple(n for n, _ in io["outputs"])
        tensors = list(io["inputs"]) + list(io["outputs"])
        self.shapes = {n: tuple(d if isinstance(d, int) else None for d in dims) for n, dims in tensors}
        self.dims = {n: tuple(dims) for n, dims in tensors}
        self.sizes = dict(gears)

    @property
    def loaded(self) -> bool:
        """Whether the graph has its session (a deferred one gets it at its first run)."""
        return self.session is not None


class _Storage:
    """A device allocation; views keep it alive through this object until the backend frees it."""

    def __init__(self, ortvalue):
        self.ortvalue = ortvalue
        self.ptr = ortvalue.data_ptr()

    @property
    def freed(self) -> bool:
        return self.ortvalue is None


class OnnxRuntimeBackend(Backend):
    name = "onnxruntime"

    def __init__(self, device: str = "cpu", threads: int | None = None, gears=None, compile_cache=None,
                 weights: str = "fp32"):
        """threads: intra_op_num_threads (None: ONNX Runtime's default, one per core, or as many as the
        CPUs this process may run on when its affinity is narrower, see threads_within_affinity). gears: None
        (every call at its own size), "compiled" (an OM bundle's gears, so CPU runs take the padding and
        chunking path an Ascend run takes), or {axis: sizes} for every graph. compile_cache: a
        compile_cache.CompileCache (the predictor makes one per bundle), or None: every graph optimised
        from its file at load. weights: "fp32" (default) or "fp16" (device cpu: each graph's large
        weights kept in fp16 and cast to fp32 where used, fp16_weights.py: about half the memory and
        slower frames)."""
        super().__init__()
        self._cache = compile_cache
        self._gears = check_gears(gears)
        import onnxruntime as ort

        device, _, index = device.partition(":")
        if device not in _DEVICES:
            raise Sam3TrackError(f"unknown device {device!r} for onnxruntime; use one of {', '.join(_DEVICES)}")
        provider, self.device_type = _DEVICES[device]
        if provider not in ort.get_available_providers():
            raise Sam3TrackError(
                f"onnxruntime here has no {provider} (available: {', '.join(ort.get_available_providers())}); "
                f"{_INSTALL_HINTS.get(provider, 'use device=cpu')}")
        if weights not in WEIGHTS or (weights != "fp32" and provider != "CPUExecutionProvider"):
            raise Sam3TrackError(f"weights={weights!r}: use one of {', '.join(map(repr, WEIGHTS))}; 'fp16' is for "
                                 "device='cpu'")
        self._weights = weights
        self.provider = provider
        self.device_id = int(index or 0)
        self._ort = ort
        self._providers = [provider] if provider == "CPUExecutionProvider" else [provider, "CPUExecutionProvider"]
        threads = threads or DEFAULT_THREADS or threads_within_affinity()
        self._sessions = SessionMaker(ort, self._providers, threads, compile_cache, weights,
                                      _INSTALL_HINTS.get(provider, ""))
        self._run_options = ort.RunOptions()
        if provider == "CPUExecutionProvider":
            # Each session's arena hands back what a run took beyond its first chunk: arenas otherwise
            # keep every graph's largest scratch, and the tensors kept between frames scatter the
            # rest (full size, 1 object: peak 5.2 -> 4.2 GB, no slower; docs/speed.md). Every session
            # must keep its CPU arena (enable_cpu_mem_arena): a run that asks to shrink none fails.
            self._run_options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
        self._waiting: list[OrtGraph] = []  # released graphs that ran: freed when another graph runs
        self._waiting_lock = threading.Lock()
        self._graphs: list[OrtGraph] = []
        self._copy_sessions: dict[tuple, object] = {}
        self._storages: weakref.WeakSet[_Storage] = weakref.WeakSet()  # every allocation not yet collected
        self.closed = False

    # ----------------------------------------------------------------------------------- graphs
    def _check_open(self) -> None:
        if self.closed:
            raise BackendError("the onnxruntime backend was closed (predictor.close()); load the bundle again")

    def load(self, name: str, path: str, compiled: dict | None = None) -> OrtGraph:
        self._check_open()
        gears = graph_gears(self._gears, name, compiled)
        cache = self._cache
        entry = cache.ort_entry(self._ort, name, self._providers, self._weights) if cache is not None else None
        hit = cache.ort_lookup(entry) if entry is not None else None
        saved = (path, entry) if entry is not None and name in cache.released else None
        if hit is None:
            graph = OrtGraph(name, self._sessions.make(name, path, entry), gears, saved=saved)
            if saved is not None:  # saved now: freed until its first run, as after a warm load
                self._free(graph)
        elif name in cache.deferred or saved is not None:  # checked now, its session made at the first run
            opener = lambda: self._sessions.open_saved(name, path, entry, hit[0])  # noqa: E731
            graph = OrtGraph(name, None, gears, hit[1], opener=opener, saved=saved)
        else:
            graph = OrtGraph(name, self._sessions.open_saved(name, path, entry, hit[0]), gears)
        self._graphs.append(graph)
        return graph

    def _session_of(self, graph: OrtGraph):
        """The graph's session, made now when the load deferred it (or a release freed it); a released
        graph counts the run as a user until _done_with."""
        session = graph.session
        if session is None or graph.saved is not None:
            with graph.lock:
                self._check_open()
                if graph.session is None:
                    if graph.opener is None:
                        raise BackendError(f"internal error: graph {graph.name!r} was not loaded by this "
                                           "onnxruntime backend; please report this")
                    graph.session, graph.opener = graph.opener(), None
                session = graph.session
                graph.users += graph.saved is not None
        return session

    # ---------------------------------------------------------------------------------- tensors
    def _wrap(self, ortvalue) -> DeviceTensor:
        dtype = np.dtype(_ORT_TO_NUMPY[ortvalue.data_type()])
        storage = _Storage(ortvalue)
        self._storages.add(storage)
        return DeviceTensor(tuple(ortvalue.shape()), dtype, (storage, 0))

    @property
    def live_allocations(self) -> int:
        return sum(1 for s in list(self._storages) if not s.freed)

    def free(self, tensor: DeviceTensor) -> None:
        storage, _ = tensor.handle
        storage.ortvalue = None  # ONNX Runtime releases the buffer with its last reference

    def upload(self, array: np.ndarray) -> DeviceTensor:
        self._check_open()
        array = np.ascontiguousarray(array)
        ov = self._ort.OrtValue.ortvalue_from_shape_and_type(array.shape, array.dtype, self.device_type,
                                                             self.device_id)
        ov.update_inplace(array)
        self._count("to_device", array.shape, array.nbytes)
        return self._wrap(ov)

    def empty(self, shape, dtype) -> DeviceTensor:
        self._check_open()
        ov = self._ort.OrtValue.ortvalue_from_shape_and_type(list(shape), np.dtype(dtype), self.device_type,
                                                             self.device_id)
        return self._wrap(ov)

    def zeros(self, shape, dtype) -> DeviceTensor:
        self._check_open()
        ov = self._ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, dtype), self.device_type, self.device_id)
        return self._wrap(ov)

    def rows(self, tensor: DeviceTensor, start: int, count: int) -> DeviceTensor:
        storage, offset = tensor.handle
        row_bytes = tensor.nbytes // max(tensor.shape[0], 1)
        if start < 0 or start + count > tensor.shape[0]:
            raise BackendError(f"internal error: rows {start}..{start + count} outside a tensor of "
                               f"{tensor.shape[0]} rows; please report this")
        return DeviceTensor((count,) + tuple(tensor.shape[1:]), tensor.dtype, (storage, offset + start * row_bytes))

    def _is_whole(self, tensor: DeviceTensor) -> bool:
        storage, offset = tensor.handle
        return offset == 0 and tuple(storage.ortvalue.shape()) == tuple(tensor.shape)

    def to_host(self, tensor: DeviceTensor, rows: np.ndarray | None = None) -> np.ndarray:
        self._check_open()
        if rows is None:
            out = np.empty(tensor.shape, tensor.dtype)
            self._count("to_host", tensor.shape, out.nbytes)
            if self._is_whole(tensor) and self.device_type == "cpu":
                np.copyto(out, self._storage(tensor).ortvalue.numpy())  # a copy: the output buffer is ORT's
            else:
                self._run_copy(tensor, self._host_tensor(out))
            return out
        # Only the selected rows leave the device, in one Gather run (never the whole tensor).
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        out = np.empty((rows.size,) + tuple(tensor.shape[1:]), tensor.dtype)
        self._count("to_host", out.shape, out.nbytes)
        if rows.size:
            session = self._helper_session("gather", tensor.dtype)
            io = session.io_binding()
            self._bind(io, "x", tensor, output=False)
            io.bind_cpu_input("index", rows)
            self._bind(io, "y", self._host_tensor(out), output=True)
            session.run_with_iobinding(io)
        return out

    def _host_tensor(self, array: np.ndarray) -> DeviceTensor:
        ov = self._ort.OrtValue.ortvalue_from_numpy(array, "cpu", 0)
        return DeviceTensor(array.shape, array.dtype, (_Storage(ov), 0))

    def copy(self, src: DeviceTensor, dst: DeviceTensor) -> None:
        self._check_open()
        if tuple(src.shape) != tuple(dst.shape) or src.dtype != dst.dtype:
            raise BackendError(f"internal error: copy between {src.shape} {src.dtype} and {dst.shape} {dst.dtype}; "
                               "please report this")
        self._run_copy(src, dst)

    def _run_copy(self, src: DeviceTensor, dst: DeviceTensor) -> None:
        session = self._helper_session("copy", src.dtype)
        io = session.io_binding()
        self._bind(io, "x", src, output=False)
        self._bind(io, "y", dst, output=True)
        session.run_with_iobinding(io)

    def _helper_session(self, kind: str, dtype):
        """One-node graphs that move data on any device ORT runs on, views included: Identity copies,
        Gather picks rows."""
        key = (kind, np.dtype(dtype).name)
        if key not in self._copy_sessions:
            from onnx import TensorProto, helper

            elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
            inputs = [helper.make_tensor_value_info("x", elem, None)]
            if kind == "gather":
                node = helper.make_node("Gather", ["x", "index"], ["y"], axis=0)
                inputs.append(helper.make_tensor_value_info("index", TensorProto.INT64, [None]))
            else:
                node = helper.make_node("Identity", ["x"], ["y"])
            g = helper.make_graph([node], kind, inputs, [helper.make_tensor_value_info("y", elem, None)])
            model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
            model.ir_version = 9
            options = self._ort.SessionOptions()
            options.intra_op_num_threads = 1  # a copy or a row gather: no pool whose workers spin after it
            self._copy_sessions[key] = self._ort.InferenceSession(model.SerializeToString(), sess_options=options,
                                                                  providers=self._providers)
        return self._copy_sessions[key]

    @staticmethod
    def _storage(tensor: DeviceTensor) -> _Storage:
        storage = tensor.handle[0]
        if storage.freed:
            raise BackendError(f"internal error: a device tensor {tensor.shape} was used after it was freed "
                               "(a pool view taken before the pool grew?); please report this")
        return storage

    def _bind(self, io, name: str, tensor: DeviceTensor, output: bool) -> None:
        storage, offset = self._storage(tensor), tensor.handle[1]
        device = storage.ortvalue.device_name().lower()
        args = (name, "cuda" if "cuda" in device else "cpu", self.device_id if "cuda" in device else 0,
                np.dtype(tensor.dtype), list(tensor.shape), storage.ptr + offset)
        if output:
            io.bind_output(*args)
        elif self._is_whole(tensor):
            io.bind_ortvalue_input(name, storage.ortvalue)
        else:
            io.bind_input(*args)

    # ------------------------------------------------------------------------------------- run
    def run(self, graph: OrtGraph, inputs, outputs=None):
        self._check_open()
        outputs = outputs or {}
        self.calls[graph.name] += 1
        if self._waiting:
            self._free_waiting(graph)
        session = self._session_of(graph)
        try:
            io = self._bound(graph, session, inputs, outputs)
            started = time.perf_counter()
            session.run_with_iobinding(io, self._run_options)
            self.seconds[graph.name] += time.perf_counter() - started
        finally:
            if graph.saved is not None:
                self._done_with(graph)
        return {name: outputs[name] if name in outputs else self._wrap(ov)
                for name, ov in zip(graph.output_names, io.get_outputs())}

    def _bound(self, graph: OrtGraph, session, inputs, outputs):
        """A fresh IOBinding of one run's inputs and outputs: nothing aliases a previous result."""
        io = session.io_binding()
        for name in graph.input_names:
            if name not in inputs:
                raise Sam3TrackError(f"graph {graph.name} needs input {name!r}")
            value = inputs[name]
            if isinstance(value, np.ndarray):  # a per-call host input: copied in now, counted
                value = self.upload(value)
            self._bind(io, name, value, output=False)
        for name in graph.output_names:
            if name in outputs:
                self._bind(io, name, outputs[name], output=True)
            else:
                io.bind_output(name, self.device_type, self.device_id)
        return io

    # ---------------------------------------------------------------------------- released graphs
    # A released graph (compile_cache.released: a large text encoder) is freed once another graph runs,
    # so a burst of prompts opens it once and no frame's peak holds it. Its outputs keep its session's
    # arena alive until they go: its callers copy them into their own buffers and free them.
    def _done_with(self, graph: OrtGraph) -> None:
        with graph.lock:
            graph.users -= 1
        with self._waiting_lock:
            if graph not in self._waiting:
                self._waiting.append(graph)

    def _free_waiting(self, running: OrtGraph) -> None:
        """Free every released graph that ran since, except `running` and those still in use."""
        with self._waiting_lock:
            waiting = [g for g in self._waiting if g is not running]
        freed = [g for g in waiting if self._free(g)]
        if freed:
            with self._waiting_lock:
                self._waiting = [g for g in self._waiting if g not in freed]
            return_freed_heap()

    def _free(self, graph: OrtGraph) -> bool:
        """Drop a released graph's session (its weights, its arena) until its next run opens it from the
        cache entry; kept while that entry is missing. False while a run still uses it."""
        path, entry = graph.saved
        with graph.lock:
            if graph.users:
                return False
            if graph.session is not None and (entry / "model.onnx").is_file():
                graph.session = None
                graph.opener = lambda: self._sessions.reopen(graph.name, path, entry)
        return True

    def close(self) -> None:
        for graph in self._graphs:
            with graph.lock:  # never while another thread makes a deferred session
                graph.session = graph.opener = None  # the InferenceSession goes with its last reference
        self._graphs.clear()
        self._waiting = []
        self._copy_sessions.clear()
        for storage in list(self._storages):
            storage.ortvalue = None
        self.closed = True
        return_freed_heap()


_ORT_TO_NUMPY = {
    "tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int64)": np.int64,
    "tensor(int32)": np.int32, "tensor(bool)": np.bool_, "tensor(uint8)": np.uint8, "tensor(double)": np.float64,
}
