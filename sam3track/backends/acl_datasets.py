"""How one run's tensors reach an OM model on the acl backend: each gear's input and output datasets
(built at load, re-pointed every run), host inputs through pinned staging, the graph's own output
buffers, the gear set before execute and the outputs read at the gear's shape.

`DatasetIO` is mixed into AclBackend (acl.py), whose return-code checks, memory and stream it uses.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np

from ..errors import BackendError
from .acl_models import AclGraph, _as_om_dtype, _Gear, _GearData, _gear_shape, _Io
from .acl_runtime import ACL_SUCCESS, MEMCPY_DEVICE_TO_DEVICE, MEMCPY_HOST_TO_DEVICE, _Allocation, _error
from .base import DeviceTensor


@dataclass
class _HostInput:
    """Where an input that arrives as a host array goes: pinned staging (memcpy_async needs host
    memory from malloc_host [P-0125]) and a device buffer, both sized for the largest gear."""

    host_ptr: int
    host: np.ndarray  # uint8 view of the pinned memory
    device: _Allocation


class DatasetIO:
    """The data path of AclBackend.run (see the module docstring)."""

    def _bind(self, graph: AclGraph, gear_index: int, in_places, out_places) -> _GearData:
        """The gear's datasets pointed at this run's memory: only acl.update_data_buffer [MMD], never
        a dataset or data buffer created while tracking."""
        data = graph.gear_data[gear_index]
        for buffer, (address, nbytes), io in zip(data.input_buffers + data.output_buffers, in_places + out_places,
                                                 graph.inputs + graph.outputs):
            self._call("acl.update_data_buffer", self._acl.update_data_buffer(buffer, address, nbytes),
                       f"graph {graph.name}, {io.name}")
        return data

    def _new_gear_data(self, graph: AclGraph) -> _GearData:
        """One input and one output dataset for a gear, built at load: one data buffer per om input
        and output, the hidden input included, in om index order [ascend.md 3.3.1-3.3.2]. They start
        empty (address 0, size 0: the form AscendCL documents for buffers filled later [unconfirmed
        for inputs]) and every run re-points them before executing."""
        acl, what = self._acl, f"graph {graph.name}"
        data = _GearData(0, 0, [], [])
        try:
            data.inputs = self._handle("acl.mdl.create_dataset", acl.mdl.create_dataset(), what)
            data.outputs = self._handle("acl.mdl.create_dataset", acl.mdl.create_dataset(), what)
            for dataset, ios, buffers in ((data.inputs, graph.inputs, data.input_buffers),
                                          (data.outputs, graph.outputs, data.output_buffers)):
                for io in ios:
                    buffer = self._handle("acl.create_data_buffer", acl.create_data_buffer(0, 0), f"{what}, {io.name}")
                    buffers.append(buffer)
                    self._value("acl.mdl.add_dataset_buffer", acl.mdl.add_dataset_buffer(dataset, buffer),
                                f"{what}, {io.name}")
        except BaseException:
            destroy_gear_data(acl, data, what, [])
            raise
        return data

    def _input_place(self, graph: AclGraph, io: _Io, inputs) -> tuple[int, int]:
        """(device address, bytes) an input is read from this run."""
        if io is graph.hidden:
            return graph.hidden_buffer.ptr, io.nbytes  # set_dynamic_* fills it [MMD, ACLL]
        value = inputs[io.name]
        if isinstance(value, DeviceTensor):
            if np.dtype(value.dtype) != io.dtype:
                raise BackendError(f"graph {graph.name}: input {io.name} is {np.dtype(value.dtype)} on the device, "
                                   f"the OM model takes {io.dtype}")
            return self._address(value), value.nbytes
        return self._stage(graph, io, value)

    def _stage(self, graph: AclGraph, io: _Io, array) -> tuple[int, int]:
        """Host array -> pinned staging -> memcpy_async into the graph's own input buffer (queued on the
        stream ahead of the model, so one synchronize covers both)."""
        array = _as_om_dtype(graph, io, array)
        staged = graph.host_inputs.get(io.name)
        if staged is None:
            staged = graph.host_inputs[io.name] = self._host_input(graph, io)
        nbytes = array.nbytes
        if nbytes > staged.device.nbytes:
            raise BackendError(f"graph {graph.name}: input {io.name} {array.shape} is {nbytes} bytes, more than the "
                               f"largest gear's {staged.device.nbytes}")
        staged.host[:nbytes] = array.reshape(-1).view(np.uint8)
        if nbytes:
            self._call("acl.rt.memcpy_async",
                       self._acl.rt.memcpy_async(staged.device.ptr, staged.device.nbytes, staged.host_ptr, nbytes,
                                                 MEMCPY_HOST_TO_DEVICE, self._stream),
                       f"graph {graph.name}, input {io.name}")
        self._count("to_device", array.shape, nbytes)
        return staged.device.ptr, nbytes

    def _host_input(self, graph: AclGraph, io: _Io) -> _HostInput:
        size = max(io.nbytes, 1)
        device = self._malloc(size, f"graph {graph.name} input {io.name}", graph_owned=True)
        host_ptr = self._value("acl.rt.malloc_host", self._acl.rt.malloc_host(size),
                               f"graph {graph.name} input {io.name}, {size} bytes")
        self._host_blocks.append(host_ptr)
        host = np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(host_ptr))
        return _HostInput(host_ptr, host, device)

    def _output_place(self, graph: AclGraph, io: _Io, gear: _Gear, outputs) -> tuple[int, int]:
        """(device address, bytes) an output is written to this run: a buffer of the largest gear's
        size (get_output_size_by_index). GE copies that many bytes into the caller's buffer whatever
        the gear [hicann/ge davinci_model.cc CopyOutputDataLegacy: no size check on dynamic models,
        memcpy of the output's full data size; mmdeploy allocates the largest too, MMD]. A tensor
        the caller placed goes straight in only when it holds the largest gear; a smaller one (a pool
        view sized for this gear) gets the graph's own buffer and a device copy afterwards
        (_results)."""
        target = outputs.get(io.name)
        if target is not None:
            want = _gear_shape(io, gear)
            if tuple(target.shape) != want or np.dtype(target.dtype) != io.dtype:
                raise BackendError(f"graph {graph.name}: output {io.name} at this gear is {want} {io.dtype}, the "
                                   f"tensor given for it is {tuple(target.shape)} {np.dtype(target.dtype)}")
            if target.nbytes >= io.nbytes:
                return self._address(target), target.nbytes
        buffer = graph.output_buffers.get(io.name)
        if buffer is None:
            buffer = graph.output_buffers[io.name] = self._malloc(
                io.nbytes, f"graph {graph.name} output {io.name}", graph_owned=True)
        return buffer.ptr, io.nbytes

    def _set_gear(self, graph: AclGraph, gear: _Gear, data: _GearData) -> None:
        """Gear models need the gear set on the input dataset before every execute, at the hidden
        input's index [ascend.md 3.4.1-3.4.2, MMD]."""
        if graph.hidden is None:
            return
        acl, what = self._acl, f"graph {graph.name}, gear {gear.sizes}"
        args = (graph.model_id, data.inputs, graph.hidden.index, gear.value)
        if graph.mode == "dynamic_batch":
            self._call("acl.mdl.set_dynamic_batch_size", acl.mdl.set_dynamic_batch_size(*args), what)
        else:
            self._call("acl.mdl.set_input_dynamic_dims", acl.mdl.set_input_dynamic_dims(*args), what)

    def _results(self, graph: AclGraph, gear: _Gear, outputs) -> dict[str, DeviceTensor]:
        """Every output at the gear's shape, read with get_cur_output_dims (never the largest gear's
        dims [C-1466, ascend.md 3.4.4]): the dense prefix of its buffer. Tensors the caller placed
        that were too small for the largest gear get that prefix by a device copy."""
        result = {}
        for io in graph.outputs:
            dims = self._value("acl.mdl.get_cur_output_dims", self._acl.mdl.get_cur_output_dims(graph.desc, io.index),
                               f"graph {graph.name}, output {io.name}")
            shape = tuple(int(d) for d in dims["dims"][:dims.get("dimCount", len(dims["dims"]))])
            nbytes = int(np.prod(shape, dtype=np.int64)) * io.dtype.itemsize
            target = outputs.get(io.name)
            if target is not None and shape != tuple(target.shape):
                raise BackendError(f"graph {graph.name}: output {io.name} came out {shape}, but "
                                   f"{tuple(target.shape)} was expected at this gear; the OM model does not match "
                                   "om_manifest.json: convert the bundle again")
            if target is not None and target.nbytes >= io.nbytes:
                result[io.name] = target  # written in place
                continue
            buffer = graph.output_buffers[io.name]
            if nbytes > buffer.nbytes:
                raise BackendError(f"graph {graph.name}: output {io.name} came out {shape}, larger than its largest "
                                   f"gear's {buffer.nbytes} bytes")
            if target is None:
                result[io.name] = DeviceTensor(shape, io.dtype, (buffer, 0))
                continue
            if nbytes:
                self._memcpy(self._address(target), target.nbytes, buffer.ptr, nbytes, MEMCPY_DEVICE_TO_DEVICE,
                             f"graph {graph.name}, output {io.name} into the tensor placed for it")
            result[io.name] = target
        return result


def destroy_gear_data(acl, data: _GearData, what: str, errors: list) -> None:
    """Data buffers first, then the datasets: destroy_dataset frees neither the data buffers nor
    their memory [ascend.md 2, MMD]. Failures are collected, not raised: teardown goes on."""
    for buffer in data.input_buffers + data.output_buffers:
        ret = acl.destroy_data_buffer(buffer)
        if ret not in (ACL_SUCCESS, None):
            errors.append(_error(acl, "acl.destroy_data_buffer", ret, what))
    for dataset in (data.inputs, data.outputs):
        if dataset:
            ret = acl.mdl.destroy_dataset(dataset)
            if ret not in (ACL_SUCCESS, None):
                errors.append(_error(acl, "acl.mdl.destroy_dataset", ret, what))
    data.input_buffers.clear()
    data.output_buffers.clear()
    data.inputs = data.outputs = 0
