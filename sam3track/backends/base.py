"""The narrow interface every backend implements: graphs in, named device tensors in and out.

The predictor never sees a backend's own types: it holds `DeviceTensor` handles, copies to the host
only through `to_host`, and every host <-> device copy is counted in `transfers`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import BackendError, BundleError, Sam3TrackError


@dataclass
class DeviceTensor:
    """An opaque handle to memory on the backend's device (`handle` belongs to the backend)."""

    shape: tuple[int, ...]
    dtype: np.dtype
    handle: Any = field(repr=False)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


@dataclass
class TransferStats:
    host_to_device: int = 0
    host_to_device_bytes: int = 0
    device_to_host: int = 0
    device_to_host_bytes: int = 0

    def snapshot(self) -> "TransferStats":
        return TransferStats(**vars(self))

    def since(self, earlier: "TransferStats") -> "TransferStats":
        return TransferStats(**{k: getattr(self, k) - getattr(earlier, k) for k in vars(self)})


class Graph(ABC):
    """A loaded graph; run it through its backend."""

    name: str
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    shapes: dict[str, tuple[int | None, ...]]  # tensor name -> fixed sizes (None where the axis is dynamic)
    # axis name -> the sizes this graph runs at, ascending (an OM model's gears); an axis not listed
    # runs at any size
    sizes: dict[str, tuple[int, ...]]


def check_gears(gears):
    """The gears= option of a backend that pads calls: {} (None), "compiled" (an OM bundle's gears), or
    {axis: ascending sizes}; anything else is one clear error."""
    if gears is None:
        return {}
    if gears == "compiled":
        return gears
    if not isinstance(gears, dict) or not all(
            isinstance(axis, str) and isinstance(sizes, (list, tuple)) and sizes
            and all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in sizes)
            for axis, sizes in gears.items()):
        raise Sam3TrackError(f"gears must be None, 'compiled' or {{axis: [sizes >= 1]}}, e.g. "
                             f"{{'objects': [1, 2, 4, 8]}}; not {gears!r}")
    return {axis: tuple(sorted(set(sizes))) for axis, sizes in gears.items()}


def graph_gears(gears, name: str, compiled: dict | None) -> dict[str, tuple[int, ...]]:
    """The sizes graph `name` runs at, given a checked gears= option and its OM compile entry (None for a
    plain bundle): "compiled" takes the OM bundle's gears; otherwise the option's, with the OM graph's
    fixed axes (its ATC-ready graph is static there)."""
    if gears == "compiled":
        if compiled is None:
            raise BundleError(f"gears='compiled' needs an OM bundle (python -m om.convert); graph {name} of "
                              "this bundle has no compiled gears")
        return {axis: tuple(sizes) for axis, sizes in compiled["axes"].items()}
    out = dict(gears)
    if compiled is not None:
        out.update({axis: tuple(sizes) for axis, sizes in compiled["axes"].items() if len(sizes) == 1})
    return out


class Backend(ABC):
    name: str

    def __init__(self) -> None:
        self.transfers = TransferStats()
        self.calls: Counter[str] = Counter()  # graph name -> runs, for tests and the notebooks
        self.seconds: Counter[str] = Counter()  # graph name -> wall time spent in run()
        # (direction, shape) of recent host <-> device copies: shows what crossed, not just how much
        self.transfer_log: deque[tuple[str, tuple[int, ...]]] = deque(maxlen=4096)

    def _count(self, direction: str, shape: tuple[int, ...], nbytes: int) -> None:
        if direction == "to_device":
            self.transfers.host_to_device += 1
            self.transfers.host_to_device_bytes += nbytes
        else:
            self.transfers.device_to_host += 1
            self.transfers.device_to_host_bytes += nbytes
        self.transfer_log.append((direction, tuple(shape)))

    @abstractmethod
    def load(self, name: str, path: str, compiled: dict | None = None) -> Graph:
        """Load graph `name`. `compiled` is its entry in an OM bundle's om_manifest.json (plus "root",
        the bundle directory), None for a plain bundle."""

    def plan(self, graph: Graph, axis: str, n: int) -> int:
        """The size a call for `n` items runs at on `axis`: the smallest compiled size >= n, or the
        largest when n is more than that (the caller then splits the work into chunks of it). This is
        the one place call sizes are decided; an axis without compiled sizes runs at n."""
        sizes = graph.sizes.get(axis)
        if not sizes:
            return n
        return next((s for s in sizes if s >= n), sizes[-1])

    @abstractmethod
    def upload(self, array: np.ndarray) -> DeviceTensor:
        """Copy a host array to a new device tensor."""

    @abstractmethod
    def empty(self, shape: tuple[int, ...], dtype) -> DeviceTensor:
        """Allocate an uninitialised device tensor (scratch outputs a graph fills completely)."""

    @abstractmethod
    def zeros(self, shape: tuple[int, ...], dtype) -> DeviceTensor:
        """Allocate a zero-filled device tensor (pools: unwritten rows must never hold garbage)."""

    @abstractmethod
    def free(self, tensor: DeviceTensor) -> None:
        """Release a tensor's memory now; any later use of it, or of a view of it, is an error."""

    @property
    @abstractmethod
    def live_allocations(self) -> int:
        """Device allocations not yet released (tests count them to find leaks)."""

    @abstractmethod
    def rows(self, tensor: DeviceTensor, start: int, count: int) -> DeviceTensor:
        """A view of rows [start, start + count) of a contiguous tensor, sharing its memory."""

    def reshape(self, tensor: DeviceTensor, shape: tuple[int, ...]) -> DeviceTensor:
        """The same contiguous memory seen with another shape of equal size (no copy)."""
        if int(np.prod(shape, dtype=np.int64)) != int(np.prod(tensor.shape, dtype=np.int64)):
            raise BackendError(f"internal error: cannot view {tensor.shape} as {shape}; please report this")
        return DeviceTensor(tuple(shape), tensor.dtype, tensor.handle)

    @abstractmethod
    def copy(self, src: DeviceTensor, dst: DeviceTensor) -> None:
        """Device-to-device copy between tensors (or views) of equal shape."""

    @abstractmethod
    def to_host(self, tensor: DeviceTensor, rows: np.ndarray | None = None) -> np.ndarray:
        """Copy a tensor, or only the given rows of it (one copy for all of them), to a new host array
        the caller owns: it never aliases device or backend memory."""

    @abstractmethod
    def run(self, graph: Graph, inputs: dict[str, DeviceTensor | np.ndarray],
            outputs: dict[str, DeviceTensor] | None = None) -> dict[str, DeviceTensor]:
        """Run `graph` with every input at a planned size (`plan`). Inputs are device tensors, or host
        arrays the backend copies in for this call (into buffers it may keep between calls). Outputs
        named in `outputs` are written into those tensors (views of pools, say); the others come
        back as device tensors valid until the next run of the same graph (a backend may reuse their
        memory; `free` on one is allowed)."""

    @abstractmethod
    def close(self) -> None:
        """Release every graph and buffer; idempotent. Every later call is a BackendClosedError."""
