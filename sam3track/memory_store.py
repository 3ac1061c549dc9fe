"""A budgeted host store for memory-bank rows that left the device: host memory up to a byte cap, then
files in a private temporary folder up to a second cap, removed on close. Values come back bit for bit
(bf16-exact float32 rows are kept as their upper 16 bits). Design and measurements: docs/corrections.md.
"""

from __future__ import annotations

import shutil
import tempfile
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Hashable

import numpy as np


@dataclass
class _Item:
    shape: tuple[int, ...]
    dtype: np.dtype  # the value's own dtype (float32 comes back as float32)
    packed: bool  # float32 kept as its upper 16 bits (the value is exactly a bfloat16)
    nbytes: int  # bytes kept
    data: np.ndarray | None = None  # in host memory
    path: Path | None = None  # on disk


def _pack(value: np.ndarray) -> tuple[np.ndarray, bool]:
    """float32 values that are exact bfloat16s -> their upper halves (uint16); anything else as it is."""
    value = np.ascontiguousarray(value)
    if value.dtype == np.float32:
        bits = value.view(np.uint32)
        if not (bits & 0xFFFF).any():
            return (bits >> 16).astype(np.uint16), True
    return value, False


def _unpack(data: np.ndarray, item: _Item) -> np.ndarray:
    if item.packed:
        return (data.astype(np.uint32) << 16).view(np.float32).reshape(item.shape)
    return data.view(item.dtype).reshape(item.shape)


class HostStore:
    """Arrays by key, oldest first out: past `ram_bytes` the oldest in memory move to disk; past
    `disk_bytes` the oldest on disk are dropped (`dropped` counts them). Both 0: nothing is kept."""

    def __init__(self, ram_bytes: int, disk_bytes: int):
        self.ram_cap, self.disk_cap = int(ram_bytes), int(disk_bytes)
        self.ram_bytes = self.disk_bytes = 0
        self.dropped = 0
        self._ram: OrderedDict[Hashable, _Item] = OrderedDict()
        self._disk: OrderedDict[Hashable, _Item] = OrderedDict()
        self._folder: Path | None = None
        self._finalizer = None
        self._count = 0

    @property
    def enabled(self) -> bool:
        return self.ram_cap > 0 or self.disk_cap > 0

    def __contains__(self, key) -> bool:
        return key in self._ram or key in self._disk

    def __len__(self) -> int:
        return len(self._ram) + len(self._disk)

    def put(self, key, value: np.ndarray) -> None:
        self.discard(key)
        data, packed = _pack(value)
        item = _Item(tuple(value.shape), np.dtype(value.dtype), packed, int(data.nbytes), data=data)
        self._ram[key] = item
        self.ram_bytes += item.nbytes
        while self.ram_bytes > self.ram_cap and self._ram:
            self._to_disk(*self._ram.popitem(last=False))

    def get(self, key) -> np.ndarray | None:
        item = self._ram.get(key) or self._disk.get(key)
        if item is None:
            return None
        if item.data is not None:
            value = _unpack(item.data, item)
            return value if item.packed else value.copy()  # packed: _unpack already made a new array
        return _unpack(np.fromfile(item.path, dtype=np.uint16 if item.packed else item.dtype), item)

    def discard(self, key) -> None:
        item = self._ram.pop(key, None)
        if item is not None:
            self.ram_bytes -= item.nbytes
            return
        item = self._disk.pop(key, None)
        if item is not None:
            self.disk_bytes -= item.nbytes
            item.path.unlink(missing_ok=True)

    def discard_where(self, predicate) -> None:
        for key in [k for k in (*self._ram, *self._disk) if predicate(k)]:
            self.discard(key)

    def clear(self) -> None:
        self.discard_where(lambda _: True)

    def close(self) -> None:
        """Forget everything and remove the folder (also done when the store is garbage-collected)."""
        self._ram.clear()
        self._disk.clear()
        self.ram_bytes = self.disk_bytes = 0
        if self._finalizer is not None:
            self._finalizer()
        self._folder = self._finalizer = None

    def _to_disk(self, key, item: _Item) -> None:
        self.ram_bytes -= item.nbytes
        if item.nbytes > self.disk_cap:
            self.dropped += 1
            return
        while self.disk_bytes + item.nbytes > self.disk_cap and self._disk:
            _, old = self._disk.popitem(last=False)
            self.disk_bytes -= old.nbytes
            old.path.unlink(missing_ok=True)
            self.dropped += 1
        if self._folder is None:
            self._folder = Path(tempfile.mkdtemp(prefix="sam3track-memory-"))
            self._finalizer = weakref.finalize(self, shutil.rmtree, str(self._folder), True)
        self._count += 1
        item.path = self._folder / f"{self._count}.bin"
        item.data.tofile(item.path)
        item.data = None
        self._disk[key] = item
        self.disk_bytes += item.nbytes
