"""Data buffers, tensor descs and datasets (host-side objects: no context needed), plus the `@api` tag.

Mixed into `runtime.Emulator`; relies on its `_handle` / `_get` / `_kill` registry, `mem` and `stats`.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field

import numpy as np

from . import constants as C
from .memory import AclError, is_device_address
from .models import nbytes


@dataclass(eq=False)
class DataBuffer:
    addr: int
    size: int


@dataclass(eq=False)
class TensorDesc:
    dtype: int
    dims: list
    fmt: int
    owned: bool = False  # created by the runtime (output descs of a dataset): not the app's to destroy


@dataclass(eq=False)
class Dataset:
    buffers: list = field(default_factory=list)
    tensor_descs: dict = field(default_factory=dict)  # index -> tensor desc handle (set_dataset_tensor_desc)
    # what set_dynamic_* recorded on this dataset (aclmdlDataset's dynamicBatchSize / dynamicDims, which
    # execute hands to GE next to the hidden input's bytes) [hicann/ge api/acl/acl_model/model/model.cpp]
    gear: tuple | None = None


def api(qualname: str, kind: str, sig: str = "", fail=None, *, init: bool = True, ctx: bool = False):
    def deco(fn):
        fn._acl = (qualname, kind, sig, fail, init, ctx)
        return fn
    return deco


def check_args(name: str, sig: str, args: tuple) -> list:
    req, _, opt = sig.partition("|")
    if not len(req) <= len(args) <= len(req) + len(opt):
        n = str(len(req)) if not opt else f"{len(req)} to {len(req) + len(opt)}"
        raise TypeError(f"{name}() takes {n} positional arguments but {len(args)} were given")
    out = []
    for i, (c, a) in enumerate(zip(req + opt, args), 1):
        bad = TypeError(f"{name}(): argument {i} has incompatible type {type(a).__name__}")
        if c == "i":
            if isinstance(a, float) or not hasattr(type(a), "__index__"):
                raise bad
            a = operator.index(a)
        elif c == "s" and not isinstance(a, str):
            raise bad
        elif c == "d" and not isinstance(a, dict):
            raise bad
        elif c == "l":
            if not isinstance(a, (list, tuple)) or any(isinstance(v, float) or not hasattr(type(v), "__index__") for v in a):
                raise bad
            a = [operator.index(v) for v in a]
        elif c == "b" and not isinstance(a, (bytes, bytearray)):
            raise bad
        out.append(a)
    return out


class DatasetCalls:
    # ------------------------------------------------------------------ data buffers / tensor descs
    def _check_buffer_target(self, ptr: int, size: int) -> None:
        if ptr and is_device_address(ptr):  # interior pointers are fine; the range must fit its block
            self.mem.check_range(ptr, size, "data buffer address")

    @api("acl.create_data_buffer", "bare", "ii", 0)
    def create_data_buffer(self, ptr, size):
        self._check_buffer_target(ptr, size)
        self.stats.data_buffers_created += 1
        return self._handle("buffer", DataBuffer(ptr, size))

    @api("acl.update_data_buffer", "ret", "iii")
    def update_data_buffer(self, h, ptr, size):
        b = self._get("buffer", h)
        self._check_buffer_target(ptr, size)
        b.addr, b.size = ptr, size

    @api("acl.destroy_data_buffer", "ret", "i")
    def destroy_data_buffer(self, h):
        self._get("buffer", h)
        self._kill("buffer", h)  # does not free the memory [MMD]

    @api("acl.get_data_buffer_addr", "bare", "i", 0)
    def get_data_buffer_addr(self, h):
        return self._get("buffer", h).addr

    @api("acl.get_data_buffer_size_v2", "bare", "i", 0)
    def get_data_buffer_size_v2(self, h):
        return self._get("buffer", h).size

    @api("acl.get_data_buffer_size", "bare", "i", 0)
    def get_data_buffer_size(self, h):  # deprecated spelling
        return self._get("buffer", h).size

    @api("acl.create_tensor_desc", "bare", "ili", 0)
    def create_tensor_desc(self, dtype, dims, fmt):
        return self._handle("tensor_desc", TensorDesc(dtype, list(dims), fmt))

    @api("acl.destroy_tensor_desc", "bare", "i", None)
    def destroy_tensor_desc(self, h):
        t = self._get("tensor_desc", h)
        if t.owned:
            raise AclError(C.ACL_ERROR_INVALID_PARAM, "this tensor desc belongs to a dataset (get_dataset_tensor_desc)", "param")
        self._kill("tensor_desc", h)

    @api("acl.get_tensor_desc_num_dims", "bare", "i", 0)
    def get_tensor_desc_num_dims(self, h):
        return len(self._get("tensor_desc", h).dims)

    def _td_dim(self, h, i):
        t = self._get("tensor_desc", h)
        if not 0 <= i < len(t.dims):
            raise AclError(C.ACL_ERROR_INVALID_PARAM, f"dim index {i} out of range ({len(t.dims)} dims)", "param")
        return t.dims[i]

    @api("acl.get_tensor_desc_dim_v2", "tuple", "ii", -1)
    def get_tensor_desc_dim_v2(self, h, i):
        return self._td_dim(h, i)

    @api("acl.get_tensor_desc_dim", "bare", "ii", -1)
    def get_tensor_desc_dim(self, h, i):
        return self._td_dim(h, i)

    @api("acl.get_tensor_desc_type", "bare", "i", C.ACL_DT_UNDEFINED)
    def get_tensor_desc_type(self, h):
        return self._get("tensor_desc", h).dtype

    @api("acl.get_tensor_desc_format", "bare", "i", C.ACL_FORMAT_UNDEFINED)
    def get_tensor_desc_format(self, h):
        return self._get("tensor_desc", h).fmt

    @api("acl.get_tensor_desc_element_count", "bare", "i", 0)
    def get_tensor_desc_element_count(self, h):
        return int(np.prod(self._get("tensor_desc", h).dims, dtype=np.int64))

    @api("acl.get_tensor_desc_size", "bare", "i", 0)
    def get_tensor_desc_size(self, h):
        t = self._get("tensor_desc", h)
        if t.dtype not in C.ACL_TO_NUMPY:
            raise AclError(C.ACL_ERROR_UNSUPPORTED_DATA_TYPE, f"dtype {t.dtype} not emulated", "param")
        return nbytes(t.dims, C.ACL_TO_NUMPY[t.dtype])

    # ---- datasets  [§3.3]
    @api("acl.mdl.create_dataset", "bare", "", 0)
    def create_dataset(self):
        self.stats.datasets_created += 1
        return self._handle("dataset", Dataset())

    @api("acl.mdl.add_dataset_buffer", "tuple", "ii", 0)
    def add_dataset_buffer(self, ds_h, buf_h):
        ds = self._get("dataset", ds_h)
        self._get("buffer", buf_h)
        ds.buffers.append(buf_h)
        return ds_h

    @api("acl.mdl.get_dataset_num_buffers", "bare", "i", 0)
    def get_dataset_num_buffers(self, ds_h):
        return len(self._get("dataset", ds_h).buffers)

    @api("acl.mdl.get_dataset_buffer", "bare", "ii", 0)
    def get_dataset_buffer(self, ds_h, i):
        ds = self._get("dataset", ds_h)
        self._index(len(ds.buffers), i, "dataset buffer")
        return ds.buffers[i]

    @api("acl.mdl.destroy_dataset", "ret", "i")
    def destroy_dataset(self, ds_h):
        ds = self._get("dataset", ds_h)
        for h in ds.tensor_descs.values():
            t = self._reg["tensor_desc"].get(h)
            if t is not None and t.owned:
                self._kill("tensor_desc", h)
        self._kill("dataset", ds_h)  # buffers and memory stay alive [MMD]

    @api("acl.mdl.set_dataset_tensor_desc", "tuple", "iii", 0)
    def set_dataset_tensor_desc(self, ds_h, td_h, index):
        ds = self._get("dataset", ds_h)
        self._get("tensor_desc", td_h)
        if index < 0:
            raise AclError(C.ACL_ERROR_INVALID_PARAM, f"index {index} < 0", "param")
        ds.tensor_descs[index] = td_h
        return ds_h

    @api("acl.mdl.get_dataset_tensor_desc", "bare", "ii", 0)
    def get_dataset_tensor_desc(self, ds_h, index):
        ds = self._get("dataset", ds_h)
        if index not in ds.tensor_descs or ds.tensor_descs[index] not in self._reg["tensor_desc"]:
            raise AclError(C.ACL_ERROR_INVALID_PARAM, f"dataset has no tensor desc at index {index}", "param")
        return ds.tensor_descs[index]
