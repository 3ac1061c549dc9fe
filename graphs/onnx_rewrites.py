"""ONNX rewrites an export applies for ATC (--attention plain), each into standard ops ATC parses
(om/onnx_ops.py): graphs.check then compares the rewritten graph with the torch module, as every graph.

- Einsum "bqc,bchw->bqhw" (the mask decoders' mask embedding product) is not one of the equations ATC's
  Einsum supports: it becomes Reshape + MatMul + Reshape.
- If nodes whose condition is computed from constants and shapes only (the backbone's position
  embedding interpolation guards) are replaced by the branch the exported sizes take; with any
  varying axis in the condition the node stays (a gear ATC compiles may take the other branch).
"""

from __future__ import annotations

import re

import numpy as np


def canonical_equation(equation: str) -> str:
    """An einsum equation with its letters renamed a, b, c, ... in order of first appearance."""
    names: dict[str, str] = {}
    return re.sub(r"[A-Za-z]", lambda m: names.setdefault(m.group(0), chr(ord("a") + len(names))),
                  equation.replace(" ", ""))


def einsum_as_matmul(proto) -> int:
    """Rewrite every Einsum "bqc,bchw->bqhw" (any letters of that form) in place; returns how many."""
    from onnx import helper

    graph, count = proto.graph, 0
    nodes = []
    for node in graph.node:
        equation = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "equation"), b"")
        equation = equation.decode() if isinstance(equation, bytes) else equation
        if node.op_type != "Einsum" or canonical_equation(equation) != "abc,acde->abde":
            nodes.append(node)
            continue
        count += 1
        nodes.extend(_bqc_bchw(node, graph, f"{node.name or 'einsum'}/as_matmul"))
    del graph.node[:]
    graph.node.extend(nodes)
    return count


def _bqc_bchw(node, graph, prefix: str) -> list:
    """q [b, q, c] x m [b, c, h, w] -> [b, q, h, w] as MatMul(q, m as [b, c, h*w]) reshaped back: one batched
    product over c, the reduction einsum does."""
    from onnx import TensorProto, helper

    q, m = node.input
    out = node.output[0]

    def const(name, values):
        graph.initializer.append(helper.make_tensor(f"{prefix}/{name}", TensorProto.INT64, [len(values)], values))
        return f"{prefix}/{name}"

    flat, hw = const("flat", [0, 0, -1]), const("hw_start", [2])
    end, zero, two = const("hw_end", [4]), const("zero", [0]), const("two", [2])
    return [
        helper.make_node("Reshape", [m, flat], [f"{prefix}/m_flat"], name=f"{prefix}/reshape_m"),
        helper.make_node("MatMul", [q, f"{prefix}/m_flat"], [f"{prefix}/product"], name=f"{prefix}/matmul"),
        helper.make_node("Shape", [q], [f"{prefix}/q_shape"], name=f"{prefix}/q_shape"),
        helper.make_node("Slice", [f"{prefix}/q_shape", zero, two], [f"{prefix}/bq"], name=f"{prefix}/bq"),
        helper.make_node("Shape", [m], [f"{prefix}/m_shape"], name=f"{prefix}/m_shape"),
        helper.make_node("Slice", [f"{prefix}/m_shape", hw, end], [f"{prefix}/hw"], name=f"{prefix}/hw"),
        helper.make_node("Concat", [f"{prefix}/bq", f"{prefix}/hw"], [f"{prefix}/out_shape"], axis=0,
                         name=f"{prefix}/out_shape"),
        helper.make_node("Reshape", [f"{prefix}/product", f"{prefix}/out_shape"], [out], name=f"{prefix}/reshape_out"),
    ]


def fold_shape_only_ifs(proto) -> int:
    """Replace each top-level If whose condition is computed from constants and the fixed dims of
    shapes only (no input value, no symbolic axis: _varies) by the branch it takes; returns how many.
    The condition is evaluated with onnxruntime, inputs as zeros (only their shapes reach it)."""
    graph = proto.graph
    varies = _Provenance(proto)
    candidates = [n for n in graph.node if n.op_type == "If" and not varies(n.input[0])]
    if not candidates:
        return 0
    values = _evaluate(proto, [n.input[0] for n in candidates], 1)
    taken = {id(n): "then_branch" if bool(np.asarray(values[n.input[0]]).reshape(-1)[0]) else "else_branch"
             for n in candidates}
    nodes = []
    for node in graph.node:
        if id(node) in taken:
            nodes.extend(_inline(node, next(a.g for a in node.attribute if a.name == taken[id(node)])))
        else:
            nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    return len(taken)


class _Provenance:
    """Which tensors may differ between runs of the exported graph: those reading an input's values,
    and those reading a symbolic (dim_param) dim through Shape. Element-wise for the 1-D shape
    tensors Shape, Gather and Slice make with constant indices (a fixed dim picked out of a shape with
    a symbolic batch dim does not vary); any other op varies when any of its inputs does."""

    def __init__(self, proto):
        import onnx

        inferred = onnx.shape_inference.infer_shapes(proto)
        self.dims = {vi.name: [d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim]
                     for vi in list(inferred.graph.input) + list(inferred.graph.value_info) + list(inferred.graph.output)}
        self.consts = {i.name: onnx.numpy_helper.to_array(i) for i in proto.graph.initializer}
        for node in proto.graph.node:
            if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
                self.consts[node.output[0]] = onnx.numpy_helper.to_array(node.attribute[0].t)
        self.producers = {o: n for n in proto.graph.node for o in n.output}
        self.memo: dict[str, object] = {}

    def __call__(self, tensor: str) -> bool:
        return bool(self.elements(tensor))

    def elements(self, name: str):
        """True (every element may vary), a set of the element indices that may vary, or empty."""
        if not name or name in self.consts:
            return set()
        if name not in self.memo:
            self.memo[name] = True  # graph inputs (their values) and cycles
            node = self.producers.get(name)
            if node is not None:
                self.memo[name] = self._node(node)
        return self.memo[name]

    def _node(self, node):
        if node.op_type == "Shape":
            dims = self.dims.get(node.input[0])
            return True if dims is None else {i for i, d in enumerate(dims) if d is None}
        if node.op_type in ("Gather", "Slice") and all(i in self.consts for i in node.input[1:] if i):
            source = self.elements(node.input[0])
            if source is True or not source:
                return source
            shape = self.dims.get(node.input[0])
            if not shape or len(shape) != 1 or shape[0] is None:  # only 1-D tensors of known length
                return True
            picked = _picked(node, self.consts, shape[0])
            return True if picked is None else {k for k, i in enumerate(picked) if i in source}
        if node.op_type == "Size":  # the element count: it varies only with a symbolic dim
            dims = self.dims.get(node.input[0])
            return True if dims is None or None in dims else set()
        if node.op_type in ("If", "Loop", "Scan") or "Random" in node.op_type:
            return True
        return True if any(self.elements(i) for i in node.input) else set()


def _picked(node, consts, length: int) -> list[int] | None:
    """The source indices a Gather (axis 0) or Slice (axis 0, constant bounds) of a 1-D tensor takes."""
    from onnx import helper

    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if node.op_type == "Gather":
        if attrs.get("axis", 0) != 0:
            return None
        return [int(i) % length for i in np.asarray(consts[node.input[1]]).reshape(-1)]
    starts, ends = (np.asarray(consts[node.input[k]]).reshape(-1) for k in (1, 2))
    axes = np.asarray(consts[node.input[3]]).reshape(-1) if len(node.input) > 3 and node.input[3] else [0]
    steps = np.asarray(consts[node.input[4]]).reshape(-1) if len(node.input) > 4 and node.input[4] else [1]
    if list(axes) != [0]:
        return None
    return list(range(length))[slice(int(starts[0]), int(ends[0]), int(steps[0]))]


def _evaluate(proto, tensors: list[str], size: int) -> dict:
    """The values of the bool ``tensors`` (If conditions) with every graph input zeros at its exported
    shape, symbolic axes at ``size``."""
    import onnx
    import onnxruntime as ort
    from onnx import helper

    model = onnx.ModelProto()
    model.CopyFrom(proto)
    del model.graph.output[:]
    model.graph.output.extend(helper.make_tensor_value_info(t, onnx.TensorProto.BOOL, None) for t in tensors)
    inits = {i.name for i in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        dims = [d.dim_value if d.HasField("dim_value") else size for d in vi.type.tensor_type.shape.dim]
        feeds[vi.name] = np.zeros(dims, helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type))
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return dict(zip(tensors, session.run(tensors, feeds)))


def _inline(node, branch) -> list:
    """The branch's nodes, its outputs renamed to the If's outputs (Identity where a branch output is
    a value from outside), and its initializers as Constants."""
    from onnx import helper

    rename = {b.name: o for b, o in zip(branch.output, node.output)}  # outputs keep the If's names
    nodes = [helper.make_node("Constant", [], [rename.get(t.name, t.name)], value=t, name=f"{node.name}/{t.name}")
             for t in branch.initializer]
    produced = set()
    for inner in branch.node:
        copy = helper.make_node(inner.op_type, [rename.get(i, i) for i in inner.input],
                                [rename.get(o, o) for o in inner.output],
                                name=f"{node.name}/{inner.name}", domain=inner.domain)
        copy.attribute.extend(inner.attribute)
        nodes.append(copy)
        produced.update(inner.output)
    for out, target in rename.items():
        if out not in produced and out not in {t.name for t in branch.initializer}:
            nodes.append(helper.make_node("Identity", [out], [target], name=f"{node.name}/{out}/pass"))
    return nodes
