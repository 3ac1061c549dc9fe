"""The emulated memory and util calls (acl.rt.malloc / free / memcpy / memset, acl.util.*).

A mixin of the Emulator (runtime.py), like ModelCalls and DatasetCalls: it uses the emulator's
`mem`, `stats`, `rules` and `_sync_stats`, and its current context and streams (`_current_ctx`,
`_stream`, `_enqueue`).
"""

from __future__ import annotations

import ctypes

import numpy as np

from . import constants as C
from .datasets import api
from .memory import AclError, EmulatorError, is_device_address
from .models import nbytes

_KIND_NAMES = {0: "H2H", 1: "H2D", 2: "D2H", 3: "D2D", 4: "DEFAULT"}


class MemoryCalls:
    """acl.rt.* memory calls and acl.util.* pointer calls; mixed into the Emulator."""

    # ------------------------------------------------------------------ memory  [P-0114, P-0124, P-0125, §3.2]
    @api("acl.rt.malloc", "tuple", "ii", 0, ctx=True)
    def malloc(self, size, policy):
        if size <= 0:
            raise AclError(C.ACL_ERROR_RT_PARAM_INVALID, f"malloc size {size}: must be > 0", "bounds")
        if policy < 0:
            raise AclError(C.ACL_ERROR_RT_PARAM_INVALID, f"malloc policy {policy} invalid", "param")
        a = self.mem.malloc(size, self._current_ctx().device)
        self._sync_stats()
        return a.base

    @api("acl.rt.free", "ret", "i", ctx=True)
    def free(self, ptr):
        a = self.mem.find(ptr) if is_device_address(ptr) else None
        if a is None or a.base != ptr:
            raise AclError(C.ACL_ERROR_RT_PARAM_INVALID, f"free(0x{ptr:x}): not the start of a device allocation", "param")
        if not a.live:
            raise AclError(C.ACL_ERROR_RT_PARAM_INVALID, f"free(0x{ptr:x}): double free", "use_after_free")
        self.mem.free(a)
        self._sync_stats()

    @api("acl.rt.malloc_host", "tuple", "i", 0, ctx=True)
    def malloc_host(self, size):
        if size <= 0:
            raise AclError(C.ACL_ERROR_RT_PARAM_INVALID, f"malloc_host size {size}: must be > 0", "bounds")
        return self.mem.malloc_host(size).base

    @api("acl.rt.free_host", "ret", "i", ctx=True)
    def free_host(self, ptr):
        a = None if is_device_address(ptr) else self.mem.find(ptr)
        if a is None or a.base != ptr:
            raise AclError(C.ACL_ERROR_RT_PARAM_INVALID, f"free_host(0x{ptr:x}): not a malloc_host block", "param")
        if not a.live:
            raise AclError(C.ACL_ERROR_RT_PARAM_INVALID, f"free_host(0x{ptr:x}): double free", "use_after_free")
        self.mem.free_host(a)

    def _plan_copy(self, dst, dest_max, src, count, kind, is_async):
        if kind not in _KIND_NAMES:
            raise AclError(C.ACL_ERROR_RT_PARAM_INVALID, f"memcpy kind {kind} is not an aclrtMemcpyKind", "param")
        if count < 0 or dest_max < 0:
            raise AclError(C.ACL_ERROR_RT_PARAM_INVALID, "negative count / dest_max", "bounds")
        if count > dest_max:  # [P-0124]
            raise AclError(C.ACL_ERROR_RT_PARAM_INVALID, f"count {count} > dest_max {dest_max}", "bounds")
        dcls, dalloc = self.mem.check_range(dst, count, "dst")
        scls, salloc = self.mem.check_range(src, count, "src")
        direction = {("host", "host"): 0, ("host", "device"): 1, ("device", "host"): 2,
                     ("device", "device"): 3}[(scls, dcls)]
        if self.rules.strict_kind and kind != C.ACL_MEMCPY_DEFAULT and kind != direction:
            # CANN 8 infers the direction and ignores kind; older CANN / RC mode honour it [P-0124, §3.2.4]
            raise AclError(C.ACL_ERROR_RT_PARAM_INVALID, f"kind {_KIND_NAMES[kind]} but the copy is "
                           f"{_KIND_NAMES[direction]} (src is {scls} memory, dst is {dcls} memory)", "kind")
        if is_async:
            if direction == 0:  # [C-0106 (8.5)]
                raise AclError(C.ACL_ERROR_RT_FEATURE_NOT_SUPPORT, "memcpy_async host to host is not supported", "async")
            if self.rules.strict_async_host:  # [P-0125]
                for side, cls, alloc, addr in (("src", scls, salloc, src), ("dst", dcls, dalloc, dst)):
                    if cls == "host" and alloc is None:
                        raise AclError(C.ACL_ERROR_RT_PARAM_INVALID, f"memcpy_async {side} 0x{addr:x} is host memory "
                                       "not from acl.rt.malloc_host", "async_host")
                    if addr % 64:
                        raise AclError(C.ACL_ERROR_RT_ADDR_UNALIGNED, f"memcpy_async {side} 0x{addr:x} is not "
                                       "64-byte aligned", "async_host")
        name = _KIND_NAMES[direction]
        key = name.lower()
        setattr(self.stats, f"{key}_count", getattr(self.stats, f"{key}_count") + 1)
        setattr(self.stats, f"{key}_bytes", getattr(self.stats, f"{key}_bytes") + count)
        self.stats.copies.append((name, count))

        def do():
            # re-checked at run time: a block freed before the stream ran is a use after free
            self.mem.check_range(dst, count, "dst")
            self.mem.check_range(src, count, "src")
            if count:
                self.mem.write(dst, self.mem.read(src, count))
        return do

    @api("acl.rt.memcpy", "ret", "iiiii", ctx=True)
    def memcpy(self, dst, dest_max, src, count, kind):
        self._plan_copy(dst, dest_max, src, count, kind, False)()

    @api("acl.rt.memcpy_async", "ret", "iiiiii", ctx=True)
    def memcpy_async(self, dst, dest_max, src, count, kind, stream):
        s = self._stream(stream)
        op = self._plan_copy(dst, dest_max, src, count, kind, True)
        self._enqueue(s, op)

    @api("acl.rt.memset", "ret", "iiii", ctx=True)
    def memset(self, ptr, max_size, value, count):
        if count > max_size:
            raise AclError(C.ACL_ERROR_RT_PARAM_INVALID, f"count {count} > max_size {max_size}", "bounds")
        self.mem.check_range(ptr, count, "ptr")
        self.mem.fill(ptr, value, count)

    # ------------------------------------------------------------------ util  (no init needed)
    @api("acl.util.bytes_to_ptr", "bare", "b", 0, init=False)
    def bytes_to_ptr(self, b):
        if isinstance(b, bytearray):
            return ctypes.addressof((ctypes.c_char * len(b)).from_buffer(b)) if b else 0
        return ctypes.cast(ctypes.c_char_p(b), ctypes.c_void_p).value or 0

    @api("acl.util.ptr_to_bytes", "bare", "ii", b"", init=False)
    def ptr_to_bytes(self, ptr, size):
        self._host_only(ptr, "ptr_to_bytes")
        return ctypes.string_at(ptr, size)

    @api("acl.util.numpy_to_ptr", "bare", "o", 0, init=False)
    def numpy_to_ptr(self, arr):
        if not isinstance(arr, np.ndarray):
            raise TypeError("acl.util.numpy_to_ptr(): argument 1 must be numpy.ndarray")
        if not arr.flags.c_contiguous:
            raise EmulatorError("numpy_to_ptr on a non C-contiguous array: a copy through this pointer reads "
                                "the wrong bytes (np.ascontiguousarray first)")
        return arr.ctypes.data

    @api("acl.util.ptr_to_numpy", "bare", "ioi", None, init=False)
    def ptr_to_numpy(self, ptr, shape, npy_type):
        self._host_only(ptr, "ptr_to_numpy")
        dt = next((np.dtype(t) for t in C.NUMPY_TO_ACL if np.dtype(t).num == npy_type), None)
        if dt is None:
            dt = {1: np.dtype(np.int8), 2: np.dtype(np.uint8)}.get(npy_type)
        if dt is None:
            raise TypeError(f"acl.util.ptr_to_numpy(): numpy type number {npy_type} not emulated")
        shape = tuple(int(s) for s in (shape if isinstance(shape, (list, tuple)) else [shape]))
        n = nbytes(shape, dt)
        return np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(ptr)).view(dt).reshape(shape)

    def _host_only(self, ptr, what):
        if is_device_address(ptr):
            raise EmulatorError(f"acl.util.{what}(0x{ptr:x}): that is device memory; the host can't read it "
                                "(copy it with memcpy D2H first)")
        if ptr == 0:
            raise EmulatorError(f"acl.util.{what}: null pointer")
