"""Roofline of a bundle's graphs: how close each graph, at each call size and precision, gets to what this CPU
can do, measured through the same runtimes that run it.

    python -m benchmarks.roofline --preset mid --cache /tmp/roofcache --out /tmp/roofline-mid
    python -m benchmarks.roofline --bundle BUNDLE --objects 1,16,64 --reps 3 --threads 1 --out DIR

For each graph and call size (the propagation decoder and memory encoder at each object count; backbone,
grounding head and text encoder once per call at one image or prompt):

- FLOPs and bytes of the call, counted from the graph's shapes by ``benchmarks.flops`` (GEMM-class FLOPs:
  MatMul, Gemm, Conv, ConvTranspose, Einsum, attention products; the element-wise/softmax/norm term apart);
  bytes moved = weights + inputs + outputs, a lower bound (bf16 runtimes: the weights at 2 bytes);
- the call's time on each runtime (``graph_speed.session``: ONNX Runtime fp32, OpenVINO f32, OpenVINO bf16
  dynamic and static shapes), runtime by runtime (one runtime's sessions open at a time: memory), repetitions
  interleaved over the runtime's cases after a warm-up call each, medians [min-max];
- the machine's peaks, measured in the same run through the same runtimes, just before that runtime's calls:
  the best GFLOP/s of a 4096 x 1024 x 2048 MatMul (``graph_speed.matmul_throughput``) or of a 3x3
  convolution of 256 channels at 64 x 64, whichever is higher (a runtime's convolution kernels can outrun
  its MatMul); and the memory bandwidth (best of a numpy copy and an ONNX Runtime Add over 256 MiB arrays);
- achieved GFLOP/s = GEMM FLOPs / median time, the roofline = min(peak, intensity * bandwidth), and the
  fraction achieved / roofline (1.0: on the roofline; the issue's target is >= 1/1.5 = 0.67);
- where the time goes, from one profiled call per case (ONNX Runtime's profiler; OpenVINO's per-layer
  counters): the share in GEMM-class kernels, in layout copies and in the rest, and the rate of the GEMM
  kernels alone (GEMM FLOPs / their time), which says whether a gap is in the GEMMs or around them.

Writes results.json, roofline.md and roofline.png (log-log roofline) to --out. A tool, not a test: on a
shared machine the timings are noisy (the load average is recorded); compare rows of one run.
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.flops import count_graph
from benchmarks.graph_speed import cpu_flags, graph_inputs, matmul_graph, openvino_request, session
from benchmarks.roofline_report import GRAPHS, PER_OBJECT, PRECISION, RUNTIMES, write_report

# op classes of the profiles: GEMM-class kernels, layout copies, and the rest (element-wise, norms, softmax)
GEMM_KERNELS = {"MatMul", "FusedMatMul", "Gemm", "Conv", "FusedConv", "ConvTranspose", "MultiHeadAttention", "Einsum",
                "FullyConnected", "Convolution", "ConvolutionBackpropData", "Deconvolution", "GroupConvolution",
                "ScaledDotProductAttention", "MatMulInteger", "DynamicQuantizeMatMul"}
COPY_KERNELS = {"Transpose", "Concat", "Gather", "GatherElements", "GatherND", "Slice", "StridedSlice", "Expand",
                "Broadcast", "Tile", "Pad", "Split", "VariadicSplit", "ScatterND", "ScatterNDUpdate", "Cast", "Convert",
                "Reorder", "Reshape", "Squeeze", "Unsqueeze", "Identity", "OneHot"}


def call_feeds(manifest: dict, graph: str, size: int, memories: int, pointers: int) -> dict:
    """graph_speed's seeded inputs at ``size`` objects (per-call graphs: one image / prompt), with SAM 3's
    memory slots those of a steady-state frame: slot 0 (a conditioning frame) and the recent ones after it."""
    feeds = graph_inputs(manifest, graph, size, memories, pointers)
    if "memory_slot" in feeds and manifest.get("family") != "sam3.1":
        slots = manifest["config"]["tracker"]["num_maskmem"]
        feeds["memory_slot"] = np.ascontiguousarray((feeds["memory_slot"] - 1) % slots)
    return feeds


def cases_of(graphs: list[str], objects: list[int]) -> list[tuple[str, int]]:
    return [(g, n) for g in graphs for n in (objects if g in PER_OBJECT else [1])]


def memory_bandwidth(reps: int, threads: int | None, mib: int = 256) -> dict:
    """GB/s (1e9 bytes) of the best of ``reps`` passes: a numpy copy (read + write) and an ONNX Runtime Add of a
    constant (read + write, every thread), over ``mib`` MiB arrays. ``gbps`` is the higher of the two."""
    import onnx
    from onnx import TensorProto, helper

    src = np.ones(mib * 2 ** 20 // 4, np.float32)
    dst = np.empty_like(src)
    best = {"numpy_copy": 0.0, "ort_add": 0.0}
    node = helper.make_node("Add", ["x", "c"], ["y"])
    graph = helper.make_graph([node], "add", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [src.size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [src.size])],
                              [helper.make_tensor("c", TensorProto.FLOAT, [1], [1.0])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "add.onnx"
        onnx.save(model, str(path))
        add = session("ort", path, threads)
        add({"x": src})
        for _ in range(max(reps, 5)):
            start = time.perf_counter()
            np.copyto(dst, src)
            best["numpy_copy"] = max(best["numpy_copy"], 2 * src.nbytes / (time.perf_counter() - start) / 1e9)
            start = time.perf_counter()
            add({"x": src})
            best["ort_add"] = max(best["ort_add"], 2 * src.nbytes / (time.perf_counter() - start) / 1e9)
    return {"mib": mib, **{k: round(v, 1) for k, v in best.items()}, "gbps": round(max(best.values()), 1)}


def matmul_peak(runtime: str, reps: int, threads: int | None, shape: tuple) -> dict:
    """GFLOP/s of an [m, k] x [k, n] MatMul with constant weights on ``runtime`` (``graph_speed.matmul_graph``),
    or why it is unavailable (``_one_node_gflops``)."""
    m, k, n = shape
    graph, x = matmul_graph(m, k, n)
    return _one_node_gflops(runtime, graph, x, 2 * m * k * n, reps, threads)


def conv_peak(runtime: str, reps: int, threads: int | None, shape: tuple) -> dict:
    """GFLOP/s of a 3x3 convolution (padding 1) of a [1, c, h, w] input to c channels, constant weights, on
    ``runtime``: the runtimes' direct convolution kernels outrun their MatMul on some CPUs (ONNX Runtime's
    NCHWc convolutions on an AVX-512 Ice Lake: 155 (162 in the backbone) against the MatMul's 114 GFLOP/s on one
    thread), so a MatMul alone is no ceiling."""
    from onnx import TensorProto, helper, numpy_helper

    c, h, w = shape
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array((rng.standard_normal((c, c, 3, 3)) / (3 * c ** 0.5)).astype(np.float32), "w")
    node = helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    graph = helper.make_graph([node], "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, h, w])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, h, w])], [weight])
    x = {"x": rng.standard_normal((1, c, h, w)).astype(np.float32)}
    return _one_node_gflops(runtime, graph, x, 2 * c * c * 9 * h * w, reps, threads)


def _one_node_gflops(runtime: str, graph, feeds: dict, flops: int, reps: int, threads: int | None) -> dict:
    """GFLOP/s of one-node ``graph`` on ``runtime`` from its fastest repetition by wall clock and by process CPU
    time, and from the median by wall clock; or why it is unavailable."""
    import onnx
    from onnx import helper

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "peak.onnx"
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
        try:
            run = session(runtime, path, threads, feeds)
        except Exception as exc:  # no openvino, no bf16 on this CPU: say so, go on
            return {"unavailable": f"{type(exc).__name__}: {exc}"}
        run(feeds)
        times = [_timed(run, feeds) for _ in range(max(reps, 5))]
    return {"wall_gflops": round(flops / min(w for w, _ in times) / 1e6, 1),
            "cpu_gflops": round(flops / max(min(c for _, c in times), 1e-6) / 1e6, 1),
            "median_wall_gflops": round(flops / statistics.median(w for w, _ in times) / 1e6, 1)}


PEAK_KERNELS = {"matmul": matmul_peak, "conv": conv_peak}  # the kernels whose best rate is a runtime's peak


def higher_peaks(r: dict, runtimes: list[str], clock: str) -> dict:
    """Each runtime's peak by ``clock``: the highest of its PEAK_KERNELS' rates (None where none ran)."""
    peaks = {}
    for rt in runtimes:
        found = [r[kind][rt].get(f"{clock}_gflops") for kind in PEAK_KERNELS]
        peaks[rt] = max((g for g in found if g), default=None)
    return peaks


def _timed(run, feeds) -> tuple[float, float]:
    """(wall ms, process CPU ms) of one call: with one thread, CPU time leaves out the time the process
    waited, descheduled, while other jobs ran on a shared machine."""
    wall, cpu = time.perf_counter(), time.process_time()
    run(feeds)
    return (time.perf_counter() - wall) * 1000, (time.process_time() - cpu) * 1000


def count_cases(bundle: Path, manifest: dict, cases: list, memories: int, pointers: int, log=print) -> dict:
    """(graph, size) -> benchmarks.flops.Count.as_dict() of that call."""
    counts = {}
    for graph, size in cases:
        started = time.perf_counter()
        feeds = call_feeds(manifest, graph, size, memories, pointers)
        counts[(graph, size)] = count_graph(bundle / manifest["graphs"][graph]["file"], feeds).as_dict()
        c = counts[(graph, size)]
        log(f"  counted {graph} x{size}: {c['gemm_flops'] / 1e9:.2f} GFLOP GEMM, {c['other_flops'] / 1e9:.3f} G other, "
            f"{c['bytes'] / 2 ** 20:.1f} MiB ({c['shape_source']}, {time.perf_counter() - started:.0f} s)")
    return counts


def time_cases(bundle: Path, manifest: dict, cases: list, runtimes: list[str], feeds: dict, reps: int,
               threads: int | None, peak_shapes: dict, log=print) -> tuple[dict, dict]:
    """Runtime by runtime: its peaks (each of PEAK_KERNELS at its shape in ``peak_shapes``), then one warm-up
    call per case
    (static variants compile for the case's shapes first) and ``reps`` repetitions interleaved over its cases;
    its sessions are closed before the next runtime's open (at mid, 64 objects, all runtimes' sessions at
    once went past 23 GB RSS and were killed). The peak is measured just before the calls it is compared
    with, so a change in the machine's load between runtimes moves both. Returns (timings, peaks: "matmul"
    and "conv", each its shape and per-runtime results):
    timings (runtime, graph, size) -> wall and process CPU milliseconds (median, min, max, every repetition)."""
    timings = {}
    peaks = {kind: {"shape": list(shape)} for kind, shape in peak_shapes.items()}
    for runtime in runtimes:
        for kind, measure in PEAK_KERNELS.items():
            peaks[kind][runtime] = measure(runtime, reps, threads, peak_shapes[kind])
        log(f"  {runtime}: MatMul {peaks['matmul'][runtime]}, Conv {peaks['conv'][runtime]}, load {_load()}")
        runs, plain = {}, {}
        for graph, size in cases:
            path = bundle / manifest["graphs"][graph]["file"]
            if runtime.endswith("-static"):
                run = session(runtime, path, threads, feeds[(graph, size)])
            else:
                run = plain.get(graph) or session(runtime, path, threads)
                plain[graph] = run
            started = time.perf_counter()
            run(feeds[(graph, size)])
            log(f"  warm-up {runtime} {graph} x{size}: {time.perf_counter() - started:.2f} s")
            runs[(runtime, graph, size)] = run
        ms = {key: [] for key in runs}
        for rep in range(reps):
            for key, run in runs.items():
                ms[key].append(_timed(run, feeds[key[1:]]))
            log(f"  {runtime}: repetition {rep + 1}/{reps} done, load {_load()}")
        for key, v in ms.items():
            wall, cpu = [w for w, _ in v], [c for _, c in v]
            timings[key] = {"median_ms": statistics.median(wall), "min_ms": min(wall), "max_ms": max(wall),
                            "cpu_median_ms": statistics.median(cpu), "cpu_min_ms": min(cpu), "cpu_max_ms": max(cpu),
                            "ms": wall, "cpu_ms": cpu}
        del runs, plain, run
        gc.collect()
    return timings, peaks


def _kernel_class(op: str) -> str:
    """gemm, fused (OpenVINO's Snippets subgraphs: fused element-wise chains, and the attention blocks its
    MHA tokenizer fuses, products included), copy or other."""
    if op == "Subgraph":
        return "fused"
    return "gemm" if op in GEMM_KERNELS else "copy" if op in COPY_KERNELS else "other"


def profile_ort(path: Path, feeds: dict, threads: int | None, calls: int = 3) -> dict:
    """Milliseconds per op type in profiled ONNX Runtime calls (its default optimisations on, so the kernels
    are the ones the timed session runs): per op type, the median over ``calls`` calls after a warm-up one."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    options.enable_profiling = True
    with tempfile.TemporaryDirectory() as tmp:
        options.profile_file_prefix = str(Path(tmp) / "roofline")
        s = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        for _ in range(calls + 1):
            s.run(None, feeds)
        events = json.loads(Path(s.end_profiling()).read_text())
    starts = sorted(e["ts"] for e in events if e.get("name") == "model_run")[1:]  # the warm-up call left out
    per_call = [collections.Counter() for _ in starts]
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] >= starts[0]:
            call = max(i for i, t in enumerate(starts) if e["ts"] >= t)
            per_call[call][e["args"]["op_name"]] += e["dur"] / 1000
    return {"by_op_ms": _median_by_op(per_call), "kernels": {}}


def _median_by_op(per_call: list) -> dict:
    ops = set().union(*per_call)
    return {op: statistics.median(c.get(op, 0.0) for c in per_call) for op in ops}


def profile_ov(runtime: str, path: Path, feeds: dict, threads: int | None, calls: int = 3) -> dict:
    """Milliseconds per layer type in OpenVINO calls with PERF_COUNT on (per type, the median over ``calls``
    calls after a warm-up one), and the kernels (exec types) of its GEMM-class layers: says whether bf16 ran
    on AMX."""
    request = openvino_request(runtime, path, threads, feeds, PERF_COUNT=True)
    request.infer(feeds)
    per_call, kernels = [], collections.Counter()
    for _ in range(calls):
        request.infer(feeds)
        by_op = collections.Counter()
        for layer in request.get_profiling_info():
            by_op[layer.node_type] += layer.real_time.total_seconds() * 1000
            if (layer.node_type in GEMM_KERNELS or layer.node_type == "Subgraph") and layer.real_time.total_seconds() > 0:
                kernels[f"{layer.node_type}:{layer.exec_type}"] += layer.real_time.total_seconds() * 1000 / calls
        per_call.append(by_op)
    return {"by_op_ms": _median_by_op(per_call), "kernels": {k: round(v, 2) for k, v in kernels.most_common(6)}}


def profile_case(runtime: str, path: Path, feeds: dict, threads: int | None, calls: int = 3) -> dict:
    """Where a call's time goes: ms per op type (medians over ``calls`` profiled calls), and the shares of
    GEMM-class, copy and other kernels."""
    if runtime == "ort":
        p = profile_ort(path, feeds, threads, calls)
    else:
        p = profile_ov(runtime, path, feeds, threads, calls)
    total = sum(p["by_op_ms"].values()) or 1.0
    shares = collections.Counter()
    for op, ms in p["by_op_ms"].items():
        shares[_kernel_class(op)] += ms / total
    top = sorted(p["by_op_ms"].items(), key=lambda kv: -kv[1])[:12]
    gemm_ms = sum(ms for op, ms in p["by_op_ms"].items() if _kernel_class(op) in ("gemm", "fused"))
    return {"profiled_ms": round(total, 2), "gemm_ms": round(gemm_ms, 3),
            "shares": {k: round(shares[k], 3) for k in ("gemm", "fused", "copy", "other")},
            "top_ops_ms": {k: round(v, 2) for k, v in top}, "gemm_kernels_ms": p["kernels"]}


def _load() -> str:
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "?"


def machine() -> dict:
    cpu = platform.processor() or "unknown CPU"
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    versions = {"python": platform.python_version()}
    for name in ("numpy", "onnx", "onnxruntime", "openvino"):
        try:
            versions[name] = getattr(__import__(name), "__version__", "?")
        except ImportError:
            versions[name] = "not installed"
    return {"cpu": cpu, "cores": os.cpu_count(), "flags": cpu_flags(), "versions": versions, "load_start": _load()}


def roofline_rows(counts: dict, timings: dict, peaks: dict, bandwidth: float, profiles: dict,
                  clock: str = "wall") -> list[dict]:
    """One row per (runtime, graph, size): FLOPs, bytes (bf16: weights at 2 bytes), intensity, time, achieved
    GFLOP/s (by ``clock``: "wall" or "cpu" median; ``peaks`` by the same clock), the roofline there, the
    fraction of it, and the profile's shares where one was taken."""
    rows = []
    for (runtime, graph, size), t in timings.items():
        c = counts[(graph, size)]
        weights = c["weight_bytes"] // 2 if PRECISION[runtime] == "bf16" else c["weight_bytes"]
        moved = weights + c["input_bytes"] + c["output_bytes"]
        intensity = c["gemm_flops"] / moved
        achieved = c["gemm_flops"] / (t["cpu_median_ms" if clock == "cpu" else "median_ms"] / 1000) / 1e9
        peak = peaks.get(runtime)
        roof = min(peak, intensity * bandwidth) if peak else None
        row = {"runtime": runtime, "precision": PRECISION[runtime], "graph": graph, "size": size,
               "gemm_gflop": c["gemm_flops"] / 1e9, "other_gflop": c["other_flops"] / 1e9,
               "copy_mb": c["copy_bytes"] / 1e6, "bytes_mb": moved / 1e6, "intensity": intensity,
               "median_ms": t["median_ms"], "min_ms": t["min_ms"], "max_ms": t["max_ms"],
               "cpu_median_ms": t.get("cpu_median_ms"), "cpu_min_ms": t.get("cpu_min_ms"),
               "cpu_max_ms": t.get("cpu_max_ms"), "clock": clock,
               "achieved_gflops": achieved, "peak_gflops": peak, "roofline_gflops": roof,
               "bound": None if roof is None else ("compute" if roof == peak else "memory"),
               "fraction": achieved / roof if roof else None}
        prof = profiles.get((runtime, graph, size))
        if prof:
            row["profile"] = prof
            gemm_ms = prof["gemm_ms"]
            row["gemm_kernel_gflops"] = c["gemm_flops"] / (gemm_ms / 1000) / 1e9 if gemm_ms else None
        rows.append(row)
    return rows


def _bundle(args, log) -> Path:
    if args.bundle:
        return Path(args.bundle)
    from benchmarks.bundles import get_bundle

    return get_bundle(args.preset, Path(args.cache), log=log).bundle


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.roofline", description=__doc__.split("\n\n")[0])
    p.add_argument("--bundle", default=None, help="a bundle folder (else --preset's seeded bundle from --cache)")
    p.add_argument("--preset", default="mid", choices=("tiny", "mid", "full"))
    p.add_argument("--cache", default="/tmp/roofcache", help="where --preset's bundle is exported once")
    p.add_argument("--graphs", default=",".join(GRAPHS))
    p.add_argument("--objects", default="1,16,64", help="call sizes of the per-object graphs")
    p.add_argument("--memories", type=int, default=None, help="memories per object (default: num_maskmem)")
    p.add_argument("--pointers", type=int, default=None, help="pointers per object (default: the encoder's maximum)")
    p.add_argument("--runtimes", default=",".join(RUNTIMES), help=f"of {', '.join(PRECISION)}")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--profile-max", type=int, default=16, help="profile calls of at most this size (0: none)")
    p.add_argument("--matmul-shape", default="4096,1024,2048", help="M,K,N of the peak MatMul")
    p.add_argument("--conv-shape", default="256,64,64", help="C,H,W of the peak 3x3 convolution (C to C channels)")
    p.add_argument("--bandwidth-mib", type=int, default=256, help="array size of the bandwidth passes")
    p.add_argument("--profile-calls", type=int, default=3, help="profiled calls per case (median per op type)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--report", action="store_true", help="only rewrite roofline.md and .png from --out's results.json")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.report:  # results.json -> roofline.md and roofline.png again
        write_report(json.loads((args.out / "results.json").read_text()), args.out)
        return 0

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)

    bundle = _bundle(args, log)
    manifest = json.loads((bundle / "manifest.json").read_text())
    tracker = manifest.get("config", {}).get("tracker", {})
    memories = args.memories or tracker.get("num_maskmem", 7)
    pointers = args.pointers or tracker.get("max_object_pointers_in_encoder", 16)
    runtimes, objects = args.runtimes.split(","), [int(n) for n in args.objects.split(",")]
    graphs = [g for g in args.graphs.split(",") if g in manifest["graphs"]]
    cases = cases_of(graphs, objects)
    r = {"command": "python -m benchmarks.roofline " + " ".join(argv if argv is not None else sys.argv[1:]),
         "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "machine": machine(),
         "settings": {"bundle": bundle.name, "graphs": graphs, "objects": objects, "memories": memories,
                      "pointers": pointers, "runtimes": runtimes, "reps": args.reps, "threads": args.threads}}
    log(f"memory bandwidth (load {_load()})")
    r["bandwidth"] = memory_bandwidth(args.reps, args.threads, args.bandwidth_mib)
    log(f"  {r['bandwidth']}")
    log("counting FLOPs and bytes")
    counts = count_cases(bundle, manifest, cases, memories, pointers, log)
    feeds = {case: call_feeds(manifest, *case, memories, pointers) for case in cases}
    log("timing")
    shapes = {kind: tuple(int(x) for x in value.split(",")) for kind, value in
              (("matmul", args.matmul_shape), ("conv", args.conv_shape))}
    timings, peaks = time_cases(bundle, manifest, cases, runtimes, feeds, args.reps, args.threads, shapes, log)
    r.update(peaks)
    clock = "cpu" if args.threads == 1 else "wall"  # CPU time sums threads: only one thread compares with wall
    r["settings"]["clock"] = clock
    r["peaks"] = higher_peaks(r, runtimes, clock)
    profiles = {}
    for (runtime, graph, size) in timings:
        if size <= args.profile_max:
            profiles[(runtime, graph, size)] = profile_case(runtime, bundle / manifest["graphs"][graph]["file"],
                                                            feeds[(graph, size)], args.threads, args.profile_calls)
            log(f"  profiled {runtime} {graph} x{size}: {profiles[(runtime, graph, size)]['shares']}")
    r["counts"] = [{"graph": g, "size": n, **c} for (g, n), c in counts.items()]
    r["rows"] = roofline_rows(counts, timings, r["peaks"], r["bandwidth"]["gbps"], profiles, clock)
    r["machine"]["load_end"] = _load()
    r["machine"]["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    r["finished"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    (args.out / "results.json").write_text(json.dumps(r, indent=1, default=str))
    write_report(r, args.out)
    log(f"wrote {args.out}/results.json, roofline.md, roofline.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
