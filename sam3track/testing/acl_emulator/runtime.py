"""The emulator state and the emulated pyacl calls of the runtime: lifecycle, contexts, streams,
memory and util (ascend.md §2 table, §3 rules). Model calls are in model_calls.py and dataset calls
in datasets.py, both mixed into `Emulator`.

Each call is a method tagged with `@api(qualname, kind, signature, fail)`: the wrapper checks the
argument count/types (TypeError, like the C extension), takes the lock, checks init (100001) and,
where the call needs one, the thread's current context (107002), and turns an `AclError` into the
documented return convention: "ret" -> the code, "tuple" -> (fail, code), "bare" -> fail.
"""

from __future__ import annotations

import ctypes
import threading
import types
from collections import Counter
from dataclasses import dataclass, field, fields

import numpy as np

from . import constants as C
from .datasets import DatasetCalls, api, check_args
from .model_calls import LoadedModel, ModelCalls
from .memory import AclError, EmulatorError, Memory, is_device_address
from .models import nbytes


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


_KIND_NAMES = {0: "H2H", 1: "H2D", 2: "D2H", 3: "D2D", 4: "DEFAULT"}
_HANDLE_BASE = 0x2000_0000_0000_0000


class Emulator(ModelCalls, DatasetCalls):
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
