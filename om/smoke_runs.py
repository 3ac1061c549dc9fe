"""What python -m om.smoke measures (om/smoke.py runs them and writes the report): each OM model's desc
next to what om_manifest.json (and so the emulator) expects, every graph at every compiled gear against
ONNX Runtime on the same ONNX, and a tracking clip against ONNX Runtime. docs/ascend.md, "The smoke kit".
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import numpy as np

from .plan import GraphPlan, TensorPlan

# A graph at origin precision must agree with ONNX Runtime as graphs.check's fp32 rule (graphs/comparison.py);
# at a reduced precision the error is reported, not judged.
FP32_REL = 1e-4


def _desc_io(acl, desc: int, count: int, kind: str) -> list[dict]:
    get = {"input": (acl.mdl.get_input_name_by_index, acl.mdl.get_input_dims, acl.mdl.get_input_data_type,
                     acl.mdl.get_input_format, acl.mdl.get_input_size_by_index),
           "output": (acl.mdl.get_output_name_by_index, acl.mdl.get_output_dims, acl.mdl.get_output_data_type,
                      acl.mdl.get_output_format, acl.mdl.get_output_size_by_index)}[kind]
    rows = []
    for i in range(count):
        dims, ret = get[1](desc, i)
        rows.append({"index": i, "name": get[0](desc, i), "dims": list(dims["dims"]) if ret == 0 else f"error {ret}",
                     "dtype": get[2](desc, i), "format": get[3](desc, i), "bytes": get[4](desc, i)})
    return rows


def _desc_gears(acl, desc: int) -> dict:
    batch, ret = acl.mdl.get_dynamic_batch(desc)
    count, ret_count = acl.mdl.get_input_dynamic_gear_count(desc, -1)
    dims = []
    if ret_count == 0 and count:
        entries, ret_dims = acl.mdl.get_input_dynamic_dims(desc, -1, count)
        dims = [list(e["dims"]) for e in entries] if ret_dims == 0 else f"error {ret_dims}"
    return {"batch": list(batch["batch"]) if ret == 0 else f"error {ret}", "dims_gear_count": count, "dims": dims}


def describe(acl, om_path: Path) -> dict:
    """The OM model's desc as pyacl reports it, unchecked (a current context is needed)."""
    model, ret = acl.mdl.load_from_file(str(om_path))
    if ret != 0:
        return {"error": f"acl.mdl.load_from_file {ret}: {acl.get_recent_err_msg()}"}
    desc = acl.mdl.create_desc()
    try:
        ret = acl.mdl.get_desc(desc, model)
        if ret != 0:
            return {"error": f"acl.mdl.get_desc {ret}: {acl.get_recent_err_msg()}"}
        return {"inputs": _desc_io(acl, desc, acl.mdl.get_num_inputs(desc), "input"),
                "outputs": _desc_io(acl, desc, acl.mdl.get_num_outputs(desc), "output"),
                "gears": _desc_gears(acl, desc)}
    finally:
        acl.mdl.destroy_desc(desc)
        acl.mdl.unload(model)


def expected(entry: dict) -> dict:
    """What om_manifest.json says the OM holds (the fake atc writes exactly this, the emulator reports it)."""
    return {"inputs": [t["name"] if t.get("hidden") else (t["name"], t["dtype"], t["shape"]) for t in entry["inputs"]],
            "outputs": [(t["name"], t["dtype"], t["shape"]) for t in entry["outputs"]],
            "mode": entry["mode"], "profiles": entry.get("profiles")}


def compare_desc(got: dict, want: dict) -> list[str]:
    """Where the desc differs from the manifest: names (by the tensor part), input order, counts."""
    if "error" in got:
        return [got["error"]]
    issues = []
    names = [i["name"] for i in got["inputs"]]
    want_names = [t if isinstance(t, str) else t[0] for t in want["inputs"]]
    if names != want_names:
        issues.append(f"inputs {names} != manifest {want_names}")
    outs = [o["name"].split(":")[-1] for o in got["outputs"]]
    want_outs = [o[0] for o in want["outputs"]]
    if outs != want_outs:
        issues.append(f"outputs {[o['name'] for o in got['outputs']]} (tensor part) != manifest {want_outs}")
    if want["mode"] == "dynamic_dims" and got["gears"]["dims_gear_count"] < len(want["profiles"] or ()):
        issues.append(f"{got['gears']['dims_gear_count']} dims gears < {len(want['profiles'])} planned")
    return issues


def _plan(name: str, entry: dict) -> GraphPlan:
    def tensors(items):
        return tuple(TensorPlan(t["name"], t["dtype"], tuple(t["shape"])) for t in items)

    return GraphPlan(name, tensors(entry["inputs"]), tensors(entry["outputs"]), {})


def run_gears(backend, graph, name: str, entry: dict, om_entry: dict, onnx_path: Path, manifest: dict,
              repeats: int) -> list[dict]:
    """The graph at every compiled gear on seeded inputs (om.prepass.sample_inputs) against ONNX Runtime
    on the OM bundle's ATC-ready ONNX: max abs / relative error per output, median seconds per run."""
    import onnxruntime as ort

    from graphs.comparison import relative_error

    from .prepass import sample_inputs

    plan = _plan(name, entry)
    fixed = {a: int(s[0]) for a, s in om_entry["axes"].items()}
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
    rows = []
    for k, gear in enumerate(graph.gears):
        sizes = {**fixed, **gear.sizes}
        inputs = sample_inputs(plan, sizes, manifest, seed=k)
        want = dict(zip([o.name for o in session.get_outputs()], session.run(None, inputs)))
        seconds = []
        for _ in range(max(1, repeats)):
            started = time.perf_counter()
            out = backend.run(graph, inputs)
            got = {o: backend.to_host(t) for o, t in out.items()}  # a run ends with its results on the host
            seconds.append(time.perf_counter() - started)
        errors = {o: relative_error(got[o], ref) for o, ref in want.items()}
        rows.append({"gear": gear.sizes, "seconds": statistics.median(seconds),
                     "outputs": {o: {"max_abs": e[0], "rel": e[1]} for o, e in errors.items()},
                     "worst_rel": max((e[1] for e in errors.values()), default=0.0)})
    return rows


def track_clip(source: Path, om_bundle: Path, frames: np.ndarray, prompts: list[str], **options) -> dict:
    """The clip tracked from frame 0 with text prompts on ONNX Runtime (source bundle) and on acl (OM
    bundle): ids per frame and mask IoU per object, as tests/test_acl_parity.py compares them.
    ``options``: sam3track.load options for both runs (e.g. new_det_thresh)."""
    import sam3track

    def run(bundle, **where):
        with sam3track.load(bundle, **options, **where) as predictor:
            session = predictor.start_session(frames)
            for prompt in prompts:
                session.add_prompt(frame_index=0, text=prompt)
            started = time.perf_counter()
            results = list(session.propagate())
            seconds = time.perf_counter() - started
            session.close()
        return results, seconds

    want, ort_seconds = run(source)
    got, acl_seconds = run(om_bundle, backend="acl", device="npu:0")
    same_ids, ious = 0, []
    for a, b in zip(want, got):
        same_ids += a.object_ids.tolist() == b.object_ids.tolist()
        if a.object_ids.tolist() == b.object_ids.tolist():
            for m, n in zip(a.masks, b.masks):
                union = np.logical_or(m, n).sum()
                ious.append(1.0 if union == 0 else float(np.logical_and(m, n).sum() / union))
    return {"frames": len(frames), "prompts": list(prompts), "frames_with_same_ids": same_ids,
            "objects_on_frame_0": int(want[0].object_ids.size) if want else 0,
            "iou_mean": float(np.mean(ious)) if ious else None, "iou_min": float(min(ious)) if ious else None,
            "seconds": {"onnxruntime": ort_seconds, "acl": acl_seconds}}
