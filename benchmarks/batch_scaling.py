"""Throughput of ``sam3track batch`` with 1 and 2 workers (or more) on the same clips, in one run.

    python benchmarks/batch_scaling.py [--bundle DIR] [--clips 12] [--frames 30] [--size 320x136]
                                       [--workers 1,2] [--out FILE.json]

Cuts ``--clips`` clips of ``--frames`` frames from examples/clips/bikes.mp4 (different start frames,
resized), starts one local Ray with as many CPUs as the machine has, then runs
:func:`sam3track.batch.track_videos` over all clips with each worker count, into a fresh folder each
time. Prints per worker count: wall seconds (actor start and predictor load included, Ray start
excluded, after an unreported warm-up on two clips), videos/min, frames/s, and the per-frame cost inside the workers (time in run_track / frames).
Default bundle: the shipped demo bundle. A tool, not a test: timings on a shared machine are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main() -> None:
    import cv2
    import ray

    from sam3track.batch import track_videos
    from sam3track.demo import demo_bundle_path
    from sam3track.video import MaskVideoWriter, open_source

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", type=Path, default=None)
    ap.add_argument("--clips", type=int, default=12)
    ap.add_argument("--frames", type=int, default=30)
    ap.add_argument("--size", default="320x136")
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--threads", type=int, default=None,
                    help="inference threads per worker (default: the cores shared among the workers)")
    ap.add_argument("--prompt", action="append", default=None)
    ap.add_argument("--out", type=Path, default=None, help="also write the results as JSON here")
    args = ap.parse_args()
    width, height = (int(v) for v in args.size.split("x"))
    bundle = args.bundle or demo_bundle_path()
    prompts = args.prompt or ["person", "bike"]

    work = Path(tempfile.mkdtemp(prefix="batch-scaling-"))
    with open_source(REPO / "examples" / "clips" / "bikes.mp4") as src:
        frames = [cv2.resize(f.rgb, (width, height), interpolation=cv2.INTER_AREA)
                  for f in src.frames()]
        rate = src.frame_rate
    clips = []
    step = max(1, (len(frames) - args.frames) // max(1, args.clips - 1))
    for i in range(args.clips):
        first = min(i * step, len(frames) - args.frames)
        clip = work / "clips" / f"clip{i:02d}.mp4"
        clip.parent.mkdir(parents=True, exist_ok=True)
        with MaskVideoWriter(clip, width=width, height=height, fps=rate) as w:
            for rgb in frames[first:first + args.frames]:
                w.write(rgb)
        clips.append(clip)

    cpus = os.cpu_count() or 1
    ray.init(num_cpus=cpus, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    results = []
    try:
        # Warm-up (not reported): the first actors of a fresh Ray pay for starting worker
        # processes and for cold caches, which would count against whichever count runs first.
        list(track_videos(clips[:2], prompts, bundle, work / "warmup", workers=2))
        for run, workers in enumerate(int(w) for w in args.workers.split(",")):
            started = time.perf_counter()
            summaries = list(track_videos(clips, prompts, bundle, work / f"out{run}-{workers}w",
                                          workers=workers, threads=args.threads))
            wall = time.perf_counter() - started
            done = [s for s in summaries if s.done]
            n_frames = sum(s.frames for s in done)
            in_worker = sum(s.seconds for s in done)
            row = {
                "workers": workers, "videos": len(done), "frames": n_frames,
                "wall_s": round(wall, 2),
                "videos_per_min": round(60 * len(done) / wall, 1),
                "frames_per_s": round(n_frames / wall, 1),
                "ms_per_frame_in_worker": round(1000 * in_worker / n_frames, 1),
                "cpus": cpus, "threads_per_worker": args.threads or max(1, cpus // workers),
            }
            results.append(row)
            print(json.dumps(row), flush=True)
    finally:
        ray.shutdown()
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
