"""Full-size mode: the default config at 1008 px (seeded weights) as a user with the real checkpoint runs
it: cold and warm load, the first frame, time per frame and peak RSS at 1/16/64/128 objects, ours at the
defaults (and any other variant) beside transformers' reference in fp32.

    python -m benchmarks.full_size [--preset full] [--objects 1,16,64,128] [--frames 4] [--reps 1]
        [--variants auto] [--threads N] [--out DIR] [--cache DIR] [--publish]

Every measured run is a process of its own (benchmarks/full_size_child.py), so each point's peak RSS
(VmHWM) is that run's, its load included; the sides run interleaved (ours, reference, ours, ...) at
each count. Object counts are set on both sides as benchmarks/run.py sets them (measure.count_overrides
from each side's own first-frame scores). A run the kernel kills (out of memory) or one past
--child-timeout is recorded as such and the benchmark goes on (a side whose first-frame scores fail is
left out of the counts, with the reason). Ours runs as benchmarks/run.py runs it (mask NMS and hole
filling off, the reference's cross-prompt quirks on, pools for the count). Writes full.md, scaling.png and
results.json to --out; --publish copies them to docs/benchmarks/full.md and docs/benchmarks/full/.
Runs by hand (hours at full size on 2 cores); tests/test_benchmarks.py runs it at the tiny size.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .bundles import PRESETS, BundleInfo, get_bundle
from .measure import count_overrides
from .run import CLIPS, REPO, VARIANTS, code_info, machine_info, settle_paths

DEFAULT_OBJECTS = (1, 16, 64, 128)
REFERENCE = "reference"


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.full_size", description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="full")
    ap.add_argument("--objects", default=",".join(map(str, DEFAULT_OBJECTS)), help="object counts, comma-separated")
    ap.add_argument("--frames", type=int, default=4, help="frames per run: frame 0 (births) and the rest timed (>= 2)")
    ap.add_argument("--reps", type=int, default=1, help="runs per side and object count")
    ap.add_argument("--load-runs", type=int, default=1, help="cold and warm loads of each variant of ours")
    ap.add_argument("--variants", default="auto", help=f"variants of ours ({', '.join(VARIANTS)}); auto = the defaults")
    ap.add_argument("--prompts", help="text prompts, comma-separated (default: the preset's)")
    ap.add_argument("--clip", type=Path, default=CLIPS / "bikes.mp4")
    ap.add_argument("--start-frame", type=int, default=76)
    ap.add_argument("--threads", type=int, help="intra-op threads on both sides (default: each runtime's own)")
    ap.add_argument("--bundle", type=Path, help="measure this bundle of --preset (reference: BUNDLE/source)")
    ap.add_argument("--cache", type=Path, help="bundle cache (default: OUT/bundles)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--child-timeout", type=float, default=4 * 3600, help="seconds before a run is stopped")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--publish", action="store_true", help="copy the outputs to docs/benchmarks/")
    return ap


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    ap = _parser()
    args = ap.parse_args(argv)
    args.objects = [int(n) for n in args.objects.split(",")]
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    args.prompts = [p.strip() for p in args.prompts.split(",")] if args.prompts else list(PRESETS[args.preset].prompts)
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown or not args.variants or args.frames < 2 or args.reps < 1 or min(args.objects) < 1:
        ap.error(f"unknown variants {unknown}" if unknown else "need a variant, --frames >= 2, --reps >= 1, objects >= 1")
    settle_paths(args, f"sam3track-full-size-{args.preset}-")
    return args


# ------------------------------------------------------------------------------------------ children
def child_spec(args, bundle: BundleInfo, side: str, task: str, overrides: dict | None = None) -> dict:
    """What one child does: `side` is a variant of ours or "reference"; task "load", "scores" or "run"."""
    return {"side": REFERENCE if side == REFERENCE else "ours", "variant": side, "task": task,
            "bundle": str(bundle.bundle), "source": str(bundle.source), "threads": args.threads,
            "clip": str(args.clip), "start_frame": args.start_frame, "frames": args.frames,
            "prompts": args.prompts, "overrides": overrides or {}}


def run_child(spec: dict, compile_cache: Path, timeout: float) -> dict:
    """One child run; a failure is returned as {"error": why} (killed, timed out, crashed), never raised."""
    env = dict(os.environ, PYTHONPATH=str(REPO), SAM3TRACK_CACHE=str(compile_cache))
    try:
        done = subprocess.run([sys.executable, "-m", "benchmarks.full_size_child", json.dumps(spec)], cwd=REPO,
                              env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"stopped after {timeout:.0f} s (--child-timeout)"}
    if done.returncode < 0:
        name = signal.Signals(-done.returncode).name
        why = " (the kernel's out-of-memory killer, most likely)" if name == "SIGKILL" else ""
        return {"error": f"killed by {name}{why}"}
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": f"exit {done.returncode}: {last}"}
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {"error": f"no result printed (stderr: {(done.stderr.strip().splitlines() or ['?'])[-1]})"}


# ------------------------------------------------------------------------------------------ stages
def load_stage(args, bundle, results, save, log) -> None:
    """Each variant of ours loaded cold (an empty compile cache) then warm (that cache, a new process);
    nothing is run; RSS after load is kept. (The reference's load is timed by its scores run.)"""
    loads = results["loads"]
    for name in args.variants:
        for i in range(args.load_runs):
            # the first pair fills the cache the later runs share (the gate of "auto" included): they
            # load warm, as a user's second run does
            with tempfile.TemporaryDirectory(prefix="sam3track-full-size-load-") as scratch:
                folder = Path(scratch) if i or name != args.variants[0] else args.compile_cache
                for kind in ("cold", "warm"):
                    got = run_child(child_spec(args, bundle, name, "load"), folder, args.child_timeout)
                    loads.setdefault(name, {}).setdefault(kind, []).append(got)
                    log(f"load {name} {kind} {i + 1}/{args.load_runs}: " + _said(got, "load_s", "s"))
                    save()
    for name in args.variants[1:]:  # their graphs into the shared cache too: every measured run loads warm
        run_child(child_spec(args, bundle, name, "load"), args.compile_cache, args.child_timeout)


def scores_stage(args, bundle, results, save, log) -> dict:
    """First-frame detection scores per side: the reference's for it and ort-fp32, each other variant's
    own (another precision scores a little differently), so each side gets the thresholds for N objects."""
    scores = {}
    for side in [REFERENCE] + [v for v in args.variants if v != "ort-fp32"]:
        got = run_child(child_spec(args, bundle, side, "scores"), args.compile_cache, args.child_timeout)
        if "error" in got or not got["scores"]:  # this side is left out of the counts, the rest go on
            results["failed"][side] = f"first-frame scores: {got.get('error', 'no detections')}"
            log(f"scores {side}: {results['failed'][side]}")
            continue
        scores[side] = got["scores"]
        if side == REFERENCE:  # from_pretrained: nothing to keep warm, its one load
            results["loads"][REFERENCE] = {"cold": [{k: got[k] for k in ("load_s", "rss_after_load_mb")}]}
        if got.get("chose"):
            results["chose"][side] = got["chose"]
        log(f"scores {side}: {len(got['scores'])} detections, top {got['scores'][:3]}")
    if REFERENCE in scores:
        scores.setdefault("ort-fp32", scores[REFERENCE])
    results["first_frame_scores"] = {k: [round(s, 6) for s in v[:160]] for k, v in scores.items()}
    save()
    return scores


def counts_stage(args, bundle, scores, results, save, log) -> None:
    """At each count, every side's runs interleaved (ours, reference, ours, ...)."""
    sides = [s for s in args.variants + [REFERENCE] if s in scores]
    for n in args.objects:
        key = str(n)
        for side in sides:
            overrides, note = count_overrides(scores[side], n)
            results["overrides"].setdefault(key, {})[side] = {**overrides, "note": note}
        for rep in range(args.reps):
            for side in sides:
                spec = child_spec(args, bundle, side, "run", _without_note(results["overrides"][key][side]))
                got = run_child(spec, args.compile_cache, args.child_timeout)
                results["runs"].setdefault(side, {}).setdefault(key, []).append(got)
                log(f"{n} objects, rep {rep + 1}/{args.reps}, {side}: " + _point_line(got))
                save()


def _without_note(entry: dict) -> dict:
    return {k: v for k, v in entry.items() if k != "note"}


def _said(got: dict, key: str, unit: str) -> str:
    if "error" in got:
        return got["error"]
    return f"{got[key]:.2f} {unit}, RSS after load {got['rss_after_load_mb']:.0f} MB, peak {got['peak_rss_mb']:.0f} MB"


def _point_line(got: dict) -> str:
    if "error" in got:
        return got["error"]
    ms = [r["ms"] for r in got["records"]]
    return (f"first frame {ms[0] / 1e3:.1f} s, then {', '.join(f'{m / 1e3:.1f}' for m in ms[1:])} s, "
            f"tracked {[r['tracked'] for r in got['records']]}, peak RSS {got['peak_rss_mb']:.0f} MB")


# ------------------------------------------------------------------------------------------ main
def main(argv: list[str] | None = None) -> int:
    from .full_size_report import markdown, plot

    args = _arguments(argv)
    log = lambda msg: print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)  # noqa: E731
    if args.bundle:
        bundle = BundleInfo(args.preset, "fp32", args.bundle.absolute(), (args.bundle / "source").absolute(), None)
    else:
        bundle = get_bundle(args.preset, args.cache, seed=args.seed, log=log)
    args.compile_cache = args.out / "compile-cache"  # shared by the count runs: their loads are warm
    results = _new_results(args, argv, bundle)

    def save() -> None:
        (args.out / "results.json").write_text(json.dumps(results, indent=1))

    shutil.rmtree(args.compile_cache, ignore_errors=True)  # an earlier run's: the cold loads start empty
    try:
        load_stage(args, bundle, results, save, log)
        scores = scores_stage(args, bundle, results, save, log)
        counts_stage(args, bundle, scores, results, save, log)
    finally:
        shutil.rmtree(args.compile_cache, ignore_errors=True)  # gigabytes at full size; bundles stay in --cache
    results["finished"] = time.strftime("%Y-%m-%d %H:%M")
    results["machine"]["load_end"] = " ".join(f"{x:.1f}" for x in os.getloadavg())
    save()
    (args.out / "full.md").write_text(markdown(results, image="scaling.png"))
    plot(results, args.out / "scaling.png")
    if args.publish:
        docs = REPO / "docs" / "benchmarks"
        (docs / "full").mkdir(parents=True, exist_ok=True)
        shutil.copy(args.out / "results.json", docs / "full" / "scaling.json")
        shutil.copy(args.out / "scaling.png", docs / "full" / "scaling.png")
        (docs / "full.md").write_text(markdown(results, image="full/scaling.png"))
    log(f"wrote {args.out / 'full.md'}")
    return 0


def _new_results(args, argv, bundle: BundleInfo) -> dict:
    graphs = json.loads((bundle.bundle / "manifest.json").read_text())["graphs"]
    size = sum((bundle.bundle / f).stat().st_size for g in graphs.values() for f in [g["file"]] + g.get("data_files", []))
    return {
        "tool": "benchmarks.full_size",
        "command": "python -m benchmarks.full_size " + " ".join(sys.argv[1:] if argv is None else argv),
        "started": time.strftime("%Y-%m-%d %H:%M"), "finished": None, "preset": args.preset,
        "machine": machine_info(), "code": code_info(),
        "bundle": {"path": str(bundle.bundle), "graphs_gb": round(size / 1e9, 2), "export_seconds": bundle.export_seconds,
                   "parameters": json.loads((bundle.bundle / "manifest.json").read_text()).get("source", {}).get("parameters")},
        "settings": {"objects": args.objects, "frames": args.frames, "reps": args.reps, "load_runs": args.load_runs,
                     "variants": args.variants, "prompts": args.prompts, "threads": args.threads,
                     "clip": args.clip.relative_to(REPO).as_posix() if args.clip.is_relative_to(REPO) else str(args.clip),
                     "start_frame": args.start_frame},
        "loads": {}, "chose": {}, "first_frame_scores": {}, "overrides": {}, "runs": {}, "failed": {},
    }


if __name__ == "__main__":
    raise SystemExit(main())
