"""The emulator state and every emulated pyacl call (ascend.md §2 table, §3 rules).

Each call is a method tagged with `@api(qualname, kind, signature, fail)`: the wrapper checks the
argument count/types (TypeError, like the C extension), takes the lock, checks init (100001) and,
where the call needs one, the thread's current context (107002), and turns an `AclError` into the
documented return convention: "ret" -> the code, "tuple" -> (fail, code), "bare" -> fail.
"""

from __future__ import annotations

import ctypes
import os
import threading
import types
from collections import Counter
from dataclasses import dataclass, field, fields

import numpy as np

from . import constants as C
from .datasets import DataBuffer, Dataset, DatasetCalls, TensorDesc, api, check_args
from .memory import AclError, EmulatorError, Memory, is_device_address
from .models import OmModel, nbytes


@dataclass
class Rules:
    """Switches; every rule is on by default (see the package docstring)."""

    strict_kind: bool = True  # memcpy kind must match the address classes (CANN 8 ignores kind) [P-0124]
    strict_async_host: bool = True  # memcpy_async host side from malloc_host, 64-B aligned [P-0125]
    deferred_async: bool = True  # async copies/executes land only at synchronize_stream [P-0125]
    strict_context: bool = True  # thread-local current context, same-context stream/model use [C-0061, P-0157]
    strict_leaks: bool = True  # leaks at reset_device/finalize/destroy_context return EMU_LEAK
    poison: bool = True  # new device/malloc_host memory reads as 0xFF (NaN) instead of 0
    soc_version: str | None = None  # when set, models compiled for another SoC fail execute (507011)
    device_count: int = 1


@dataclass
class Stats:
    h2d_count: int = 0
    h2d_bytes: int = 0
    d2h_count: int = 0
    d2h_bytes: int = 0
    d2d_count: int = 0
    d2d_bytes: int = 0
    h2h_count: int = 0
    h2h_bytes: int = 0
    copies: list = field(default_factory=list)  # (direction "H2D"|"D2H"|"D2D"|"H2H", nbytes) per copy call
    executes: Counter = field(default_factory=Counter)  # om file name -> executes (sync + async)
    datasets_created: int = 0
    data_buffers_created: int = 0
    live_allocations: int = 0  # device allocations alive now
    live_device_bytes: int = 0
    peak_device_bytes: int = 0
    leaks: list = field(default_factory=list)  # one line per leaked resource, at reset_device/finalize
    errors: list = field(default_factory=list)  # every diagnostic, in order


@dataclass(eq=False)
class Context:
    handle: int
    device: int
    default: bool


@dataclass(eq=False)
class Stream:
    handle: int
    ctx: int
    pending: list = field(default_factory=list)  # callables run at synchronize_stream


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


_KIND_NAMES = {0: "H2H", 1: "H2D", 2: "D2H", 3: "D2D", 4: "DEFAULT"}
_HANDLE_BASE = 0x2000_0000_0000_0000


class Emulator(DatasetCalls):
    def __init__(self, **rules):
        unknown = set(rules) - {f.name for f in fields(Rules)}
        if unknown:
            raise TypeError(f"unknown emulator rules {sorted(unknown)}; known: {[f.name for f in fields(Rules)]}")
        self.rules = Rules(**rules)
        self.stats = Stats()
        self.mem = Memory(poison=self.rules.poison)
        self._lock = threading.RLock()
        self._tls = threading.local()
        self._last_ctx: int | None = None
        self._initialized = False
        self._ever_finalized = False
        self._devices: dict[int, int] = {}  # device -> set_device refcount
        self._default_ctx: dict[int, int] = {}
        self._next_handle = 0
        self._next_model = 1
        self._reg = {k: {} for k in ("context", "stream", "desc", "dataset", "buffer", "tensor_desc")}
        self._models: dict[int, LoadedModel] = {}
        self._dead: dict[int, str] = {}  # destroyed handle -> kind (handles are never reused)
        self.last_error = ""
        self.acl = self._build_module()

    # ------------------------------------------------------------------ plumbing
    def reset_stats(self) -> None:
        self.stats = Stats(live_allocations=self.mem.live_device_count, live_device_bytes=self.mem.live_device_bytes,
                           peak_device_bytes=self.mem.live_device_bytes)
        self.mem.peak_device_bytes = self.mem.live_device_bytes

    def _build_module(self) -> types.ModuleType:
        acl = types.ModuleType("acl", "sam3track acl emulator (see sam3track.testing.acl_emulator)")
        subs = {n: types.ModuleType(f"acl.{n}") for n in ("rt", "mdl", "util")}
        for n, m in subs.items():
            setattr(acl, n, m)
        for attr in dir(type(self)):
            meta = getattr(getattr(type(self), attr), "_acl", None)
            if meta is None:
                continue
            qual = meta[0]
            parts = qual.split(".")
            target = acl if len(parts) == 2 else subs[parts[1]]
            setattr(target, parts[-1], self._wrap(getattr(self, attr), *meta))
        acl._emu = self
        return acl

    def _wrap(self, fn, qualname, kind, sig, fail, needs_init, needs_ctx):
        def call(*args, **kwargs):
            if kwargs:
                raise TypeError(f"{qualname}() takes no keyword arguments")
            args = check_args(qualname, sig, args)
            with self._lock:
                try:
                    if needs_init and not self._initialized:
                        raise AclError(C.ACL_ERROR_UNINITIALIZE, "acl.init() has not been called", "lifecycle")
                    if needs_ctx:
                        self._current_ctx()
                    value = fn(*args)
                except AclError as e:
                    self._diag(qualname, e)
                    return e.code if kind == "ret" else (fail, e.code) if kind == "tuple" else fail
            return 0 if kind == "ret" else (value, 0) if kind == "tuple" else value
        call.__name__ = qualname.rsplit(".", 1)[-1]
        call.__qualname__ = qualname
        return call

    def _diag(self, qualname: str, e: AclError) -> None:
        self.last_error = f"{qualname}: [{e.rule}] {e.message} (error {e.code})"
        self.stats.errors.append(self.last_error)

    def _handle(self, kind: str, obj) -> int:
        self._next_handle += 1
        h = _HANDLE_BASE | (list(self._reg).index(kind) << 48) | (self._next_handle << 6)
        self._reg[kind][h] = obj
        return h

    def _get(self, kind: str, h: int, code: int = C.ACL_ERROR_INVALID_PARAM):
        obj = self._reg[kind].get(h)
        if obj is not None:
            return obj
        if self._dead.get(h) == kind:
            raise AclError(code, f"{kind} 0x{h:x} was already destroyed (use after destroy)", "use_after_free")
        other = next((k for k, r in self._reg.items() if h in r), None)
        if other:
            raise AclError(code, f"0x{h:x} is a {other} handle, not a {kind}", "param")
        raise AclError(code, f"0x{h:x} is not a live {kind} handle", "param")

    def _kill(self, kind: str, h: int) -> None:
        del self._reg[kind][h]
        self._dead[h] = kind

    def _current_ctx(self) -> Context:
        # the current context is thread-local [C-0061, ERR 107002]
        h = getattr(self._tls, "ctx", None)
        if h is not None and h in self._reg["context"]:
            return self._reg["context"][h]
        if not self.rules.strict_context and self._last_ctx in self._reg["context"]:
            return self._reg["context"][self._last_ctx]
        raise AclError(C.ACL_ERROR_RT_CONTEXT_NULL, "no current context in this thread: call acl.rt.set_context "
                       "(or set_device) in this thread first", "context")

    def _bind(self, h: int | None) -> None:
        self._tls.ctx = h
        if h is not None:
            self._last_ctx = h

    def _model(self, model_id: int, check_ctx: bool = True) -> LoadedModel:
        m = self._models.get(model_id)
        if m is None:
            raise AclError(C.ACL_ERROR_INVALID_MODEL_ID, f"model id {model_id} is not loaded", "param")
        if check_ctx and self.rules.strict_context and self._current_ctx().handle != m.ctx:
            # load/execute/unload in the same context [P-0157]
            raise AclError(C.ACL_ERROR_RT_MODEL_CONTEXT, f"model {model_id} was loaded in context 0x{m.ctx:x}, "
                           f"the current context is 0x{self._current_ctx().handle:x}", "context")
        return m

    def _stream(self, h: int) -> Stream:
        s = self._get("stream", h, C.ACL_ERROR_INVALID_RESOURCE_HANDLE)
        if self.rules.strict_context and self._current_ctx().handle != s.ctx:
            raise AclError(C.ACL_ERROR_RT_STREAM_CONTEXT, f"stream 0x{h:x} belongs to context 0x{s.ctx:x}, not the "
                           "current one", "context")
        return s

    def _sync_stats(self) -> None:
        self.stats.live_allocations = self.mem.live_device_count
        self.stats.live_device_bytes = self.mem.live_device_bytes
        self.stats.peak_device_bytes = max(self.stats.peak_device_bytes, self.mem.peak_device_bytes)

    # ------------------------------------------------------------------ lifecycle  [ERR, MMD, §3.1]
    @api("acl.init", "ret", "|s", init=False)
    def init(self, config_path=None):
        if self._initialized:
            raise AclError(C.ACL_ERROR_REPEAT_INITIALIZE, "acl.init called twice", "lifecycle")
        self._initialized = True

    @api("acl.finalize", "ret", "", init=False)
    def finalize(self):
        if not self._initialized:
            if self._ever_finalized:
                raise AclError(C.ACL_ERROR_REPEAT_FINALIZE, "acl.finalize called twice", "lifecycle")
            raise AclError(C.ACL_ERROR_UNINITIALIZE, "acl.finalize before acl.init", "lifecycle")
        leaks = []
        for dev in list(self._devices):
            leaks += [f"device {dev} never reset: " + x for x in self._release_device(dev)] or [f"device {dev} never reset"]
        self._initialized = False
        self._ever_finalized = True
        self._report_leaks(leaks, "finalize")

    def _report_leaks(self, leaks: list, where: str) -> None:
        if not leaks:
            return
        self.stats.leaks += [f"{where}: {x}" for x in leaks]
        if self.rules.strict_leaks:
            raise AclError(C.EMU_LEAK, f"{len(leaks)} leaked at {where}: " + "; ".join(leaks[:8])
                           + (" ..." if len(leaks) > 8 else ""), "leaks")

    @api("acl.get_recent_err_msg", "bare", "", "", init=False)
    def get_recent_err_msg(self):
        return self.last_error

    @api("acl.rt.set_device", "ret", "i")
    def set_device(self, dev):
        if not 0 <= dev < self.rules.device_count:
            raise AclError(C.ACL_ERROR_RT_INVALID_DEVICEID, f"device {dev} does not exist "
                           f"({self.rules.device_count} emulated)", "param")
        if dev not in self._devices:
            self._devices[dev] = 0
            self._default_ctx[dev] = self._handle("context", Context(0, dev, True))
            self._reg["context"][self._default_ctx[dev]].handle = self._default_ctx[dev]
        self._devices[dev] += 1
        self._bind(self._default_ctx[dev])  # set_device makes the default context current [C-0061]

    @api("acl.rt.reset_device", "ret", "i")
    def reset_device(self, dev):
        if dev not in self._devices:
            raise AclError(C.ACL_ERROR_RT_INVALID_DEVICEID, f"device {dev} was not set", "param")
        self._devices[dev] -= 1
        if self._devices[dev] > 0:  # set/reset are reference counted [unconfirmed]
            return
        self._report_leaks(self._release_device(dev), f"reset_device({dev})")

    def _release_device(self, dev: int) -> list[str]:
        """Tear down a device; return one line per resource the application left alive."""
        leaks = []
        ctxs = {h for h, c in self._reg["context"].items() if c.device == dev}
        for mid, m in list(self._models.items()):
            if m.ctx in ctxs:
                leaks.append(f"model {mid} ({m.om.name}) not unloaded")
                del self._models[mid]
        for h, s in list(self._reg["stream"].items()):
            if s.ctx in ctxs:
                leaks.append(f"stream 0x{h:x} not destroyed")
                self._kill("stream", h)
        for a in self.mem.live_device():
            if a.device == dev:
                leaks.append(f"device allocation 0x{a.base:x} ({a.size} B) not freed")
                self.mem.free(a)
        for h in ctxs:
            if not self._reg["context"][h].default:
                leaks.append(f"context 0x{h:x} not destroyed")
            self._kill("context", h)
        del self._devices[dev], self._default_ctx[dev]
        if not self._devices:  # host-side objects: reported when the last device goes
            for kind, what in (("dataset", "dataset"), ("buffer", "data buffer"), ("desc", "model desc")):
                leaks += [f"{what} 0x{h:x} not destroyed" for h in self._reg[kind]]
            leaks += [f"tensor desc 0x{h:x} not destroyed" for h, t in self._reg["tensor_desc"].items() if not t.owned]
            leaks += [f"malloc_host block 0x{a.base:x} ({a.size} B) not freed" for a in self.mem.live_host()]
        self._sync_stats()
        return leaks

    @api("acl.rt.get_device", "tuple", "", None)
    def get_device(self):
        return self._current_ctx().device

    @api("acl.rt.create_context", "tuple", "i", 0)
    def create_context(self, dev):
        if dev not in self._devices:
            raise AclError(C.ACL_ERROR_RT_INVALID_DEVICEID, f"device {dev} was not set (call set_device first)", "param")
        h = self._handle("context", Context(0, dev, False))
        self._reg["context"][h].handle = h
        self._bind(h)  # create_context binds to the calling thread [C-0059]
        return h

    @api("acl.rt.destroy_context", "ret", "i")
    def destroy_context(self, h):
        c = self._get("context", h, C.ACL_ERROR_INVALID_RESOURCE_HANDLE)
        if c.default:
            raise AclError(C.ACL_ERROR_RT_PARAM_INVALID, "the default context of set_device can't be destroyed", "context")
        leaks = []
        for mid, m in list(self._models.items()):
            if m.ctx == h:
                leaks.append(f"model {mid} ({m.om.name}) not unloaded")
                del self._models[mid]
        for sh, s in list(self._reg["stream"].items()):
            if s.ctx == h:
                leaks.append(f"stream 0x{sh:x} not destroyed")
                self._kill("stream", sh)
        self._kill("context", h)
        if getattr(self._tls, "ctx", None) == h:
            self._tls.ctx = None
        self._report_leaks(leaks, "destroy_context")

    @api("acl.rt.set_context", "ret", "i")
    def set_context(self, h):
        self._get("context", h, C.ACL_ERROR_INVALID_RESOURCE_HANDLE)
        self._bind(h)

    @api("acl.rt.get_context", "tuple", "", 0)
    def get_context(self):
        h = getattr(self._tls, "ctx", None)
        if h is None or h not in self._reg["context"]:
            raise AclError(C.ACL_ERROR_RT_CONTEXT_NULL, "no current context in this thread", "context")
        return h

    @api("acl.rt.get_run_mode", "tuple", "", -1)
    def get_run_mode(self):
        return C.ACL_HOST  # host run mode only (device/RC mode not emulated)

    # ------------------------------------------------------------------ streams
    @api("acl.rt.create_stream", "tuple", "", 0, ctx=True)
    def create_stream(self):
        h = self._handle("stream", Stream(0, self._current_ctx().handle))
        self._reg["stream"][h].handle = h
        return h

    @api("acl.rt.destroy_stream", "ret", "i", ctx=True)
    def destroy_stream(self, h):
        s = self._stream(h)
        if s.pending:
            raise AclError(C.ACL_ERROR_RT_PARAM_INVALID, f"stream 0x{h:x} has {len(s.pending)} unsynchronized "
                           "task(s): synchronize_stream before destroy_stream", "async")
        self._kill("stream", h)

    @api("acl.rt.synchronize_stream", "ret", "i", ctx=True)
    def synchronize_stream(self, h):
        s = self._stream(h)
        tasks, s.pending = s.pending, []
        first = None
        for t in tasks:  # a failing task fails the sync; the later ones still run [unconfirmed]
            try:
                t()
            except AclError as e:
                first = first or e
        if first is not None:
            raise first

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

    def _enqueue(self, s: Stream, op) -> None:
        if self.rules.deferred_async:
            s.pending.append(op)  # visible only after synchronize_stream [P-0125]
        else:
            op()

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
        return om.outputs[i].name  # "<node>:<index>:<tensor>" [P-0205, MMD]

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

    @api("acl.mdl.get_input_dynamic_gear_count", "tuple", "ii", -1)
    def get_input_dynamic_gear_count(self, h, index):
        om = self._desc(h)
        return len(om.gears) if om.mode == "dynamic_dims" else 0  # batch models: 0 [unconfirmed]

    @api("acl.mdl.get_input_dynamic_dims", "tuple", "iii", None)
    def get_input_dynamic_dims(self, h, index, count):
        om = self._desc(h)
        if om.mode != "dynamic_dims":
            raise AclError(C.ACL_ERROR_MODEL_NOT_DYNAMIC, "not a dynamic_dims model", "gear")
        if count != len(om.gears):
            raise AclError(C.ACL_ERROR_INVALID_PARAM, f"gear count {count} != {len(om.gears)}", "param")
        return [{"name": "", "dimCount": len(om.flat_dims(g)), "dims": om.flat_dims(g)} for g in om.gears]  # [P-0226]

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

    def _select_gear(self, lm: LoadedModel, b: DataBuffer, gear: tuple) -> None:
        # GE writes the gear (one uint64 per dynamic value) into the hidden input's device memory, so a
        # gear stays selected for as long as that buffer keeps its bytes [unconfirmed; GE SetDynamicBatchSize]
        self.mem.write(b.addr, np.asarray(gear, dtype="<i8").view(np.uint8))
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
        self._select_gear(lm, b, (batch,))

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
        self._select_gear(lm, b, gear)

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
            b = self._get("buffer", ins.buffers[om.hidden_index])
            self.mem.check_range(b.addr, om.hidden_size, f"{C.HIDDEN_INPUT} buffer")
            gear = tuple(int(v) for v in self.mem.read(b.addr, om.hidden_size).view("<i8"))
            if gear not in om.gears:  # set_dynamic_* must have selected a gear on this dataset [§3.4.1]
                raise AclError(C.ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID, f"no gear selected: {C.HIDDEN_INPUT} holds "
                               f"{list(gear)}; call set_dynamic_batch_size / set_input_dynamic_dims on this input "
                               "dataset before execute", "gear")
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
            code = C.ACL_ERROR_RT_MODEL_EXECUTE if om.mode == "shape_range" else C.ACL_ERROR_MODEL_OUTPUT_NOT_MATCH
            b = self._io_buffer(outs, i, r.nbytes, f"output {i} ({s.name})", code)
            self.mem.write(b.addr, r)
            if om.mode == "shape_range":  # output shapes through get_dataset_tensor_desc [§3.5.3]
                old = outs.tensor_descs.get(i)
                if old in self._reg["tensor_desc"] and self._reg["tensor_desc"][old].owned:
                    self._kill("tensor_desc", old)
                outs.tensor_descs[i] = self._handle("tensor_desc", TensorDesc(s.acl_dtype, list(r.shape),
                                                                              C.ACL_FORMAT_ND, owned=True))

    def _io_buffer(self, ds: Dataset, i: int, need: int, what: str, code: int) -> DataBuffer:
        b = self._get("buffer", ds.buffers[i])
        if b.addr == 0 or not is_device_address(b.addr):
            raise AclError(C.ACL_ERROR_RT_INVALID_MEMORY_TYPE, f"{what}: buffer address 0x{b.addr:x} is not device "
                           "memory", "dataset")
        if b.size < need:  # [§3.3.3]
            raise AclError(code, f"{what}: buffer holds {b.size} B, this run needs {need} B", "dataset")
        self.mem.check_range(b.addr, b.size, what)
        return b
