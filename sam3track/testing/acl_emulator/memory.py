"""Fake device memory and the host/device address classes (ascend.md §3.2, §6.3).

Device addresses live in a reserved, non-canonical range (a host dereference would fault, as a real
device pointer does in host run mode) and are backed by numpy arrays filled with 0xFF, which reads as
NaN for float32/float16 and -1 for signed ints, so forgotten copies surface. Addresses are never
reused: a freed block leaves a tombstone, so use-after-free and double free are told apart from
plain garbage. Host pointers are any other int; only `malloc_host` blocks are tracked (bounds, use
after free, 64-byte alignment for async copies); other host memory (numpy arrays, bytes) is accessed
through ctypes unchecked.
"""

from __future__ import annotations

import bisect
import ctypes
from dataclasses import dataclass, field

import numpy as np

from . import constants as C

DEVICE_BASE = 0x1E00_0000_0000_0000
DEVICE_SPAN = 1 << 56
POISON = 0xFF
HOST_QUARANTINE_BYTES = 64 << 20  # freed malloc_host blocks kept mapped (no address reuse) up to this


class AclError(Exception):
    """An acl call failed: `code` is what the call returns, `rule` names the rule broken."""

    def __init__(self, code: int, message: str, rule: str = "param"):
        super().__init__(message)
        self.code = code
        self.message = message
        self.rule = rule


class EmulatorError(RuntimeError):
    """A misuse the real runtime would not report but crash on (e.g. reading device memory on the host)."""


def align_up(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def is_device_address(addr: int) -> bool:
    return DEVICE_BASE <= addr < DEVICE_BASE + DEVICE_SPAN


@dataclass(eq=False)
class Allocation:
    base: int
    size: int  # the requested size: bounds are enforced on it, not on the padded capacity [P-0114]
    kind: str  # "device" | "host"
    device: int
    data: np.ndarray | None = field(repr=False, default=None)  # uint8 backing (None once freed, device)
    live: bool = True

    @property
    def end(self) -> int:
        return self.base + self.size


class Memory:
    def __init__(self, poison: bool = True):
        self.poison = poison
        self._dev: list[Allocation] = []  # ascending bases (addresses only grow)
        self._dev_bases: list[int] = []
        self._next = DEVICE_BASE + 0x1000
        self._host: dict[int, Allocation] = {}  # malloc_host blocks, live and quarantined
        self._host_bases: list[int] = []
        self._quarantine: list[Allocation] = []
        self.live_device_bytes = 0
        self.live_device_count = 0
        self.peak_device_bytes = 0

    # ---- device
    def malloc(self, size: int, device: int) -> Allocation:
        # capacity ALIGN_UP(size,32)+32, start 64-byte aligned, uninitialised [P-0114, C-0095]
        cap = align_up(size, 32) + 32
        base = align_up(self._next, 64)
        self._next = base + cap
        fill = POISON if self.poison else 0
        a = Allocation(base, size, "device", device, np.full(cap, fill, dtype=np.uint8))
        self._dev.append(a)
        self._dev_bases.append(base)
        self.live_device_bytes += size
        self.live_device_count += 1
        self.peak_device_bytes = max(self.peak_device_bytes, self.live_device_bytes)
        return a

    def free(self, a: Allocation) -> None:
        a.live = False
        a.data = None
        self.live_device_bytes -= a.size
        self.live_device_count -= 1

    def live_device(self) -> list[Allocation]:
        return [a for a in self._dev if a.live]

    # ---- host (malloc_host): real host memory, so host code may touch it through its pointer
    def malloc_host(self, size: int) -> Allocation:
        raw = np.full(size + 64, POISON if self.poison else 0, dtype=np.uint8)
        off = (-raw.ctypes.data) % 64
        a = Allocation(raw.ctypes.data + off, size, "host", -1, raw[off:off + size])
        a._raw = raw  # type: ignore[attr-defined]  # keeps the block mapped
        self._forget_host_overlaps(a)
        self._host[a.base] = a
        bisect.insort(self._host_bases, a.base)
        return a

    def free_host(self, a: Allocation) -> None:
        a.live = False
        self._quarantine.append(a)
        while sum(q.size for q in self._quarantine) > HOST_QUARANTINE_BYTES and len(self._quarantine) > 1:
            old = self._quarantine.pop(0)
            self._drop_host(old)

    def live_host(self) -> list[Allocation]:
        return [a for a in self._host.values() if a.live]

    def _drop_host(self, a: Allocation) -> None:
        if self._host.get(a.base) is a:
            del self._host[a.base]
            self._host_bases.remove(a.base)

    def _forget_host_overlaps(self, new: Allocation) -> None:
        for a in [a for a in self._host.values() if a.base < new.end and new.base < a.end]:
            self._drop_host(a)

    # ---- lookup
    def find(self, addr: int) -> Allocation | None:
        """The allocation (live or freed) whose [base, base+size] holds addr, device or malloc_host."""
        if is_device_address(addr):
            bases, blocks = self._dev_bases, self._dev
            i = bisect.bisect_right(bases, addr) - 1
            a = blocks[i] if i >= 0 else None
        else:
            i = bisect.bisect_right(self._host_bases, addr) - 1
            a = self._host[self._host_bases[i]] if i >= 0 else None
        if a is not None and a.base <= addr <= a.end:
            return a
        return None

    def check_range(self, addr: int, count: int, what: str, *, bounds: bool = True) -> tuple[str, Allocation | None]:
        """Classify addr ('device' | 'host') and check [addr, addr+count) lies in one live block."""
        if addr == 0:
            raise AclError(C.ACL_ERROR_RT_PARAM_INVALID, f"{what} is a null pointer", "bounds")
        a = self.find(addr)
        if is_device_address(addr):
            if a is None:
                raise AclError(C.ACL_ERROR_RT_PARAM_INVALID,
                               f"{what} 0x{addr:x} is not inside any device allocation", "bounds")
        if a is None:
            return "host", None  # untracked host memory (numpy, bytes): cannot be checked
        if not a.live:
            kind = "device" if a.kind == "device" else "malloc_host"
            raise AclError(C.ACL_ERROR_RT_PARAM_INVALID,
                           f"{what} 0x{addr:x} points into freed {kind} block 0x{a.base:x} (use after free)",
                           "use_after_free")
        if bounds and addr + count > a.end:
            raise AclError(C.ACL_ERROR_RT_PARAM_INVALID,
                           f"{what} [0x{addr:x}, +{count}) runs past the end of its {a.size}-byte block "
                           f"0x{a.base:x} (offset {addr - a.base})", "bounds")
        return a.kind, a

    # ---- raw access (no checks: callers checked)
    def read(self, addr: int, count: int) -> np.ndarray:
        a = self.find(addr) if is_device_address(addr) else None
        if a is not None:
            off = addr - a.base
            return a.data[off:off + count].copy()
        if is_device_address(addr):
            raise EmulatorError(f"read of unmapped device address 0x{addr:x}")
        return np.frombuffer(ctypes.string_at(addr, count), dtype=np.uint8).copy()

    def write(self, addr: int, data: np.ndarray | bytes) -> None:
        buf = np.frombuffer(bytes(data), dtype=np.uint8) if not isinstance(data, np.ndarray) else data.view(np.uint8).reshape(-1)
        if is_device_address(addr):
            a = self.find(addr)
            if a is None or a.data is None:
                raise EmulatorError(f"write to unmapped device address 0x{addr:x}")
            off = addr - a.base
            a.data[off:off + buf.size] = buf
        else:
            ctypes.memmove(addr, np.ascontiguousarray(buf).ctypes.data, buf.size)

    def fill(self, addr: int, value: int, count: int) -> None:
        if is_device_address(addr):
            a = self.find(addr)
            off = addr - a.base
            a.data[off:off + count] = value & 0xFF
        else:
            ctypes.memset(addr, value & 0xFF, count)
