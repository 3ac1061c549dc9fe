"""The emulator state and the emulated pyacl calls of the runtime: lifecycle, contexts and streams
(ascend.md §2 table, §3 rules). Model calls are in model_calls.py, dataset calls in datasets.py and
memory and util calls in memory_calls.py, all mixed into `Emulator`.

Each call is a method tagged with `@api(qualname, kind, signature, fail)`: the wrapper checks the
argument count/types (TypeError, like the C extension), takes the lock, checks init (100001) and,
where the call needs one, the thread's current context (107002), and turns an `AclError` into the
documented return convention: "ret" -> the code, "tuple" -> (fail, code), "bare" -> fail.
"""

from __future__ import annotations

import threading
import types
from collections import Counter
from dataclasses import dataclass, field, fields

from . import constants as C
from .datasets import DatasetCalls, api, check_args
from .memory import AclError, Memory
from .memory_calls import MemoryCalls
from .model_calls import LoadedModel, ModelCalls


@dataclass
class Rules:
    """Switches; every rule is on by default (see docs/ascend.md, "Using the emulator")."""

    strict_kind: bool = True  # memcpy kind must match the address classes (CANN 8 ignores kind) [P-0124]
    strict_async_host: bool = True  # memcpy_async host side from malloc_host, 64-B aligned [P-0125]
    deferred_async: bool = True  # async copies/executes land only at synchronize_stream [P-0125]
    strict_context: bool = True  # thread-local current context, same-context stream/model use [C-0061, P-0157]
    strict_leaks: bool = True  # leaks at reset_device/finalize/destroy_context return EMU_LEAK
    poison: bool = True  # new device/malloc_host memory reads as 0xFF (NaN) instead of 0
    soc_version: str | None = None  # when set, models compiled for another SoC fail execute (507011)
    # False: get_output_name_by_index gives "node:index" without the tensor name, as some descs do
    # (ascend.md audit, risk 2), so callers must bind outputs by position
    output_tensor_names: bool = True
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


_HANDLE_BASE = 0x2000_0000_0000_0000


class Emulator(ModelCalls, DatasetCalls, MemoryCalls):
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

    def _enqueue(self, s: Stream, op) -> None:
        if self.rules.deferred_async:
            s.pending.append(op)  # visible only after synchronize_stream [P-0125]
        else:
            op()
