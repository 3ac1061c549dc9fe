"""Long-stream soak: memory and per-frame time of a live stream over thousands of frames.

    python benchmarks/soak.py --bundle DIR [--scene fixed|loop] [--frames N] [--block 500]
                              [--set NAME=VALUE ...] [--out FILE.json]

`fixed`: one frame of bikes.mp4 fed again and again (nothing changes: memory must stay flat).
`loop`: the whole clip played in a loop (objects come and go: the retirement policy must bound them).
(`--set threads=1`, `--set max_num_objects=4`: any load() argument, as JSON.)
Frames go through `session.track()` (a live stream, as a webcam would feed it). Every `--block`
frames it prints: RSS (from /proc), the median and max time per frame in the block, live objects,
ids born so far, memory/pointer pool rows in use and their capacity, live device allocations.
A tool, not a test: the machine is shared and timings are noisy.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def rss_mb(field: str = "VmRSS") -> float:
    """This process's resident memory now (VmRSS) or its peak so far (VmHWM), MB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def clip_frames(scene: str) -> list[np.ndarray]:
    from sam3track.video import open_video

    with open_video(REPO / "examples" / "clips" / "bikes.mp4") as video:
        if scene == "fixed":
            return [video.read(90)]  # a frame where the tiny model tracks an object
        return [f.rgb for f in video.frames()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", type=Path, required=True)
    parser.add_argument("--scene", choices=("fixed", "loop"), default="fixed")
    parser.add_argument("--frames", type=int, default=10_000)
    parser.add_argument("--block", type=int, default=500)
    parser.add_argument("--prompts", nargs="+", default=["bike", "phone"])
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    import sam3track

    overrides = {k: json.loads(v) for k, v in (s.split("=", 1) for s in args.set)}
    frames = clip_frames(args.scene)
    predictor = sam3track.load(args.bundle, **overrides)
    session = predictor.start_session(None)
    for prompt in args.prompts:
        session.add_prompt(text=prompt)
    rows, times = [], []
    print(f"{args.scene} scene, {args.frames} frames, prompts {args.prompts}, overrides {overrides}")
    print(f"{'frames':>7} {'RSS MB':>8} {'peak MB':>8} {'ms med':>7} {'ms max':>7} {'objects':>7} {'born':>5} "
          f"{'mem rows/cap':>13} {'ptr rows/cap':>13} {'device allocs':>13}")
    for i in range(args.frames):
        started = time.perf_counter()
        session.track(frames[i % len(frames)])
        times.append(time.perf_counter() - started)
        if (i + 1) % args.block == 0:
            usage = session.memory_usage()
            row = dict(frames=i + 1, rss_mb=round(rss_mb(), 1), peak_mb=round(rss_mb("VmHWM"), 1),
                       ms_median=round(1e3 * statistics.median(times), 1),
                       ms_max=round(1e3 * max(times), 1), objects=len(session.object_ids),
                       born=session.objects.max_obj_id + 1, **usage,
                       device_allocations=predictor.backend.live_allocations)
            rows.append(row)
            times = []
            print(f"{row['frames']:>7} {row['rss_mb']:>8} {row['peak_mb']:>8} {row['ms_median']:>7} {row['ms_max']:>7} "
                  f"{row['objects']:>7} {row['born']:>5} "
                  f"{usage['memory_rows']:>6}/{usage['memory_capacity']:<6} "
                  f"{usage['pointer_rows']:>6}/{usage['pointer_capacity']:<6} {row['device_allocations']:>13}",
                  flush=True)
    predictor.close()
    if args.out:
        args.out.write_text(json.dumps({"scene": args.scene, "overrides": overrides, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
