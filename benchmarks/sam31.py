"""SAM 3.1 against SAM 3 in sam3track, and sam3track's SAM 3.1 against Meta's predictor, per frame.

    python -m benchmarks.sam31 [--objects 1,16,64,128] [--frames 4] [--reps 2] [--threads 2]
        [--out DIR] [--cache DIR] [--no-meta]

Three sides (ours 3.1, ours 3.0, Meta 3.1) on the same frames and text prompt at each object count N,
repetitions interleaved; writes results.json and results.md to --out. The sides, how the counts are set
and what is timed: docs/benchmarks/README.md; the latest numbers: *SAM 3.1 vs SAM 3* in docs/speed.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
CLIPS = REPO / "examples" / "clips"
FIXED_31 = {"det_nms_thresh": 0.0, "hotstart_delay": 0, "masklet_confirmation_enable": False}
FIXED_30 = {"mask_nms": False, "fill_holes": False, "det_nms_thresh": 0.0, "hotstart_delay": 0}


def _stat(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "values": values}


def frames_of(clip: Path, count: int) -> np.ndarray:
    from sam3track.video import open_video

    with open_video(clip) as video:
        return np.stack([video.read(i) for i in range(count)])


def bundles(cache: Path, log=print) -> dict[str, Path]:
    """The two bundles, exported once into ``cache``."""
    from graphs.export import main as export

    out = {"ours 3.1": cache / "sam31-tiny", "ours 3.0": cache / "sam3-small"}
    args = {"ours 3.1": ["--family", "sam3.1", "--tiny"], "ours 3.0": ["--preset", "small"]}
    for side, path in out.items():
        if not (path / "manifest.json").is_file():
            log(f"exporting {side} to {path}")
            if export([*args[side], "--out", str(path), "--overwrite"]) != 0:
                raise SystemExit(f"error: exporting {side} failed")
    sizes = {side: json.loads((path / "manifest.json").read_text())["preprocessing"]["image_size"]
             for side, path in out.items()}
    if len(set(sizes.values())) != 1:  # a cache exported before one of the two configs changed
        raise SystemExit(f"error: the cached bundles in {cache} are of different image sizes ({sizes}); "
                         f"delete {out['ours 3.1']} and {out['ours 3.0']} to export both again")
    return out


# ----------------------------------------------------------------------------------- ours, SAM 3.1
def scores_31(bundle: Path, frame: np.ndarray, text: str, threads: int | None, **options) -> list[float]:
    """Frame 0's detection scores as our SAM 3.1 path filters them (boundary filter included), highest
    first; options: more load() options (precision=, shapes=: that path's own scores)."""
    import sam3track
    from sam3track.families.sam31 import tracker as trk

    found = []
    original = trk.Sam31Tracker.detect

    def detect(self, features, *rest):
        det = original(self, features, *rest)
        found.append(det.scores[det.keep].copy())
        return det

    with sam3track.load(bundle, threads=threads, score_threshold_detection=0.0, new_det_thresh=1.0,
                        **FIXED_31, **options) as predictor:
        # patched after the load: backend="auto"'s first load tracks its own gate clip through detect
        trk.Sam31Tracker.detect = detect
        try:
            with predictor.start_session(frame[None]) as session:
                session.add_prompt(frame_index=0, text=text)
        finally:
            trk.Sam31Tracker.detect = original
    return sorted(found[0].tolist(), reverse=True)


def threshold(scores: list[float], n: int) -> float:
    if len(scores) <= n:
        raise SystemExit(f"error: frame 0 has {len(scores)} detections; {n} objects need {n + 1}")
    return (scores[n - 1] + scores[n]) / 2


def run_ours(predictor, frames: np.ndarray, text: str) -> dict:
    """add_prompt on frame 0, then propagate; per-frame seconds, objects and graph calls."""
    backend = predictor.backend
    with predictor.start_session(frames) as session:
        start = time.perf_counter()
        session.add_prompt(frame_index=0, text=text)
        add_s = time.perf_counter() - start
        seconds, objects, calls = [], [], []
        stream = session.propagate()
        while True:
            before = Counter(backend.calls)
            start = time.perf_counter()
            try:
                result = next(stream)
            except StopIteration:
                break
            seconds.append(time.perf_counter() - start)
            objects.append(len(result.object_ids))
            calls.append({g: c - before[g] for g, c in backend.calls.items() if c - before[g]})
    # our SAM 3.1 session grounds frames in batches before tracking them, as Meta's does, so the first
    # yield carries the batch: only the mean over all frames is per-frame (the same on every side)
    return {"add_prompt_s": add_s, "frame_s": seconds, "frame_objects": objects, "frame_calls": calls,
            "per_frame_s": float(np.mean(seconds))}


def _calls(run: dict) -> dict | None:
    """Graph calls per propagated frame, summed over the run and divided by its frames."""
    if "frame_calls" not in run:
        return None
    total = Counter()
    for c in run["frame_calls"]:
        total.update(c)
    return {g: n / len(run["frame_calls"]) for g, n in sorted(total.items())}


# ------------------------------------------------------------------------------------------ Meta
def run_meta(env: Path, checkpoint: Path, n: int, args) -> dict:
    from graphs.sam31 import reference as ref

    with tempfile.TemporaryDirectory(prefix="sam31-bench-") as tmp:
        out = Path(tmp) / "t.json"
        ref.run_script(env, "time_predictor.py", ["--checkpoint", checkpoint, "--objects", str(n), "--frames",
                                                  str(args.frames), "--clip", args.clip, "--text", args.text,
                                                  "--threads", str(args.threads or 2), "--out", out])
        return json.loads(out.read_text())["counts"][str(n)]


# ------------------------------------------------------------------------------------------ main
def main(argv: list[str] | None = None) -> int:
    import sam3track
    from benchmarks.measure import count_overrides, ours_detection_scores
    from sam3track.backend_choice import Candidate

    p = argparse.ArgumentParser(prog="python -m benchmarks.sam31", description=__doc__.split("\n\n")[0])
    p.add_argument("--objects", default="1,16,64,128")
    p.add_argument("--frames", type=int, default=4)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--threads", type=int, default=None, help="intra-op threads per side (default: each runtime's)")
    p.add_argument("--clip", default="bikes.mp4")
    p.add_argument("--text", default="bike")
    p.add_argument("--out", type=Path, default=Path("/tmp/bench-sam31"))
    p.add_argument("--cache", type=Path, default=Path("/tmp/bench-sam31-cache"))
    p.add_argument("--no-meta", action="store_true", help="leave Meta's predictor out (no reference env needed)")
    p.add_argument("--precision", choices=("fp32", "bf16"), default=None,
                   help="ours on OpenVINO at this precision (with its own detection thresholds) instead of auto")
    p.add_argument("--shapes", choices=("dynamic", "rows", "static"), default=None, help="ours' OpenVINO shapes=")
    a = p.parse_args(argv)
    ours = {k: v for k, v in (("precision", a.precision), ("shapes", a.shapes)) if v is not None}
    counts = [int(x) for x in a.objects.split(",")]
    a.out.mkdir(parents=True, exist_ok=True)
    a.cache.mkdir(parents=True, exist_ok=True)
    paths = bundles(a.cache)
    frames = frames_of(CLIPS / a.clip, a.frames)
    env = checkpoint = None
    if not a.no_meta:
        from graphs.sam31 import reference as ref

        env = ref.find_env()
        if env is None:
            raise SystemExit(f"error: {ref.missing_reason()} (or pass --no-meta)")
        checkpoint = ref.checkpoint_dir(env) / "sam3.1_multiplex.pt"

    scores31 = scores_31(paths["ours 3.1"], frames[0], a.text, a.threads, **ours)
    with sam3track.load(paths["ours 3.0"], threads=a.threads, score_threshold_detection=0.0, new_det_thresh=1.0,
                        **{k: v for k, v in FIXED_30.items() if k != "det_nms_thresh"}, **ours) as scorer:
        scores30 = ours_detection_scores(scorer, frames[0], [a.text])
    # a backend named in the environment overrides auto's choice for ours: the command must carry it
    named = os.environ.get("SAM3TRACK_BACKEND", "").strip()
    forced = [f"SAM3TRACK_BACKEND={named}"] if named else []
    command = [*forced, "python -m benchmarks.sam31", *(argv if argv is not None else sys.argv[1:])]
    results = {"command": " ".join(command),
               "started": time.strftime("%Y-%m-%d %H:%M"), "clip": a.clip, "text": a.text, "frames": a.frames,
               "reps": a.reps, "threads": a.threads, "ours_options": ours, "counts": {}}
    for n in counts:
        over31 = dict(max_num_objects=n, score_threshold_detection=threshold(scores31, n),
                      new_det_thresh=threshold(scores31, n), **FIXED_31)
        over30, note30 = count_overrides(scores30, n)
        over30 = {**over30, **FIXED_30, "pool_objects": max(64, n)}  # SAM 3's pools hold 64 objects by default
        loaded = {"ours 3.1": sam3track.load(paths["ours 3.1"], threads=a.threads, **over31, **ours),
                  "ours 3.0": sam3track.load(paths["ours 3.0"], threads=a.threads, **over30, **ours)}
        runs = {side: [] for side in (*loaded, *(() if a.no_meta else ("Meta 3.1",)))}
        # the path each of ours took: backend="auto"'s (its verdict is kept per machine and bundle: made by
        # the first load here, scores_31's on a cold cache, and reused), or the one the options name
        paths_of = {side: Candidate(p.backend_choice.backend, p.backend_choice.options).label
                    for side, p in loaded.items()}
        try:
            for side, predictor in loaded.items():  # warm-up: first calls at new shapes (with --shapes rows
                run_ours(predictor, frames, a.text)  # the compiles, once a count has run twice: every frame)
            for rep in range(a.reps):
                for side, predictor in loaded.items():
                    runs[side].append(run_ours(predictor, frames, a.text))
                if not a.no_meta:
                    runs["Meta 3.1"].append(run_meta(env, checkpoint, n, a))
                print(f"N={n} rep {rep}: " + ", ".join(f"{s} {r[-1]['per_frame_s'] * 1e3:.0f} ms/frame "
                                                       f"{r[-1]['frame_objects']}" for s, r in runs.items()),
                      flush=True)
        finally:
            for predictor in loaded.values():
                predictor.close()
        results["counts"][str(n)] = {
            "overrides": {"ours 3.1": over31, "ours 3.0": over30}, "sam3_count_note": note30, "paths": paths_of,
            "sides": {side: {"ms_per_frame": _stat([r["per_frame_s"] * 1e3 for r in reps]),
                             "objects_per_frame": sorted({o for r in reps for o in r["frame_objects"][1:]}),
                             "calls_per_frame": _calls(reps[0]), "runs": reps}
                      for side, reps in runs.items()}}
        (a.out / "results.json").write_text(json.dumps(results, indent=1))
    (a.out / "results.md").write_text(report(results))
    print(report(results))
    return 0


def _paths_line(results: dict) -> str:
    """"; ours at backend="auto": ours 3.1 ran ..." (results.json files before 2026-12-07 have no paths)."""
    paths = next(iter(results["counts"].values()), {}).get("paths")
    if not paths:
        return ""
    options = results.get("ours_options") or {}
    how = (f"ours with {', '.join(f'{k}={v!r}' for k, v in options.items())}" if options
           else "ours with the backend named by SAM3TRACK_BACKEND"
           if results["command"].startswith("SAM3TRACK_BACKEND=")
           else 'ours at backend="auto"')
    return f"; {how}: " + "; ".join(f"{k} ran {v}" for k, v in paths.items())


def report(results: dict) -> str:
    sides = list(next(iter(results["counts"].values()))["sides"])
    lines = [f"`{results['command']}` ({results['started']}; {results['frames']} frames of {results['clip']}, "
             f"text {results['text']!r}, {results['reps']} interleaved repetitions, threads "
             f"{results['threads'] or 'default'}{_paths_line(results)})", "",
             "| objects | " + " | ".join(f"{s} ms/frame" for s in sides) + " | ours 3.1 / ours 3.0 | ours 3.1 / Meta |"
             " objects per frame | propagation calls per frame (3.1 / 3.0) |",
             "|---" * (len(sides) + 5) + "|"]
    for n, c in results["counts"].items():
        s = c["sides"]
        med = {k: v["ms_per_frame"]["median"] for k, v in s.items()}
        cells = [f"{med[k]:,.0f} [{v['ms_per_frame']['min']:,.0f}-{v['ms_per_frame']['max']:,.0f}]" for k, v in s.items()]
        r30 = f"{med['ours 3.1'] / med['ours 3.0']:.2f}"
        rm = f"{med['ours 3.1'] / med['Meta 3.1']:.2f}" if "Meta 3.1" in med else "-"
        objs = " / ".join(",".join(map(str, v["objects_per_frame"])) for v in s.values())
        calls = " / ".join(f"{(s[k]['calls_per_frame'] or {}).get('propagation_decoder', 0):g}" for k in ("ours 3.1", "ours 3.0"))
        lines.append(f"| {n} | " + " | ".join(cells) + f" | {r30} | {rm} | {objs} | {calls} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
