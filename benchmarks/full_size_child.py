"""One measured run of benchmarks/full_size.py in a process of its own, so that its peak RSS (VmHWM) is
this run's alone: load one side (a variant of ours or transformers' reference), then either nothing
(a load-time run), the first frame's detection scores (the count thresholds), or a text-prompted run
over the frames at the given settings. Prints one JSON line.

    python -m benchmarks.full_size_child '<json spec>'   (spec: see benchmarks/full_size.py `child_spec`)
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict
from pathlib import Path


def proc_mb(field: str) -> float:
    """VmRSS or VmHWM of this process in MB (0 where /proc is missing)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _frames(spec: dict):
    from .run import clip_frames

    return clip_frames(Path(spec["clip"]), spec["start_frame"], spec["frames"])


def run_ours(spec: dict) -> dict:
    from .bundles import BundleInfo
    from .measure import SCORING_OVERRIDES, ours_detection_scores, run_ours as timed_run
    from .run import OURS_FIXED, load_variant

    bundles = {"fp32": BundleInfo("", "fp32", Path(spec["bundle"]), Path(spec["source"]), None)}
    started = time.perf_counter()
    if spec["task"] == "scores":
        overrides = SCORING_OVERRIDES  # every detection scored
    else:  # what benchmarks/run.py runs ours with: NMS, hole filling off, the reference's quirks, pools for n
        n = int(spec["overrides"].get("max_num_objects", 1))
        overrides = {**OURS_FIXED, "pool_objects": max(64, n), **spec["overrides"]}
    predictor = load_variant(spec["variant"], bundles, overrides, spec["threads"])
    out = {"load_s": time.perf_counter() - started, "rss_after_load_mb": proc_mb("VmRSS")}
    chose = getattr(predictor, "backend_choice", None)
    out["chose"] = {"backend": chose.backend, **chose.options, "reason": chose.reason} if chose is not None else None
    try:
        if spec["task"] == "scores":
            out["scores"] = ours_detection_scores(predictor, _frames(spec)[0], spec["prompts"])
        elif spec["task"] == "run":
            out["records"] = [asdict(r) for r in timed_run(predictor, _frames(spec), spec["prompts"])]
    finally:
        predictor.close()
    return out


def run_reference(spec: dict) -> dict:
    from .measure import Reference
    from .run import bundle_config

    started = time.perf_counter()
    ref = Reference(spec["source"], threads=spec["threads"])
    out = {"load_s": time.perf_counter() - started, "rss_after_load_mb": proc_mb("VmRSS")}
    if spec["task"] == "load":
        return out
    _, config, tokenizer = bundle_config(Path(spec["bundle"]))
    frames = _frames(spec)
    pixels = ref.pixels(frames, config)
    if spec["task"] == "scores":
        out["scores"] = ref.detection_scores(pixels[0], spec["prompts"], tokenizer)
        return out
    ref.configure(spec["overrides"])
    h, w = frames.shape[1:3]
    out["records"] = [asdict(r) for r in ref.run(pixels, h, w, spec["prompts"], tokenizer)]
    return out


def main(argv: list[str] | None = None) -> None:
    spec = json.loads((argv or sys.argv[1:])[0])
    out = run_reference(spec) if spec["side"] == "reference" else run_ours(spec)
    # VmHWM trails VmRSS by the kernel's batched counters: the peak is never below what was read
    out["peak_rss_mb"] = max(proc_mb("VmHWM"), proc_mb("VmRSS"), out["rss_after_load_mb"])
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
