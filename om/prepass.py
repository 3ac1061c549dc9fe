"""The ONNX pre-pass: rewrite a bundle graph into the form ATC parses, and prove the rewrite changed nothing.

It refuses nodes outside the default domain, keeps one opset, turns bf16 rounding back into Casts at a
reduced precision, writes every dim but the planned varying axes as a number, and reports risky inputs
and ops for the om_manifest; then the original and the rewritten graph must agree within 1e-5 under
onnxruntime. Each step and why: docs/ascend.md, "The ONNX pre-pass".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from graphs import bf16_rounding

from .errors import PrepassError
from .onnx_ops import DEFAULT_DOMAINS, problems, walk_nodes
from .plan import GraphPlan

# Ops ATC parses (om/onnx_ops.py: what it does not parse is refused) that may still run badly: reported,
# never refused (ascend.md 1.4, "verify on the first real run"; om.smoke times them on hardware).
RISKY_OPS = {
    "NonZero": "data-dependent output shape forces a dynamic partition",
    "TopK": "data-dependent shapes may force a dynamic partition",
    "Unique": "data-dependent output shape",
    "ScatterND": "reported to fall back to AI CPU",
    "If": "control flow (the export folds shape-only ones: graphs/onnx_rewrites.py)",
    "Loop": "control flow",
    "Scan": "control flow",
}
TOLERANCE = 1e-5
EXTERNAL_DATA_THRESHOLD = 1_800_000_000  # protobuf caps one file at 2 GiB (as graphs.export)


@dataclass
class PrepassReport:
    warnings: list[str] = field(default_factory=list)
    risky_ops: dict[str, int] = field(default_factory=dict)  # op type -> node count
    data_files: list[str] = field(default_factory=list)  # external data written next to the ONNX
    check_sizes: dict[str, int] = field(default_factory=dict)  # the sizes the onnxruntime check ran at


def check_domains(model, graph_name: str) -> None:
    """Refuse, naming the first node and op, a graph with any node outside the default ONNX domain."""
    for node in walk_nodes(model.graph):
        if node.domain not in DEFAULT_DOMAINS:
            raise PrepassError(
                f"graph {graph_name}: node {node.name or '(unnamed)'!r} is op {node.op_type} of domain "
                f"{node.domain!r}; ATC parses only the default ONNX domain (it fails with E19010 'No parser is "
                f"registered for Op'). Export this graph without custom ops (e.g. no onnxruntime fusions)")


def check_ops(model, graph_name: str) -> None:
    """Refuse a graph with nodes ATC would not parse or compile (om/onnx_ops.py), naming them all."""
    found = problems(model)
    if found:
        lines = "\n".join(f"  {p.node} ({p.op}): {p.code} {p.message}" for p in found[:10])
        raise PrepassError(f"graph {graph_name}: {len(found)} node(s) ATC would refuse (om/onnx_ops.py, docs/ascend.md "
                           f"'What the fake atc checks'):\n{lines}\nExport the bundle again with --attention plain "
                           "(its forms are rewritten for ATC) or change the graph")


def _single_default_opset(model, graph_name: str) -> None:
    default = [o for o in model.opset_import if o.domain in DEFAULT_DOMAINS]
    if not default:
        raise PrepassError(f"graph {graph_name}: the model imports no default-domain opset; export it again")
    version = max(o.version for o in default)
    del model.opset_import[:]
    entry = model.opset_import.add()
    entry.domain, entry.version = "", version


def _fix_dims(value_info, dims: list, graph_name: str) -> None:
    """Write ``dims`` (ints; axis names stay symbolic) into an input/output's declared shape."""
    shape = value_info.type.tensor_type.shape
    if len(shape.dim) != len(dims):
        raise PrepassError(f"graph {graph_name}: {value_info.name} has rank {len(shape.dim)} in the ONNX but "
                           f"{len(dims)} in the manifest; the manifest does not describe this graph: export again")
    for i, (d, want) in enumerate(zip(shape.dim, dims)):
        if d.HasField("dim_value") and isinstance(want, int) and d.dim_value != want:
            raise PrepassError(f"graph {graph_name}: {value_info.name} dim {i} is {d.dim_value} in the ONNX but the "
                               f"plan gives {want}; fix the manifest or the --gears of that axis")
        if isinstance(want, int):
            d.Clear()
            d.dim_value = want
        else:
            d.Clear()
            d.dim_param = want


def planned_dims(plan: GraphPlan, shape: tuple) -> list:
    """A manifest shape with fixed axes replaced by their one size; varying axes keep their name."""
    varying = set(plan.varying)
    return [d if (isinstance(d, str) and d in varying) else (plan.axes[d][0] if isinstance(d, str) else int(d))
            for d in shape]


def make_atc_ready(src: Path, plan: GraphPlan, manifest: dict, out: Path, seed: int = 0) -> PrepassReport:
    """Write the ATC-ready version of graph ``plan.graph`` from ``src`` to ``out`` and check it (see module doc)."""
    import onnx

    g = plan.graph
    report = PrepassReport()
    model = onnx.load(str(src))
    check_domains(model, g)
    _single_default_opset(model, g)
    check_ops(model, g)

    inits = {i.name for i in model.graph.initializer}
    onnx_inputs = [i for i in model.graph.input if i.name not in inits]
    want_inputs = [t.name for t in plan.inputs]
    if [i.name for i in onnx_inputs] != want_inputs:
        raise PrepassError(f"graph {g}: the ONNX inputs are {[i.name for i in onnx_inputs]} but the manifest lists "
                           f"{want_inputs} (order matters: it is the om input order); export the bundle again")
    by_name = {t.name: t for t in plan.inputs + plan.outputs}
    for vi in list(onnx_inputs) + list(model.graph.output):
        t = by_name.get(vi.name)
        if t is None:
            raise PrepassError(f"graph {g}: output {vi.name} is not in the manifest; export the bundle again")
        dtype = onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type).name
        if dtype != t.dtype:
            raise PrepassError(f"graph {g}: {vi.name} is {dtype} in the ONNX but {t.dtype} in the manifest; "
                               "export the bundle again")
        _fix_dims(vi, planned_dims(plan, t.shape), g)
    # Intermediate shapes were inferred with the old symbolic dims; ATC infers its own.
    del model.graph.value_info[:]

    if plan.precision != "origin":
        # The memories' bf16 rounding is float32 arithmetic whose splitter is inf in float16: where ATC
        # may compute in float16, it becomes Casts again (graphs/bf16_rounding.py; same values in ORT).
        bf16_rounding.as_casts(model)

    wide = [f"{t.name} ({t.dtype})" for t in plan.inputs if t.dtype in ("int64", "bool")]
    if wide:
        report.warnings.append(f"{g}: inputs {', '.join(wide)}: ATC converts int64/bool inputs but verify them on "
                               "the NPU (int32 ids and float masks are safer)")
    for node in walk_nodes(model.graph):
        if node.op_type in RISKY_OPS:
            report.risky_ops[node.op_type] = report.risky_ops.get(node.op_type, 0) + 1
    for op, n in sorted(report.risky_ops.items()):
        report.warnings.append(f"{g}: {n} {op} node(s): {RISKY_OPS[op]} (ascend.md 1.4)")

    out.parent.mkdir(parents=True, exist_ok=True)
    if model.ByteSize() > EXTERNAL_DATA_THRESHOLD or any(True for _ in src.parent.glob(src.name + ".data")):
        data = out.name + ".data"
        onnx.save_model(model, str(out), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=data, size_threshold=1024)
        report.data_files.append(data)
    else:
        onnx.save_model(model, str(out))
    report.check_sizes = check_equivalent(src, out, plan, manifest, seed)
    return report


# ------------------------------------------------------------------------------------------- check
def _check_sizes(plan: GraphPlan) -> dict[str, int]:
    """One gear to check at: the smallest size above 1 of each varying axis (1 would hide broadcasting
    bugs), or, where the plan compiles only some combinations, the compiled gear with fewest axes at 1
    and the smallest sizes."""
    sizes = plan.sizes_at(lambda sizes: next((s for s in sizes if s > 1), sizes[0]))
    gears = plan.gear_sizes()
    if gears and not any(all(sizes[a] == v for a, v in g.items()) for g in gears):
        best = min(gears, key=lambda g: (sum(v == 1 for v in g.values()), sum(g.values())))
        sizes.update(best)
    return sizes


def _vocab_size(model, manifest: dict) -> int:
    """Rows of the embedding table input_ids index (followed through Casts), else the tokenizer's pad id + 1."""
    from onnx import numpy_helper

    inits = {i.name: i for i in model.graph.initializer}
    names = {"input_ids"}
    for node in model.graph.node:
        if node.op_type == "Cast" and node.input[0] in names:
            names.add(node.output[0])
        if node.op_type == "Gather" and len(node.input) > 1 and node.input[1] in names and node.input[0] in inits:
            return int(numpy_helper.to_array(inits[node.input[0]]).shape[0])
    return int(manifest.get("tokenizer", {}).get("pad_token_id", 0)) + 1


# 0/1 inputs besides *_valid (SAM 3, then SAM 3.1 names), and index inputs whose pool is not <prefix>_pool
FLAGS = ("binarize", "via_image", "use_memory", "multimask", "masks", "conditioning", "use_mask_prompt",
         "round_levels")
POOL_OF = {"memory_image_index": "image_pool"}


def sample_inputs(plan: GraphPlan, sizes: dict[str, int], manifest: dict, model=None, seed: int = 0) -> dict:
    """Seeded inputs that are valid for the graph's semantics, without torch.

    The same rules as graphs.sam3.specs.sample_inputs, by name: indices within their pool's rows, slots within
    num_maskmem, masks 0/1 with at least one valid entry per row (an all-masked softmax is NaN on both sides
    and would hide a real mismatch), ids within the vocabulary.
    """
    rng = np.random.default_rng(seed)
    shapes = {t.name: plan.shape_at(t, sizes) for t in plan.inputs}
    num_maskmem = int(manifest.get("config", {}).get("tracker", {}).get("num_maskmem", 1))
    out = {}
    for t in plan.inputs:
        shape, name = shapes[t.name], t.name
        if name == "input_ids":
            high = _vocab_size(model, manifest) if model is not None else 2
            value = rng.integers(0, high, shape)
        elif name.endswith("_index"):
            pool = shapes.get(POOL_OF.get(name, name[: -len("_index")] + "_pool"))
            value = rng.integers(0, pool[0] if pool else 1, shape)
        elif name == "point_labels":  # negative, positive, box corners
            value = rng.integers(0, 4, shape)
        elif name.endswith("_slot"):
            value = rng.integers(0, num_maskmem, shape)
        elif name.endswith("mask") and len(shape) == 2:  # attention masks: a prefix of ones per row
            lengths = rng.integers(1, shape[1] + 1, (shape[0], 1))
            value = np.arange(shape[1])[None] < lengths
        elif name.endswith("_valid") or name in FLAGS:
            value = rng.random(shape) > 0.5
            if value.ndim == 2:
                value[:, 0] = True
        elif name.endswith("_offset"):
            value = rng.uniform(-1, 1, shape)
        elif name == "boxes":  # normalised cxcywh boxes inside the frame
            half = tuple(shape[:-1]) + (2,)
            value = np.concatenate([rng.uniform(0.2, 0.8, half), rng.uniform(0.05, 0.4, half)], -1)
        elif name == "box_labels":  # negative, positive
            value = rng.integers(0, 2, shape)
        elif t.dtype.startswith("float"):
            value = rng.standard_normal(shape)
        else:
            value = np.zeros(shape)
        out[name] = np.ascontiguousarray(np.asarray(value).astype(t.dtype))
    return out


def _session(path: Path):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 3  # the original graph's spurious output dim_params would warn on every run
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def check_equivalent(original: Path, rewritten: Path, plan: GraphPlan, manifest: dict, seed: int = 0) -> dict:
    """Run both graphs on the same inputs at one gear; raise unless every output agrees within 1e-5."""
    import onnx

    sizes = _check_sizes(plan)
    inputs = sample_inputs(plan, sizes, manifest, onnx.load(str(original), load_external_data=False), seed)
    try:
        want = _session(original).run(None, inputs)
        new = _session(rewritten)
        have = new.run(None, inputs)
    except Exception as exc:  # onnxruntime raises its own exception types
        raise PrepassError(f"graph {plan.graph}: onnxruntime could not run it at {sizes}: {exc}") from exc
    outputs = {t.name: t for t in plan.outputs}
    for meta, a, b in zip(new.get_outputs(), want, have):
        expected = plan.shape_at(outputs[meta.name], sizes)
        if list(b.shape) != expected:
            raise PrepassError(f"graph {plan.graph}: output {meta.name} has shape {list(b.shape)} at {sizes} but the "
                               f"manifest implies {expected}; the manifest does not describe this graph")
        diff = float(np.max(np.nan_to_num(np.abs(a.astype(np.float64) - b.astype(np.float64))), initial=0.0))
        scale = max(1.0, float(np.max(np.abs(np.nan_to_num(a.astype(np.float64))), initial=0.0)))
        if not np.array_equal(np.isnan(a), np.isnan(b)) or diff > TOLERANCE * scale:
            raise PrepassError(f"graph {plan.graph}: the ATC-ready rewrite changed output {meta.name} "
                               f"(max abs difference {diff:.3g} at {sizes}); this is a converter bug, report it")
    return sizes
