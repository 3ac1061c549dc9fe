"""om_manifest.json and the OM bundle's manifest.json, exactly as /work/notes/om-contract.md lays them out."""

from __future__ import annotations

import copy
from pathlib import Path

from sam3track.bundle import file_sha256

from .plan import GraphPlan

FORMAT = "sam3track-om"
VERSION = 1
HIDDEN_INPUT = "ascend_mbatch_shape_data"  # the extra last input of every gear model (ascend.md 1.2)


def graph_entry(plan: GraphPlan, source_file: str, source_sha256: str, onnx_file: str, onnx_sha256: str,
                argv: list[str], script: str, om_file: str | None, risky_ops: dict[str, int],
                check_sizes: dict[str, int]) -> dict:
    varying = set(plan.varying)

    def axes_of(t):
        return [d if isinstance(d, str) else None for d in t.shape]

    inputs = [{"name": t.name, "dtype": t.dtype,
               # gear and range modes both give a varying dim as -1 here; "ranges" holds the bounds
               "shape": [-1 if isinstance(d, str) and d in varying else a for d, a in zip(t.shape, plan.atc_dims(t))],
               "axes": axes_of(t)} for t in plan.inputs]
    if plan.mode in ("dynamic_batch", "dynamic_dims"):
        inputs.append({"name": HIDDEN_INPUT, "hidden": True})
    largest = plan.sizes_at(max)
    outputs = [{"name": t.name, "dtype": t.dtype, "shape": plan.shape_at(t, largest), "axes": axes_of(t)}
               for t in plan.outputs]
    ranges = None
    if plan.ranges is not None:
        ranges = {name: [list(d) if isinstance(d, (tuple, list)) else d for d in dims]
                  for name, dims in plan.ranges.items()}
    return {
        "source": {"file": source_file, "sha256": source_sha256},
        "onnx": {"file": onnx_file, "sha256": onnx_sha256},
        "mode": plan.mode,
        "axes": {a: list(s) for a, s in plan.axes.items()},
        "profiles": plan.profiles(),
        "ranges": ranges,
        "inputs": inputs,
        "outputs": outputs,
        "precision": plan.precision,
        "atc_command": list(argv),
        "atc_script": script,
        "om_file": om_file,
        "risky_ops": dict(sorted(risky_ops.items())),
        "checked_at": check_sizes,  # the sizes the onnxruntime equivalence check of the pre-pass ran at
        "notes": list(plan.notes),  # why the plan is what it is, where a rule narrowed it
    }


def om_manifest(soc: str, cann_version: str | None, source_manifest: Path, graphs: dict[str, dict],
                family: str = "sam3") -> dict:
    return {
        "format": FORMAT,
        "version": VERSION,
        "family": family,  # the source bundle's model family (its manifest.json says the same)
        "soc_version": soc,
        "cann_version": cann_version,
        "compiled": all(g["om_file"] is not None for g in graphs.values()),
        "source_bundle": {"manifest_sha256": file_sha256(source_manifest)},
        "graphs": graphs,
    }


def bundle_manifest(source: dict, root: Path, onnx_files: dict[str, list[str]]) -> dict:
    """The source manifest pointing at the ATC-ready graphs, so onnxruntime can run the OM bundle too.

    ``onnx_files``: graph -> [model file, *external data files], relative to ``root``.
    """
    manifest = copy.deepcopy(source)
    for name, files in onnx_files.items():
        entry = manifest["graphs"][name]
        entry["file"] = files[0]
        entry["data_files"] = files[1:]
        entry["sha256"] = {f: file_sha256(root / f) for f in files}
        entry["bytes"] = sum((root / f).stat().st_size for f in files)
    return manifest
