"""Where a predictor's memory goes: resident memory after each phase of a short live stream, and
optionally per graph call (the peak within the call and what it left behind).

    python -m benchmarks.memory_phases BUNDLE [--frames 3] [--weights fp16] [--per-graph] [--video]
                                       [--backend openvino --precision bf16] [--set NAME=VALUE ...]
                                       [--release-text-encoder auto|yes|no] [--threads N]

Loads BUNDLE on ONNX Runtime (or `--backend`), adds one text prompt to a live stream (`--video`: a video session) and
tracks `--frames` frames of bikes.mp4, printing one JSON object: VmRSS and the process peak VmHWM (MB) after the load, the prompt
and each frame, seconds per frame and per graph. `--per-graph` resets the peak before each graph call
(/proc/self/clear_refs) and records, per graph, the largest rise within one call over the RSS before
it and the total RSS its calls left behind; the per-phase peaks then cover only the last call. One
run is a measurement, not a benchmark (docs/speed.md, "Memory at full size").
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def memory_mb() -> dict[str, int]:
    """VmRSS and VmHWM of this process, MB."""
    from .full_size_child import proc_mb

    return {field: int(proc_mb(field)) for field in ("VmRSS", "VmHWM")}


def record_graph_calls(backend) -> dict:
    """Wrap backend.run to record, per graph: calls, the peak rise within one call, RSS left behind."""
    per_graph: dict[str, dict[str, int]] = {}
    run = backend.run

    def recording_run(graph, inputs, outputs=None):
        before = memory_mb()["VmRSS"]
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
        result = run(graph, inputs, outputs)
        after = memory_mb()
        entry = per_graph.setdefault(graph.name, {"calls": 0, "peak_rise_mb": 0, "left_mb": 0})
        entry["calls"] += 1
        entry["peak_rise_mb"] = max(entry["peak_rise_mb"], after["VmHWM"] - before)
        entry["left_mb"] += after["VmRSS"] - before
        return result

    backend.run = recording_run
    return per_graph


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.memory_phases", description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle", type=Path)
    ap.add_argument("--frames", type=int, default=3)
    ap.add_argument("--weights", choices=("fp32", "fp16"), default="fp32")
    ap.add_argument("--backend", choices=("onnxruntime", "openvino"), default="onnxruntime")
    ap.add_argument("--precision", choices=("fp32", "bf16"), help="OpenVINO's inference precision")
    ap.add_argument("--release-text-encoder", choices=("auto", "yes", "no"), default="auto")
    ap.add_argument("--per-graph", action="store_true")
    ap.add_argument("--video", action="store_true", help="a video session over the frames (propagate), not a stream")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="a config override (a JSON value), e.g. --set max_num_objects=1")
    ap.add_argument("--threads", type=int)
    ap.add_argument("--prompt", default="person")
    ap.add_argument("--clip", type=Path, default=REPO / "examples" / "clips" / "bikes.mp4")
    ap.add_argument("--start-frame", type=int, default=76)
    args = ap.parse_args(argv)

    import sam3track

    from .run import clip_frames

    frames = clip_frames(args.clip, args.start_frame, args.frames)
    release = {"auto": None, "yes": True, "no": False}[args.release_text_encoder]
    started = time.perf_counter()
    overrides = {name: json.loads(value) for name, _, value in (item.partition("=") for item in args.set)}
    options = {"precision": args.precision} if args.precision else {}
    predictor = sam3track.load(args.bundle, backend=args.backend, threads=args.threads,
                               weights=None if args.weights == "fp32" else args.weights,
                               release_text_encoder=release, **options, **overrides)
    out = {"load_s": round(time.perf_counter() - started, 2), "after_load": memory_mb()}
    per_graph = record_graph_calls(predictor.backend) if args.per_graph else None
    with predictor, predictor.start_session(frames if args.video else None) as session:
        session.add_prompt(text=args.prompt)
        out["after_prompt"] = memory_mb()
        seconds = []
        results = session.propagate() if args.video else (session.track(frame) for frame in frames)
        started = time.perf_counter()
        for i, result in enumerate(results):
            seconds.append(round(time.perf_counter() - started, 2))
            out[f"frame{i}"] = memory_mb() | {"objects": len(result.object_ids),
                                               "text_encoder_open": predictor.graphs["text_encoder"].loaded}
            started = time.perf_counter()
        out["seconds_per_frame"] = seconds
        out["graph_seconds"] = {k: round(v, 2) for k, v in predictor.backend.seconds.items()}
    out["after_close"] = memory_mb()
    if per_graph is not None:
        out["per_graph"] = per_graph
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
