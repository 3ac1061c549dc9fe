"""Export the SAM 3.1 tracker graphs and check them in ONNX Runtime against Meta's recorded modules.

    export_tracker_graphs(state_dict, out_dir, attention="fused" | "plain") -> manifest graph entries
    check_<graph>(bundle_or_onnx_dir, dumps) -> [graphs.check.Row]     (the graph registry calls these)

``dumps`` is the folder of reference/sam31/dump_modules.py (``graphs.sam31.reference.Reference.modules()``).
How its cases are fed, the criteria and the checks beyond the dumps: docs/sam31.md, "Checks and the
reference".
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from ..comparison import BF16_CRITERION, FP32_TOL, Row, relative_error, within_one_bf16_step
from . import tracker_specs
from .tracker_feeds import (interactive_feeds, memory_encoder_feeds, pad_propagation, propagation_feeds,
                            single_bucket_feeds)

NO_OBJ = -1024.0
PAD_TEST_EXTRA = (3, 2)  # extra padded memory and pointer entries in the padding-invariance cases


# ------------------------------------------------------------------------------------------ export
def export_tracker_graphs(state_dict: dict, out_dir, attention: str = "fused", image_size: int | None = None,
                          graphs=tracker_specs.GRAPHS, log=None) -> dict[str, dict]:
    """Write ``<graph>.onnx`` for each tracker graph into out_dir; return {name: manifest entry} in the
    SAM 3 manifest's graph-entry format (file, sha256, bytes, precision, attention, bf16_rounding, inputs,
    outputs). image_size (14F) defaults to the one the detector ViT's RoPE tables imply."""
    import torch

    from . import tracker

    grid = image_size // tracker.BACKBONE_STRIDE if image_size else tracker.grid_from_state_dict(state_dict)
    if grid is None:
        raise tracker.MappingError("the state dict has no detector ViT RoPE tables to size the grid from; "
                                   "pass image_size")
    trk = tracker.Sam31Tracker.from_state_dict(state_dict, grid)
    dims = tracker_specs.TrackerDims.from_tracker(trk)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    entries = {}
    with torch.no_grad():
        for name in graphs:
            t = time.perf_counter()
            entries[name] = export_graph(trk, dims, name, out_dir, attention)
            if log:
                log(f"{name}: {time.perf_counter() - t:.1f} s, {entries[name]['bytes'] / 1e6:.1f} MB")
    return entries


def export_graph(trk, dims, name: str, out_dir: Path, attention: str) -> dict:
    """One tracker graph through graphs.onnx_export.export_module (the exporter every family shares)."""
    from ..onnx_export import export_module
    from ..ops import ATTENTION_MODES

    if attention not in ATTENTION_MODES:
        raise ValueError(f"attention must be one of {ATTENTION_MODES}, got {attention!r}")
    spec = tracker_specs.graph_specs(dims)[name]
    module = spec.module(trk)
    inputs = tracker_specs.sample_inputs(spec, dims, tracker_specs.trace_sizes(dims))
    try:
        return export_module(module, spec, inputs, out_dir, attention=attention)
    finally:
        module.attention_mode = "plain"  # the torch checks run the wrappers in plain attention


# ------------------------------------------------------------------------------------------ running
class GraphRunner:
    """ONNX Runtime session of one graph of a bundle (manifest.json) or of a folder of <graph>.onnx."""

    def __init__(self, bundle_or_onnx_dir, name: str, patch=None):
        import onnx
        import onnxruntime as ort

        folder = Path(bundle_or_onnx_dir)
        manifest = folder / "manifest.json"
        if manifest.is_file():
            file = json.loads(manifest.read_text())["graphs"][name]["file"]
        else:
            file = f"{name}.onnx"
        self.path = folder / file
        if not self.path.is_file():
            raise FileNotFoundError(f"{self.path} not found (export the tracker graphs first)")
        source = str(self.path)
        if patch is not None:  # a changed copy of the graph, in memory
            proto = onnx.load(source)
            patch(proto)
            source = proto.SerializeToString()
        options = ort.SessionOptions()
        options.intra_op_num_threads = 2
        self.session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
        self.inputs = {i.name: i for i in self.session.get_inputs()}
        self.outputs = [o.name for o in self.session.get_outputs()]
        self.name = name

    def static_shapes(self) -> dict[str, tuple]:
        return {k: tuple(d if isinstance(d, int) else -1 for d in v.shape) for k, v in self.inputs.items()}

    def __call__(self, feeds: dict) -> dict[str, np.ndarray]:
        types = {"tensor(float)": np.float32, "tensor(int32)": np.int32}
        cast = {k: np.ascontiguousarray(v, dtype=types[self.inputs[k].type]) for k, v in feeds.items()}
        return dict(zip(self.outputs, self.session.run(None, cast)))


def _compare(rows, graph, case, names, got: dict, ref: dict, bf16=(), masks=None):
    """One Row per output name; ``masks``: {name: bool array of the elements to compare} (e.g. real slots)."""
    for name in names:
        g, r = np.asarray(got[name], np.float32), np.asarray(ref[name], np.float32)
        if g.shape != r.shape:
            rows.append(Row(graph, case, name, float("inf"), float("inf"), 0.0, f"FAIL shape {g.shape} != {r.shape}"))
            continue
        if masks and name in masks:
            g, r = g[masks[name]], r[masks[name]]
        max_abs, rel = relative_error(g, r)
        if name in bf16:
            ok = within_one_bf16_step(g, r)
            rows.append(Row(graph, case, name, max_abs, rel, None, "" if ok else "beyond one bf16 step",
                            criterion=BF16_CRITERION, criterion_met=ok))
        else:
            rows.append(Row(graph, case, name, max_abs, rel, FP32_TOL))


def _dump(dumps, case: str) -> dict:
    path = Path(dumps) / f"{case}.npz"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: the module dumps lack case {case!r} (reference/sam31/dump_modules.py "
                                "of this checkout makes it; python -m graphs.sam31.reference --modules)")
    index = json.loads((Path(dumps) / "index.json").read_text())["cases"][case]
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    for k, v in index["values"].items():  # same_as references and plain values
        arrays[k] = arrays[v["same_as"]] if isinstance(v, dict) and "same_as" in v else v
    return arrays


def _cases(dumps, prefix: str) -> list[str]:
    index = json.loads((Path(dumps) / "index.json").read_text())["cases"]
    return sorted(c for c in index if c.startswith(prefix))


# ------------------------------------------------------------------------------- propagation
PROPAGATION_OUTPUTS = ("low_res_masks", "iou_scores", "object_score_logits", "object_pointer")


def _shift_obj_score_bias(shift: float):
    """An ONNX patch adding ``shift`` to the multiplex decoder's object-score output bias (the dump's
    B2_absent case shifts the same parameter of Meta's model), by the parameter's initializer name."""
    def patch(proto):
        from onnx import numpy_helper

        name = "trk.mask_decoder.obj_score_head.proj_out.bias"
        for init in proto.graph.initializer:
            if init.name == name:
                init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) + np.float32(shift), name))
                return
        raise KeyError(f"initializer {name} not in the graph: cannot apply the object-score bias shift")
    return patch


def check_propagation_decoder(bundle_or_onnx_dir, dumps) -> list[Row]:
    rows: list[Row] = []
    run = GraphRunner(bundle_or_onnx_dir, "propagation_decoder")
    grid = run.static_shapes()["tracker_feat"][2]
    for case in _cases(dumps, "propagation_step_"):
        z = _dump(dumps, case)
        feeds, ref, masks, (n, p) = propagation_feeds(z, grid)
        shift = float(z.get("in/obj_score_bias_shift", 0.0))
        runner = run if shift == 0.0 else GraphRunner(bundle_or_onnx_dir, "propagation_decoder",
                                                      patch=_shift_obj_score_bias(shift))
        label = f"{case.removeprefix('propagation_step_')} K={n} P={p}"
        _compare(rows, "propagation_decoder", label, PROPAGATION_OUTPUTS, runner(feeds), ref, masks=masks)
        # the same call with padding: 3 more memory entries and 2 more pointer entries per bucket, pointing
        # at pool rows that hold real data (and junk slots / offsets), all marked invalid
        _compare(rows, "propagation_decoder", f"{label} +padding", PROPAGATION_OUTPUTS,
                 runner(pad_propagation(feeds, *PAD_TEST_EXTRA)), ref, masks=masks)
    rows += check_propagation_batching(run)
    return rows


def check_propagation_batching(run: GraphRunner, buckets: int = 5, memories: int = 4, pointers: int = 6) -> list[Row]:
    """5 buckets with mixed memory / pointer counts and holes in one call against each bucket alone with
    its padding removed (beyond the dumps' sizes; also padding invariance at these sizes)."""
    import torch

    dims = tracker_specs.TrackerDims.from_inputs(run.static_shapes())
    spec = tracker_specs.graph_specs(dims)["propagation_decoder"]
    sizes = dict(buckets=buckets, memories=memories, pointers=pointers, memory_rows=3 * memories,
                 image_rows=memories + 2, pointer_rows=3 * pointers)
    with torch.no_grad():
        feeds = {k: v.numpy() for k, v in tracker_specs.sample_inputs(spec, dims, sizes, seed=5).items()}
    feeds["tracker_feat_s0"] = feeds["tracker_feat_s0"] * 0.5  # unit-scale neck levels, as conv_s0/s1 give
    together = run(feeds)
    rows: list[Row] = []
    alone = [run(single_bucket_feeds(feeds, i, trim=True)) for i in range(buckets)]
    ref = {k: np.concatenate([a[k] for a in alone]) for k in PROPAGATION_OUTPUTS}
    valid = feeds["slot_valid"] > 0.5
    masks = {"low_res_masks": np.broadcast_to(valid[:, :, None, None, None], together["low_res_masks"].shape),
             "iou_scores": np.broadcast_to(valid[:, :, None], together["iou_scores"].shape),
             "object_score_logits": valid[:, :, None]}
    counts = ",".join(f"{int(feeds['memory_valid'][i].sum())}/{int(feeds['pointer_valid'][i].sum())}"
                      for i in range(buckets))
    _compare(rows, "propagation_decoder", f"B={buckets} vs 1 each (K/P {counts})", PROPAGATION_OUTPUTS, together,
             ref, masks=masks)
    return rows


# ------------------------------------------------------------------------------------- memory encoder
def check_memory_encoder(bundle_or_onnx_dir, dumps) -> list[Row]:
    rows: list[Row] = []
    run = GraphRunner(bundle_or_onnx_dir, "memory_encoder")
    grid = run.static_shapes()["tracker_feat"][2]
    names = ("maskmem_features", "image_features")
    for case in _cases(dumps, "memory_encoder_step_"):
        z = _dump(dumps, case)
        feeds, ref = memory_encoder_feeds(z, grid)
        label = case.removeprefix("memory_encoder_step_")
        _compare(rows, "memory_encoder", label, names, run(feeds), ref, bf16=("maskmem_features",))
        # other junk in the empty slots: nothing may change, to the bit
        other, _ = memory_encoder_feeds(z, grid, seed=7)
        _compare(rows, "memory_encoder", f"{label} other junk in empty slots", names, run(other), run(feeds))
    rows += check_memory_encoder_batching(run, grid)
    return rows


def check_memory_encoder_batching(run: GraphRunner, grid: int, buckets: int = 5) -> list[Row]:
    import torch

    dims = tracker_specs.TrackerDims.from_inputs(run.static_shapes())
    spec = tracker_specs.graph_specs(dims)["memory_encoder"]
    rows: list[Row] = []
    for side in (14 * grid, 16 * grid):
        with torch.no_grad():
            feeds = {k: v.numpy() for k, v in tracker_specs.sample_inputs(
                spec, dims, dict(buckets=buckets, mask_side=side), seed=side).items()}
        together = run(feeds)
        alone = [run({k: (v[i:i + 1] if k != "tracker_feat" else v) for k, v in feeds.items()}) for i in range(buckets)]
        ref = {"maskmem_features": np.concatenate([a["maskmem_features"] for a in alone]),
               "image_features": alone[0]["image_features"]}
        _compare(rows, "memory_encoder", f"B={buckets} vs 1 each, side {side}", ref.keys(), together, ref,
                 bf16=("maskmem_features",))
    return rows


# ------------------------------------------------------------------------------------ interactive
INTERACTIVE_OUTPUTS = ("low_res_masks", "iou_scores", "object_score_logits", "object_pointer")


def check_interactive_decoder(bundle_or_onnx_dir, dumps) -> list[Row]:
    rows: list[Row] = []
    run = GraphRunner(bundle_or_onnx_dir, "interactive_decoder")
    for case in _cases(dumps, "interactive_step_"):
        feeds, ref = interactive_feeds(_dump(dumps, case))
        label = f"{case.removeprefix('interactive_step_')} multimask={int(feeds['multimask'][0])}"
        _compare(rows, "interactive_decoder", label, INTERACTIVE_OUTPUTS, run(feeds), ref)
    rows += _objects_batching(run, "interactive_decoder", INTERACTIVE_OUTPUTS,
                              shared=("interactive_feat_s0", "interactive_feat_s1", "interactive_feat"),
                              sizes=dict(objects=5, points=3))
    return rows


def _objects_batching(run: GraphRunner, graph: str, names, shared, sizes) -> list[Row]:
    """objects=5 in one call (mixed flags) against one object at a time."""
    import torch

    dims = tracker_specs.TrackerDims.from_inputs(run.static_shapes())
    spec = tracker_specs.graph_specs(dims)[graph]
    with torch.no_grad():
        feeds = {k: v.numpy() for k, v in tracker_specs.sample_inputs(spec, dims, sizes, seed=11).items()}
    together = run(feeds)
    n = sizes["objects"]
    alone = [run({k: (v if k in shared else v[i:i + 1]) for k, v in feeds.items()}) for i in range(n)]
    ref = {k: np.concatenate([a[k] for a in alone]) for k in names}
    flags = ",".join(f"{int(feeds['multimask'][i])}{int(feeds['use_mask_prompt'][i])}" for i in range(n)) \
        if "multimask" in feeds else ""
    rows: list[Row] = []
    _compare(rows, graph, f"N={n} vs 1 each {flags}".rstrip(), names, together, ref)
    return rows


# ------------------------------------------------------------------------------------------ mask init
MASK_INIT_OUTPUTS = ("low_res_masks", "object_pointer", "object_score_logits")


def check_mask_init(bundle_or_onnx_dir, dumps) -> list[Row]:
    rows: list[Row] = []
    run = GraphRunner(bundle_or_onnx_dir, "mask_init")
    for case in _cases(dumps, "mask_init_step_"):
        z = _dump(dumps, case)
        got = run(dict(interactive_feat=z["in/interactive_feat"], mask_logits=z["in/mask_logits"]))
        ref = dict(low_res_masks=z["out.low_res_masks"], object_pointer=z["out.obj_ptr"],
                   object_score_logits=z["out.object_score_logits"])
        _compare(rows, "mask_init", case.removeprefix("mask_init_step_"), MASK_INIT_OUTPUTS, got, ref)
    rows += _objects_batching(run, "mask_init", MASK_INIT_OUTPUTS, shared=("interactive_feat",), sizes=dict(objects=5))
    return rows


def check_against_torch(bundle_or_onnx_dir, tracker, name: str) -> list[Row]:
    """The graph in ONNX Runtime against its torch wrapper on seeded inputs at two sets of sizes, for weights
    Meta recorded nothing for (a real checkpoint); fills the part of the Meta checks the dumps would give."""
    import torch

    run = GraphRunner(bundle_or_onnx_dir, name)
    dims = tracker_specs.TrackerDims.from_tracker(tracker)
    spec = tracker_specs.graph_specs(dims)[name]
    module = spec.module(tracker).eval()
    rows: list[Row] = []
    base = tracker_specs.trace_sizes(dims)
    for label, sizes in (("trace sizes", base),
                         ("other sizes", {**base, "buckets": 3, "memories": 4, "pointers": 3, "memory_rows": 9,
                                          "image_rows": 5, "pointer_rows": 7, "objects": 3, "points": 2,
                                          "mask_side": 16 * dims.grid})):
        with torch.no_grad():
            inputs = tracker_specs.sample_inputs(spec, dims, sizes, seed=3)
            out = module(*(inputs[t.name] for t in spec.inputs))
        out = out if isinstance(out, tuple) else (out,)
        ref = {t.name: o.float().numpy() for t, o in zip(spec.outputs, out)}
        got = run({k: v.numpy() for k, v in inputs.items()})
        bf16 = ("maskmem_features",) if name == "memory_encoder" else ()
        _compare(rows, name, f"torch, {label}", [t.name for t in spec.outputs], got, ref, bf16=bf16)
    return rows


def check_batching_only(bundle_or_onnx_dir, name: str) -> list[Row]:
    """The size and padding checks that need no Meta dumps."""
    run = GraphRunner(bundle_or_onnx_dir, name)
    if name == "propagation_decoder":
        return check_propagation_batching(run)
    if name == "memory_encoder":
        return check_memory_encoder_batching(run, run.static_shapes()["tracker_feat"][2])
    if name == "interactive_decoder":
        return _objects_batching(run, name, INTERACTIVE_OUTPUTS,
                                 shared=("interactive_feat_s0", "interactive_feat_s1", "interactive_feat"),
                                 sizes=dict(objects=5, points=3))
    return _objects_batching(run, name, MASK_INIT_OUTPUTS, shared=("interactive_feat",), sizes=dict(objects=5))


CHECKS = {"propagation_decoder": check_propagation_decoder, "memory_encoder": check_memory_encoder,
          "interactive_decoder": check_interactive_decoder, "mask_init": check_mask_init}


def check_tracker_graphs(bundle_or_onnx_dir, dumps, graphs=tracker_specs.GRAPHS, log=print) -> list[Row]:
    from ..comparison import HEADER

    rows = []
    for name in graphs:
        rows += CHECKS[name](bundle_or_onnx_dir, dumps)
    if log:
        log(HEADER)
        for r in rows:
            log(r.line())
    return rows


def main(argv=None) -> int:
    """python -m graphs.sam31.tracker_check OUT [--plain] [--graphs ...]: export from the reference's
    seeded checkpoint into OUT and check against its module dumps."""
    import argparse

    import torch

    from . import reference as ref

    ap = argparse.ArgumentParser(prog="python -m graphs.sam31.tracker_check", description=main.__doc__)
    ap.add_argument("out", type=Path)
    ap.add_argument("--attention", choices=("fused", "plain"), default="fused")
    ap.add_argument("--graphs", nargs="+", default=list(tracker_specs.GRAPHS))
    a = ap.parse_args(argv)
    env = ref.find_env()
    if env is None:
        print(f"error: {ref.missing_reason()}")
        return 2
    ck = ref.checkpoint_dir(env)
    state = torch.load(ck / "sam3.1_multiplex.pt", weights_only=True, map_location="cpu")
    export_tracker_graphs(state, a.out, attention=a.attention, graphs=a.graphs, log=print)
    rows = check_tracker_graphs(a.out, ref.module_dumps(env, ck), graphs=a.graphs)
    bad = [r for r in rows if not r.ok]
    print(f"{len(rows) - len(bad)} passed, {len(bad)} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
