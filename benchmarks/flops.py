"""FLOPs and bytes of one call of an ONNX graph at concrete input sizes, counted from the graph's shapes.

    python -m benchmarks.flops GRAPH.onnx [--bind objects=16,memories=7 ...]   # prints the count

What is counted (``count_graph``), per node, from its input and output shapes at the call's sizes:

- ``gemm``: multiply-adds, 2 FLOPs each. MatMul (batched too: 2 * prod(output) * K), Gemm (2*M*N*K),
  Conv (2 * prod(output) * Cin/groups * kh * kw), ConvTranspose (2 * prod(input) * Cout/groups * kh * kw),
  Einsum (2 * the product of every index's size, for two operands), and ONNX Runtime's fused
  ``com.microsoft.MultiHeadAttention`` (its two products, Q.K^T and P.V: 2*B*S*L*(Dqk + Dv); its
  projections are separate MatMuls in these graphs).
- ``other``: the smaller term, reported apart and kept out of the roofline's FLOPs: element-wise ops 1 per
  output element (activations, Erf, Where ... included), Softmax 5 per element (max, subtract, exp, sum,
  divide; the softmax inside MultiHeadAttention too), normalisations 8 per element, reductions 1 per input
  element, Resize 4 per output element, bias adds of Gemm and Conv 1 per output element.
- ``copy_bytes``: bytes written by layout and indexing ops (Transpose, Concat, Gather, Slice, Expand, Tile,
  Pad, Split, ScatterND, Cast ...): no FLOPs, but memory traffic a runtime may or may not fuse away.
- Bytes moved, a lower bound: the weights (initializers, read once; an embedding table that only Gathers
  read counts by the rows gathered), the inputs fed and the outputs returned. Intermediate activations that spill out of cache are not in it, so a graph's real traffic is
  higher and its arithmetic intensity lower than this count says.

Shapes: ONNX's own shape inference with the inputs' symbolic dims bound to the fed sizes (pure onnx);
where that leaves a counted node's shapes unknown (Reshape targets computed at run time, contrib ops such
as MultiHeadAttention, If branches), the graph is run once in ONNX Runtime with profiling on and every
node's input and output shapes are read from the profile (exact: the shapes of that very call).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import shape_inference

GEMM_OPS = ("MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum", "MultiHeadAttention", "MatMulInteger",
            "QLinearMatMul", "ConvInteger", "FusedMatMul")
SOFTMAX_OPS = ("Softmax", "LogSoftmax")
NORM_OPS = ("LayerNormalization", "InstanceNormalization", "BatchNormalization", "GroupNormalization",
            "SimplifiedLayerNormalization", "SkipLayerNormalization", "RMSNormalization")
REDUCE_OPS = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2", "ArgMax", "ArgMin",
              "CumSum")
COPY_OPS = ("Transpose", "Concat", "Gather", "GatherElements", "GatherND", "Slice", "Expand", "Tile", "Pad",
            "Split", "ScatterND", "ScatterElements", "Cast", "OneHot", "DepthToSpace", "SpaceToDepth")
FREE_OPS = ("Shape", "Size", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Constant",
            "ConstantOfShape", "Range", "If", "Loop", "Dropout", "NonZero")
ELEMENT_COST = {**{op: 5 for op in SOFTMAX_OPS}, **{op: 8 for op in NORM_OPS}, "Resize": 4}
DTYPE_BYTES = {"float": 4, "float32": 4, "float16": 2, "bfloat16": 2, "double": 8, "int64": 8, "int32": 4,
               "int8": 1, "uint8": 1, "bool": 1, "int16": 2}


@dataclass
class Shapes:
    """Per node name: input and output shapes (None where unknown) and output dtypes."""
    inputs: dict = field(default_factory=dict)
    outputs: dict = field(default_factory=dict)
    output_dtypes: dict = field(default_factory=dict)
    source: str = "onnx"


@dataclass
class Count:
    gemm: int = 0
    other: int = 0
    copy_bytes: int = 0
    weight_bytes: int = 0
    input_bytes: int = 0
    output_bytes: int = 0
    by_op: dict = field(default_factory=dict)  # op type -> {"gemm": .., "other": .., "copy_bytes": .., "nodes": ..}
    uncounted: list = field(default_factory=list)  # names of nodes whose shapes stayed unknown
    shape_source: str = "onnx"

    @property
    def bytes(self) -> int:
        """The lower bound on bytes moved: weights + inputs + outputs."""
        return self.weight_bytes + self.input_bytes + self.output_bytes

    def as_dict(self) -> dict:
        return {"gemm_flops": self.gemm, "other_flops": self.other, "copy_bytes": self.copy_bytes,
                "weight_bytes": self.weight_bytes, "input_bytes": self.input_bytes,
                "output_bytes": self.output_bytes, "bytes": self.bytes, "by_op": self.by_op,
                "uncounted": self.uncounted, "shape_source": self.shape_source}


def _prod(shape) -> int:
    return int(math.prod(shape)) if shape is not None else 0


def name_nodes(graph: onnx.GraphProto, prefix: str = "") -> None:
    """Gives every node (subgraphs' too) a unique name, so shapes and profiles can be keyed by it."""
    seen = set()
    for i, node in enumerate(graph.node):
        if not node.name or node.name in seen:
            node.name = f"{prefix}node{i}_{node.op_type}"
        seen.add(node.name)
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                name_nodes(attr.g, f"{node.name}/{attr.name}/")


def bind_inputs(model: onnx.ModelProto, feeds: dict) -> onnx.ModelProto:
    """A copy of ``model`` whose graph inputs have the fed arrays' shapes (symbolic dims bound)."""
    bound = onnx.ModelProto()
    bound.CopyFrom(model)
    for vi in bound.graph.input:
        if vi.name in feeds:
            dims = vi.type.tensor_type.shape.dim
            for d, size in zip(dims, np.shape(feeds[vi.name])):
                d.Clear()
                d.dim_value = int(size)
    return bound


def _value_shapes(graph: onnx.GraphProto) -> tuple[dict, dict]:
    shapes, dtypes = {}, {}
    for vi in list(graph.input) + list(graph.value_info) + list(graph.output):
        t = vi.type.tensor_type
        if t.HasField("shape") and all(d.HasField("dim_value") for d in t.shape.dim):
            shapes[vi.name] = [d.dim_value for d in t.shape.dim]
            dtypes[vi.name] = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name if t.elem_type else "float32"
    for init in graph.initializer:
        shapes[init.name] = list(init.dims)
        dtypes[init.name] = onnx.helper.tensor_dtype_to_np_dtype(init.data_type).name
    return shapes, dtypes


def inferred_shapes(model: onnx.ModelProto, feeds: dict) -> Shapes:
    """Node shapes from onnx.shape_inference (with data propagation) at the fed sizes."""
    inferred = shape_inference.infer_shapes(bind_inputs(model, feeds), data_prop=True)
    values, dtypes = _value_shapes(inferred.graph)
    out = Shapes(source="onnx")
    for node in inferred.graph.node:
        out.inputs[node.name] = [values.get(i) if i else None for i in node.input]
        out.outputs[node.name] = [values.get(o) for o in node.output]
        out.output_dtypes[node.name] = [dtypes.get(o) for o in node.output]
    return out


def profiled_shapes(model: onnx.ModelProto, feeds: dict) -> Shapes:
    """Node shapes read from an ONNX Runtime profile of one run (graph optimisations off, so every node of
    the graph runs under its own name). Imports onnxruntime here only."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.enable_profiling = True
    with tempfile.TemporaryDirectory() as tmp:
        options.profile_file_prefix = str(Path(tmp) / "shapes")
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        session.run(None, feeds)
        events = json.loads(Path(session.end_profiling()).read_text())
    outs = {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            outs[e["name"][: -len("_kernel_time")]] = e["args"].get("output_type_shape", [])
    return _by_value_name(model, feeds, outs)


def _by_value_name(model: onnx.ModelProto, feeds: dict, outs: dict) -> Shapes:
    """Shapes keyed by node from the profiled nodes' outputs (``outs``: node name -> [{dtype: shape}]): every
    input is looked up by its value's name (the profile leaves out some constant inputs, e.g. the weights
    ConvTranspose prepacks), among the feeds, the initializers, Constant nodes and the profiled outputs."""
    values = {**_initializer_values(model.graph),
              **{k: (list(np.shape(v)), np.asarray(v).dtype.name) for k, v in feeds.items()}}
    for node, _ in _walk(model.graph):
        if node.op_type == "Constant" and node.attribute and node.attribute[0].type == onnx.AttributeProto.TENSOR:
            t = node.attribute[0].t
            values[node.output[0]] = (list(t.dims), onnx.helper.tensor_dtype_to_np_dtype(t.data_type).name)
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                values.update(_initializer_values(attr.g))
        for name, t in zip([o for o in node.output if o], outs.get(node.name, [])):
            dtype, shape = next(iter(t.items()))
            values[name] = (shape, dtype)
        if node.name not in outs and node.op_type in ("Cast", "Identity") and node.input[0] in values:
            # ONNX Runtime removes redundant Casts even unoptimised: their outputs keep their inputs' shapes
            to = next((a.i for a in node.attribute if a.name == "to"), None)
            dtype = onnx.helper.tensor_dtype_to_np_dtype(to).name if to else values[node.input[0]][1]
            values[node.output[0]] = (values[node.input[0]][0], dtype)
    out = Shapes(source="onnxruntime profile")
    for node, _ in _walk(model.graph):
        if node.name not in outs:
            continue
        out.inputs[node.name] = [values.get(i, (None, None))[0] if i else None for i in node.input]
        out.outputs[node.name] = [values.get(o, (None, None))[0] for o in node.output]
        out.output_dtypes[node.name] = [values.get(o, (None, None))[1] for o in node.output]
    return out


def _initializer_values(graph: onnx.GraphProto) -> dict:
    return {i.name: (list(i.dims), onnx.helper.tensor_dtype_to_np_dtype(i.data_type).name) for i in graph.initializer}


def _einsum_flops(equation: str, shapes: list) -> int:
    lhs = equation.replace(" ", "").split("->")[0].split(",")
    sizes = {}
    for term, shape in zip(lhs, shapes):
        if "..." in term:  # the ellipsis' dims get letters of their own
            extra = len(shape) - (len(term) - 3)
            term = term.replace("...", "".join(chr(0x100 + k) for k in range(extra)))
        for letter, size in zip(term, shape):
            sizes[letter] = max(sizes.get(letter, 1), size)
    return 2 * _prod(sizes.values()) if len(lhs) >= 2 else 0


def _attention_flops(node: onnx.NodeProto, ins: list, outs: list) -> tuple[int, int]:
    """(gemm, softmax) FLOPs of com.microsoft.MultiHeadAttention from its shapes."""
    heads = next(a.i for a in node.attribute if a.name == "num_heads")
    q = ins[0]
    k = ins[1] if len(ins) > 1 and ins[1] else None
    if len(q) == 5:  # packed QKV: [B, S, N, 3, H]
        batch, s, length, dqk = q[0], q[1], q[1], q[2] * q[4]
    else:
        batch, s, dqk = q[0], q[1], q[2]
        length = q[1] if k is None else (k[2] if len(k) == 4 else k[1])
    dv = outs[0][-1]
    return 2 * batch * s * length * (dqk + dv), 5 * batch * heads * s * length


def node_cost(node: onnx.NodeProto, ins: list, outs: list, out_dtypes: list | None = None) -> tuple[int, int, int]:
    """(gemm FLOPs, other FLOPs, copy bytes) of one node from its input and output shapes (module docstring)."""
    op, out_elems = node.op_type, _prod(outs[0]) if outs and outs[0] is not None else 0
    if op in GEMM_OPS and (not ins or ins[0] is None or (op != "MultiHeadAttention" and ins[1] is None)):
        raise TypeError(f"{node.name}: an input's shape is unknown")
    if op in ("MatMul", "MatMulInteger", "QLinearMatMul", "FusedMatMul"):
        return 2 * out_elems * ins[0][-1], 0, 0
    if op == "Gemm":
        trans_a = next((a.i for a in node.attribute if a.name == "transA"), 0)
        k = ins[0][0] if trans_a else ins[0][1]
        return 2 * out_elems * k, (out_elems if len(ins) > 2 and ins[2] else 0), 0
    if op in ("Conv", "ConvInteger"):
        return 2 * out_elems * _prod(ins[1][1:]), (out_elems if len(ins) > 2 and ins[2] else 0), 0
    if op == "ConvTranspose":
        return 2 * _prod(ins[0]) * _prod(ins[1][1:]), (out_elems if len(ins) > 2 and ins[2] else 0), 0
    if op == "Einsum":
        equation = next(a.s.decode() for a in node.attribute if a.name == "equation")
        flops = _einsum_flops(equation, [s for s in ins if s is not None])
        return flops, (0 if flops else out_elems), 0
    if op == "MultiHeadAttention":
        return (*_attention_flops(node, ins, outs), 0)
    if op in REDUCE_OPS:
        return 0, _prod(ins[0]), 0
    if op in COPY_OPS:
        dtypes = out_dtypes or [None] * len(outs)
        return 0, 0, sum(_prod(s) * DTYPE_BYTES.get(t, 4) for s, t in zip(outs, dtypes) if s is not None)
    if op in FREE_OPS:
        return 0, 0, 0
    return 0, ELEMENT_COST.get(op, 1) * out_elems, 0


def _walk(graph: onnx.GraphProto, top: bool = True):
    """(node, in the top graph?) for every node, subgraphs' included."""
    for node in graph.node:
        yield node, top
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _walk(attr.g, False)


def _weight_bytes(graph: onnx.GraphProto) -> int:
    total = 0
    for init in graph.initializer:
        total += _prod(init.dims) * onnx.helper.tensor_dtype_to_np_dtype(init.data_type).itemsize
    for node, _ in _walk(graph):
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                total += sum(_prod(i.dims) * onnx.helper.tensor_dtype_to_np_dtype(i.data_type).itemsize
                             for i in attr.g.initializer)
    return total


def _gathered_tables(graph: onnx.GraphProto) -> dict:
    """Initializers read only as the data of Gather nodes (embedding tables): name -> their bytes. A call
    reads only the gathered rows of these, so they count by the Gathers' outputs instead."""
    sizes = {i.name: _prod(i.dims) * onnx.helper.tensor_dtype_to_np_dtype(i.data_type).itemsize
             for i in graph.initializer}
    consumers = collections.defaultdict(list)
    for node, _ in _walk(graph):
        for k, name in enumerate(node.input):
            if name in sizes:
                consumers[name].append((node.op_type, k))
    return {name: sizes[name] for name, uses in consumers.items() if all(u == ("Gather", 0) for u in uses)}


def _complete(model: onnx.ModelProto, shapes: Shapes) -> bool:
    """Whether every node of the top graph that costs anything has its shapes (gemm ops: inputs too)."""
    for node, top in _walk(model.graph):
        if not top or node.op_type in FREE_OPS + ("Cast",):
            continue
        outs = shapes.outputs.get(node.name)
        if not outs or outs[0] is None:
            return False
        if node.op_type in GEMM_OPS and any(s is None for s in shapes.inputs.get(node.name, [None])[:2]):
            return False
    return True


def load(model) -> onnx.ModelProto:
    """``model`` (a path or a ModelProto) with every node named (a copy: the caller's model is untouched)."""
    if isinstance(model, (str, Path)):
        model = onnx.load(str(model))
    else:
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        model = copy
    name_nodes(model.graph)
    return model


def count_graph(model, feeds: dict, shapes: str = "auto") -> Count:
    """FLOPs and bytes of one call of ``model`` (path or ModelProto) with ``feeds`` (name -> array; only their
    shapes and dtypes matter unless the graph has to be run). ``shapes``: "onnx" (shape inference only),
    "run" (ONNX Runtime profile only) or "auto" (inference, then the profile if a costed node stays unknown)."""
    model = load(model)
    found = inferred_shapes(model, feeds) if shapes in ("auto", "onnx") else None
    if found is None or (shapes == "auto" and not _complete(model, found)):
        found = profiled_shapes(model, feeds)
    count = Count(weight_bytes=_weight_bytes(model.graph), shape_source=found.source,
                  input_bytes=sum(np.asarray(v).nbytes for v in feeds.values()))
    tables, gathered = _gathered_tables(model.graph), 0
    produced = {}
    for node, top in _walk(model.graph):
        outs = found.outputs.get(node.name)
        if outs is None or (outs and outs[0] is None and node.op_type not in FREE_OPS):
            if top and node.op_type not in FREE_OPS + ("Cast",):  # ORT drops redundant Casts even unoptimised
                count.uncounted.append(node.name)
            continue
        dtypes = found.output_dtypes.get(node.name)
        for name, shape, dtype in zip(node.output, outs, dtypes or [None] * len(outs)):
            produced[name] = _prod(shape) * DTYPE_BYTES.get(dtype, 4) if shape is not None else 0
        try:
            gemm, other, copied = node_cost(node, found.inputs.get(node.name, []), outs, dtypes)
        except (TypeError, IndexError, StopIteration):  # an input's shape unknown
            count.uncounted.append(node.name)
            continue
        if node.op_type == "Gather" and node.input[0] in tables:
            gathered += produced.get(node.output[0], 0)
        count.gemm, count.other, count.copy_bytes = count.gemm + gemm, count.other + other, count.copy_bytes + copied
        entry = count.by_op.setdefault(node.op_type, {"gemm": 0, "other": 0, "copy_bytes": 0, "nodes": 0})
        entry["gemm"] += gemm
        entry["other"] += other
        entry["copy_bytes"] += copied
        entry["nodes"] += 1
    count.output_bytes = sum(produced.get(o.name, 0) for o in model.graph.output)
    count.weight_bytes += gathered - sum(tables.values())
    return count


def _parse_bind(text: str) -> dict:
    return {k: int(v) for k, v in (kv.split("=") for kv in text.split(",") if kv)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.flops", description=__doc__.split("\n\n")[0])
    p.add_argument("graph", type=Path)
    p.add_argument("--bind", default="", help="symbolic dim sizes, e.g. objects=16,memories=7 (others: 1)")
    p.add_argument("--shapes", choices=("auto", "onnx", "run"), default="auto")
    args = p.parse_args(argv)
    model, bind = onnx.load(str(args.graph)), _parse_bind(args.bind)
    rng = np.random.default_rng(0)
    feeds = {}
    for vi in model.graph.input:
        t = vi.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else bind.get(d.dim_param, 1) for d in t.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type)
        feeds[vi.name] = (rng.standard_normal(shape) if dtype.kind == "f" else np.zeros(shape)).astype(dtype)
    count = count_graph(model, feeds, args.shapes)
    print(json.dumps({k: v for k, v in count.as_dict().items() if k != "by_op"}, indent=2))
    for op, e in sorted(count.by_op.items(), key=lambda kv: -kv[1]["gemm"] - kv[1]["other"]):
        print(f"{op:<28} nodes {e['nodes']:>4}  gemm {e['gemm'] / 1e9:10.3f} GFLOP  other {e['other'] / 1e9:8.3f} "
              f"G  copy {e['copy_bytes'] / 1e6:9.1f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
