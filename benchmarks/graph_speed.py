"""One graph at a time, across runtimes and precisions, at several object counts; and the machine's best
fp32/bf16 MatMul throughput. Answers "where does an extra object go, and how close to the CPU's limit is it?"

    python -m benchmarks.graph_speed --bundles BUNDLE[,BUNDLE2] [--graphs propagation_decoder,memory_encoder]
        [--runtimes ort,ov-f32,ov-bf16] [--objects 1,16] [--memories 2] [--pointers 2] [--reps 3] [--matmul]

Inputs are seeded random values of the manifest's shapes (every memory and pointer valid), so the numbers
are the graphs' cost, not a tracking run's. Repetitions are interleaved over every (bundle, runtime, graph,
count) after one warm-up call each; medians [min-max] in ms, and the cost per extra object (least-squares
slope over the counts). Timings on a shared machine are noisy: compare rows of one run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

RUNTIMES = ("ort", "ov-f32", "ov-bf16", "ov-f32-static", "ov-bf16-static")  # *-static: compiled for the call's shapes


def graph_inputs(manifest: dict, graph: str, objects: int, memories: int, pointers: int) -> dict:
    """Seeded inputs of ``graph`` at these sizes: each object reads its own memories and pointers, all valid.
    SAM 3.1 bundles (``family: "sam3.1"``): the objects fill buckets of 16 slots (ceil(objects / 16)
    buckets, the last one partly), each bucket reads its own memories and pointer frames."""
    if manifest.get("family") == "sam3.1" and graph in ("propagation_decoder", "memory_encoder"):
        return _bucket_inputs(manifest, graph, objects, memories, pointers)
    sizes = dict(objects=objects, memories=memories, pointers=pointers, memory_rows=objects * memories,
                 pointer_rows=objects * pointers, prompts=1, images=1, points=2, boxes=1)
    index = {"memory_index": np.arange(objects * memories).reshape(objects, memories),
             "pointer_index": np.arange(objects * pointers).reshape(objects, pointers),
             "memory_slot": np.tile(np.arange(1, memories + 1), (objects, 1)),
             "pointer_offset": np.tile(np.arange(1, pointers + 1), (objects, 1))}
    return _fill(manifest, graph, sizes, index)


def _fill(manifest: dict, graph: str, sizes: dict, index: dict) -> dict:
    """Feeds by the manifest's shapes (backend_choice.seeded_feeds): ``index`` arrays as given, *_valid
    ones, integer inputs and the 0/1 switches 0, everything else seeded normal values."""
    from sam3track.backend_choice import seeded_feeds

    return seeded_feeds(manifest["graphs"][graph]["inputs"], sizes.__getitem__, index)


def _bucket_inputs(manifest: dict, graph: str, objects: int, memories: int, pointers: int) -> dict:
    slots = next(t["shape"][1] for t in manifest["graphs"][graph]["inputs"] if t["name"] == "slot_valid")
    buckets = -(-objects // slots)
    side = 16 * manifest["config"]["geometry"]["grid"]  # the memory encoder's mask side in tracking
    sizes = dict(buckets=buckets, memories=memories, pointers=pointers, memory_rows=buckets * memories,
                 image_rows=memories, pointer_rows=buckets * pointers, mask_side=side)
    index = {"memory_index": np.arange(buckets * memories).reshape(buckets, memories),
             "memory_image_index": np.tile(np.arange(memories), (buckets, 1)),
             "memory_slot": np.tile(np.arange(1, memories + 1) % 7, (buckets, 1)),
             "pointer_index": np.arange(buckets * pointers).reshape(buckets, pointers),
             "pointer_offset": np.tile(np.arange(1, pointers + 1) / 15, (buckets, 1)),
             "slot_valid": (np.arange(buckets * slots) < objects).reshape(buckets, slots)}
    return _fill(manifest, graph, sizes, index)


def session(runtime: str, path: Path, threads: int | None, feeds: dict | None = None):
    """A callable running the graph at ``path`` on ``runtime`` with numpy feeds (a *-static runtime:
    compiled for the shapes of ``feeds``, as the openvino backend's shapes="static" does)."""
    if runtime == "ort":
        import onnxruntime as ort

        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        s = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        return lambda feeds: s.run(None, feeds)
    request = openvino_request(runtime, path, threads, feeds)
    return lambda feeds: request.infer(feeds)


def openvino_request(runtime: str, path: Path, threads: int | None, feeds: dict | None = None, **config):
    """An OpenVINO infer request for the graph at ``path`` ("ov-bf16*": bf16, else f32; "*-static":
    compiled for the shapes of ``feeds``); config: more compile properties (e.g. PERF_COUNT=True)."""
    from sam3track.backends.openvino import shared_core  # one Core per process: see its docstring

    config = {"INFERENCE_PRECISION_HINT": "bf16" if "bf16" in runtime else "f32", "PERFORMANCE_HINT": "LATENCY",
              **config}
    if threads:
        config["INFERENCE_NUM_THREADS"] = threads
    core = shared_core()
    model = core.read_model(str(path))
    if runtime.endswith("-static"):
        model.reshape({p: list(feeds[p.get_node().get_friendly_name()].shape) for p in model.inputs})
    return core.compile_model(model, "CPU", config).create_infer_request()


def time_graphs(bundles: list[Path], graphs: list[str], runtimes: list[str], objects: list[int], memories: int,
                pointers: int, reps: int, threads: int | None, log=print) -> list[dict]:
    cases = []
    for bundle in bundles:
        manifest = json.loads((bundle / "manifest.json").read_text())
        for runtime in runtimes:
            for graph in graphs:
                run = None if runtime.endswith("-static") else session(runtime, bundle / manifest["graphs"][graph]["file"],
                                                                      threads)
                for n in objects:
                    feeds = graph_inputs(manifest, graph, n, memories, pointers)
                    if runtime.endswith("-static"):
                        run = session(runtime, bundle / manifest["graphs"][graph]["file"], threads, feeds)
                    run(feeds)  # warm-up: first calls at a new shape pay for allocations and kernel choice
                    cases.append({"bundle": bundle.name, "runtime": runtime, "graph": graph, "objects": n,
                                  "run": run, "feeds": feeds, "ms": []})
    for _ in range(reps):
        for case in cases:
            start = time.perf_counter()
            case["run"](case["feeds"])
            case["ms"].append((time.perf_counter() - start) * 1000)
    rows = []
    for case in cases:
        ms = case.pop("ms")
        case.pop("run"), case.pop("feeds")
        rows.append({**case, "median_ms": statistics.median(ms), "min_ms": min(ms), "max_ms": max(ms)})
    for key in {(r["bundle"], r["runtime"], r["graph"]) for r in rows}:
        mine = [r for r in rows if (r["bundle"], r["runtime"], r["graph"]) == key]
        if len(mine) > 1:
            slope = float(np.polyfit([r["objects"] for r in mine], [r["median_ms"] for r in mine], 1)[0])
            for r in mine:
                r["ms_per_object"] = slope
    return rows


def matmul_graph(m: int, k: int, n: int):
    """A one-node [m, k] x [k, n] MatMul graph with constant (seeded) weights, and its feeds: the CPU's
    dense fp32 ceiling here and in benchmarks.roofline."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "matmul",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])], [weight])
    return graph, {"x": rng.standard_normal((m, k)).astype(np.float32)}


def matmul_throughput(reps: int, threads: int | None, m: int = 4096, k: int = 1024, n: int = 2048,
                      runtimes: tuple[str, ...] = RUNTIMES) -> dict:
    """GFLOPS of one [m, k] x [k, n] MatMul with constant weights, in ONNX Runtime fp32 and OpenVINO f32/bf16:
    about the most a dense fp32 (or bf16) graph can get from this CPU. ``gflops``: from the median of the
    repetitions; ``best_gflops``: from the fastest (the ceiling, for a roofline)."""
    import tempfile

    import onnx
    from onnx import helper

    graph, x = matmul_graph(m, k, n)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    out, best = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "matmul.onnx"
        onnx.save(model, str(path))
        for runtime in runtimes:
            try:
                run = session(runtime, path, threads, x)
            except Exception as exc:  # no openvino, no bf16 on this CPU: say so, go on
                out[runtime] = f"unavailable: {type(exc).__name__}: {exc}"
                continue
            run(x)
            ms = []
            for _ in range(max(reps, 3)):
                start = time.perf_counter()
                run(x)
                ms.append((time.perf_counter() - start) * 1000)
            out[runtime] = round(2 * m * k * n / (statistics.median(ms) / 1000) / 1e9, 1)
            best[runtime] = round(2 * m * k * n / (min(ms) / 1000) / 1e9, 1)
    return {"shape": [m, k, n], "gflops": out, "best_gflops": best}


NO_FLAGS = "none of AVX2, AVX-512, AMX (or no /proc/cpuinfo)"


def cpu_flags() -> list[str]:
    """The vector and matrix extensions that decide which kernels run (an AVX2-only CPU lists avx2 and fma)."""
    from sam3track.backend_choice import cpu_model_and_flags

    wanted = ("amx", "avx512_bf16", "avx512_vnni", "avx512f", "avx2", "fma", "avx_vnni")
    return sorted(f for f in cpu_model_and_flags()[1] if f.startswith(wanted))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.graph_speed", description=__doc__.split("\n\n")[0])
    p.add_argument("--bundles", required=True, help="comma-separated bundle folders (e.g. fused and plain exports)")
    p.add_argument("--graphs", default="propagation_decoder,memory_encoder")
    p.add_argument("--runtimes", default=",".join(RUNTIMES), help=f"comma-separated, of {', '.join(RUNTIMES)}")
    p.add_argument("--objects", default="1,16")
    p.add_argument("--memories", type=int, default=2)
    p.add_argument("--pointers", type=int, default=2)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--matmul", action="store_true", help="also measure the CPU's best MatMul throughput")
    p.add_argument("--json", type=Path, default=None, help="write the rows here too")
    args = p.parse_args(argv)
    runtimes = args.runtimes.split(",")
    unknown = [r for r in runtimes if r not in RUNTIMES]
    if unknown:
        p.error(f"--runtimes: {unknown} not among {RUNTIMES}")
    bundles = [Path(b) for b in args.bundles.split(",")]
    missing = [str(b) for b in bundles if not (b / "manifest.json").is_file()]
    if missing:
        p.error(f"--bundles: {missing} hold no manifest.json (export one with python -m graphs.export)")
    rows = time_graphs(bundles, args.graphs.split(","), runtimes, [int(n) for n in args.objects.split(",")],
                       args.memories, args.pointers, args.reps, args.threads)
    print(f"CPU flags: {' '.join(cpu_flags()) or NO_FLAGS}; {args.memories} memories, "
          f"{args.pointers} pointers")
    print(f"{'bundle':<16} {'runtime':<8} {'graph':<20} {'objects':>7} {'median ms':>10}  [min-max]   ms/extra object")
    for r in sorted(rows, key=lambda r: (r["graph"], r["bundle"], r["runtime"], r["objects"])):
        per = f"{r['ms_per_object']:.1f}" if "ms_per_object" in r else "-"
        print(f"{r['bundle']:<16} {r['runtime']:<8} {r['graph']:<20} {r['objects']:>7} {r['median_ms']:>10.1f}  "
              f"[{r['min_ms']:.1f}-{r['max_ms']:.1f}]   {per}")
    result = {"cpu_flags": cpu_flags(), "rows": rows}
    if args.matmul:
        result["matmul"] = matmul_throughput(args.reps, args.threads)
        shape = "x".join(map(str, result["matmul"]["shape"]))
        print(f"MatMul {shape}, GFLOPS: " + ", ".join(f"{k} {v}" for k, v in result["matmul"]["gflops"].items()))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
