"""How long `sam3track.load(bundle)` takes cold (a fresh compile cache) and warm (the same cache again),
each in its own process, and where the time goes.

    python -m benchmarks.load_time --bundle BUNDLE [--runs 3] [--backend onnxruntime] [--threads N]
        [--no-frame] [--out results.json]

Per run: cold (an empty cache folder), then warm (that folder, a new process), then "no cache"
(SAM3TRACK_COMPILE_CACHE=0: every graph optimised from its file and every sha256 computed, as before the
cache). Each child times the import, the load, and inside it the sha256 hashing, the graphs optimised
(ONNX Runtime sessions made from a bundle file, saving into the cache included; OpenVINO compiles, from
its cache or not) and the saved graphs opened (ONNX Runtime); then the first text-prompted frame, with
the time it spent making the deferred graphs it needed. Medians [min-max] over the runs. The bundle's
files are read once first, so every run reads them from the page cache. A shared machine makes every number noisy: the load average is reported.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# The child: times the phases by wrapping the functions that do them (the runtime has no timers of its own).
CHILD = r"""
import json, sys, time
started = time.perf_counter()
import numpy as np
import sam3track
from sam3track import bundle as bundle_mod
from sam3track.backends import compile_cache
spent = {"sha256": 0.0, "optimised": 0.0, "opened_saved": 0.0}
def timed(key, fn):
    def wrapper(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            spent[key] += time.perf_counter() - t
    return wrapper
bundle_mod.file_sha256 = timed("sha256", bundle_mod.file_sha256)
backend_name, bundle, threads = sys.argv[1], sys.argv[2], (int(sys.argv[3]) if sys.argv[3] != "0" else None)
run_frame = sys.argv[4] == "1"
if backend_name == "onnxruntime":
    from sam3track.backends.ort_sessions import SessionMaker as B
    B.optimise, B.open_saved = timed("optimised", B.optimise), timed("opened_saved", B.open_saved)
else:
    from sam3track.backends import openvino as ov_backend
    ov_backend.OpenVinoBackend._compile = timed("optimised", ov_backend.OpenVinoBackend._compile)
imported = time.perf_counter()
p = sam3track.load(bundle, backend=backend_name, threads=threads)
loaded = time.perf_counter()
deferred = sorted(n for n, g in p.graphs.items() if getattr(g, "session", True) is None
                  or getattr(g, "compiled", True) is None)
size = p.bundle.manifest["preprocessing"]["image_size"]
frame = np.random.default_rng(0).integers(0, 255, (size, size, 3), dtype=np.uint8)
before_frame = dict(spent)
first_frame = 0.0
if run_frame:
    s = p.start_session([frame])
    s.add_prompt(text="person")
    t = time.perf_counter()
    list(s.propagate())
    first_frame = time.perf_counter() - t
p.close()
print(json.dumps({"import": imported - started, "load": loaded - imported, "first_frame": first_frame,
                  "first_frame_sessions": sum(spent.values()) - sum(before_frame.values()),
                  "deferred": deferred, **{k: before_frame[k] for k in spent},
                  "cache_stats": dict(compile_cache.STATS)}))
"""


def child(bundle: Path, cache: Path | None, backend: str, threads: int, frame: bool) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    if cache is None:
        env["SAM3TRACK_COMPILE_CACHE"] = "0"
    else:
        env["SAM3TRACK_CACHE"] = str(cache)
        env.pop("SAM3TRACK_COMPILE_CACHE", None)
    done = subprocess.run([sys.executable, "-c", CHILD, backend, str(bundle), str(threads), "1" if frame else "0"],
                          env=env, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"the load child failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["stderr_lines"] = [line for line in done.stderr.splitlines() if line.startswith("sam3track:")]
    return result


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--backend", default="onnxruntime", choices=("onnxruntime", "openvino"))
    parser.add_argument("--threads", type=int, default=0, help="0: the backend's default")
    parser.add_argument("--no-frame", action="store_true", help="skip the first frame (minutes at full size)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    for path in sorted(args.bundle.rglob("*")):  # into the page cache: every run reads the same way
        if path.is_file() and "source" not in path.relative_to(args.bundle).parts:
            with open(path, "rb") as f:
                while f.read(1 << 24):
                    pass
    runs = {"cold": [], "warm": [], "no cache": []}
    for i in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="sam3track-load-") as folder:
            runs["cold"].append(child(args.bundle, Path(folder), args.backend, args.threads, not args.no_frame))
            os.sync()  # the cold load's gigabytes on disk first: a second run does not compete with their writeback
            runs["warm"].append(child(args.bundle, Path(folder), args.backend, args.threads, not args.no_frame))
        runs["no cache"].append(child(args.bundle, None, args.backend, args.threads, not args.no_frame))
        print(f"run {i + 1}/{args.runs}: " + ", ".join(f"{k} {v[-1]['load']:.2f} s" for k, v in runs.items()),
              flush=True)
    graphs = json.loads((args.bundle / "manifest.json").read_text())["graphs"]
    size = sum((args.bundle / f).stat().st_size for g in graphs.values() for f in [g["file"]] + g.get("data_files", []))
    size /= 1e9  # the graphs, not the checkpoint a seeded bundle keeps in source/
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?") \
        if os.path.exists("/proc/cpuinfo") else "?"
    print(f"\n{args.bundle} ({size:.2f} GB of graphs), {args.backend}, {os.cpu_count()} CPUs ({cpu}), load average "
          f"{os.getloadavg()[0]:.1f} at the end; seconds, median [min-max] of {args.runs}")
    keys = ("import", "load", "sha256", "optimised", "opened_saved", "first_frame", "first_frame_sessions")
    print("| load | " + " | ".join(keys) + " |")
    print("|---|" + "---|" * len(keys))
    for kind, results in runs.items():
        print(f"| {kind} | " + " | ".join(summary([r[k] for r in results]) for k in keys) + " |")
    print(f"deferred at load: {', '.join(runs['warm'][0]['deferred']) or 'none'}")
    print("a cold load's stderr:\n  " + "\n  ".join(runs["cold"][0]["stderr_lines"] or ["(nothing)"]))
    if args.out:
        args.out.write_text(json.dumps({"bundle": str(args.bundle), "backend": args.backend, "runs": runs,
                                        "loadavg": os.getloadavg(), "time": time.time()}, indent=1))


if __name__ == "__main__":
    main()
