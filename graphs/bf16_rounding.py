"""The bf16 rounding of stored memories in an exported ONNX graph: find it, name it, or swap its form.

The reference stores memories rounded to bfloat16. ``modules.round_to_bfloat16`` writes that rounding
as float32 arithmetic (``s = x * 65537; s - (s - x)``, Veltkamp's split), which every float32 runtime
does exactly, where a Cast to BFLOAT16 rounds ties differently in OpenVINO. The splitter overflows
float16, so a graph that will compute in reduced precision (``--fp16`` export, ATC's fp16 and mixed
modes) gets the Cast form instead: :func:`as_casts`.

onnx only (no torch): om.convert uses it too.
"""

from __future__ import annotations

PREFIX = "bf16_rounding"
SPLITTER = 65537.0  # 2**16 + 1: keeps 24 - 16 = 8 significant bits of a float32


class RoundingError(Exception):
    pass


def name_nodes(proto, graph_name: str) -> list[str]:
    """Give each rounding's nodes fixed names ``bf16_rounding[k]/{splitter,scale,residual,result}``
    and return them. Found as a Mul by the splitter whose output feeds ``s - x`` and ``s - (s - x)``."""
    from onnx import numpy_helper

    graph = proto.graph
    consts = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    constant_nodes = {}
    for n in graph.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            consts[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
            constant_nodes[n.output[0]] = n

    def is_splitter(name: str) -> bool:
        value = consts.get(name)
        return value is not None and value.size == 1 and float(value.reshape(())) == SPLITTER

    consumers: dict[str, list] = {}
    for n in graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    names: list[str] = []
    for k, mul in enumerate([n for n in graph.node if n.op_type == "Mul" and any(is_splitter(i) for i in n.input)]):
        scaled, x = mul.output[0], next(i for i in mul.input if not is_splitter(i))
        subs = [n for n in consumers.get(scaled, []) if n.op_type == "Sub"]
        residual = [n for n in subs if list(n.input) == [scaled, x]]
        result = [n for n in subs if residual and list(n.input) == [scaled, residual[0].output[0]]]
        if len(residual) != 1 or len(result) != 1:
            raise RoundingError(f"graph {graph_name}: a Mul by {SPLITTER} that is not the bf16 rounding "
                                "s - (s - x); the exporter changed how it writes round_to_bfloat16")
        splitter = [constant_nodes[i] for i in mul.input if i in constant_nodes and is_splitter(i)]
        parts = [(n, "splitter") for n in splitter] + [(mul, "scale"), (residual[0], "residual"),
                                                      (result[0], "result")]
        for node, part in parts:
            node.name = f"{PREFIX}{k or ''}/{part}"
            names.append(node.name)
    return names


def as_casts(proto) -> int:
    """Replace each named rounding by Cast to BFLOAT16 and back to FLOAT (the same values in ONNX
    Runtime and torch), in place; returns how many were replaced. Safe for fp16 conversion and ATC's
    reduced-precision modes, where the splitter would be inf."""
    from onnx import TensorProto, helper

    graph = proto.graph
    groups: dict[str, dict] = {}
    for n in graph.node:
        if n.name.startswith(PREFIX) and "/" in n.name:
            prefix, part = n.name.split("/", 1)
            groups.setdefault(prefix, {})[part] = n
    for prefix, parts in groups.items():
        if {"scale", "residual", "result"} - set(parts):
            raise RoundingError(f"{prefix}: nodes {sorted(parts)} of a bf16 rounding, not all four")
        scale, result = parts["scale"], parts["result"]
        x = parts["residual"].input[1]  # residual = scaled - x
        at = list(graph.node).index(scale)
        for n in parts.values():
            graph.node.remove(n)
        to_bf16 = helper.make_node("Cast", [x], [f"{prefix}/bf16"], name=f"{prefix}/to_bf16", to=TensorProto.BFLOAT16)
        back = helper.make_node("Cast", [f"{prefix}/bf16"], [result.output[0]], name=f"{prefix}/to_float",
                                to=TensorProto.FLOAT)
        graph.node.insert(at, back)
        graph.node.insert(at, to_bf16)
    return len(groups)

