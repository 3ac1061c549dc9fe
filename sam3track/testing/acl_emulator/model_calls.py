"""The emulated model calls (acl.mdl.*): loading, the model desc, gears and execute.

A mixin of the Emulator (runtime.py), like DatasetCalls: it uses the emulator's handle tables,
memory and stats. Execute runs the OM's ONNX with onnxruntime at the selected gear's shape, reading
the gear-sized prefix of every input buffer, padding bytes included.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass

import numpy as np

from . import constants as C
from .datasets import DataBuffer, Dataset, TensorDesc, api
from .memory import AclError, is_device_address
from .models import OmModel, nbytes


@dataclass(eq=False)
class LoadedModel:
    id: int
    om: OmModel
    ctx: int
    current_gear: tuple | None = None  # set by set_dynamic_* (what get_cur_output_dims reports)


@dataclass(eq=False)
class Desc:
    model_id: int | None = None
    om: OmModel | None = None



class ModelCalls:
    """acl.mdl.* calls about models; mixed into the Emulator."""

    # ------------------------------------------------------------------ models  [MMD, ACLL, P-0157]
    @api("acl.mdl.load_from_file", "tuple", "s", 0, ctx=True)
    def load_from_file(self, path):
        if not os.path.isfile(path):
            raise AclError(C.ACL_ERROR_INVALID_FILE, f"{path}: no such file", "model_file")
        with open(path, "rb") as f:
            blob = f.read()
        return self._load(OmModel.from_bytes(blob, os.path.basename(path)))

    @api("acl.mdl.load_from_mem", "tuple", "ii", 0, ctx=True)
    def load_from_mem(self, ptr, size):
        if is_device_address(ptr) or ptr == 0 or size <= 0:
            raise AclError(C.ACL_ERROR_INVALID_PARAM, "load_from_mem needs a host pointer and size > 0", "param")
        return self._load(OmModel.from_bytes(ctypes.string_at(ptr, size), f"mem:{self._next_model}"))

    def _load(self, om: OmModel) -> int:
        mid = self._next_model
        self._next_model += 1
        self._models[mid] = LoadedModel(mid, om, self._current_ctx().handle)
        return mid

    @api("acl.mdl.unload", "ret", "i", ctx=True)
    def unload(self, mid):
        self._model(mid)
        del self._models[mid]

    # ---- desc
    @api("acl.mdl.create_desc", "bare", "", 0)
    def create_desc(self):
        return self._handle("desc", Desc())

    @api("acl.mdl.get_desc", "ret", "ii")
    def get_desc(self, h, mid):
        d = self._get("desc", h)
        m = self._model(mid, check_ctx=False)
        d.model_id, d.om = mid, m.om

    @api("acl.mdl.destroy_desc", "ret", "i")
    def destroy_desc(self, h):
        self._get("desc", h)
        self._kill("desc", h)

    def _desc(self, h) -> OmModel:
        d = self._get("desc", h)
        if d.om is None:
            raise AclError(C.ACL_ERROR_INVALID_PARAM, "model desc not filled: call acl.mdl.get_desc first", "param")
        return d.om

    def _index(self, n: int, i: int, what: str) -> None:
        if not 0 <= i < n:
            raise AclError(C.ACL_ERROR_INVALID_PARAM, f"{what} index {i} out of range (model has {n})", "param")

    @api("acl.mdl.get_num_inputs", "bare", "i", 0)
    def get_num_inputs(self, h):
        return self._desc(h).num_inputs  # includes ascend_mbatch_shape_data [MMD, ACLL]

    @api("acl.mdl.get_num_outputs", "bare", "i", 0)
    def get_num_outputs(self, h):
        return len(self._desc(h).outputs)

    @api("acl.mdl.get_input_size_by_index", "bare", "ii", 0)
    def get_input_size_by_index(self, h, i):
        om = self._desc(h)
        self._index(om.num_inputs, i, "input")
        return om.input_size(i)  # largest gear; 0 for shape_range [MMD; P-dyn 0047]

    @api("acl.mdl.get_output_size_by_index", "bare", "ii", 0)
    def get_output_size_by_index(self, h, i):
        om = self._desc(h)
        self._index(len(om.outputs), i, "output")
        return om.output_size(i)

    def _in_spec(self, om: OmModel, i: int):
        self._index(om.num_inputs, i, "input")
        if om.gear_mode and i == om.hidden_index:
            return C.HIDDEN_INPUT, [len(om.gears[0])], C.ACL_INT64  # hidden input dims/dtype [unconfirmed]
        s = om.inputs[i]
        return s.name, list(s.dims), s.acl_dtype

    @api("acl.mdl.get_input_dims", "tuple", "ii", None)
    def get_input_dims(self, h, i):
        name, dims, _ = self._in_spec(self._desc(h), i)
        return {"name": name, "dimCount": len(dims), "dims": dims}  # -1 on dynamic axes [P-0211]

    @api("acl.mdl.get_input_dims_v2", "tuple", "ii", None)
    def get_input_dims_v2(self, h, i):
        name, dims, _ = self._in_spec(self._desc(h), i)
        return {"name": name, "dimCount": len(dims), "dims": dims}

    @api("acl.mdl.get_output_dims", "tuple", "ii", None)
    def get_output_dims(self, h, i):
        om = self._desc(h)
        self._index(len(om.outputs), i, "output")
        s = om.outputs[i]
        return {"name": s.name, "dimCount": len(s.dims), "dims": list(s.dims)}  # largest gear [P-0212]

    @api("acl.mdl.get_cur_output_dims", "tuple", "ii", None)
    def get_cur_output_dims(self, h, i):
        d = self._get("desc", h)
        om = self._desc(h)
        self._index(len(om.outputs), i, "output")
        lm = self._models.get(d.model_id)
        if lm is None or lm.om is not om:
            raise AclError(C.ACL_ERROR_INVALID_MODEL_ID, f"model {d.model_id} of this desc is no longer loaded", "param")
        s = om.outputs[i]
        # the gear last set with set_dynamic_* on this model; the largest gear before that [C-1466, MMD]
        dims = list(om.output_dims(lm.current_gear)[i]) if lm.current_gear is not None else list(s.dims)
        return {"name": s.name, "dimCount": len(dims), "dims": dims}

    @api("acl.mdl.get_input_data_type", "bare", "ii", C.ACL_DT_UNDEFINED)
    def get_input_data_type(self, h, i):
        return self._in_spec(self._desc(h), i)[2]

    @api("acl.mdl.get_output_data_type", "bare", "ii", C.ACL_DT_UNDEFINED)
    def get_output_data_type(self, h, i):
        om = self._desc(h)
        self._index(len(om.outputs), i, "output")
        return om.outputs[i].acl_dtype

    @api("acl.mdl.get_input_format", "bare", "ii", C.ACL_FORMAT_UNDEFINED)
    def get_input_format(self, h, i):
        self._in_spec(self._desc(h), i)
        return C.ACL_FORMAT_ND  # [unconfirmed]: the real one reports --input_format

    @api("acl.mdl.get_output_format", "bare", "ii", C.ACL_FORMAT_UNDEFINED)
    def get_output_format(self, h, i):
        om = self._desc(h)
        self._index(len(om.outputs), i, "output")
        return C.ACL_FORMAT_ND

    @api("acl.mdl.get_input_name_by_index", "bare", "ii", "")
    def get_input_name_by_index(self, h, i):
        return self._in_spec(self._desc(h), i)[0]

    @api("acl.mdl.get_output_name_by_index", "bare", "ii", "")
    def get_output_name_by_index(self, h, i):
        om = self._desc(h)
        self._index(len(om.outputs), i, "output")
        name = om.outputs[i].name  # "<node>:<index>:<tensor>" [P-0205, MMD]
        if not self.rules.output_tensor_names:  # "<node>:<index>" only (ascend.md audit, risk 2)
            name = ":".join(name.split(":")[:2])
        return name

    @api("acl.mdl.get_input_index_by_name", "tuple", "is", -1)
    def get_input_index_by_name(self, h, name):
        om = self._desc(h)
        names = [s.name for s in om.inputs] + ([C.HIDDEN_INPUT] if om.gear_mode else [])
        if name not in names:
            raise AclError(C.ACL_ERROR_INVALID_PARAM, f"no input named {name!r} (inputs: {names})", "param")
        return names.index(name)

    @api("acl.mdl.get_output_index_by_name", "tuple", "is", -1)
    def get_output_index_by_name(self, h, name):
        om = self._desc(h)
        names = [s.name for s in om.outputs]
        if name not in names:
            raise AclError(C.ACL_ERROR_INVALID_PARAM, f"no output named {name!r} (outputs: {names})", "param")
        return names.index(name)

    # ---- gears  [§3.4]
    @api("acl.mdl.get_dynamic_batch", "tuple", "i", None)
    def get_dynamic_batch(self, h):
        om = self._desc(h)
        batch = [g[0] for g in om.gears] if om.mode == "dynamic_batch" else []
        return {"batchCount": len(batch), "batch": batch}  # [P-0212 (8.5)]

    @api("acl.mdl.get_dynamic_hw", "tuple", "ii", None)
    def get_dynamic_hw(self, h, index):
        self._desc(h)
        return {"hwCount": 0, "hw": []}  # dynamic image size is not emulated (the fake atc never makes it)

    @staticmethod
    def _reserved_index(index: int, call: str) -> None:
        # "reserved, fixed to -1" [P-0226]; anything else is refused [hicann/ge model_om2.cpp]
        if index != -1:
            raise AclError(C.ACL_ERROR_INVALID_PARAM, f"{call}: index must be -1, not {index}", "param")

    @api("acl.mdl.get_input_dynamic_gear_count", "tuple", "ii", -1)
    def get_input_dynamic_gear_count(self, h, index):
        om = self._desc(h)
        self._reserved_index(index, "get_input_dynamic_gear_count")
        # the desc's dynamic dims gears: 0 for static and batch models [hicann/ge model_om2.cpp]
        return len(om.gears) if om.mode == "dynamic_dims" else 0

    @api("acl.mdl.get_input_dynamic_dims", "tuple", "iii", None)
    def get_input_dynamic_dims(self, h, index, count):
        om = self._desc(h)
        self._reserved_index(index, "get_input_dynamic_dims")
        if om.mode != "dynamic_dims":
            raise AclError(C.ACL_ERROR_MODEL_NOT_DYNAMIC, "not a dynamic_dims model", "gear")
        if count < len(om.gears):  # a larger count is accepted [hicann/ge model_om2.cpp]
            raise AclError(C.ACL_ERROR_INVALID_PARAM, f"gear count {count} is less than the model's "
                           f"{len(om.gears)}", "param")
        flat = [om.flat_dims(g) for g in om.gears]
        if len(flat[0]) > C.ACL_MAX_DIM_CNT:  # the inputs' dims, concatenated, fill one aclmdlIODims
            raise AclError(C.ACL_ERROR_FAILURE, f"the inputs have {len(flat[0])} dims in all, more than "
                           f"ACL_MAX_DIM_CNT {C.ACL_MAX_DIM_CNT}", "gear")
        return [{"name": "", "dimCount": len(f), "dims": f} for f in flat]  # [P-0226]

    @api("acl.mdl.get_input_dims_range", "tuple", "ii", None)
    def get_input_dims_range(self, h, i):
        om = self._desc(h)
        self._index(len(om.inputs), i, "input")
        s = om.inputs[i]
        rng = [(r if isinstance(r, list) else [r, r]) for r in (s.ranges or [[d, d] for d in s.dims])]
        return {"dimCount": len(rng), "range": rng}  # layout [unconfirmed]

    def _hidden_buffer(self, lm: LoadedModel, ds_h: int, index: int) -> DataBuffer:
        om = lm.om
        if not om.gear_mode:  # [ERR 100019]
            raise AclError(C.ACL_ERROR_MODEL_NOT_DYNAMIC, f"model {lm.id} ({om.name}) is {om.mode}, not a gear model", "gear")
        if index != om.hidden_index:
            raise AclError(C.ACL_ERROR_INVALID_PARAM, f"index {index} is not the {C.HIDDEN_INPUT} input "
                           f"(index {om.hidden_index})", "gear")
        ds = self._get("dataset", ds_h)
        if index >= len(ds.buffers):
            raise AclError(C.ACL_ERROR_GE_DYNAMIC_INPUT_ADDR_INVALID, f"input dataset has no buffer at index {index} "
                           f"for {C.HIDDEN_INPUT} (add it before set_dynamic_*)", "gear")
        b = self._get("buffer", ds.buffers[index])
        if not is_device_address(b.addr):
            raise AclError(C.ACL_ERROR_GE_DYNAMIC_INPUT_ADDR_INVALID, f"{C.HIDDEN_INPUT} buffer is not device memory", "gear")
        if b.size < om.hidden_size:
            raise AclError(C.ACL_ERROR_GE_DYNAMIC_INPUT_LENGTH_INVALID, f"{C.HIDDEN_INPUT} buffer holds {b.size} B, "
                           f"needs {om.hidden_size}", "gear")
        self.mem.check_range(b.addr, om.hidden_size, f"{C.HIDDEN_INPUT} buffer")
        return b

    def _select_gear(self, lm: LoadedModel, ds_h: int, b: DataBuffer, gear: tuple) -> None:
        # acl records the gear on the dataset (dynamicBatchSize / dynamicDims) and GE writes it into the
        # hidden input's device memory (one uint64 per dynamic value [unconfirmed layout]); execute
        # hands both to the model [hicann/ge api/acl/acl_model/model/model.cpp]
        self.mem.write(b.addr, np.asarray(gear, dtype="<i8").view(np.uint8))
        self._get("dataset", ds_h).gear = gear
        lm.current_gear = gear

    @api("acl.mdl.set_dynamic_batch_size", "ret", "iiii", ctx=True)
    def set_dynamic_batch_size(self, mid, ds, index, batch):
        lm = self._model(mid)
        b = self._hidden_buffer(lm, ds, index)
        if lm.om.mode != "dynamic_batch":
            raise AclError(C.ACL_ERROR_INVALID_PARAM, f"model {mid} is {lm.om.mode}: use set_input_dynamic_dims", "gear")
        if (batch,) not in lm.om.gears:  # [ACLL 145013]
            raise AclError(C.ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID, f"batch {batch} is not a compiled gear "
                           f"{[g[0] for g in lm.om.gears]}", "gear")
        self._select_gear(lm, ds, b, (batch,))

    @api("acl.mdl.set_input_dynamic_dims", "ret", "iiid", ctx=True)
    def set_input_dynamic_dims(self, mid, ds, index, dims):
        lm = self._model(mid)
        b = self._hidden_buffer(lm, ds, index)
        om = lm.om
        if om.mode != "dynamic_dims":
            raise AclError(C.ACL_ERROR_INVALID_PARAM, f"model {mid} is {om.mode}: use set_dynamic_batch_size", "gear")
        flat = list(dims.get("dims", []))
        if "dimCount" in dims and dims["dimCount"] != len(flat):
            raise AclError(C.ACL_ERROR_INVALID_PARAM, f"dimCount {dims['dimCount']} != len(dims) {len(flat)}", "param")
        gear = next((g for g in om.gears if om.flat_dims(g) == flat), None)
        if gear is None:  # must equal one gear exactly [P-0226, MMD]
            raise AclError(C.ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID, f"dims {flat} are not a compiled gear "
                           f"(gears: {[om.flat_dims(g) for g in om.gears]})", "gear")
        self._select_gear(lm, ds, b, gear)

    @api("acl.mdl.set_dynamic_hw_size", "ret", "iiiii", ctx=True)
    def set_dynamic_hw_size(self, mid, ds, index, h, w):
        lm = self._model(mid)
        if not lm.om.gear_mode:
            raise AclError(C.ACL_ERROR_MODEL_NOT_DYNAMIC, f"model {mid} is {lm.om.mode}", "gear")
        raise AclError(C.ACL_ERROR_INVALID_PARAM, "set_dynamic_hw_size: dynamic image size is not emulated", "gear")

    # ---- execute  [§3.3, §3.4, §3.5]
    @api("acl.mdl.execute", "ret", "iii", ctx=True)
    def execute(self, mid, in_ds, out_ds):
        self._plan_execute(mid, in_ds, out_ds)()

    @api("acl.mdl.execute_async", "ret", "iiii", ctx=True)
    def execute_async(self, mid, in_ds, out_ds, stream):
        s = self._stream(stream)
        self._enqueue(s, self._plan_execute(mid, in_ds, out_ds))

    def _plan_execute(self, mid, in_ds, out_ds):
        lm = self._model(mid)
        ins, outs = self._get("dataset", in_ds), self._get("dataset", out_ds)
        om = lm.om
        if len(ins.buffers) != om.num_inputs:  # hidden input included [ACLL, MMD]
            raise AclError(C.ACL_ERROR_MODEL_INPUT_NOT_MATCH, f"input dataset has {len(ins.buffers)} buffers, the "
                           f"model {om.num_inputs} inputs" + (f" (incl. {C.HIDDEN_INPUT})" if om.gear_mode else ""), "dataset")
        if len(outs.buffers) != len(om.outputs):
            raise AclError(C.ACL_ERROR_MODEL_OUTPUT_NOT_MATCH, f"output dataset has {len(outs.buffers)} buffers, the "
                           f"model {len(om.outputs)} outputs", "dataset")
        return lambda: self._run(lm, ins, outs)

    def _run(self, lm: LoadedModel, ins: Dataset, outs: Dataset) -> None:
        om = lm.om
        if lm.id not in self._models:
            raise AclError(C.ACL_ERROR_INVALID_MODEL_ID, f"model {lm.id} unloaded before it ran", "use_after_free")
        soc = self.rules.soc_version
        if soc and om.header.get("soc_version") not in (None, soc):
            raise AclError(C.ACL_ERROR_RT_MODEL_EXECUTE, f"model compiled for {om.header.get('soc_version')}, "
                           f"device is {soc}", "soc")
        gear = None
        if om.gear_mode:
            gear = self._dataset_gear(om, ins)
            shapes = om.shapes_at(gear)
        elif om.mode == "shape_range":
            shapes = []
            for i, s in enumerate(om.inputs):
                th = ins.tensor_descs.get(i)
                if th is None or th not in self._reg["tensor_desc"]:
                    if -1 in s.dims:  # [P-dyn 0047]
                        raise AclError(C.ACL_ERROR_GE_SHAPE_INVALID, f"input {i} ({s.name}) is dynamic: "
                                       "set_dataset_tensor_desc before execute", "shape_range")
                    shapes.append(s.dims)
                    continue
                t = self._reg["tensor_desc"][th]
                why = om.check_range(i, tuple(t.dims))
                if why:
                    raise AclError(C.ACL_ERROR_GE_SHAPE_INVALID, f"input {i} ({s.name}): {why}", "shape_range")
                if t.dtype != s.acl_dtype:
                    raise AclError(C.ACL_ERROR_GE_DATATYPE_INVALID, f"input {i} ({s.name}): tensor desc dtype "
                                   f"{t.dtype} != model dtype {s.acl_dtype}", "shape_range")
                shapes.append(tuple(t.dims))
        else:
            shapes = om.shapes_at(None)
        arrays = []
        for i, (s, shape) in enumerate(zip(om.inputs, shapes)):
            need = nbytes(shape, s.dtype)
            b = self._io_buffer(ins, i, need, f"input {i} ({s.name})", C.ACL_ERROR_MODEL_INPUT_NOT_MATCH)
            # the gear-sized prefix, padding bytes and all [§3.4.4]
            arrays.append(self.mem.read(b.addr, need).view(s.dtype).reshape(shape))
        results = om.run(arrays, gear)
        self.stats.executes[om.name] += 1
        for i, (s, r) in enumerate(zip(om.outputs, results)):
            self._write_output(om, outs, i, r)
            if om.mode == "shape_range":  # output shapes through get_dataset_tensor_desc [§3.5.3]
                old = outs.tensor_descs.get(i)
                if old in self._reg["tensor_desc"] and self._reg["tensor_desc"][old].owned:
                    self._kill("tensor_desc", old)
                outs.tensor_descs[i] = self._handle("tensor_desc", TensorDesc(s.acl_dtype, list(r.shape),
                                                                              C.ACL_FORMAT_ND, owned=True))

    def _dataset_gear(self, om: OmModel, ins: Dataset) -> tuple:
        """The gear this execute runs: the one set on the input dataset, which the hidden input's
        bytes must still hold (set_dynamic_* writes both) [§3.4.1, hicann/ge model.cpp]."""
        b = self._get("buffer", ins.buffers[om.hidden_index])
        self.mem.check_range(b.addr, om.hidden_size, f"{C.HIDDEN_INPUT} buffer")
        held = tuple(int(v) for v in self.mem.read(b.addr, om.hidden_size).view("<i8"))
        if ins.gear is None or held not in om.gears:
            raise AclError(C.ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID, f"no gear selected on this input dataset "
                           f"({C.HIDDEN_INPUT} holds {list(held)}); call set_dynamic_batch_size / "
                           "set_input_dynamic_dims on it before execute", "gear")
        if held != ins.gear:
            raise AclError(C.ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID, f"the input dataset's gear {list(ins.gear)} "
                           f"differs from the {list(held)} its {C.HIDDEN_INPUT} buffer holds (another dataset "
                           "set its gear into the same buffer, or a copy overwrote it)", "gear")
        return ins.gear

    def _write_output(self, om: OmModel, outs: Dataset, i: int, r: np.ndarray) -> None:
        """Output i into its buffer. Gear models: the buffer must hold the largest gear, since GE copies
        the output's full (largest-gear) data size whatever the gear [hicann/ge davinci_model.cc
        CopyOutputDataLegacy]; the bytes past this gear's result are the model's leftovers (poison)."""
        s = om.outputs[i]
        what = f"output {i} ({s.name})"
        if om.mode == "shape_range":
            b = self._io_buffer(outs, i, r.nbytes, what, C.ACL_ERROR_RT_MODEL_EXECUTE)
        elif om.gear_mode:
            need = om.output_size(i)
            # [unconfirmed code]: the device's copy of `need` bytes into a smaller buffer fails in memcpy
            b = self._io_buffer(outs, i, need, what + " (gear models need the largest gear's size, "
                                "get_output_size_by_index)", C.ACL_ERROR_RT_PARAM_INVALID)
            if self.rules.poison and need > r.nbytes:
                self.mem.write(b.addr + r.nbytes, np.full(need - r.nbytes, 0xFF, np.uint8))
        else:
            b = self._io_buffer(outs, i, r.nbytes, what, C.ACL_ERROR_MODEL_OUTPUT_NOT_MATCH)
        self.mem.write(b.addr, r)

    def _io_buffer(self, ds: Dataset, i: int, need: int, what: str, code: int) -> DataBuffer:
        b = self._get("buffer", ds.buffers[i])
        if b.addr == 0 or not is_device_address(b.addr):
            raise AclError(C.ACL_ERROR_RT_INVALID_MEMORY_TYPE, f"{what}: buffer address 0x{b.addr:x} is not device "
                           "memory", "dataset")
        if b.size < need:  # [§3.3.3]
            raise AclError(code, f"{what}: buffer holds {b.size} B, this run needs {need} B", "dataset")
        self.mem.check_range(b.addr, b.size, what)
        return b
