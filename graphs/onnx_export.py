"""The ONNX export machinery every model family shares: trace one graph wrapper to ONNX (fused or plain
attention, fp16 or int8 where asked, the memories' bf16 rounding named), and publish a finished bundle.

graphs/sam3/ and graphs/sam31/ call it; neither imports the other for it.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

from sam3track.atomic_files import replace_directory
from sam3track.bundle import file_sha256

OPSET = 17
EXTERNAL_DATA_THRESHOLD = 1_800_000_000  # protobuf caps one file at 2 GiB


class CheckpointError(Exception):
    """The checkpoint directory cannot be exported; the message says which file and what to do."""


# what `pip install -e '.[export]'` adds: a missing one is one line naming the extra, not a traceback
EXPORT_DEPENDENCIES = ("torch", "transformers", "safetensors", "onnxscript")


def missing_dependency_message(exc: ModuleNotFoundError) -> str | None:
    """The message for an export dependency that is not installed; None for any other missing module."""
    name = (exc.name or "").split(".")[0]
    if name not in EXPORT_DEPENDENCIES:
        return None
    return (f"{name} is not installed; exporting needs the export extra: pip install -e '.[export]' in a "
            "sam3track checkout (or pip install 'sam3track[export]')")


class ExportError(Exception):
    """An export asked for something it cannot do: the message names the flag or path and what to do."""


def command(run: Callable[[list[str] | None], int]) -> Callable[[list[str] | None], int]:
    """A graphs command line (python -m graphs.export, graphs.check): a missing export dependency is one
    error line and exit 2, not a traceback."""
    @functools.wraps(run)
    def main(argv: list[str] | None = None) -> int:
        try:
            return run(argv)
        except ModuleNotFoundError as exc:
            message = missing_dependency_message(exc)
            if message is None:
                raise
            print(f"error: {message}", file=sys.stderr)
            return 2

    return main


def check_destination(out: Path, overwrite: bool, attention: str) -> None:
    """Every family's first checks: the bundle folder is free (or --overwrite) and the attention mode known."""
    from .ops import ATTENTION_MODES

    if out.exists() and not overwrite:
        raise ExportError(f"{out} already exists; pass --overwrite to replace it or choose another --out")
    if attention not in ATTENTION_MODES:
        raise ExportError(f"--attention {attention!r}: choose from {', '.join(ATTENTION_MODES)}")


def staging_dir(out: Path) -> Path:
    """A private sibling folder the bundle is built in; publish_bundle renames it into place."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    except OSError as exc:
        raise ExportError(f"cannot write the bundle to {out.parent}: {exc.strerror}; choose a writable --out")


class BundleBuild:
    """One bundle being built: its staging folder, removed if the build fails; `publish` records the
    exporter and renames the folder into place (publish_bundle)."""

    def __init__(self, out: Path, attention: str, log=print, started: float | None = None):
        self.out, self.attention, self.log = out, attention, log
        self.started = time.perf_counter() if started is None else started
        self.staging = staging_dir(out)

    def __enter__(self) -> "BundleBuild":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is not None:
            shutil.rmtree(self.staging, ignore_errors=True)
        return False

    def publish(self, manifest: dict) -> None:
        manifest["exporter"] = exporter_record(self.attention, self.started)
        publish_bundle(self.staging, manifest, self.out)
        self.log(f"bundle written to {self.out}")


def precision_of(name: str, fp16, int8) -> str:
    return "fp16" if name in fp16 else "int8" if name in int8 else "fp32"


def exporter_record(attention: str, started: float) -> dict:
    """The manifest's "exporter": library versions, opset, attention mode and the export's seconds."""
    import onnx
    import torch
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__, "onnx": onnx.__version__,
            "opset": OPSET, "attention": attention, "export_seconds": round(time.perf_counter() - started, 1)}


def export_module(module, spec, inputs: dict, out_dir: Path, precision: str = "fp32", attention: str = "fused") -> dict:
    """Export ``module`` (a graph wrapper) traced on ``inputs`` as ``spec`` describes it to
    ``out_dir/<spec.name>.onnx``; returns the graph's manifest entry."""
    import onnx
    import torch

    from . import bf16_rounding
    from .ops import transformers_attention

    name = spec.name
    module = module.eval()
    if hasattr(module, "attention_mode"):
        module.attention_mode = attention
    args = tuple(inputs[t.name] for t in spec.inputs)
    path = out_dir / f"{name}.onnx"
    layers = attention
    with torch.no_grad(), warnings.catch_warnings(), transformers_attention(module, layers):
        warnings.simplefilter("ignore")  # tracer warnings about Python control flow on fixed sizes
        torch.onnx.export(
            module, args, str(path), input_names=[t.name for t in spec.inputs],
            output_names=[t.name for t in spec.outputs], dynamic_axes=spec.dynamic_axes,
            opset_version=OPSET, dynamo=False, do_constant_folding=True,
            custom_opsets={"com.microsoft": 1} if layers == "fused" else None,
        )
    proto = onnx.load(str(path))
    _deduplicate_constants(proto)
    if layers == "plain":  # the standard-op export is for ATC: the forms it parses (graphs/onnx_rewrites.py)
        from .onnx_rewrites import einsum_as_matmul, fold_shape_only_ifs

        fold_shape_only_ifs(proto)
        einsum_as_matmul(proto)
    try:
        rounding = bf16_rounding.name_nodes(proto, name)
    except bf16_rounding.RoundingError as e:
        raise ExportError(str(e)) from None
    if precision == "fp16":
        from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16

        # Inputs and outputs stay float32 so the runtime binds the same buffers for either precision;
        # the fused attention op keeps float32 too (its padding logit and softmax want the range);
        # the bf16 rounding's splitter is inf in float16, so it becomes Casts (graphs/bf16_rounding.py).
        bf16_rounding.as_casts(proto)
        proto = convert_float_to_float16(proto, keep_io_types=True,
                                         op_block_list=DEFAULT_OP_BLOCK_LIST + ["MultiHeadAttention"])
    elif precision == "int8":
        proto = _quantize_int8(proto, out_dir)
    data_files = []
    if proto.ByteSize() > EXTERNAL_DATA_THRESHOLD or (out_dir / f"{name}.onnx.data").exists():
        data_name = f"{name}.onnx.data"
        onnx.save_model(proto, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=data_name, size_threshold=1024)
        data_files.append(data_name)
    else:
        onnx.save_model(proto, str(path))
    bound = {i.name for i in proto.graph.input}
    missing = [t.name for t in spec.inputs if t.name not in bound]
    if missing:
        raise ExportError(f"graph {name}: inputs {missing} were pruned by the exporter; they are unused")

    def tensors(items):
        return [{"name": t.name, "dtype": t.dtype, "shape": list(t.shape)} for t in items]

    files = [path.name] + data_files
    return {
        "file": path.name,
        "data_files": data_files,
        "sha256": {f: file_sha256(out_dir / f) for f in files},
        "bytes": sum((out_dir / f).stat().st_size for f in files),
        "precision": precision,
        # "fused" where the graph runs ONNX Runtime's fused attention op (which ATC cannot parse), else "plain"
        "attention": "fused" if any(n.domain == "com.microsoft" for n in proto.graph.node) else "plain",
        # the nodes of the memories' bf16 rounding (graphs/bf16_rounding.py), float32 arithmetic
        "bf16_rounding": rounding if precision != "fp16" else [],
        "inputs": tensors(spec.inputs),
        "outputs": tensors(spec.outputs),
    }


def _quantize_int8(proto, work_dir: Path):
    """ONNX Runtime dynamic quantisation of the MatMuls with constant weights: int8 weights (per
    tensor), activations quantised per call (uint8), float32 everywhere else. Inputs and outputs keep
    their types, so the runtime cannot tell. Where it pays and what it costs in fidelity is measured by
    ``python -m benchmarks.run`` (the README's table)."""
    import logging

    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory(dir=work_dir) as tmp:
        src, dst = Path(tmp) / "fp32.onnx", Path(tmp) / "int8.onnx"
        large = proto.ByteSize() > EXTERNAL_DATA_THRESHOLD
        onnx.save_model(proto, str(src), save_as_external_data=large)
        logging.disable(logging.WARNING)  # its advice to run a pre-processing pass is for static quantisation
        try:
            quantize_dynamic(src, dst, op_types_to_quantize=["MatMul"], weight_type=QuantType.QInt8,
                             use_external_data_format=large, extra_options={"MatMulConstBOnly": True})
        finally:
            logging.disable(logging.NOTSET)
        return onnx.load(str(dst))


def _deduplicate_constants(proto) -> int:
    """Keep one copy of each constant tensor (Constant nodes and initializers alike).

    Constant folding materialises a value once per consumer: the propagation decoder's RoPE tables
    came out 5 times each (145 MB of 186 MB at full size). Returns the bytes saved.
    """
    import hashlib

    from onnx import numpy_helper

    graph = proto.graph
    outputs = {o.name for o in graph.output}
    canonical: dict[tuple, str] = {}
    rename: dict[str, str] = {}
    saved = 0

    def key(tensor):
        array = numpy_helper.to_array(tensor)
        return (array.dtype.str, array.shape, hashlib.sha256(array.tobytes()).hexdigest()), array.nbytes

    kept_inits = []
    for init in graph.initializer:
        k, nbytes = key(init)
        if k in canonical and init.name not in outputs:
            rename[init.name] = canonical[k]
            saved += nbytes
        else:
            canonical.setdefault(k, init.name)
            kept_inits.append(init)
    kept_nodes = []
    for node in graph.node:
        value = next((a.t for a in node.attribute if a.name == "value"), None) if node.op_type == "Constant" else None
        if value is not None and node.output[0] not in outputs:
            k, nbytes = key(value)
            if k in canonical:
                rename[node.output[0]] = canonical[k]
                saved += nbytes
                continue
            canonical[k] = node.output[0]
        kept_nodes.append(node)
    if rename:
        for node in kept_nodes:
            for i, name in enumerate(node.input):
                if name in rename:
                    node.input[i] = rename[name]
        del graph.initializer[:]
        graph.initializer.extend(kept_inits)
        del graph.node[:]
        graph.node.extend(kept_nodes)
    return saved


def publish_bundle(staging: Path, manifest: dict, out: Path) -> None:
    """The last step of every family's export: the manifest written last, ordinary permissions, and
    the staging directory renamed into place (with --overwrite the old bundle goes only once the new
    one is complete)."""
    (staging / "manifest.json").write_text(json.dumps(manifest, indent=2))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(staging, 0o777 & ~umask)  # mkdtemp creates it private; a bundle is an ordinary directory
    for file in staging.rglob("*"):  # onnx writes external data files private too
        if file.is_file():
            os.chmod(file, 0o666 & ~umask)
    replace_directory(staging, out)
