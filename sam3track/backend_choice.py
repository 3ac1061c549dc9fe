"""backend="auto" (the default): which runtime and precision run a bundle on this machine, and why.

Fixed rules first: $SAM3TRACK_BACKEND names a backend; an explicit precision= or shapes= means
OpenVINO; an NPU device runs an OM bundle on acl; a GPU or CANN device runs ONNX Runtime. On a CPU,
the candidates (OpenVINO bf16 where the CPU lists BF16, OpenVINO fp32) are measured against ONNX
Runtime fp32, the path the parity tests hold to the reference: the same short synthetic clip, a text
prompt and clicks that force three objects, tracked through both; each candidate then runs every
graph that takes rows at one row and at three (sweep_rows: a path that refuses larger calls fails).
A candidate passes the fidelity gate when the ids are equal on every frame and mask IoU has mean
>= 0.99 and min >= 0.95 (the parity tolerances); a clip on which ONNX Runtime tracks no object pixels
measures no candidate. The fastest passing path wins if it is faster per frame than ONNX Runtime at
all and its memory while tracking stays within what the defaults promise (allowed_memory_mb: 3.5 GB, or ONNX
Runtime's own where that is more) and within half the machine's (full size: OpenVINO bf16 is 2.6x
faster on an AMX CPU but holds 9 GB, so it is left to precision="bf16"; at mid it holds 2.8 GB and wins).
The verdict is kept in the user cache per machine (CPU model and flags), thread count, bundle (its
graphs' sha256s) and package and runtime versions, so the gate runs once. docs/speed.md, "backend=auto".
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

GATE_FRAMES = 4  # a conditioning frame and three propagated ones that read its memory
IOU_MEAN, IOU_MIN = 0.99, 0.95  # tests/test_parity.py's tolerances
# sweep_rows: the axes that count rows, and the sizes each row-taking graph of a candidate runs at after
# the clip (3 objects; on SAM 3.1, 3 buckets, as 33-48 objects take)
SWEEP_AXES = ("objects", "buckets", "memory_rows", "pointer_rows")
SWEEP_ROWS = (1, 3)
FLAG_INPUTS = ("binarize", "via_image", "use_memory", "multimask", "conditioning")  # graphs' 0/1 switches
MIN_GAIN = 0.9  # a candidate must take under 90% of ONNX Runtime's time per frame: noise is no reason
# The gate's peak RSS over the bundle's weights: 12.6 GB for the 3.1 GB full-size bundle (OpenVINO's bf16
# compile the largest part; benchmarks/full_size.py, cold load of "auto"). With less memory available
# than that, measuring could get the process killed: ONNX Runtime fp32 is taken unmeasured.
GATE_MEMORY_FACTOR = 4
# The memory the defaults promise (issue 34: the full-size model within 3.5 GB at one object, a laptop's
# share): a faster path may hold up to this on the gate clip, or up to what ONNX Runtime fp32 itself held
# there (+256 MB of noise) where that is more.
DEFAULTS_MEMORY_MB = 3584.0
MEMORY_SLACK_MB = 256.0
SCHEMA = 4  # 2: the memory allowance; 3: sweep_rows (verdicts of 1-2 may hold a path they refuse);
# 4: ONNX Runtime's workers stop spinning after runs (its times in verdicts of 1-3 are slower than it is)
ENV_BACKEND = "SAM3TRACK_BACKEND"
log = logging.getLogger("sam3track")


@dataclass(frozen=True)
class Candidate:
    backend: str
    options: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        return self.backend + "".join(f" {k}={v}" for k, v in sorted(self.options.items()))


BASELINE = Candidate("onnxruntime")


@dataclass(frozen=True)
class Choice:
    """The path a load takes: a backend and its options, why, and what the gate measured (if it ran)."""
    backend: str
    options: dict
    reason: str
    measured: list = field(default_factory=list)  # per path: label, ms_per_frame, same_ids, iou_mean, iou_min


def choose(bundle, device: str, threads: int | None, precision: str | None, shapes: str | None, gears,
           open_predictor: Callable[[Candidate], object], weights: str | None = None) -> Choice:
    """The path for backend="auto". open_predictor(candidate) loads the bundle on that path (only the
    gate calls it, one path at a time, each closed before the next)."""
    named = os.environ.get(ENV_BACKEND, "").strip()
    if named and named != "auto":
        from .backends import BACKENDS
        from .errors import Sam3TrackError

        if named not in BACKENDS + ("ort", "ov"):
            raise Sam3TrackError(f"${ENV_BACKEND}={named!r} is not a backend; set it to one of "
                                 f"{', '.join(BACKENDS)} or auto, or unset it")
        return Choice(named, _asked(precision, shapes, weights), f"${ENV_BACKEND}={named}")
    if precision is not None or shapes is not None:
        return Choice("openvino", _asked(precision, shapes, weights), "precision=/shapes= are OpenVINO options")
    if gears is not None:
        return Choice("onnxruntime", {}, "gears= given (without shapes=): ONNX Runtime pads its calls to them")
    device = str(device)
    if device.startswith("npu"):
        return Choice("acl", {}, f"device {device}: an OM bundle on pyacl")
    if device != "cpu":
        return Choice("onnxruntime", {}, f"device {device}: ONNX Runtime's execution provider for it")
    if weights not in (None, "fp32"):  # the user's choice of memory over fidelity: never measured
        return Choice("onnxruntime", _asked(None, None, weights), f"weights={weights!r} given: ONNX Runtime, not measured")
    candidates = cpu_candidates()
    if not candidates:
        return Choice("onnxruntime", {}, "ONNX Runtime fp32: no faster path installed (pip install "
                                         "'sam3track[openvino]' to measure OpenVINO here)")
    key = verdict_key(bundle.manifest, threads, candidates)
    cached = _read(key)
    if cached is not None:
        log.info("backend=auto: %s %s (measured earlier on this machine): %s", cached["backend"],
                 cached["options"], cached["reason"])
        return Choice(**cached)
    short = _memory_short_of_gate(bundle)
    if short is not None:  # not kept as a verdict: memory comes back
        return Choice("onnxruntime", {}, f"ONNX Runtime fp32, not measured: {short}")
    choice = run_gate(bundle, candidates, open_predictor)
    _write(key, asdict(choice))
    return choice


def _memory_short_of_gate(bundle) -> str | None:
    """Why the gate must not run now (too little memory for it), or None."""
    from .call_sizes import available_memory

    weights = bundle.graph_bytes()
    free = available_memory()
    if free is None or weights * GATE_MEMORY_FACTOR <= free:
        return None
    return (f"measuring the faster paths would take about {weights * GATE_MEMORY_FACTOR / 2**30:.1f} GB, "
            f"{free / 2**30:.1f} GB is available now (backend='openvino' to choose it yourself)")


def _asked(precision, shapes, weights=None) -> dict:
    asked = (("precision", precision), ("shapes", shapes), ("weights", None if weights == "fp32" else weights))
    return {k: v for k, v in asked if v is not None}


def cpu_candidates() -> list[Candidate]:
    """The CPU paths worth measuring here, fastest first where each pays: bf16 only where OpenVINO
    lists BF16 for this CPU (AMX, AVX512-BF16)."""
    try:
        from .backends.openvino import cpu_capabilities
        bf16 = "BF16" in cpu_capabilities()
    except Exception:  # openvino not installed, or a broken build: nothing to measure
        return []
    return ([Candidate("openvino", {"precision": "bf16"})] if bf16 else []) + [Candidate("openvino", {})]


# --------------------------------------------------------------------------------- the gate
def run_gate(bundle, candidates: list[Candidate], open_predictor) -> Choice:
    """Track the gate clip through ONNX Runtime fp32 and each candidate; the fastest that passes and
    whose resident memory while tracking stays within what the defaults promise (allowed_memory_mb) and
    half this machine's memory (memory_limit_mb)."""
    print(f"sam3track: backend=auto: measuring which path runs {bundle.root} fastest within the parity "
          f"tolerances on this machine (once; {len(candidates) + 1} short runs of {GATE_FRAMES} frames; "
          f"backend='onnxruntime' or ${ENV_BACKEND}=onnxruntime skips it) ...",
          file=sys.stderr, flush=True)
    frames, clicks = gate_clip(bundle.manifest)
    limit = memory_limit_mb()
    before = resident_mb()
    base, base_ms, base_mb = track_gate_clip(open_predictor(BASELINE), frames, clicks)
    measured = [{"path": BASELINE.label, "ms_per_frame": base_ms, "same_ids": True, "iou_mean": 1.0, "iou_min": 1.0,
                 "object_frames": sum(len(ids) for ids, _ in base), "memory_mb": _grown(before, base_mb)}]
    best, best_ms = BASELINE, base_ms
    if not any(m.any() for _, masks in base for m in masks.values()):
        # nothing to hold a candidate to (a seeded test model's clicks give empty masks): equal ids
        # and IoU 1 over empty masks would pass any path that runs
        reason = ("ONNX Runtime fp32 (the reference's numerics); no candidate measured: the gate clip gave "
                  "ONNX Runtime no object pixels to compare against")
        return Choice(BASELINE.backend, {}, reason, measured)
    allowed = allowed_memory_mb(measured[0]["memory_mb"])
    for candidate in candidates:
        before = resident_mb()
        try:
            tracked, ms, rss = track_gate_clip(open_predictor(candidate), frames, clicks, sweep=True)
        except Exception as exc:  # a path that cannot run this bundle is not a candidate
            measured.append({"path": candidate.label, "error": f"{type(exc).__name__}: {exc}"})
            continue
        same_ids, iou_mean, iou_min = compare(base, tracked)
        memory = _grown(before, rss)
        fits = memory is None or ((limit is None or memory <= limit) and (allowed is None or memory <= allowed))
        passed = same_ids and iou_mean >= IOU_MEAN and iou_min >= IOU_MIN
        measured.append({"path": candidate.label, "ms_per_frame": ms, "same_ids": same_ids, "iou_mean": iou_mean,
                         "iou_min": iou_min, "passed": passed, "memory_mb": memory, "fits": fits})
        if passed and fits and ms < best_ms * (MIN_GAIN if best is BASELINE else 1.0):
            best, best_ms = candidate, ms
    choice = Choice(best.backend, dict(best.options), _reason(best, measured), measured)
    log.info("backend=auto chose %s: %s", best.label, choice.reason)
    return choice


def allowed_memory_mb(base_mb: float | None) -> float | None:
    """What a faster path may hold while tracking the gate clip, given ONNX Runtime fp32's MB."""
    return None if base_mb is None else max(DEFAULTS_MEMORY_MB, base_mb + MEMORY_SLACK_MB)


def _reason(best: Candidate, measured: list) -> str:
    base = measured[0]["ms_per_frame"]
    parts = []
    for m in measured[1:]:
        if "error" in m:
            parts.append(f"{m['path']} failed to run ({m['error']})")
            continue
        verdict = "within" if m["passed"] else "outside"
        memory = "" if m.get("fits", True) else _memory_verdict(m, measured[0])
        parts.append(f"{m['path']} {m['ms_per_frame'] / base:.2f}x the time, {verdict} the parity tolerances "
                     f"(ids {'equal' if m['same_ids'] else 'differ'}, IoU mean {m['iou_mean']:.4f} min "
                     f"{m['iou_min']:.4f}){memory}")
    head = "ONNX Runtime fp32 (the reference's numerics)" if best == BASELINE else f"{best.label}: fastest within tolerance"
    return f"{head}; measured against ONNX Runtime fp32: " + "; ".join(parts)


def _memory_verdict(m: dict, base: dict) -> str:
    """Why a path was refused for its memory (it may still be asked for by name)."""
    allowed, limit = allowed_memory_mb(base["memory_mb"]), memory_limit_mb()
    if limit is not None and m["memory_mb"] > limit:
        over = f"over half this machine's memory ({limit:,.0f} MB)"
    else:
        over = (f"over the {allowed:,.0f} MB the defaults keep to (the larger of {DEFAULTS_MEMORY_MB:,.0f} MB and "
                f"ONNX Runtime fp32's own {base['memory_mb']:,.0f} MB +{MEMORY_SLACK_MB:.0f})")
    faster = m["ms_per_frame"] < base["ms_per_frame"] * MIN_GAIN
    ask = f"; load with {_by_name(m['path'])} to take it anyway" if m["passed"] and faster else ""
    return f"; needs {m['memory_mb']:,.0f} MB, {over}{ask}"


def _by_name(label: str) -> str:
    """The load() arguments of a path label: "openvino precision=bf16" -> backend='openvino', precision='bf16'."""
    backend, *options = label.split()
    return ", ".join([f"backend={backend!r}"] + [f"{k}={v!r}" for k, v in (o.split("=", 1) for o in options)])


def gate_clip(manifest: dict) -> tuple[np.ndarray, list[list[int]]]:
    """GATE_FRAMES deterministic frames at the model's input size (textured background, a bright disc
    moving right and a dark square moving down) and three clicks in frame 0: the disc, the square and
    the background (whatever the model makes of each, three objects are tracked)."""
    size = int(manifest["preprocessing"]["image_size"])
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    background = 96 + 48 * np.sin(12 * xx) * np.cos(9 * yy)
    frames = []
    for t in range(GATE_FRAMES):
        frame = np.repeat(background[..., None], 3, axis=2) * np.asarray([1.0, 0.9, 0.8], np.float32)
        cx, cy = 0.35 + 0.04 * t, 0.4
        frame[(xx - cx) ** 2 + (yy - cy) ** 2 < 0.02] = (235, 200, 60)
        frame[(abs(xx - 0.7) < 0.1) & (abs(yy - (0.3 + 0.05 * t)) < 0.1)] = (30, 40, 90)
        frames.append(frame.clip(0, 255).astype(np.uint8))
    clicks = [[0.35, 0.4], [0.7, 0.3], [0.2, 0.8]]
    return np.stack(frames), [[int(x * size), int(y * size)] for x, y in clicks]


def track_gate_clip(predictor, frames: np.ndarray, clicks: list[list[int]], sweep: bool = False):
    """Per frame (ids, masks), the ms per frame of the propagation pass (results come out held back by
    the hotstart delay, so the pass is timed whole) and the process's resident MB once tracked (None
    where unknown); closes the predictor. sweep: then sweep_rows, after the memory is read (OpenVINO
    keeps the buffers of its largest call, which the clip's memory verdict must not count)."""
    with predictor, predictor.start_session(frames) as session:
        session.add_prompt(frame_index=0, text="object")
        for click in clicks:
            session.add_prompt(frame_index=0, points=[click], labels=[1])
        start = time.perf_counter()
        out = [(r.object_ids.tolist(), {int(i): m for i, m in zip(r.object_ids, r.masks)})
               for r in session.propagate()]
        seconds = time.perf_counter() - start
        rss = resident_mb()
        if sweep:
            sweep_rows(predictor)
    return out, 1000 * seconds / max(len(out), 1), rss


def sweep_rows(predictor) -> None:
    """Run every graph with a row axis (objects, buckets) at one row and then at several, on seeded
    feeds; raises what the path raises. The gate clip's calls are mostly of one row, and OpenVINO
    2026.4.1's CPU plugin ran those but refused every larger call of graphs that add one frame's
    features to each row (SAM 3.1 bundles exported before 2026-12-07)."""
    for name, graph in predictor.graphs.items():
        for rows in SWEEP_ROWS:
            feeds = sweep_feeds(predictor, name, rows)
            if feeds is None:
                break
            for out_name, tensor in predictor.backend.run(graph, feeds).items():
                host = predictor.backend.to_host(tensor)
                if host.dtype.kind == "f" and not np.isfinite(host).all():
                    raise RuntimeError(f"graph {name} gave non-finite {out_name} at {rows} rows")


def sweep_feeds(predictor, name: str, rows: int, seed: int = 0) -> dict | None:
    """Seeded feeds of graph ``name`` with ``rows`` on every row axis (one memory and one pointer per
    row), at the sizes the backend plans (seeded_feeds); None for a graph without a row axis."""
    inputs = predictor.bundle.manifest["graphs"][name]["inputs"]
    if not any(set(t["shape"]) & set(SWEEP_AXES) for t in inputs):
        return None
    grid = predictor.bundle.manifest.get("config", {}).get("geometry", {}).get("grid")
    want = {**{axis: rows for axis in SWEEP_AXES}, "mask_side": 16 * grid if grid else 1}
    graph = predictor.graphs[name]
    return seeded_feeds(inputs, lambda dim: predictor.backend.plan(graph, dim, want.get(dim, 1)), seed=seed)


def seeded_feeds(inputs: list[dict], size_of: Callable[[str], int], index: dict | None = None,
                 seed: int = 0) -> dict:
    """Feeds for a graph's manifest input specs, each named axis sized by ``size_of``: ``index`` arrays as
    given, *_valid inputs 1, integer inputs and the 0/1 switches (FLAG_INPUTS) 0, everything else seeded
    normal values (drawn in float32: no float64 copy of a full-size input). benchmarks.graph_speed
    feeds its timings with it too."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for t in inputs:
        shape = [d if isinstance(d, int) else size_of(d) for d in t["shape"]]
        if index and t["name"] in index:
            value = index[t["name"]]
        elif t["name"].endswith("_valid"):
            value = np.ones(shape)
        elif t["dtype"].startswith("int") or t["name"] in FLAG_INPUTS:
            value = np.zeros(shape)
        else:
            value = rng.standard_normal(shape, dtype=np.float32)
        feeds[t["name"]] = np.ascontiguousarray(value, dtype=t["dtype"])
    return feeds


def resident_mb() -> float | None:
    """This process's resident memory (Linux VmRSS), MB; None elsewhere."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return None


def memory_limit_mb() -> float | None:
    """The most a faster path may hold while tracking on this machine: half its memory (MemTotal, or the
    cgroup's limit when lower), so that a verdict is never one this machine cannot hold (the verdict's key
    includes it). None where unknown."""
    from .call_sizes import cgroup_memory, meminfo_bytes

    total, (limit, _) = meminfo_bytes("MemTotal"), cgroup_memory()
    if total is None:
        return None
    return min(total, limit if limit is not None else total) / 2 / 2 ** 20


def _grown(before: float | None, after: float | None) -> float | None:
    return None if before is None or after is None else round(max(0.0, after - before), 1)


def compare(base, other) -> tuple[bool, float, float]:
    """(ids equal on every frame, IoU mean, IoU min over the objects of every frame; empty-both is 1)."""
    same = len(base) == len(other) and all(a[0] == b[0] for a, b in zip(base, other))
    ious = []
    for (ids, masks_a), (_, masks_b) in zip(base, other):
        for i in ids:
            a, b = masks_a[i], masks_b.get(i, np.zeros_like(masks_a[i]))
            union = np.logical_or(a, b).sum()
            ious.append(1.0 if union == 0 else float(np.logical_and(a, b).sum() / union))
    return same, float(np.mean(ious)) if ious else 1.0, float(np.min(ious)) if ious else 1.0


# ----------------------------------------------------------------------------- the verdicts
def verdict_key(manifest: dict, threads: int | None, candidates: list[Candidate]) -> str:
    """What the verdict depends on: the bundle's graphs, this CPU, the threads, the versions."""
    versions = {"sam3track": _package_version()}
    for module in ("onnxruntime", "openvino"):
        try:
            versions[module] = __import__(module).__version__
        except Exception:
            versions[module] = None
    graphs = {name: g.get("sha256") for name, g in manifest["graphs"].items()}
    facts = {"schema": SCHEMA, "graphs": graphs, "cpu": cpu_identity(), "threads": threads,
             "versions": versions, "candidates": [c.label for c in candidates], "memory_limit_mb": memory_limit_mb()}
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()[:24]


def _package_version() -> str:
    """This package's version without importing sam3track/__init__ (which imports this module)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sam3track")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


def cpu_identity() -> str:
    """This CPU's model name and the flags that change which kernels run."""
    model, flags = cpu_model_and_flags()
    wanted = sorted(f for f in flags if f.startswith(("avx", "amx", "fma", "f16c", "sse4")))
    return f"{model} {os.cpu_count()} cpus {' '.join(wanted)}"


def cpu_model_and_flags() -> tuple[str, set[str]]:
    """This CPU's model name and its /proc/cpuinfo flags (empty where there is no /proc/cpuinfo)."""
    model, flags = platform.processor(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and not model:
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    return model, flags


def verdict_folder() -> Path:
    base = os.environ.get("SAM3TRACK_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sam3track"
    return Path(base) / "backend-choice"


def cached_verdict(manifest: dict, threads: int | None = None) -> Choice | None:
    """The verdict a CPU load with backend="auto" would reuse here, None if the gate has not run yet."""
    candidates = cpu_candidates()
    cached = _read(verdict_key(manifest, threads, candidates)) if candidates else None
    return Choice(**cached) if cached is not None else None


def _read(key: str) -> dict | None:
    try:
        value = json.loads((verdict_folder() / f"{key}.json").read_text())
        Choice(**value)
        return value
    except (OSError, ValueError, TypeError):
        return None  # absent, or unreadable: measure again


def _write(key: str, value: dict) -> None:
    """By rename, so concurrent loads read a whole verdict or none; a read-only home only costs the
    next load the gate again."""
    folder = verdict_folder()
    temp = folder / f"{key}.{os.getpid()}.partial"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        temp.write_text(json.dumps(value, sort_keys=True))
        os.replace(temp, folder / f"{key}.json")
    except OSError:
        temp.unlink(missing_ok=True)
