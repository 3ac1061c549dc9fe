"""ONNX Runtime backend: IOBinding with OrtValues, so features and memory stay on the device.

Views into pools are bound by raw pointer (base + row offset), so a graph writes its outputs straight
into the memory bank's pools and reads them back without any copy.
"""

from __future__ import annotations

import time

import numpy as np

from ..errors import BundleError, Sam3TrackError
from .base import Backend, DeviceTensor, Graph

_DEVICES = {"cpu": ("CPUExecutionProvider", "cpu"), "cuda": ("CUDAExecutionProvider", "cuda")}


class OrtGraph(Graph):
    def __init__(self, name: str, session):
        self.name = name
        self.session = session
        self.input_names = tuple(i.name for i in session.get_inputs())
        self.output_names = tuple(o.name for o in session.get_outputs())


class _Storage:
    """A device allocation; views keep it alive through this object."""

    def __init__(self, ortvalue):
        self.ortvalue = ortvalue
        self.ptr = ortvalue.data_ptr()


class OnnxRuntimeBackend(Backend):
    name = "onnxruntime"

    def __init__(self, device: str = "cpu", threads: int | None = None):
        super().__init__()
        import onnxruntime as ort

        device, _, index = device.partition(":")
        if device not in _DEVICES:
            raise Sam3TrackError(f"unknown device {device!r} for onnxruntime; use one of {', '.join(_DEVICES)}")
        provider, self.device_type = _DEVICES[device]
        if provider not in ort.get_available_providers():
            raise Sam3TrackError(
                f"onnxruntime here has no {provider} (available: {', '.join(ort.get_available_providers())}); "
                "install onnxruntime-gpu for device='cuda' or use device='cpu'")
        self.device_id = int(index or 0)
        self._ort = ort
        self._providers = [provider] if provider == "CPUExecutionProvider" else [provider, "CPUExecutionProvider"]
        self._options = ort.SessionOptions()
        self._options.log_severity_level = 3
        if threads:
            self._options.intra_op_num_threads = threads
        self._graphs: list[OrtGraph] = []
        self._copy_sessions: dict[str, object] = {}
        self.closed = False

    # ----------------------------------------------------------------------------------- graphs
    def load(self, name: str, path: str) -> OrtGraph:
        try:
            session = self._ort.InferenceSession(path, sess_options=self._options, providers=self._providers)
        except Exception as exc:
            raise BundleError(f"onnxruntime cannot load graph {name} from {path}: {exc}") from exc
        graph = OrtGraph(name, session)
        self._graphs.append(graph)
        return graph

    # ---------------------------------------------------------------------------------- tensors
    def _wrap(self, ortvalue) -> DeviceTensor:
        dtype = np.dtype(_ORT_TO_NUMPY[ortvalue.data_type()])
        return DeviceTensor(tuple(ortvalue.shape()), dtype, (_Storage(ortvalue), 0))

    def upload(self, array: np.ndarray) -> DeviceTensor:
        array = np.ascontiguousarray(array)
        ov = self._ort.OrtValue.ortvalue_from_shape_and_type(array.shape, array.dtype, self.device_type,
                                                             self.device_id)
        ov.update_inplace(array)
        self._count("to_device", array.shape, array.nbytes)
        return self._wrap(ov)

    def empty(self, shape, dtype) -> DeviceTensor:
        ov = self._ort.OrtValue.ortvalue_from_shape_and_type(list(shape), np.dtype(dtype), self.device_type,
                                                             self.device_id)
        return self._wrap(ov)

    def rows(self, tensor: DeviceTensor, start: int, count: int) -> DeviceTensor:
        storage, offset = tensor.handle
        row_bytes = tensor.nbytes // max(tensor.shape[0], 1)
        if start < 0 or start + count > tensor.shape[0]:
            raise IndexError(f"rows {start}..{start + count} outside a tensor of {tensor.shape[0]} rows")
        return DeviceTensor((count,) + tuple(tensor.shape[1:]), tensor.dtype, (storage, offset + start * row_bytes))

    def _is_whole(self, tensor: DeviceTensor) -> bool:
        storage, offset = tensor.handle
        return offset == 0 and tuple(storage.ortvalue.shape()) == tuple(tensor.shape)

    def to_host(self, tensor: DeviceTensor, rows: np.ndarray | None = None) -> np.ndarray:
        if rows is not None:
            rows = np.asarray(rows, dtype=np.int64)
            out = np.empty((len(rows),) + tuple(tensor.shape[1:]), tensor.dtype)
            for i, r in enumerate(rows):  # one copy per selected row: never the whole tensor
                out[i] = self._copy_out(self.rows(tensor, int(r), 1))[0]
            return out
        return self._copy_out(tensor)

    def _copy_out(self, tensor: DeviceTensor) -> np.ndarray:
        self._count("to_host", tensor.shape, tensor.nbytes)
        if self._is_whole(tensor):
            return tensor.handle[0].ortvalue.numpy()
        out = np.empty(tensor.shape, tensor.dtype)
        self._run_copy(tensor, self._host_tensor(out))
        return out

    def _host_tensor(self, array: np.ndarray) -> DeviceTensor:
        ov = self._ort.OrtValue.ortvalue_from_numpy(array, "cpu", 0)
        return DeviceTensor(array.shape, array.dtype, (_Storage(ov), 0))

    def copy(self, src: DeviceTensor, dst: DeviceTensor) -> None:
        if tuple(src.shape) != tuple(dst.shape) or src.dtype != dst.dtype:
            raise ValueError(f"copy between {src.shape} {src.dtype} and {dst.shape} {dst.dtype}")
        self._run_copy(src, dst)

    def _run_copy(self, src: DeviceTensor, dst: DeviceTensor) -> None:
        """Copy with an Identity graph: works for any device ORT runs on, views included."""
        key = np.dtype(src.dtype).name
        if key not in self._copy_sessions:
            from onnx import helper

            elem = helper.np_dtype_to_tensor_dtype(np.dtype(src.dtype))
            g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "copy",
                                  [helper.make_tensor_value_info("x", elem, None)],
                                  [helper.make_tensor_value_info("y", elem, None)])
            model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
            model.ir_version = 9
            self._copy_sessions[key] = self._ort.InferenceSession(model.SerializeToString(),
                                                                  providers=self._providers)
        session = self._copy_sessions[key]
        io = session.io_binding()
        self._bind(io, "x", src, output=False)
        self._bind(io, "y", dst, output=True)
        session.run_with_iobinding(io)

    def _bind(self, io, name: str, tensor: DeviceTensor, output: bool) -> None:
        storage, offset = tensor.handle
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
        outputs = outputs or {}
        self.calls[graph.name] += 1
        io = graph.session.io_binding()  # a fresh binding per run: nothing aliases a previous result
        for name in graph.input_names:
            if name not in inputs:
                raise Sam3TrackError(f"graph {graph.name} needs input {name!r}")
            self._bind(io, name, inputs[name], output=False)
        for name in graph.output_names:
            if name in outputs:
                self._bind(io, name, outputs[name], output=True)
            else:
                io.bind_output(name, self.device_type, self.device_id)
        started = time.perf_counter()
        graph.session.run_with_iobinding(io)
        self.seconds[graph.name] += time.perf_counter() - started
        result = {}
        for name, ov in zip(graph.output_names, io.get_outputs()):
            result[name] = outputs[name] if name in outputs else self._wrap(ov)
        return result

    def close(self) -> None:
        self._graphs.clear()
        self._copy_sessions.clear()
        self.closed = True


_ORT_TO_NUMPY = {
    "tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int64)": np.int64,
    "tensor(int32)": np.int32, "tensor(bool)": np.bool_, "tensor(uint8)": np.uint8, "tensor(double)": np.float64,
}
