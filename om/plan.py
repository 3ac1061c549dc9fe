"""Which sizes each graph is compiled for, and how ATC is told (static, dynamic batch, dynamic dims, shape range).

Every symbolic axis of a graph gets a tuple of sizes ("gears"). One size means the axis is fixed: ATC
sees a plain number. Two or more make it vary, and the graph's mode follows from where the varying axes
sit (see ``choose_mode``). ``GraphPlan.validate`` refuses whatever ATC would refuse (ascend.md 1.2), so a
bad plan fails here with a message naming the graph, not 10 minutes into an atc run.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from sam3track.call_sizes import DEFAULT_GEARS, GRAPH_GEARS  # noqa: F401  one definition, shared with ORT on CANN

from . import sam31
from .atc_rules import MAX_DIMS_INPUT_RANK, MAX_DIMS_PER_PROFILE, MAX_PROFILES, MIN_PROFILES  # noqa: F401
from .errors import PlanError

MODES = ("static", "dynamic_batch", "dynamic_dims", "shape_range")


def default_capacities(manifest: dict) -> dict[str, int]:
    """Fixed sizes of the propagation_decoder's pool axes, derived from the source manifest's tracker config.

    The runtime pads to these same numbers when it drives an OM bundle, so there is one definition:
    sam3track.families.sam3.config.TrackerConfig.capacities(), with the bundle's own config and default settings.
    With those defaults (max_conditioning_frames 16, pool_objects 64) it gives

    - memories K = max_cond_frame_num + num_maskmem - 1: the selected conditioning frames plus the
      num_maskmem - 1 most recent frames (max_cond_frame_num = -1, "unbounded", counts as 16);
    - pointers P = 16 + max_object_pointers_in_encoder - 1;
    - memory_rows = 1 + 64 * (num_maskmem + 8) and pointer_rows = 1 + 64 * (max_object_pointers_in_encoder
      + 8): room for 64 objects with 8 spare entries each, plus row 0, which padding entries point at.

    Returns {"memories": K, "pointers": P, "memory_rows": ..., "pointer_rows": ...}. A session configured
    with other max_conditioning_frames / pool_objects needs a bundle converted with matching --gears.
    """
    from sam3track.families.sam3.config import TrackerConfig

    return TrackerConfig.from_manifest(manifest).capacities()


def family(manifest: dict) -> str:
    """The bundle's model family: "sam3" (also when the manifest names none) or "sam3.1"."""
    return manifest.get("family", "sam3")


def default_gears(manifest: dict) -> dict[str, tuple[int, ...]]:
    """DEFAULT_GEARS plus the pool capacities, each capacity a single (fixed) size. A SAM 3.1 bundle adds
    its bucket and mask-side gears and takes its capacities from its own config (om/sam31.py)."""
    if family(manifest) == sam31.FAMILY:
        return sam31.default_gears(manifest, DEFAULT_GEARS)
    from sam3track.call_sizes import default_gears as with_capacities
    from sam3track.families.sam3.config import TrackerConfig

    return with_capacities(TrackerConfig.from_manifest(manifest))


# The pool axes (memories, pointers, memory_rows, pointer_rows) of the graphs that gather memory: the
# runtime pads them to the compiled capacities, so they are compiled at one size each. Varying memories
# (--gears memories=4,10) is allowed for propagation_decoder (the per-frame call); interactive_decoder
# keeps the largest, so its profiles stay objects x points.
POOL_AXES = ("memories", "pointers", "memory_rows", "pointer_rows")
ONE_SIZE_POOL_AXES = ("interactive_decoder",)
# Sizes a graph is compiled at whatever --gears says (SAM 3.1 adds om.sam31.FIXED). interactive_decoder
# runs one object per call: its points vary at dim 1, so it needs --dynamic_dims, whose profiles take at
# most 4 values (om/atc_rules.py), and objects appear in up to 10 of its inputs, points in 2. Several
# clicked objects run as chunks of one (sam3track/call_sizes.py).
FIXED_GEARS = {"interactive_decoder": {"objects": (1,)}}


def graph_gears(name: str, gears: dict[str, tuple[int, ...]], explicit=(), family: str = "sam3"
                ) -> dict[str, tuple[int, ...]]:
    """The gears of graph ``name``: ``gears`` with GRAPH_GEARS' per-graph defaults (and a SAM 3.1
    bundle's, om/sam31.py) for axes the user did not name (``explicit``: the axes given with --gears),
    the pool axes of ONE_SIZE_POOL_AXES graphs fixed at their largest size, and FIXED_GEARS (and
    om.sam31.FIXED) whatever was named."""
    out = dict(gears)
    per_graph = dict(GRAPH_GEARS.get(name, {}))
    if family == sam31.FAMILY:
        per_graph.update(sam31.graph_gears(gears).get(name, {}))
    out.update({a: s for a, s in per_graph.items() if a not in explicit})
    out.update(FIXED_GEARS.get(name, {}))  # sizes the graph is compiled at, whatever --gears says
    if family == sam31.FAMILY:
        out.update(sam31.FIXED.get(name, {}))
    if name in ONE_SIZE_POOL_AXES:
        out.update({a: (max(out[a]),) for a in POOL_AXES if out.get(a)})
    return out


def parse_gears(items: list[str], known_axes: set[str]) -> dict[str, tuple[int, ...]]:
    """``["objects=1,2,4", "memory_rows=513"]`` -> {"objects": (1, 2, 4), "memory_rows": (513,)}."""
    gears: dict[str, tuple[int, ...]] = {}
    for item in items:
        axis, sep, values = item.partition("=")
        axis = axis.strip()
        if not sep or not axis:
            raise PlanError(f"--gears {item!r}: write AXIS=N,N,... (e.g. objects=1,2,4,8,16)")
        if axis not in known_axes:
            raise PlanError(f"--gears names unknown axis {axis!r}; the bundle's axes are {', '.join(sorted(known_axes))}")
        sizes = []
        for v in values.split(","):
            v = v.strip()
            if not v.isdigit() or int(v) < 1:
                raise PlanError(f"--gears {axis}: {v!r} is not a positive integer; gears are sizes >= 1 "
                                f"(e.g. {axis}=1,2,4)")
            sizes.append(int(v))
        gears[axis] = tuple(sorted(set(sizes)))
    return gears


@dataclass(frozen=True)
class TensorPlan:
    name: str
    dtype: str
    shape: tuple  # ints and axis names, as the source manifest lists them


@dataclass(frozen=True)
class Placeholder:
    """One -1 in --input_shape: which input, which dim, which logical axis it stands for."""

    input: str
    dim: int
    axis: str


@dataclass
class GraphPlan:
    """How one graph is compiled. At most one of batch_sizes, dynamic_dims, ranges may be set (ATC takes one
    dynamic option); none set means static."""

    graph: str
    inputs: tuple[TensorPlan, ...]  # ONNX input order = om input order
    outputs: tuple[TensorPlan, ...]
    axes: dict[str, tuple[int, ...]]  # every symbolic axis of the graph -> sizes compiled, ascending
    batch_sizes: tuple[int, ...] | None = None  # --dynamic_batch_size
    dynamic_dims: tuple[tuple[int, ...], ...] | None = None  # --dynamic_dims, one value per placeholder
    ranges: dict[str, tuple] | None = None  # shape range: input -> per dim int or (lo, hi)
    precision: str = "origin"
    notes: list[str] = field(default_factory=list)

    # ----------------------------------------------------------------------------- derived
    @property
    def varying(self) -> list[str]:
        """Axes with more than one size, in order of first appearance across the inputs."""
        seen: list[str] = []
        for t in self.inputs:
            for d in t.shape:
                if isinstance(d, str) and len(self.axes.get(d, ())) > 1 and d not in seen:
                    seen.append(d)
        return seen

    @property
    def mode(self) -> str:
        if self.ranges is not None:
            return "shape_range"
        if self.batch_sizes is not None:
            return "dynamic_batch"
        if self.dynamic_dims is not None:
            return "dynamic_dims"
        return "static"

    def placeholders(self) -> list[Placeholder]:
        """Every -1 of --input_shape in input order (a gear mode's profile lists one value per entry)."""
        varying = set(self.varying)
        return [Placeholder(t.name, i, d) for t in self.inputs for i, d in enumerate(t.shape)
                if isinstance(d, str) and d in varying]

    def atc_dims(self, t: TensorPlan) -> list:
        """The dims of one input as --input_shape gives them: fixed sizes, -1 or 'lo~hi' for varying axes."""
        dims = []
        for i, d in enumerate(t.shape):
            if not isinstance(d, str):
                dims.append(int(d))
            elif d not in self.varying:
                dims.append(self.axes[d][0])
            elif self.ranges is not None and t.name in self.ranges:
                r = self.ranges[t.name][i]
                dims.append(f"{r[0]}~{r[1]}" if isinstance(r, (tuple, list)) else int(r))
            else:
                dims.append(-1)
        return dims

    def input_shape_arg(self) -> str:
        return ";".join(f"{t.name}:{','.join(str(d) for d in self.atc_dims(t))}" for t in self.inputs)

    def dynamic_args(self) -> list[str]:
        args = []
        if self.batch_sizes is not None:
            args.append("--dynamic_batch_size=" + ",".join(str(b) for b in self.batch_sizes))
        if self.dynamic_dims is not None:
            args.append("--dynamic_dims=" + ";".join(",".join(str(v) for v in p) for p in self.dynamic_dims))
        return args

    def profiles(self) -> list[list[int]] | None:
        """om_manifest "profiles": dynamic_dims as is, dynamic batch as [[b], ...], else None."""
        if self.dynamic_dims is not None:
            return [list(p) for p in self.dynamic_dims]
        if self.batch_sizes is not None:
            return [[b] for b in self.batch_sizes]
        return None

    def gear_sizes(self) -> list[dict[str, int]] | None:
        """Every compiled gear as {varying axis: size} (one per batch gear or dims profile); None for
        static and shape-range plans."""
        if self.batch_sizes is not None:
            return [{a: b for a in self.varying} for b in self.batch_sizes]
        if self.dynamic_dims is not None:
            holes = self.placeholders()
            return [{h.axis: v for h, v in zip(holes, p)} for p in self.dynamic_dims]
        return None

    def sizes_at(self, pick) -> dict[str, int]:
        """One size per axis; ``pick(sizes)`` chooses among a varying axis's sizes (e.g. max)."""
        return {a: (pick(s) if a in self.varying else s[0]) for a, s in self.axes.items()}

    def shape_at(self, t: TensorPlan, sizes: dict[str, int]) -> list[int]:
        return [sizes[d] if isinstance(d, str) else int(d) for d in t.shape]

    # ----------------------------------------------------------------------------- rules
    def validate(self) -> "GraphPlan":
        """Refuse what ATC would refuse (ascend.md 1.2); returns self so callers can chain."""
        g = self.graph
        if self.mode not in MODES:  # pragma: no cover - mode is derived
            raise PlanError(f"graph {g}: unknown mode {self.mode!r}")
        for axis, sizes in self.axes.items():
            if not sizes or any(not isinstance(s, int) or isinstance(s, bool) or s < 1 for s in sizes):
                raise PlanError(f"graph {g}: axis {axis} has sizes {list(sizes)}; gears must be positive integers "
                                f"(--gears {axis}=1,2,4)")
        for t in self.inputs + self.outputs:
            for d in t.shape:
                if isinstance(d, str) and d not in self.axes:
                    raise PlanError(f"graph {g}: {t.name} uses axis {d!r}, which has no sizes; pass --gears {d}=N")
        options = [name for name, v in (("--dynamic_batch_size", self.batch_sizes),
                                         ("--dynamic_dims", self.dynamic_dims),
                                         ("a shape range in --input_shape", self.ranges)) if v is not None]
        if len(options) > 1:
            raise PlanError(f"graph {g}: the plan sets {' and '.join(options)}, but ATC takes exactly one dynamic "
                            "option per model; keep one mode for this graph (give the other axes one gear each)")
        holes = self.placeholders()
        if self.mode == "static" and holes:
            h = holes[0]
            raise PlanError(f"graph {g}: {h.input} dim {h.dim} ({h.axis}) varies ({list(self.axes[h.axis])}) but no "
                            f"dynamic option gives the -1 a value; give {h.axis} one gear or plan a gear mode")
        if self.mode == "dynamic_batch":
            self._check_batch(holes)
        elif self.mode == "dynamic_dims":
            self._check_dims(holes)
        elif self.mode == "shape_range":
            self._check_ranges()
        return self

    def _check_count(self, n: int, what: str) -> None:
        if not MIN_PROFILES <= n <= MAX_PROFILES:
            detail = " x ".join(f"{a} {len(self.axes[a])}" for a in self.varying) or "no varying axis"
            raise PlanError(f"graph {self.graph}: {n} {what} ({detail}); ATC accepts {MIN_PROFILES} to "
                            f"{MAX_PROFILES}. Use fewer gears (--gears AXIS=...), or fix an axis at one size")

    def _check_batch(self, holes: list[Placeholder]) -> None:
        g, varying = self.graph, self.varying
        if len({self.axes[a] for a in varying}) != 1:
            raise PlanError(f"graph {g}: --dynamic_batch_size gives every -1 one value, but axes {varying} vary "
                            "apart; use dynamic_dims or give all but one axis a single gear")
        bad = [h for h in holes if h.dim != 0]
        if bad:
            raise PlanError(f"graph {g}: --dynamic_batch_size allows -1 only at dim 0, but {bad[0].input} has "
                            f"{bad[0].axis} at dim {bad[0].dim}; use dynamic_dims for this graph")
        self._check_count(len(self.batch_sizes), "batch gears")
        if tuple(self.batch_sizes) != tuple(self.axes[varying[0]]):  # tied axes share these sizes
            raise PlanError(f"graph {g}: batch gears {list(self.batch_sizes)} differ from the sizes of "
                            f"{varying[0]} {list(self.axes[varying[0]])}")

    def _check_dims(self, holes: list[Placeholder]) -> None:
        g = self.graph
        self._check_count(len(self.dynamic_dims), "--dynamic_dims profiles")
        if not holes:
            raise PlanError(f"graph {g}: --dynamic_dims is set but no input dim is -1; the graph is static")
        if len(holes) > MAX_DIMS_PER_PROFILE:  # atc_rules: at most 4 values per profile [D-dims4]
            where = ", ".join(f"{h.input}[{h.dim}]" for h in holes)
            raise PlanError(f"graph {g}: --dynamic_dims would need {len(holes)} values per profile ({where}), ATC "
                            f"takes at most {MAX_DIMS_PER_PROFILE}; vary fewer axes (give the others one gear with "
                            "--gears AXIS=N) or vary only axes at dim 0 (dynamic batch)")
        ranks = [t for t in self.inputs if any(h.input == t.name for h in holes) and len(t.shape) > MAX_DIMS_INPUT_RANK]
        if ranks:
            raise PlanError(f"graph {g}: input {ranks[0].name} has rank {len(ranks[0].shape)} and a dynamic dim; "
                            f"--dynamic_dims takes inputs of rank <= {MAX_DIMS_INPUT_RANK}")
        if len(set(map(tuple, self.dynamic_dims))) != len(self.dynamic_dims):  # E10039 [GE-mbo]
            raise PlanError(f"graph {g}: --dynamic_dims lists a profile twice; ATC refuses duplicate profiles")
        for k, profile in enumerate(self.dynamic_dims):
            if len(profile) != len(holes):
                where = ", ".join(f"{h.input}[{h.dim}]={h.axis}" for h in holes)
                raise PlanError(f"graph {g}: --dynamic_dims profile {k + 1} {list(profile)} has {len(profile)} values "
                                f"for {len(holes)} -1 dims ({where}); every -1 needs its own value, a logical "
                                "axis repeated for every input it appears in")
            given: dict[str, int] = {}
            for h, v in zip(holes, profile):
                if not isinstance(v, int) or v < 1:
                    raise PlanError(f"graph {g}: profile {k + 1} gives {h.input}[{h.dim}] the value {v!r}; "
                                    "sizes must be positive integers")
                if given.setdefault(h.axis, v) != v:
                    raise PlanError(f"graph {g}: profile {k + 1} gives axis {h.axis} both {given[h.axis]} and {v}; "
                                    "an axis must have one size per profile in every input it appears in")

    def _check_ranges(self) -> None:
        g = self.graph
        if not self.varying:
            raise PlanError(f"graph {g}: shape range asked for, but no axis varies; give one axis 2+ gears "
                            "or drop --shape-range for this graph")
        for t in self.inputs:
            r = self.ranges.get(t.name)
            if r is None or len(r) != len(t.shape):
                raise PlanError(f"graph {g}: the shape range gives no per-dim range for input {t.name}")
            for d in r:
                if isinstance(d, (tuple, list)) and not 1 <= d[0] <= d[1]:
                    raise PlanError(f"graph {g}: range {d[0]}~{d[1]} of {t.name} is empty or below 1")


# ------------------------------------------------------------------------------------------- planning
def _tensors(items: list[dict]) -> tuple[TensorPlan, ...]:
    return tuple(TensorPlan(t["name"], t["dtype"], tuple(t["shape"])) for t in items)


def axes_of(entry: dict) -> list[str]:
    """Symbolic axes of one manifest graph entry, in order of first appearance (inputs, then outputs)."""
    seen: list[str] = []
    for t in entry["inputs"] + entry["outputs"]:
        for d in t["shape"]:
            if isinstance(d, str) and d not in seen:
                seen.append(d)
    return seen


def plan_graph(name: str, entry: dict, gears: dict[str, tuple[int, ...]], shape_range: bool = False,
               precision: str = "origin", allowed=None) -> GraphPlan:
    """Plan one graph from its manifest entry and the gears of every axis, then validate it.

    No varying axis -> static; one varying axis at dim 0 of every input it appears in -> dynamic batch;
    otherwise dynamic dims over the cartesian product of the varying axes' gears. ``shape_range`` picks
    shape-range mode instead (each varying axis spans its smallest to largest gear).

    ``allowed`` (sizes -> bool) keeps only the combinations of sizes the graph can run (SAM 3.1's
    grounding head: prompts 1 or equal to images); the axes are narrowed to the sizes some allowed
    combination uses before the mode is chosen.
    """
    missing = [a for a in axes_of(entry) if a not in gears]
    if missing:
        raise PlanError(f"graph {name}: axes {missing} have no gears; pass --gears {missing[0]}=N,...")
    plan = GraphPlan(name, _tensors(entry["inputs"]), _tensors(entry["outputs"]),
                     {a: tuple(sorted(set(gears[a]))) for a in axes_of(entry)}, precision=precision)
    if allowed is not None and plan.varying:
        combos = _allowed_combinations(plan, allowed)
        plan.axes.update({a: tuple(sorted({c[a] for c in combos})) for a in list(plan.varying)})
    varying = plan.varying
    if not varying:
        return plan.validate()
    if shape_range:
        plan.ranges = {t.name: tuple((plan.axes[d][0], plan.axes[d][-1]) if d in varying else
                                     (plan.axes[d][0] if isinstance(d, str) else int(d)) for d in t.shape)
                       for t in plan.inputs}
        return plan.validate()
    holes = plan.placeholders()
    tied = _tied_sizes(plan, allowed)
    if tied is not None and all(h.dim == 0 for h in holes):
        plan.batch_sizes = tied
        return plan.validate()
    profiles = []
    for combo in itertools.product(*(plan.axes[a] for a in varying)):
        size = dict(zip(varying, combo))
        if allowed is None or allowed(plan.sizes_at(min) | size):
            profiles.append(tuple(size[h.axis] for h in holes))
    plan.dynamic_dims = tuple(profiles)
    return plan.validate()


def _tied_sizes(plan: GraphPlan, allowed) -> tuple[int, ...] | None:
    """The batch gears when every compiled combination gives all varying axes one size (a single
    varying axis, or axes ``allowed`` ties together such as SAM 3.1's image-prompt rows), else None:
    --dynamic_batch_size gives every -1 the same value [D-batch]."""
    varying = plan.varying
    if len(varying) == 1:
        return plan.axes[varying[0]]
    if allowed is None:
        return None
    combos = _allowed_combinations(plan, allowed)
    if any(len(set(c.values())) != 1 for c in combos):
        return None
    return tuple(sorted({next(iter(c.values())) for c in combos}))


def _allowed_combinations(plan: GraphPlan, allowed) -> list[dict[str, int]]:
    """The combinations of the varying axes' sizes that ``allowed`` accepts (fixed axes at their size)."""
    varying = plan.varying
    combos = [dict(zip(varying, c)) for c in itertools.product(*(plan.axes[a] for a in varying))]
    fixed = plan.sizes_at(min)
    kept = [c for c in combos if allowed(fixed | c)]
    if not kept:
        detail = ", ".join(f"{a}={list(plan.axes[a])}" for a in varying)
        raise PlanError(f"graph {plan.graph}: no combination of the gears {detail} is a shape this graph runs; "
                        "choose other --gears")
    return kept
