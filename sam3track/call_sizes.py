"""The sizes graph calls run at: each call's item count planned by the backend (`Backend.plan`).

A static-shape backend (Ascend OM) only runs the sizes compiled into a model, so a call for 3
objects runs at the gear 4 with one padding row, and a call for 40 objects on a model compiled up
to 16 runs as chunks of 16, 16 and 8. Padding rows repeat the first real row: they compute finite
values that are dropped, and no graph ever sees an all-padding row it was not exported for.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .backends import Backend, Graph
from .errors import CapacityError


@dataclass(frozen=True)
class Chunk:
    """Items [start, start + count) of a call, run at `size` (>= count; the rest is padding)."""

    start: int
    count: int
    size: int

    @property
    def items(self) -> slice:
        return slice(self.start, self.start + self.count)


# The gears a static-shape target compiles by default (om.convert, and ONNX Runtime on CANN, which
# compiles a graph again for every new input shape): powers of two up to 16 objects, 8 prompts.
# points (interactive_decoder, the points of one object's prompt; a box is 2): every count from 1 to 8,
# then 10, 12, 16. The runtime never pads points (a fake point changes the mask), so a call with a
# count not listed here is refused (CapacityError) on a backend with these gears.
DEFAULT_GEARS = {"objects": (1, 2, 4, 8, 16), "prompts": (1, 2, 4, 8), "images": (1,),
                 "points": (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16)}
# Per-graph defaults where one graph needs other gears than DEFAULT_GEARS (om.convert; ONNX Runtime's
# gears are one set for every graph); none at present. Sizes a graph is compiled at whatever --gears
# says are om.plan.FIXED_GEARS (interactive_decoder: one object per call).
GRAPH_GEARS: dict[str, dict[str, tuple[int, ...]]] = {}


def default_gears(config) -> dict[str, tuple[int, ...]]:
    """DEFAULT_GEARS with the bounded axes fixed at the config's capacities (config.capacities())."""
    return {**DEFAULT_GEARS, **{axis: (size,) for axis, size in config.capacities().items()}}


def static_gears(config) -> dict[str, tuple[int, ...]]:
    """The sizes OpenVINO's shapes="static" pads calls to, so that it compiles a few shapes per graph
    rather than one per object count and memory depth: objects and prompts as DEFAULT_GEARS (more run as
    chunks); memories and pointers per object in powers of two, with the steady state of an object
    tracked from one conditioning frame (num_maskmem memories, max_object_pointers_in_encoder pointers)
    and the capacities exact. Padding is masked (memory_valid, pointer_valid), so results are unchanged.
    Points (never padded) and the pools (they grow) run at their own sizes."""
    caps = config.capacities()

    def powers_and(*exact: int) -> tuple[int, ...]:
        top = max(exact)
        return tuple(sorted({2 ** i for i in range(top.bit_length()) if 2 ** i < top} | set(exact)))

    return {"objects": DEFAULT_GEARS["objects"], "prompts": DEFAULT_GEARS["prompts"],
            "memories": powers_and(config.num_maskmem, caps["memories"]),
            "pointers": powers_and(config.max_object_pointers_in_encoder, caps["pointers"])}


def objects_per_call(config, budget_bytes: int) -> int:
    """How many objects one propagation_decoder call holds within `budget_bytes`: per object, the
    memory attention's scores from every image token to every memory and pointer token at the
    config's capacities, fp32, twice (a product and its softmax can be alive at once); at least 1."""
    caps, tokens = config.capacities(), config.feature_grid ** 2
    pointer_tokens = max(1, config.hidden_dim // config.memory_dim)  # a pointer is split into these
    per_object = 2 * 4 * tokens * (caps["memories"] * tokens + caps["pointers"] * pointer_tokens)
    return max(1, int(budget_bytes) // per_object)


def available_memory() -> int | None:
    """Bytes of memory this process can still take (Linux MemAvailable, and no more than what its
    cgroup's memory.max leaves, in a container), or None where unknown."""
    free = meminfo_bytes("MemAvailable")
    limit, used = cgroup_memory()
    return free if free is None or limit is None else min(free, max(0, limit - used))


def meminfo_bytes(field: str) -> int | None:
    """A field of /proc/meminfo (MemTotal, MemAvailable) in bytes; None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            return next((int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":")), None)
    except (OSError, ValueError, IndexError):
        return None


def cgroup_memory() -> tuple[int | None, int]:
    """This process's cgroup v2 memory limit and use in bytes: (None, 0) without a limit (cgroup v1,
    none, or "max")."""
    try:
        limit = open("/sys/fs/cgroup/memory.max").read().strip()
        used = int(open("/sys/fs/cgroup/memory.current").read().strip())
        return (int(limit), used) if limit.isdigit() else (None, 0)
    except (OSError, ValueError):
        return None, 0


def chunks(backend: Backend, graph: Graph, axis: str, n: int) -> list[Chunk]:
    """How to run `n` items on `axis`: one call when a planned size holds them all, else chunks of
    the largest size (the last one planned on its own)."""
    size = backend.plan(graph, axis, n)
    if size >= n:
        return [Chunk(0, n, size)]
    out = []
    for start in range(0, n, size):
        count = min(size, n - start)
        out.append(Chunk(start, count, backend.plan(graph, axis, count)))
    return out


def fixed_size(backend: Backend, graph: Graph, axis: str, n: int, what: str, setting: str) -> int:
    """The planned size for `n` on an axis that cannot be split into chunks (memories per object):
    a CapacityError when the graph was compiled for fewer."""
    size = backend.plan(graph, axis, n)
    if size < n:
        raise CapacityError(f"{what} needs {n} {axis} in one {graph.name} call, but the graph was compiled for at "
                            f"most {size}; {setting}")
    return size


def pad_rows(array: np.ndarray, size: int) -> np.ndarray:
    """`array` with rows repeated from its first one up to `size` rows (axis 0)."""
    n = array.shape[0]
    if size == n:
        return array
    return np.concatenate([array, np.repeat(array[:1], size - n, axis=0)])
