"""What a correction far behind the stop costs: a whole pass over a long clip, then a click pair on a
frame half a clip back, with the memory bank's host store on (the default) and off.

    python benchmarks/corrections.py --bundle DIR [--frames 1000] [--objects 2] [--set NAME=VALUE ...]

Frames are synthetic (two coloured blocks crossing a textured background, repeated as a ping-pong).
Prints, per run: the pass's seconds and its RSS every tenth of the clip (from /proc), the store's bytes in host
memory and on disk per tracked frame and object, and the seconds of the correction's two clicks, of
the same clicks on the frame the pass stopped on (nothing to bring back), and of the 20-frame passes
after each. A tool, not a test: the machine is shared and timings are noisy (docs/corrections.md).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.soak import rss_mb  # noqa: E402


def clip(n: int) -> np.ndarray:
    from tests.test_parity import synthetic_frames

    base = synthetic_frames()
    order = np.concatenate([np.arange(len(base)), np.arange(len(base))[::-1]])
    return base[np.resize(order, n)]


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def correct(session, frame: int, xy, obj_id: int) -> float:
    _, first = timed(lambda: session.add_prompt(frame_index=frame, points=[xy], labels=[1], obj_id=obj_id))
    _, second = timed(lambda: session.add_prompt(frame_index=frame, points=[[xy[0] + 40, xy[1]]], labels=[0],
                                                 obj_id=obj_id, clear_old_points=False))
    return first + second


def run(bundle: str, n: int, objects: int, overrides: dict) -> dict:
    import sam3track

    frames = clip(n)
    clicks = [[35, 60], [230, 135], [120, 20], [20, 170]][:objects]
    out = {"overrides": overrides}
    with sam3track.load(bundle, **overrides) as predictor, predictor.start_session(frames) as s:
        for k, xy in enumerate(clicks):
            s.add_prompt(frame_index=0, points=[xy], obj_id=k + 1)
        rss = {}

        def tracked():
            for r in s.propagate():
                if r.frame_index % (n // 10) == 0 or r.frame_index == n - 1:
                    rss[r.frame_index] = round(rss_mb(), 1)
                yield r

        _, out["pass_s"] = timed(lambda: sum(1 for _ in tracked()))
        out["rss_mb_by_frame"] = rss
        store = s.bank.store
        tracked = max(1, store.count("p"))
        out.update(store_ram_mb=store.ram_bytes / 2**20, store_disk_mb=store.disk_bytes / 2**20,
                   bytes_per_frame_object=(store.ram_bytes + store.disk_bytes) / tracked)
        out["click_at_stop_s"] = correct(s, n - 1, clicks[0], 1)
        middle = n // 2
        out["click_far_behind_s"] = correct(s, middle, clicks[0], 1)
        _, out["pass_20_after_s"] = timed(lambda: sum(1 for _ in s.propagate(start_frame=middle, max_frames=20)))
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", required=True)
    parser.add_argument("--frames", type=int, default=1000)
    parser.add_argument("--objects", type=int, default=2)
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    args = parser.parse_args(argv)
    base = {k: int(v) for k, v in (s.split("=", 1) for s in args.set)}
    for label, extra in (("store off", dict(memory_store_ram_mib=0, memory_store_disk_mib=0)), ("store on", {})):
        print(label, run(args.bundle, args.frames, args.objects, {**base, **extra}), flush=True)


if __name__ == "__main__":
    main()
