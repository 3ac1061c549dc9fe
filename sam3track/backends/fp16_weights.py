"""Weights stored in fp16, computed in fp32 (onnxruntime backend, weights="fp16"): an optimised graph
rewritten so each large float initializer is kept in fp16 and cast to fp32 just before its first use.

ONNX Runtime maps the fp16 file instead of reading fp32 weights into memory, and with its priority-based
execution order each cast's fp32 copy lives only until its consumer has run. Measured on the full-size
backbone (one 1008 px frame, 1 thread): 1,854 -> 78 MB after load, peak 2,343 -> 1,461 MB, the frame
about 20% slower (the casts, and MatMul weights no longer pre-packed); outputs within 7e-4 of fp32
(relative to the largest). The saved graph must be opened with every optimisation off: ONNX Runtime's
constant folding and its FuseFp16InitializerToFp32NodeTransformer would fold the casts back into fp32
weights. docs/speed.md, "Memory at full size".
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

MIN_ELEMENTS = 4096  # smaller tensors (biases, norms, positional tables of tiny graphs) stay fp32
FP16_MAX = 65504.0
SCHEMA = 1  # bump when the rewrite changes: the compile cache keys fp16 entries by it


def convert(model_path: str | Path, out_dir: Path) -> int:
    """Write `model_path` (an ONNX graph, its weights beside it) into out_dir/model.onnx + model.data
    with its large float initializers in fp16 behind Cast nodes. Returns the parameters converted.
    Initializers read inside subgraphs (If, Loop bodies), initializers that are also graph inputs and
    any with a value beyond fp16's range stay fp32."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    with warnings.catch_warnings():  # ONNX Runtime's own keys (pre-packed weights) in the external data
        warnings.simplefilter("ignore", UserWarning)
        model = onnx.load(str(model_path))
    graph = model.graph
    inner = _subgraph_inputs(graph) | {i.name for i in graph.input}  # a graph input's default stays as it is
    first_use: dict[str, int] = {}
    for index, node in enumerate(graph.node):
        for name in node.input:
            first_use.setdefault(name, index)
    casts: dict[int, list] = {}
    converted = 0
    for init in list(graph.initializer):
        if init.data_type != TensorProto.FLOAT or int(np.prod(init.dims)) < MIN_ELEMENTS or init.name in inner \
                or init.name not in first_use:
            continue
        values = numpy_helper.to_array(init)
        if not np.all(np.abs(values) <= FP16_MAX):  # also catches inf and nan
            continue
        stored = numpy_helper.from_array(values.astype(np.float16), init.name + "__fp16")
        graph.initializer.remove(init)
        graph.initializer.append(stored)
        cast = helper.make_node("Cast", [stored.name], [init.name], to=TensorProto.FLOAT, name=init.name + "__to_fp32")
        casts.setdefault(first_use[init.name], []).append(cast)
        converted += values.size
    nodes = list(graph.node)
    del graph.node[:]
    for index, node in enumerate(nodes):  # each cast just before its first consumer
        graph.node.extend(casts.get(index, []))
        graph.node.append(node)
    out_dir.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(out_dir / "model.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
              location="model.data", size_threshold=1024)
    return converted


def _subgraph_inputs(graph) -> set[str]:
    """Every name read by a node inside a subgraph of `graph` (at any depth)."""
    import onnx

    names: set[str] = set()
    for node in graph.node:
        for attribute in node.attribute:
            bodies = [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else list(attribute.graphs)
            for body in bodies:
                for inner in body.node:
                    names.update(inner.input)
                names |= _subgraph_inputs(body)
    return names
