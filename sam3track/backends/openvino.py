"""OpenVINO backend (CPU): the bundle's .onnx graphs compiled by OpenVINO, tensors kept in OpenVINO memory.

One compiled model and infer request per graph; outputs named in `outputs=` are written straight into the
caller's views, every other output into a fresh tensor. Options: shapes="dynamic" (default: one compile per
graph), "rows" (dynamic, and a graph whose row counts settle compiled again with them fixed, faster calls:
openvino_rows.py) or "static" (compiled again per new call shape, faster calls), precision="fp32" (default,
always set) or "bf16" (CPUs that list BF16), weights="fp32" (default) or "fp16" (kept in fp16:
store_weights_in_fp16), cache_dir= (OpenVINO's compiled-model cache; by default the compile cache's folder of
the bundle, compile_cache.py). Graphs the load defers are read at load and compiled at their first run; a
released graph (a large text encoder) is compiled again at each first run after another graph ran. The
design: docs/architecture.md, "The OpenVINO backend"; what static shapes and bf16 gain and cost, and which
quantised graphs load: docs/speed.md, "CPU fast paths".
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections import Counter, OrderedDict
from pathlib import Path

import numpy as np
import openvino as ov

from .. import load_notice
from ..errors import BackendError, BundleError, Sam3TrackError
from .base import Backend, DeviceTensor, Graph, check_gears, graph_gears
from .compile_cache import STATS as CACHE_STATS
from .openvino_rows import FIXED_ROWS_CONFIG, RowModels

_VERSION = ov.__version__.split("-")[0]  # "2026.4.1" of "2026.4.1-22982-...-releases/2026/4"
PRECISIONS = ("fp32", "bf16")
SHAPES = ("dynamic", "rows", "static")
WEIGHTS = ("fp32", "fp16")
_HINTS = {"fp32": "f32", "bf16": "bf16"}


# Axes the frame loop splits into chunks of the largest planned size (call_sizes.chunks); every other
# axis must hold a call's n in one run (call_sizes.fixed_size)
SPLIT_AXES = ("objects", "prompts", "buckets")
# Per graph, with shapes="static": compiled models kept, the least recently used dropped. Each holds its own
# weights and its own buffers for every intermediate at its shapes: the mid propagation decoder at 16 objects
# about 1.1 GB a shape (5 shapes kept: 7.7 GB resident; 11 without gears: 14.7 GB; dynamic shapes: 3.8 GB).
# With OpenVINO's cache (CACHE_DIR) a dropped shape comes back as an import: two kept, the steady shape and one
# more, so a count that moves between two gears does not import on every frame. Without it a dropped shape is
# compiled again (seconds), so more are kept.
MAX_STATIC_SHAPES = 2
MAX_STATIC_SHAPES_UNCACHED = 6


class OvGraph(Graph):
    def __init__(self, name: str, model, compiled, gears: dict[str, tuple[int, ...]], compile_for=None,
                 deferred=None, reader=None, keep_static: int = MAX_STATIC_SHAPES, compile_rows=None):
        """model: the graph as read (its ports carry the ONNX names; compiling can merge other tensor
        names into them), kept only while a deferred compile still needs it; compiled:
        the same graph compiled with its dynamic axes, ports in the same order, or None with
        shapes="static", where compile_for(model, input shapes) compiles the model as reader() reads it
        again, reshaped to those shapes, or None for a graph the load deferred: deferred(model) compiles
        it at its first run. reader: reads the model again (static shapes; a released graph), so the read
        model is not kept; a released graph (compile_cache.released) has its compiled model dropped once
        another graph runs (OpenVinoBackend._free_released), so its next run reads and compiles it again
        (from OpenVINO's cache). keep_static: the compiled shapes kept (static shapes). compile_rows:
        shapes="rows": compiles the graph with the leading sizes {input index: rows} fixed (RowModels)."""
        self.name = name
        self.model = model
        self.compiled = compiled
        self.request = compiled.create_infer_request() if compiled is not None else None  # reused by every run
        self.compile_for = compile_for
        self.deferred = deferred
        self.static: OrderedDict[tuple, tuple] = OrderedDict()  # input shapes -> (compiled, request), LRU order
        self.keep_static = keep_static
        self.lock = threading.Lock()
        # ports are bound by index, in the order the ONNX graph declares them
        self.input_names = tuple(p.get_node().get_friendly_name() for p in model.inputs)
        self.output_names = tuple(_output_name(p) for p in model.outputs)
        ports = list(model.inputs) + list(model.outputs)
        self.shapes = {n: tuple(d.get_length() if d.is_static else None for d in p.get_partial_shape())
                       for n, p in zip(self.input_names + self.output_names, ports)}
        self.sizes = dict(gears)
        self.output_types = [p.get_element_type() for p in model.outputs]
        leading = tuple(i for i, n in enumerate(self.input_names) if self.shapes[n] and self.shapes[n][0] is None)
        self.rows = RowModels(name, leading, compile_rows) if compile_rows is not None else None
        self.released_for = 0  # RowModels.compiles when the dynamic model's buffers were last released
        self.reader, self.compiler = reader, deferred
        if compiled is not None or reader is not None:  # the read model holds the weights as read: not kept
            self.model = None
        self.closed = False

    @property
    def loaded(self) -> bool:
        """Whether the graph is compiled now (a deferred or released one is compiled at its next run)."""
        return not self.closed and (self.compiled is not None or bool(self.static))

    def request_for(self, shapes: tuple) -> tuple:
        """(infer request, its compiled model) for a call with these input shapes; called under the lock."""
        if self.compiled is None and self.deferred is not None:  # a deferred graph's first run, or a released one's
            self.compiled, self.deferred = self.deferred(self.model if self.model is not None else self.reader()), None
            self.request = self.compiled.create_infer_request()
            self.model = None
        if self.compile_for is None:
            entry = self.rows.request_for(shapes) if self.rows is not None else None
            if entry is None:
                return self.request, self.compiled
            if self.released_for != self.rows.compiles:  # a new fixed model: the dynamic model's buffers from
                self.compiled.release_memory()  # the calls that settled it go back (not at every later switch)
                self.released_for = self.rows.compiles
            return entry
        entry = self.static.get(shapes)
        if entry is None:
            compiled = self.compile_for(self.reader(), shapes)
            entry = self.static[shapes] = (compiled, compiled.create_infer_request())
            while len(self.static) > self.keep_static:
                self.static.popitem(last=False)
        else:
            self.static.move_to_end(shapes)
        return entry[1], entry[0]

    @staticmethod
    def fresh_output(compiled, index: int):
        """An OpenVINO tensor for output ``index`` of ``compiled``: its own shape where static, else empty
        (the run sizes it)."""
        port = compiled.outputs[index]
        shape = port.get_partial_shape()
        dims = shape.to_shape() if shape.is_static else [0] * (shape.rank.get_length() if shape.rank.is_static
                                                               else 1)
        return ov.Tensor(port.get_element_type(), list(dims))

    def free_compiled(self) -> None:
        """A released graph after its run: its compiled model dropped (weights, packed copies, buffers)
        until its next run compiles it again; called under the lock."""
        if self.compiled is not None:
            self.request = self.compiled = None
            self.deferred = self.compiler

    def release(self) -> None:
        # OpenVINO frees them with their last reference
        self.request = self.compiled = self.deferred = self.compiler = self.reader = None
        self.static.clear()
        if self.rows is not None:
            self.rows.clear()
        self.closed = True


class _Storage:
    """An OpenVINO allocation; views reach it through this object until the backend frees it."""

    def __init__(self, tensor):
        self.tensor = tensor
        self.bytes = tensor.data.reshape(-1).view(np.uint8)  # shares the tensor's memory (keeps it alive)

    @property
    def freed(self) -> bool:
        return self.tensor is None


class OpenVinoBackend(Backend):
    name = "openvino"

    def __init__(self, device: str = "cpu", threads: int | None = None, precision: str | None = None,
                 cache_dir: str | os.PathLike | None = None, shapes: str | None = None, compile_cache=None,
                 weights: str = "fp32", gears=None):
        """device: "cpu". threads: OpenVINO's INFERENCE_NUM_THREADS (None: OpenVINO's default, every
        core). precision: "fp32" (default) or "bf16" (CPUs whose OPTIMIZATION_CAPABILITIES list BF16:
        AMX, AVX512-BF16). cache_dir: a folder for OpenVINO's compiled-model cache, one subfolder per
        precision, weights and thread count (None: no cache).
        shapes: "dynamic" (default: one compile per graph), "rows" (dynamic, and each graph compiled again
        for the row counts its calls settle on: openvino_rows.py) or "static" (one compile per graph and
        distinct input shapes, faster runs; see the module docstring). compile_cache: the load's
        compile_cache.CompileCache: its folder of the bundle is the CACHE_DIR when cache_dir is unset,
        and its deferred graphs are compiled at their first run. weights: "fp32" (default: as the bundle
        stores them) or "fp16" (each weight kept in fp16 behind a Convert: store_weights_in_fp16).
        gears: None, "compiled" (an OM bundle's) or {axis: sizes}: calls padded up to those sizes, so that
        static shapes compile a bounded set (the predictor gives shapes="static" call_sizes.static_gears);
        past the largest size an axis runs as chunks where the caller splits it, else at its own size."""
        super().__init__()
        self._gears = check_gears(gears)
        shapes = "dynamic" if shapes is None else shapes
        if shapes not in SHAPES:
            raise Sam3TrackError(f"unknown shapes {shapes!r} for openvino; use one of {', '.join(SHAPES)}")
        self.shapes = shapes
        if str(device).lower() != "cpu":
            raise Sam3TrackError(f"unknown device {device!r} for openvino; this backend runs on device='cpu' "
                                 "(for a GPU use backend='onnxruntime', device='cuda:0')")
        precision = "fp32" if precision is None else precision
        if precision not in PRECISIONS:
            raise Sam3TrackError(f"unknown precision {precision!r} for openvino; use one of {', '.join(PRECISIONS)}")
        self._core = shared_core()
        if precision == "bf16":
            capabilities = cpu_capabilities(self._core)
            if "BF16" not in capabilities:
                cpu = self._core.get_property("CPU", "FULL_DEVICE_NAME")
                raise Sam3TrackError(
                    f"precision='bf16' needs a CPU with bf16 support (AMX or AVX512-BF16); OpenVINO reports "
                    f"{cpu} with {', '.join(capabilities)} only: use precision='fp32' (the default)")
        if weights not in WEIGHTS:
            raise Sam3TrackError(f"weights={weights!r}: use one of {', '.join(map(repr, WEIGHTS))}")
        self.precision, self.weights = precision, weights
        self.device = "CPU"
        self._config = {"INFERENCE_PRECISION_HINT": _HINTS[precision],  # explicit: bf16 is the CPU default
                        "PERFORMANCE_HINT": "LATENCY"}  # one request at a time, all cores on it
        if threads:
            self._config["INFERENCE_NUM_THREADS"] = int(threads)
        self._deferred = compile_cache.deferred if compile_cache is not None else frozenset()
        self._released = compile_cache.released if compile_cache is not None else frozenset()
        self._compile_cache = compile_cache  # held: its folder is not pruned while this backend lives
        if cache_dir is None and compile_cache is not None:
            keyed = self._config if weights == "fp32" else {**self._config, "weights": weights}  # fp32: the old key
            cache_dir = _usable(compile_cache.openvino_dir(_VERSION, keyed))
        elif cache_dir is not None:  # OpenVINO's blob key leaves precision and threads out: a folder each
            stored = "" if weights == "fp32" else f"-{weights}"  # fp32: the folder's old name
            cache_dir = _usable(Path(cache_dir) / f"{precision}{stored}-threads-{threads or 'all'}")
        if cache_dir is not None:
            self._config["CACHE_DIR"] = str(cache_dir)
        if cache_dir is None or shapes == "static":  # nothing to compile it again from quickly: kept
            self._released = frozenset()
        self.compile_seconds: dict[str, float] = {}  # graph name -> read + compile time
        self._graphs: list[OvGraph] = []
        self._storages: weakref.WeakSet[_Storage] = weakref.WeakSet()  # every allocation not yet collected
        self.closed = False

    # ----------------------------------------------------------------------------------- graphs
    def _check_open(self) -> None:
        if self.closed:
            raise BackendError("the openvino backend was closed (predictor.close()); load the bundle again")

    def load(self, name: str, path: str, compiled: dict | None = None) -> OvGraph:
        self._check_open()
        gears = graph_gears(self._gears, name, compiled)
        started = time.perf_counter()
        model = self._read(name, path)
        if self.shapes == "static":  # compiled per call shapes, at first use (OvGraph.request_for)
            def compile_for(model, input_shapes, name=name, path=path):
                shapes = {port: ov.PartialShape(list(shape)) for port, shape in zip(model.inputs, input_shapes)}
                return self._compile_reshaped(name, path, model, shapes,
                                              f" at input shapes {list(map(list, input_shapes))}")

            # read again for each new shape rather than kept: a kept model held every graph's weights once
            # more beside the compiled copies (mid: 0.6 GB)
            keep = MAX_STATIC_SHAPES if "CACHE_DIR" in self._config else MAX_STATIC_SHAPES_UNCACHED  # a cache: fewer
            graph = OvGraph(name, model, None, gears, compile_for, reader=lambda: self._read(name, path),
                            keep_static=keep)
        elif name in self._released:  # read (and so checked) now, compiled at each first run after a release
            # from the file where the weights stay as stored: OpenVINO's cache then finds the blob by the
            # file, and the graph is never read into memory beside it (full size, bf16: 9.5 -> 7.2 GB at a prompt)
            direct = self.weights == "fp32"
            graph = OvGraph(name, model, None, gears, deferred=lambda model: self._compile(name, path, model, ""),
                            reader=(lambda: path) if direct else (lambda: self._read(name, path)))
        elif name in self._deferred:  # read (and so checked) now, compiled at its first run
            graph = OvGraph(name, model, None, gears, deferred=lambda model: self._compile(name, path, model, ""),
                            compile_rows=self._rows_compiler(name, path))
        else:
            graph = OvGraph(name, model, self._compile(name, path, model, ""), gears,
                            compile_rows=self._rows_compiler(name, path))
        self.compile_seconds[name] = time.perf_counter() - started
        self._graphs.append(graph)
        return graph

    def _rows_compiler(self, name: str, path: str):
        """shapes="rows": what compiles graph `name` again with the leading sizes {input index: rows}
        fixed (None with other shapes; a released graph gets none: it is dropped after each use)."""
        if self.shapes != "rows":
            return None

        def compile_rows(rows: dict[int, int]):
            model = self._read(name, path)
            ports = {i: model.inputs[i] for i in rows}
            shapes = {port: ov.PartialShape([ov.Dimension(rows[i]), *list(port.get_partial_shape())[1:]])
                      for i, port in ports.items()}
            return self._compile_reshaped(name, path, model, shapes,
                                          f" with its rows fixed at {sorted(set(rows.values()))}", FIXED_ROWS_CONFIG)
        return compile_rows

    def _compile_reshaped(self, name: str, path: str, model, shapes: dict, where: str, config: dict | None = None):
        """Graph `name` compiled after its read model is reshaped to `shapes` ({port: PartialShape}) after
        the load (static or fixed-rows shapes, with `config`'s properties beside the backend's), its time
        added to compile_seconds."""
        started = time.perf_counter()
        model.reshape(shapes)
        compiled = self._compile(name, path, model, where, config)
        self.compile_seconds[name] = self.compile_seconds.get(name, 0.0) + time.perf_counter() - started
        return compiled

    @property
    def row_compiles(self) -> Counter[str]:
        """graph name -> models compiled with its rows fixed so far (shapes="rows"; open graphs only)."""
        return Counter({g.name: g.rows.compiles for g in self._graphs if g.rows is not None and g.rows.compiles})

    def plan(self, graph: Graph, axis: str, n: int) -> int:
        """As Backend.plan, but n past the largest gear runs at n on an axis an OM bundle does not fix:
        OpenVINO compiles any shape, so a gear is a size to pad to, never a limit (a call that cannot be
        split, such as memories per object, is not refused)."""
        size = super().plan(graph, axis, n)
        asked = self._gears.get(axis) if isinstance(self._gears, dict) else None
        opened = asked is not None and graph.sizes.get(axis) == asked and axis not in SPLIT_AXES  # not OM-fixed
        return n if size < n and opened else size

    def _read(self, name: str, path: str):
        """The graph as OpenVINO reads it, its weights stored as weights= asks."""
        try:
            model = self._core.read_model(path)
        except Exception as exc:
            raise BundleError(f"openvino {_VERSION} cannot read graph {name} from {path}: "
                              f"{_first_lines(exc)}; run it with backend='onnxruntime'") from exc
        if self.weights == "fp16" and not store_weights_in_fp16(model):
            raise Sam3TrackError(f"weights='fp16' needs OpenVINO's compress_model_transformation, which openvino "
                                 f"{_VERSION} lacks: load without weights= (fp32), or with backend='onnxruntime'")
        return model

    def _compile(self, name: str, path: str, model, where: str, config: dict | None = None):
        if self._compile_cache is not None and "CACHE_DIR" in self._config:  # a compile after the load too
            self._compile_cache.mark_used(Path(self._config["CACHE_DIR"]))
        merged = {**self._config, **(config or {})}
        if config and "CACHE_DIR" in self._config:  # OpenVINO's blob key leaves compile properties out (the
            # CPU plugin's CACHING_PROPERTIES: FULL_DEVICE_NAME), and a blob keeps the transformations they
            # chose: a subfolder per extra set, or a blob compiled without them would be imported
            extra = "-".join(f"{k}-{v}" for k, v in sorted(config.items()))  # plain names and values only
            merged["CACHE_DIR"] = str(Path(self._config["CACHE_DIR"]) / extra)
        try:
            with load_notice.step(f"compiling graph {name} for OpenVINO{where}"):
                return self._core.compile_model(model, self.device, merged)
        except Exception as exc:
            hint = "run it with backend='onnxruntime'"
            # OpenVINO's ONNX frontend reads QuantizeLinear/DequantizeLinear pairs as FakeQuantize
            if not isinstance(model, str) and any(op.get_type_name() == "FakeQuantize" for op in model.get_ordered_ops()):
                hint = ("it holds statically quantised (QuantizeLinear/DequantizeLinear) int8 nodes, which OpenVINO "
                        "fails to compile here: export the graph without --int8 (or with dynamic quantisation), "
                        "or run this bundle with backend='onnxruntime'")
            raise BundleError(f"openvino {_VERSION} cannot compile graph {name} from {path} for "
                              f"{self.device} at {self.precision}{where}: {_first_lines(exc)}; {hint}") from exc

    # ---------------------------------------------------------------------------------- tensors
    def _wrap(self, tensor) -> DeviceTensor:
        storage = _Storage(tensor)
        self._storages.add(storage)
        return DeviceTensor(tuple(tensor.shape), np.dtype(tensor.data.dtype), (storage, 0))

    @property
    def live_allocations(self) -> int:
        return sum(1 for s in list(self._storages) if not s.freed)

    def free(self, tensor: DeviceTensor) -> None:
        storage, _ = tensor.handle
        storage.tensor = storage.bytes = None  # OpenVINO frees the memory with its last reference

    def _new(self, shape, dtype):
        return ov.Tensor(np.dtype(dtype), [int(d) for d in shape])

    def upload(self, array: np.ndarray) -> DeviceTensor:
        self._check_open()
        array = np.ascontiguousarray(array)
        tensor = self._new(array.shape, array.dtype)
        np.copyto(tensor.data, array)
        self._count("to_device", array.shape, array.nbytes)
        return self._wrap(tensor)

    def empty(self, shape, dtype) -> DeviceTensor:
        self._check_open()
        return self._wrap(self._new(shape, dtype))

    def zeros(self, shape, dtype) -> DeviceTensor:
        self._check_open()
        tensor = self._new(shape, dtype)
        tensor.data[...] = 0
        return self._wrap(tensor)

    def rows(self, tensor: DeviceTensor, start: int, count: int) -> DeviceTensor:
        storage, offset = tensor.handle
        row_bytes = tensor.nbytes // max(tensor.shape[0], 1)
        if start < 0 or start + count > tensor.shape[0]:
            raise BackendError(f"internal error: rows {start}..{start + count} outside a tensor of "
                               f"{tensor.shape[0]} rows; please report this")
        return DeviceTensor((count,) + tuple(tensor.shape[1:]), tensor.dtype, (storage, offset + start * row_bytes))

    @staticmethod
    def _storage(tensor: DeviceTensor) -> _Storage:
        storage = tensor.handle[0]
        if storage.freed:
            raise BackendError(f"internal error: a device tensor {tensor.shape} was used after it was freed "
                               "(a pool view taken before the pool grew?); please report this")
        return storage

    def _array(self, tensor: DeviceTensor) -> np.ndarray:
        """The tensor's bytes in OpenVINO memory, seen as a numpy array (a view, never a copy)."""
        storage, offset = self._storage(tensor), tensor.handle[1]
        flat = storage.bytes[offset:offset + tensor.nbytes]
        return flat.view(tensor.dtype).reshape(tensor.shape)

    def _bound(self, tensor: DeviceTensor):
        """An ov.Tensor over the same memory, for one call (a view is never the storage's own tensor,
        so OpenVINO cannot resize a caller's allocation)."""
        return ov.Tensor(self._array(tensor), shared_memory=True)

    def to_host(self, tensor: DeviceTensor, rows: np.ndarray | None = None) -> np.ndarray:
        self._check_open()
        if rows is None:
            out = np.array(self._array(tensor), copy=True)  # the caller's own memory
        else:  # only the selected rows, in one copy
            rows = np.asarray(rows, dtype=np.int64).reshape(-1)
            out = self._array(tensor)[rows]  # fancy indexing copies
        self._count("to_host", out.shape, out.nbytes)
        return out

    def copy(self, src: DeviceTensor, dst: DeviceTensor) -> None:
        self._check_open()
        if tuple(src.shape) != tuple(dst.shape) or src.dtype != dst.dtype:
            raise BackendError(f"internal error: copy between {src.shape} {src.dtype} and {dst.shape} {dst.dtype}; "
                               "please report this")
        np.copyto(self._array(dst), self._array(src))

    # ------------------------------------------------------------------------------------- run
    def run(self, graph: OvGraph, inputs, outputs=None):
        self._check_open()
        outputs = outputs or {}
        if not isinstance(graph, OvGraph) or graph.closed:
            raise BackendError(f"internal error: graph {getattr(graph, 'name', graph)!r} was not loaded by this "
                               "openvino backend; please report this")
        self.calls[graph.name] += 1
        if self._released:
            self._free_released(graph)
        bound_in = []
        for name in graph.input_names:
            if name not in inputs:
                raise Sam3TrackError(f"graph {graph.name} needs input {name!r}")
            value = inputs[name]
            if isinstance(value, np.ndarray):  # a per-call host input: copied in now, counted
                value = self.upload(value)
            bound_in.append(self._bound(value))
        with graph.lock:
            request, compiled = graph.request_for(tuple(tuple(t.shape) for t in bound_in))
            bound_out = [self._bound(outputs[name]) if name in outputs else graph.fresh_output(compiled, i)
                         for i, name in enumerate(graph.output_names)]
            try:
                for i, t in enumerate(bound_in):
                    request.set_input_tensor(i, t)
                for i, t in enumerate(bound_out):
                    request.set_output_tensor(i, t)
                started = time.perf_counter()
                request.infer()
            except Exception as exc:
                raise BackendError(f"openvino failed running graph {graph.name}: {_first_lines(exc)} (inputs "
                                   + ", ".join(f"{n} {tuple(t.shape)} {t.element_type}"
                                               for n, t in zip(graph.input_names, bound_in)) + ")"
                                   + _known_fault(graph.name, exc)) from exc
            self.seconds[graph.name] += time.perf_counter() - started
            results = [request.get_output_tensor(i) for i in range(len(bound_out))]
        out = {}
        for name, mine, got in zip(graph.output_names, bound_out, results):
            if name not in outputs:
                out[name] = self._wrap(got)
                continue
            target = outputs[name]
            if tuple(got.shape) != tuple(target.shape):
                raise BackendError(f"internal error: graph {graph.name} output {name} is {tuple(got.shape)}, the "
                                   f"tensor given for it is {tuple(target.shape)}; please report this")
            if got.data.ctypes.data != mine.data.ctypes.data:  # OpenVINO kept its own buffer: copy it in
                np.copyto(self._array(target), got.data)
            out[name] = target
        return out

    def _free_released(self, running: OvGraph) -> None:
        """Drop every released graph's compiled model but `running`'s: a burst of prompts compiles the
        text encoder once, and no frame's peak holds it. A run holds its graph's lock, so none is freed
        mid-run; its outputs are tensors of their own."""
        for graph in self._graphs:
            if graph is not running and graph.compiler is not None and graph.reader is not None \
                    and graph.compiled is not None:
                with graph.lock:
                    graph.free_compiled()

    def close(self) -> None:
        for graph in self._graphs:
            graph.release()
        self._graphs.clear()
        for storage in list(self._storages):
            storage.tensor = storage.bytes = None
        self.closed = True


def _usable(folder):
    """`folder` when it can be made and written, else None (a read-only cache: compile without one)."""
    if folder is None:
        return None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if os.access(folder, os.W_OK):
            return folder
    except OSError:
        pass
    CACHE_STATS["unwritable"] += 1
    return None


_SHARED_CORE = None
_SHARED_CORE_LOCK = threading.Lock()


def shared_core():
    """The process's one ``ov.Core``, never released: every backend (and anything else of ours that asks
    OpenVINO something) goes through it.

    Why one: each Core loads its own instance of the CPU plugin, and each instance installs a signal
    stack (sigaltstack) on the thread that created it, remembering the one it replaced, and puts that
    back when it is released. Two instances released in the order they were made (open two predictors,
    close the first, then the second) leave the thread on the first instance's freed stack, and the next
    signal delivered there (Ctrl-C, SIGTERM) kills the process with SIGSEGV instead of running Python's
    handler (OpenVINO 2026.4 on Linux; reproduced in tests/test_openvino_backend.py). With one instance
    alive for the whole process, the stack it installed stays valid."""
    global _SHARED_CORE
    with _SHARED_CORE_LOCK:
        if _SHARED_CORE is None:
            _SHARED_CORE = ov.Core()
        return _SHARED_CORE


def store_weights_in_fp16(model) -> bool:
    """weights="fp16": turn the read model's fp32 constants into fp16 constants followed by a Convert, in
    place, as OpenVINO's own IR format stores weights by default (ov.save_model's compress_to_fp16). The
    compiled graph then holds its constants in half the memory, and the fp32 ones read from the bundle
    are freed before compiling rather than kept beside the plugin's packed copies (full size, bf16: 10.1
    -> 7.1 GB at 1 object; blobs in the cache 3.3 -> 1.8 GB; docs/speed.md, "Memory at full size"). Not
    the default, not even for bf16: fp16 has 5 exponent bits where bf16 keeps fp32's 8, so small weights
    lose precision that bf16 would keep (the seeded mid model then failed auto's gate in bf16, IoU min
    0.0003 against 0.986 with fp32 weights). Constants outside fp16's range stay fp32 (OpenVINO's rule).
    False where this OpenVINO lacks the (private) transformation (the load then refuses weights="fp16")."""
    try:
        from openvino._offline_transformations import compress_model_transformation
    except ImportError:
        return False
    compress_model_transformation(model)
    return True


def cpu_capabilities(core=None) -> list[str]:
    """OpenVINO's OPTIMIZATION_CAPABILITIES of the CPU (BF16 among them on AMX / AVX512-BF16 CPUs)."""
    core = shared_core() if core is None else core
    return [str(c) for c in core.get_property("CPU", "OPTIMIZATION_CAPABILITIES")]


def _output_name(port) -> str:
    """The ONNX name of a graph output: the one name of its tensor, or, where OpenVINO's ONNX frontend
    gave the tensor several, the one its Result node is named after ("<name>/sink_port_0")."""
    names = port.get_names()
    if len(names) == 1:
        return next(iter(names))
    result = port.get_node().get_friendly_name().rsplit("/sink_port_", 1)[0]
    return result if result in names else port.get_any_name()


def _known_fault(graph: str, exc: Exception) -> str:
    """What to do about a failure this version of sam3track knows the cause of ("" for others)."""
    if graph in ("memory_encoder", "mask_init") and "Can not clone with new dims" in str(exc):
        # SAM 3.1 bundles exported before the frame's features were tiled over the rows (memory_encoder
        # and mask_init, 2026-12-07)
        return (f"; this bundle's {graph} broadcasts the frame's features over the rows, which "
                "OpenVINO's CPU plugin cannot run for two or more: export the bundle again with this "
                "sam3track (python -m graphs.export), or load it with backend='onnxruntime'")
    return ""


def _first_lines(exc: Exception, limit: int = 3) -> str:
    """OpenVINO's messages start with a stack of "Exception from src/..." lines; keep the substance."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    useful = [line for line in lines if not line.startswith("Exception from src/")] or lines
    text = " ".join(useful[:limit])
    return text if len(text) <= 600 else text[:595] + " ..."
