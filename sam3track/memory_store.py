"""A budgeted host store for memory-bank rows that left the device, keyed by (kind, object id, frame):
host memory up to a byte cap, then one unnamed spill file up to a second cap (gone when closed, and
when the process dies). Values come back bit for bit (bf16-exact float32 rows are kept as their upper
16 bits). Its own bookkeeping is a few bytes per frame and object. Design: docs/corrections.md.
"""

from __future__ import annotations

import os
import tempfile
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

NONE, IN_RAM, ON_DISK = 0, 1, 2
Key = tuple  # (kind, obj_id, frame): kind is a short string ("m", "p"), frame a whole number >= 0


@dataclass(frozen=True)
class _Layout:
    shape: tuple[int, ...]
    dtype: np.dtype  # the value's own dtype (float32 comes back as float32)
    packed: bool  # float32 kept as its upper 16 bits (the value is exactly a bfloat16)
    nbytes: int  # bytes kept

    @property
    def kept_dtype(self) -> np.dtype:
        return np.dtype(np.uint16) if self.packed else self.dtype


@dataclass
class _Track:
    """One (kind, object)'s entries, indexed by frame: where each is, its layout, its file offset and its
    put order (the oldest leave first). Arrays, not objects per entry, so a long clip costs 18 bytes a
    frame here whatever the store holds."""
    where: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int8))
    layout: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int8))
    offset: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    seq: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    def fit(self, frame: int) -> None:
        if frame >= len(self.where):
            size = max(64, 2 * len(self.where), frame + 1)
            for name in ("where", "layout", "offset", "seq"):
                old = getattr(self, name)
                new = np.zeros(size, old.dtype)
                new[: len(old)] = old
                setattr(self, name, new)

    def state(self, frame: int) -> int:
        return int(self.where[frame]) if 0 <= frame < len(self.where) else NONE


def _pack(value: np.ndarray) -> tuple[np.ndarray, bool]:
    """float32 values that are exact bfloat16s -> their upper halves (uint16); anything else as it is."""
    value = np.ascontiguousarray(value)
    if value.dtype == np.float32:
        bits = value.view(np.uint32)
        if not (bits & 0xFFFF).any():
            return (bits >> 16).astype(np.uint16), True
    return value, False


def _unpack(kept: np.ndarray, layout: _Layout) -> np.ndarray:
    """A new array with the value `kept` holds."""
    if layout.packed:
        return (kept.astype(np.uint32) << 16).view(np.float32).reshape(layout.shape)
    return kept.view(layout.dtype).reshape(layout.shape).copy()


class HostStore:
    """Rows by (kind, object id, frame), oldest first out: past `ram_bytes` the oldest in memory move to
    the spill file; past `disk_bytes` the oldest there are dropped (`dropped` counts them). Both 0:
    nothing is kept."""

    def __init__(self, ram_bytes: int, disk_bytes: int):
        self.ram_cap, self.disk_cap = int(ram_bytes), int(disk_bytes)
        self.ram_bytes = self.disk_bytes = 0  # bytes of the values kept (the spill file may hold holes too)
        self.dropped = 0
        self._tracks: dict[tuple, _Track] = {}
        self._ram: OrderedDict[Key, np.ndarray] = OrderedDict()  # put order
        self._layouts: list[_Layout] = []
        self._layout_ids: dict[_Layout, int] = {}
        self._file = None  # an unnamed temporary file, opened at the first spill
        self._end = 0  # the spill file's length
        self._holes: dict[int, list[int]] = {}  # size -> offsets freed in the file, reused by rows that size
        self._seq = self._count = 0

    @property
    def enabled(self) -> bool:
        return self.ram_cap > 0 or self.disk_cap > 0

    def __contains__(self, key: Key) -> bool:
        track = self._tracks.get(key[:2])
        return track is not None and track.state(key[2]) != NONE

    def __len__(self) -> int:
        return self._count

    def count(self, kind: str) -> int:
        """Entries of one kind, wherever they are."""
        return sum(int(np.count_nonzero(t.where)) for k, t in self._tracks.items() if k[0] == kind)

    def put(self, key: Key, value: np.ndarray) -> None:
        if not self.enabled:
            return
        self.discard(key)
        kept, packed = _pack(value)
        layout = _Layout(tuple(value.shape), np.dtype(value.dtype), packed, int(kept.nbytes))
        track = self._tracks.setdefault(key[:2], _Track())
        frame = int(key[2])
        track.fit(frame)
        self._seq += 1
        track.where[frame], track.layout[frame], track.seq[frame] = IN_RAM, self._layout_id(layout), self._seq
        self._ram[key] = kept
        self.ram_bytes += layout.nbytes
        self._count += 1
        while self.ram_bytes > self.ram_cap and self._ram:
            self._to_disk(*self._ram.popitem(last=False))

    def get(self, key: Key) -> np.ndarray | None:
        track, frame = self._tracks.get(key[:2]), int(key[2])
        state = track.state(frame) if track is not None else NONE
        if state == NONE:
            return None
        layout = self._layouts[track.layout[frame]]
        if state == IN_RAM:
            return _unpack(self._ram[key], layout)
        raw = os.pread(self._file.fileno(), layout.nbytes, int(track.offset[frame]))
        return _unpack(np.frombuffer(raw, layout.kept_dtype), layout)

    def discard(self, key: Key) -> None:
        track, frame = self._tracks.get(key[:2]), int(key[2])
        if track is not None and track.state(frame) != NONE:
            self._forget(key, track, frame)

    def discard_object(self, obj_id: int) -> None:
        """Everything kept of one object."""
        for tkey in [k for k in self._tracks if k[1] == obj_id]:
            track = self._tracks[tkey]
            for frame in np.flatnonzero(track.where):
                self._forget((*tkey, int(frame)), track, int(frame))
            del self._tracks[tkey]

    def clear(self) -> None:
        self._tracks.clear()
        self._ram.clear()
        self._holes.clear()
        self.ram_bytes = self.disk_bytes = self._count = self._end = 0
        if self._file is not None:
            self._file.truncate(0)

    def close(self) -> None:
        """Forget everything and close the spill file (the system removes it: it never had a name that
        outlives it)."""
        self.clear()
        if self._file is not None:
            self._file.close()
            self._file = None

    def _layout_id(self, layout: _Layout) -> int:
        found = self._layout_ids.get(layout)
        if found is None:
            found = self._layout_ids[layout] = len(self._layouts)
            self._layouts.append(layout)
        return found

    def _forget(self, key: Key, track: _Track, frame: int) -> None:
        if track.where[frame] == IN_RAM:
            self.ram_bytes -= self._ram.pop(key).nbytes
        else:
            nbytes = self._layouts[track.layout[frame]].nbytes
            self._holes.setdefault(nbytes, []).append(int(track.offset[frame]))
            self.disk_bytes -= nbytes
        track.where[frame] = NONE
        self._count -= 1

    def _to_disk(self, key: Key, kept: np.ndarray) -> None:
        """Move a row that left the RAM share to the spill file, making room there by dropping the oldest."""
        self.ram_bytes -= kept.nbytes
        track, frame = self._tracks[key[:2]], int(key[2])
        track.where[frame] = NONE  # until written
        self._count -= 1
        if kept.nbytes > self.disk_cap:
            self.dropped += 1
            return
        while self.disk_bytes + kept.nbytes > self.disk_cap:
            self._drop_oldest_on_disk()
        offset = self._allocate(kept.nbytes)
        os.pwrite(self._file.fileno(), memoryview(kept).cast("B"), offset)
        track.where[frame], track.offset[frame] = ON_DISK, offset
        self.disk_bytes += kept.nbytes
        self._count += 1

    def _drop_oldest_on_disk(self) -> None:
        oldest = None  # (put order, track key, frame)
        for tkey, track in self._tracks.items():
            on_disk = np.flatnonzero(track.where == ON_DISK)
            if len(on_disk):
                frame = int(on_disk[np.argmin(track.seq[on_disk])])
                if oldest is None or track.seq[frame] < oldest[0]:
                    oldest = (track.seq[frame], tkey, frame)
        _, tkey, frame = oldest
        self._forget((*tkey, frame), self._tracks[tkey], frame)
        self.dropped += 1

    def _allocate(self, nbytes: int) -> int:
        holes = self._holes.get(nbytes)
        if holes:
            return holes.pop()
        if self._file is None:
            self._file = tempfile.TemporaryFile(prefix="sam3track-memory-")
        offset, self._end = self._end, self._end + nbytes
        return offset
