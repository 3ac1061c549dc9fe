"""Ascend backend: ATC-compiled OM models run through pyacl, with every tensor kept in NPU memory.

Runtime (acl.init, return codes) in acl_runtime.py, one OM model in acl_models.py, a run's datasets in
acl_datasets.py. Comments cite the source tags of /work/shared/docs/ascend.md (P-xxxx pyACL reference
pages, C-xxxx AscendCL C pages, MMD mmdeploy's wrapper, ACLL acllite, ERR the error-code table) and say
[unconfirmed] where no public source confirmed the behaviour. The design (handles, graphs, datasets,
gears, threads, teardown): docs/ascend.md, "The acl backend".
"""

from __future__ import annotations

import threading
import time
import weakref

import numpy as np

from ..errors import BackendError
from .acl_datasets import DatasetIO, destroy_gear_data
from .acl_models import HIDDEN_INPUT, AclGraph, _check_io_names, _om_path, describe, pick_gear
from .acl_runtime import (ACL_MEM_MALLOC_HUGE_FIRST, ACL_SUCCESS, MEMCPY_DEVICE_TO_DEVICE,
                          MEMCPY_DEVICE_TO_HOST, MEMCPY_HOST_TO_DEVICE, _acquire_acl, _Allocation, _error, _import_acl,
                          _parse_device, _release_acl)
from .base import Backend, DeviceTensor


# Which backend's context this thread made current last. A per-backend token object (never the
# context handle, which a later context may reuse) so a stale entry can never match a new backend.
_THREAD = threading.local()


# --------------------------------------------------------------------------------------- backend
class AclBackend(DatasetIO, Backend):
    name = "acl"

    def __init__(self, device: str = "npu:0", threads: int | None = None):
        """threads: accepted for load()'s common options and ignored (the NPU runs the graphs)."""
        super().__init__()
        self.device_id = _parse_device(device)
        self._acl = acl = _import_acl()
        self.closed = False
        self._graphs: list[AclGraph] = []
        # Tensors' blocks are held by their DeviceTensors only, as ONNX Runtime's are: one nobody
        # references any more (an upload passed straight to run(), say) is queued by its finalizer and
        # freed by the next call, on a thread with our context (a finalizer runs on any thread).
        self._tensors: weakref.WeakSet[_Allocation] = weakref.WeakSet()
        self._collected: list[int] = []  # pointers of unreferenced blocks, not yet freed
        self._graph_blocks: list[_Allocation] = []  # graphs' own buffers, freed by close()
        self._host_blocks: list[int] = []  # every malloc_host block
        self._token = object()
        self._context = self._stream = None
        self._device_set = False
        _acquire_acl(acl)
        try:
            self._call("acl.rt.set_device", acl.rt.set_device(self.device_id), f"npu:{self.device_id}")
            self._device_set = True
            # An explicit context, not set_device's default one: it can be made current on any thread
            # (set_context) and destroyed by us [C-0059, P-0077]; create_context binds it here.
            self._context = self._value("acl.rt.create_context", acl.rt.create_context(self.device_id))
            _THREAD.owner = self._token
            self._stream = self._value("acl.rt.create_stream", acl.rt.create_stream())
        except BaseException:
            self._teardown()
            raise

    # ------------------------------------------------------------------------- return codes
    def _call(self, call: str, ret, what: str = "") -> None:
        if ret != ACL_SUCCESS:
            raise _error(self._acl, call, ret, what)

    def _value(self, call: str, result, what: str = ""):
        """Unpack a `(value, ret)` pair [ascend.md 2, "tuple"] and check ret."""
        value, ret = result
        self._call(call, ret, what)
        return value

    def _handle(self, call: str, handle, what: str = ""):
        """Calls that return a bare handle signal failure with 0/None [ascend.md 2, "bare"]."""
        if not handle:
            raise _error(self._acl, call, "(null handle)", what)
        return handle

    # ------------------------------------------------------------------- context per thread
    def _enter(self) -> None:
        if self.closed:
            raise BackendError("the acl backend was closed (predictor.close()); load the bundle again")
        self._bind_context()
        self._free_collected()

    def _bind_context(self) -> None:
        # The current context is per thread [ascend.md 3.1.3]: a worker thread starts with none (107002),
        # and another backend may have made its own current here since.
        if getattr(_THREAD, "owner", None) is not self._token:
            self._call("acl.rt.set_context", self._acl.rt.set_context(self._context))
            _THREAD.owner = self._token

    # ---------------------------------------------------------------------------- graphs
    def load(self, name: str, path: str, compiled: dict | None = None) -> AclGraph:
        self._enter()
        om_path = _om_path(name, path, compiled)
        acl = self._acl
        model_id = self._value("acl.mdl.load_from_file", acl.mdl.load_from_file(str(om_path)),
                               f"graph {name}, {om_path}")
        desc = None
        try:
            desc = self._handle("acl.mdl.create_desc", acl.mdl.create_desc(), f"graph {name}")
            self._call("acl.mdl.get_desc", acl.mdl.get_desc(desc, model_id), f"graph {name}")
            graph = describe(acl, self._value, name, om_path, compiled, model_id, desc)
            if graph.hidden is not None:  # sized by the desc, as mmdeploy does [MMD]
                graph.hidden_buffer = self._malloc(graph.hidden.nbytes, f"graph {name} {HIDDEN_INPUT}",
                                                   graph_owned=True)
        except BaseException:
            if desc:
                acl.mdl.destroy_desc(desc)
            acl.mdl.unload(model_id)
            raise
        self._graphs.append(graph)  # from here on close() releases what the graph holds
        for index in range(len(graph.gears)):
            graph.gear_data[index] = self._new_gear_data(graph)
        return graph

    # --------------------------------------------------------------------------- tensors
    @property
    def live_allocations(self) -> int:
        """Tensors from upload/empty/zeros neither freed nor unreferenced (graphs' own buffers are not
        counted)."""
        return sum(1 for a in list(self._tensors) if not a.freed)

    def _malloc(self, nbytes: int, what: str, graph_owned: bool = False) -> _Allocation:
        # malloc(0) is invalid [P-0114]: an empty tensor still gets a (tiny) block of its own
        ptr = self._value("acl.rt.malloc", self._acl.rt.malloc(max(int(nbytes), 1), ACL_MEM_MALLOC_HUGE_FIRST),
                          f"{what}, {nbytes} bytes")
        allocation = _Allocation(ptr, int(nbytes), what, graph_owned)
        if graph_owned:
            self._graph_blocks.append(allocation)
        else:
            self._tensors.add(allocation)
            allocation.collected = weakref.finalize(allocation, self._collected.append, ptr)
        return allocation

    def _release(self, allocation: _Allocation) -> None:
        allocation.freed = True
        allocation.collected.detach()
        self._tensors.discard(allocation)
        self._call("acl.rt.free", self._acl.rt.free(allocation.ptr), allocation.what)

    def _free_collected(self) -> None:
        while self._collected:
            ptr = self._collected.pop()
            self._call("acl.rt.free", self._acl.rt.free(ptr), "a device tensor nobody references any more")

    def _tensor(self, shape, dtype, what: str) -> DeviceTensor:
        shape, dtype = tuple(int(s) for s in shape), np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        return DeviceTensor(shape, dtype, (self._malloc(nbytes, f"{what} {shape} {dtype}"), 0))

    def _address(self, tensor: DeviceTensor) -> int:
        allocation, offset = tensor.handle
        if allocation.freed:
            raise BackendError(f"a device tensor {tuple(tensor.shape)} was used after its memory ({allocation.what}) "
                               "was freed (a pool view taken before the pool grew?); please report this")
        if offset + tensor.nbytes > allocation.nbytes:
            raise BackendError(f"internal error: a view {tuple(tensor.shape)} at byte {offset} runs past its "
                               f"allocation of {allocation.nbytes} bytes; please report this")
        return allocation.ptr + offset

    def upload(self, array: np.ndarray) -> DeviceTensor:
        self._enter()
        array = np.ascontiguousarray(array)
        tensor = self._tensor(array.shape, array.dtype, "upload")
        self._memcpy(self._address(tensor), tensor.nbytes, array.ctypes.data, array.nbytes, MEMCPY_HOST_TO_DEVICE,
                     "upload")
        self._count("to_device", array.shape, array.nbytes)
        return tensor

    def empty(self, shape, dtype) -> DeviceTensor:
        self._enter()
        return self._tensor(shape, dtype, "empty")

    def zeros(self, shape, dtype) -> DeviceTensor:
        self._enter()
        tensor = self._tensor(shape, dtype, "zeros")
        if tensor.nbytes:
            # rt.memset [unconfirmed in ascend.md 2: signature (ptr, max_size, value, count) as aclrtMemset]:
            # chosen over uploading a zero array because nothing crosses the bus and transfers stay honest.
            self._call("acl.rt.memset", self._acl.rt.memset(self._address(tensor), tensor.nbytes, 0, tensor.nbytes),
                       f"zeros {tensor.shape}")
        return tensor

    def free(self, tensor: DeviceTensor) -> None:
        """Frees the tensor's whole allocation (as the ONNX Runtime backend does for views). A no-op for
        graph results (their buffers belong to the graph), for a second free, and after close() (which
        already freed everything: callers such as memory pools are closed after the predictor)."""
        allocation, _ = tensor.handle
        if self.closed or allocation.freed or allocation.graph_owned:
            return
        self._bind_context()
        self._release(allocation)
        self._free_collected()

    def rows(self, tensor: DeviceTensor, start: int, count: int) -> DeviceTensor:
        allocation, offset = tensor.handle
        if start < 0 or count < 0 or start + count > tensor.shape[0]:
            raise BackendError(f"internal error: rows {start}..{start + count} outside a tensor of "
                               f"{tensor.shape[0]} rows; please report this")
        row_bytes = tensor.nbytes // max(tensor.shape[0], 1)
        return DeviceTensor((count,) + tuple(tensor.shape[1:]), tensor.dtype, (allocation, offset + start * row_bytes))

    def copy(self, src: DeviceTensor, dst: DeviceTensor) -> None:
        self._enter()
        if tuple(src.shape) != tuple(dst.shape) or np.dtype(src.dtype) != np.dtype(dst.dtype):
            raise BackendError(f"internal error: copy between {src.shape} {src.dtype} and {dst.shape} {dst.dtype}; "
                               "please report this")
        if src.nbytes:
            self._memcpy(self._address(dst), dst.nbytes, self._address(src), src.nbytes, MEMCPY_DEVICE_TO_DEVICE,
                         f"copy {tuple(src.shape)}")

    def to_host(self, tensor: DeviceTensor, rows: np.ndarray | None = None) -> np.ndarray:
        """A new host array. With `rows`, one memcpy per run of consecutive rows (each one counted):
        pyacl has no gather copy, and rows the caller asks for are mostly runs."""
        self._enter()
        base = self._address(tensor)
        if rows is None:
            out = np.empty(tensor.shape, tensor.dtype)
            if out.nbytes:
                self._memcpy(out.ctypes.data, out.nbytes, base, out.nbytes, MEMCPY_DEVICE_TO_HOST,
                             f"to_host {tuple(tensor.shape)}")
            self._count("to_host", out.shape, out.nbytes)
            return out
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        n = tensor.shape[0]
        if rows.size and (rows.min() < 0 or rows.max() >= n):
            raise BackendError(f"internal error: rows {rows.tolist()} outside a tensor of {n} rows; please report this")
        row_shape = tuple(tensor.shape[1:])
        row_bytes = int(np.prod(row_shape, dtype=np.int64)) * np.dtype(tensor.dtype).itemsize
        out = np.empty((rows.size,) + row_shape, tensor.dtype)
        for start, end in _runs(rows):
            count = end - start
            if row_bytes:
                self._memcpy(out.ctypes.data + start * row_bytes, count * row_bytes,
                             base + int(rows[start]) * row_bytes, count * row_bytes, MEMCPY_DEVICE_TO_HOST,
                             f"to_host rows {int(rows[start])}..{int(rows[start]) + count} of {tuple(tensor.shape)}")
            self._count("to_host", (count,) + row_shape, count * row_bytes)
        return out

    def _memcpy(self, dst: int, dst_max: int, src: int, count: int, kind: int, what: str) -> None:
        # synchronous; CANN 8 infers the direction from the addresses, older ones honour kind [P-0124]
        self._call("acl.rt.memcpy", self._acl.rt.memcpy(dst, dst_max, src, count, kind), what)

    # ------------------------------------------------------------------------------- run
    def run(self, graph: AclGraph, inputs, outputs=None):
        """inputs: DeviceTensors, or host arrays (copied into the graph's own input buffers); every
        input at a compiled gear's size. Outputs not placed in `outputs` come back in the graph's own
        buffers: valid until the next run of the same graph."""
        self._enter()
        outputs = outputs or {}
        graph = self._own(graph)
        _check_io_names(graph, inputs, outputs)
        gear_index = pick_gear(graph, inputs)
        gear = graph.gears[gear_index]
        self.calls[graph.name] += 1
        started = time.perf_counter()
        queued = False  # anything on the stream: synchronize even when a later step fails
        try:
            in_places = []
            for io in graph.inputs:
                in_places.append(self._input_place(graph, io, inputs))
                queued = queued or (io is not graph.hidden and not isinstance(inputs[io.name], DeviceTensor))
            out_places = [self._output_place(graph, io, gear, outputs) for io in graph.outputs]
            data = self._bind(graph, gear_index, in_places, out_places)
            self._set_gear(graph, gear, data)
            self._call("acl.mdl.execute_async",
                       self._acl.mdl.execute_async(graph.model_id, data.inputs, data.outputs, self._stream),
                       f"graph {graph.name}")
            queued = True
        finally:
            if queued:  # the stream is idle between public calls: sync memcpy and to_host rely on it
                self._call("acl.rt.synchronize_stream", self._acl.rt.synchronize_stream(self._stream),
                           f"graph {graph.name}")
        self.seconds[graph.name] += time.perf_counter() - started
        return self._results(graph, gear, outputs)

    def _own(self, graph) -> AclGraph:
        if not isinstance(graph, AclGraph) or not any(graph is g for g in self._graphs):
            raise BackendError(f"internal error: graph {getattr(graph, 'name', graph)!r} was not loaded by this "
                               "acl backend; please report this")
        return graph

    # ---------------------------------------------------------------------------- teardown
    def close(self) -> None:
        """Teardown in the documented order [ascend.md 3.1.5]; idempotent. Every step is tried even
        when one fails (the first failure is raised at the end)."""
        if self.closed:
            return
        self.closed = True
        self._teardown()

    def _teardown(self) -> None:
        acl, errors = self._acl, []

        def attempt(call: str, ret, what: str = "") -> None:
            if ret not in (ACL_SUCCESS, None):
                errors.append(_error(acl, call, ret, what))

        if self._context is not None:
            try:
                self._call("acl.rt.set_context", acl.rt.set_context(self._context))
                _THREAD.owner = self._token
            except BackendError as exc:
                errors.append(exc)
        for graph in self._graphs:
            what = f"graph {graph.name}"
            for data in graph.gear_data.values():
                destroy_gear_data(acl, data, what, errors)
            graph.gear_data.clear()
        for graph in self._graphs:
            attempt("acl.mdl.destroy_desc", acl.mdl.destroy_desc(graph.desc), f"graph {graph.name}")
        for graph in self._graphs:
            attempt("acl.mdl.unload", acl.mdl.unload(graph.model_id), f"graph {graph.name}")
            graph.host_inputs.clear()
            graph.output_buffers.clear()
            graph.hidden_buffer = None
        self._graphs.clear()
        for allocation in list(self._tensors) + self._graph_blocks:
            if not allocation.freed:
                allocation.freed = True
                if allocation.collected is not None:
                    allocation.collected.detach()
                attempt("acl.rt.free", acl.rt.free(allocation.ptr), allocation.what)
        self._graph_blocks.clear()
        while self._collected:
            attempt("acl.rt.free", acl.rt.free(self._collected.pop()), "a device tensor nobody references any more")
        for host_ptr in self._host_blocks:
            attempt("acl.rt.free_host", acl.rt.free_host(host_ptr))
        self._host_blocks.clear()
        if self._stream is not None:
            attempt("acl.rt.destroy_stream", acl.rt.destroy_stream(self._stream))
            self._stream = None
        if self._context is not None:
            attempt("acl.rt.destroy_context", acl.rt.destroy_context(self._context))
            self._context = None
            if getattr(_THREAD, "owner", None) is self._token:
                _THREAD.owner = None
        if self._device_set:
            attempt("acl.rt.reset_device", acl.rt.reset_device(self.device_id), f"npu:{self.device_id}")
            self._device_set = False
        try:
            _release_acl(acl)
        except BackendError as exc:
            errors.append(exc)
        if errors:
            raise errors[0]


# ------------------------------------------------------------------------------------- helpers
def _runs(rows: np.ndarray):
    """(start, end) of every run of consecutive ascending indices in `rows`."""
    if rows.size == 0:
        return []
    breaks = np.flatnonzero(np.diff(rows) != 1) + 1
    return list(zip([0, *breaks.tolist()], [*breaks.tolist(), rows.size]))
