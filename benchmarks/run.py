"""sam3track against transformers' Sam3VideoModel: time per frame at controlled object counts, where the
time goes, fast variants and their fidelity, and RSS over a long live stream.

    python -m benchmarks.run [--preset tiny|mid|full] [--objects 1,4,16,64] [--frames N] [--reps R]
                             [--out DIR] [--variants ort-fp32,openvino-fp32,openvino-bf16,ort-int8]
                             [--reference-bf16] [--rss-frames 1000] [--publish]

Writes results.json, results.md, ms_per_frame.png and breakdown.png to --out. Presets, the bundle cache,
--low-memory, --threads and the measurements behind them: docs/benchmarks/README.md; the latest numbers:
docs/speed.md. `python -m benchmarks.report OUT` rewrites results.md and the plots from OUT/results.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from .bundles import PRESETS, BundleInfo, exporter_hash, get_bundle, int8_supported
from .measure import (SCORING_OVERRIDES, Reference, bf16_cpu, count_overrides, ours_detection_scores, run_ours,
                      summarize)

REPO = Path(__file__).resolve().parents[1]
CLIPS = REPO / "examples" / "clips"
VARIANTS = {
    "ort-fp32": {"bundle": "fp32", "backend": "onnxruntime"},
    "openvino-fp32": {"bundle": "fp32", "backend": "openvino", "precision": "fp32"},
    "openvino-bf16": {"bundle": "fp32", "backend": "openvino", "precision": "bf16"},
    # each graph compiled again for the object count its calls settle on (sam3track/backends/openvino_rows.py)
    "openvino-bf16-rows": {"bundle": "fp32", "backend": "openvino", "precision": "bf16", "shapes": "rows"},
    # static shapes: each graph compiled again per distinct call shape (in the warm-up run), faster calls
    "openvino-fp32-static": {"bundle": "fp32", "backend": "openvino", "precision": "fp32", "shapes": "static"},
    "openvino-bf16-static": {"bundle": "fp32", "backend": "openvino", "precision": "bf16", "shapes": "static"},
    # static shapes at every call's own sizes (no padding to call_sizes.static_gears): more compiles
    "openvino-bf16-static-exact": {"bundle": "fp32", "backend": "openvino", "precision": "bf16", "shapes": "static",
                                   "gears": {}},
    "ort-int8": {"bundle": "int8", "backend": "onnxruntime"},
    # weights kept in fp16, computed in fp32 (sam3track/backends/fp16_weights.py): the memory-light path
    "ort-fp16-weights": {"bundle": "fp32", "backend": "onnxruntime", "weights": "fp16"},
    # what sam3track.load(bundle) runs: the path backend="auto" measured fastest within tolerance here
    "auto": {"bundle": "fp32", "backend": "auto"},
}
# On our side only (the reference has no such settings): NMS and hole filling off, as transformers
# runs without its CUDA kernel; the reference's cross-prompt quirks on, so both sides do the same work;
# pools big enough for the largest count.
OURS_FIXED = {"mask_nms": False, "fill_holes": False, "match_reference_quirks": True}
NMS_NOTE = ("are off on both sides: transformers runs them only through the `kernels-community/cv-utils` kernel, "
            "which is CUDA-only and fetched from the hub, and skips both silently without it, so a CPU user of "
            "transformers never gets them (sam3track: `mask_nms=False, fill_holes=False`). The test-side CPU ports "
            "in tests/reference_kernels.py exist for correctness and are not representative of the kernel's speed.")
COUNTS_NOTE = ("are set identically on both sides (`sam3track.load(bundle, **overrides)`, attributes of the "
               "reference model): `max_num_objects` = N; `score_threshold_detection` = `new_det_thresh` = halfway "
               "between the N-th and (N+1)-th detection score of the first frame over all prompts (computed with "
               "the reference's detector), so N detections start objects on frame 0 (later frames detect more or "
               "fewer, as scores move; none can add an object past the cap); `hotstart_delay` = 0, so the hotstart "
               "rules remove nobody; `det_nms_thresh` = 0 (NMS is off on both sides, see below; without its kernel "
               "the reference would still compute the detections' pairwise mask IoU, quadratic in detections, and "
               "discard it). Ours also runs with `match_reference_quirks=True` (the reference's cross-prompt "
               "coupling, so both do the same work). Fast variants at another precision (bf16, int8) score detections "
               "a little differently, so each of them gets its thresholds by the same rule from its own first-frame "
               "scores (ort-fp32 shares the reference's). The table lists every per-frame tracked count seen in every "
               "repetition of each side.")


REFERENCE_SIDES = ("reference", "reference-bf16")  # the same transformers model in fp32 and under autocast bf16


class Unavailable(Exception):
    pass


# ------------------------------------------------------------------------------------------ helpers
def machine_info() -> dict:
    cpu = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ram = float("nan")
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram = int(line.split()[1]) / 1024 ** 2
    except OSError:
        pass
    versions = {"python": platform.python_version()}
    for name in ("numpy", "onnxruntime", "openvino", "torch", "transformers"):
        try:
            module = __import__(name)
            versions[name] = getattr(module, "__version__", "?")
        except Exception:
            versions[name] = "not installed"
    flags = ""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        pass
    isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_int8", "avx512_vnni") if f" {f}" in flags]
    return {"cpu": cpu, "cpu_short": cpu.replace("(R)", "").replace("(TM)", ""), "cores": os.cpu_count(),
            "ram_gb": ram, "isa": isa, "versions": versions, "platform": platform.platform(),
            "load_start": _load(), "load_end": None}


def code_info() -> dict:
    """The commit measured (and whether the work tree had changes), and the hash of graphs/**/*.py that
    keys the bundle cache."""
    def git(*a):
        try:
            return subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
    return {"commit": git("rev-parse", "--short", "HEAD") or None, "dirty": bool(git("status", "--porcelain")),
            "graphs_hash": exporter_hash()}


def _load() -> str:
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "?"


def clip_frames(clip: Path, start: int, count: int) -> np.ndarray:
    from sam3track.video import open_video

    with open_video(clip) as video:
        return np.stack([video.read(start + i) for i in range(count)])


def bundle_config(bundle: Path):
    """The bundle's preprocessing config and tokenizer, without loading a graph."""
    from sam3track.bundle import Bundle
    from sam3track.families.sam3.config import TrackerConfig
    from sam3track.tokenizer import PromptTokenizer

    b = Bundle.open(Path(bundle))
    config = TrackerConfig.from_manifest(b.manifest)
    return b.manifest, config, PromptTokenizer(b.tokenizer_file, config.text_length, config.pad_token_id)


def load_variant(name: str, bundles: dict, overrides: dict, threads: int | None):
    import importlib.util
    import inspect

    import sam3track
    from sam3track.predictor import Predictor

    spec = VARIANTS[name]
    bundle = bundles.get(spec["bundle"])
    if isinstance(bundle, str):
        raise Unavailable(bundle)
    options = {}
    if spec["backend"] == "openvino":
        if importlib.util.find_spec("sam3track.backends.openvino") is None:
            raise Unavailable("sam3track.backends.openvino is not in this checkout (the OpenVINO backend is being built)")
        if "precision" not in inspect.signature(Predictor.load).parameters:
            raise Unavailable("sam3track.load has no precision= option in this checkout")
        options["precision"] = spec["precision"]
        options.update({k: spec[k] for k in ("shapes", "gears") if k in spec})
    if "weights" in spec:
        options["weights"] = spec["weights"]
    try:
        return sam3track.load(bundle.bundle, backend=spec["backend"], threads=threads, **options, **overrides)
    except Exception as exc:  # a missing runtime, a CPU without bf16, ...: reported, the run goes on
        raise Unavailable(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")


def _stat(values: list[float]) -> dict:
    return {"median": float(statistics.median(values)), "min": float(min(values)), "max": float(max(values)),
            "values": [round(v, 3) for v in values]}


def side_summary(reps: list[list], n: int, ours: bool) -> dict:
    sums = [summarize(r) for r in reps]
    outside = ("preprocess", "results") if ours else ("postprocess",)
    model = [s["ms"] - sum(s["parts_ms"].get(c, 0.0) for c in outside) for s in sums]
    cats = sorted({c for s in sums for c in s["parts_ms"]})
    keys = sorted({k for s in sums for k in s["transfers"]})
    tracked = [s["tracked"] for s in sums]
    return {"ms": _stat([s["ms"] for s in sums]), "model_ms": _stat(model),
            "first_frame_ms": float(statistics.median(s["first_frame_ms"] for s in sums)),
            "parts_ms": {c: float(statistics.median(s["parts_ms"].get(c, 0.0) for s in sums)) for c in cats},
            "transfers": {k: float(statistics.median(s["transfers"].get(k, 0.0) for s in sums)) for k in keys},
            "tracked": tracked, "shown": [s["shown"] for s in sums], "detections": [s["detections"] for s in sums],
            "counts_ok": all(c == n for rep in tracked for c in rep)}


def slope(ns: list[int], ms: list[float]) -> dict:
    if len(ns) < 2:
        return {"ms_per_object": float("nan"), "intercept_ms": float("nan")}
    a, b = np.polyfit(np.asarray(ns, float), np.asarray(ms, float), 1)
    return {"ms_per_object": float(a), "intercept_ms": float(b)}


def _records(records) -> list[dict]:
    return [vars(r) for r in records]


# ----------------------------------------------------------------------------------------- stages
def time_counts(args, preset, bundles, results, save, log) -> None:
    manifest, config, tokenizer = bundle_config(bundles["fp32"].bundle)
    frames = clip_frames(args.clip, args.start_frame, args.frames)
    h, w = frames.shape[1:3]
    results["settings"]["video_size"] = f"{w}x{h}"
    ref = Reference(bundles["fp32"].source, threads=args.threads)
    pixels = ref.pixels(frames, config)
    scores = ref.detection_scores(pixels[0], args.prompts, tokenizer)
    results["first_frame_scores"] = [round(s, 6) for s in scores]
    own_scores = _variant_scores(args, bundles, frames, results)
    bf16_scores = _reference_bf16_scores(args, ref, pixels[0], tokenizer, results)
    for n in args.objects:
        key = str(n)
        overrides, note = count_overrides(scores, n)
        results["count_notes"][key] = note
        results["overrides"][key] = {"both": overrides, "ours_only": {**OURS_FIXED, "pool_objects": max(64, n)}}
        log(f"[{n} objects] thresholds {overrides['score_threshold_detection']:.6f} (load {_load()})")
        ref_overrides = {"reference": overrides}
        if bf16_scores is not None:  # its own thresholds, from its own scores, as a fast variant of ours
            ref_overrides["reference-bf16"], bf16_note = count_overrides(bf16_scores, n)
            results["overrides"][key]["reference-bf16"] = ref_overrides["reference-bf16"]
            results.setdefault("variant_count_notes", {}).setdefault(key, {})["reference-bf16"] = bf16_note
        variant_overrides = _variant_overrides(args, n, overrides, own_scores, results)
        raw = _time_count(args, bundles, frames, key, variant_overrides, (ref, ref_overrides),
                          (pixels, h, w, tokenizer), results, log)
        if getattr(ref, "bf16_error", None):
            results["reference_bf16"].update(available=False, reason=ref.bf16_error)
            bf16_scores = None
        for side, reps in raw.items():
            results["summary"].setdefault(side, {})[key] = side_summary(reps, n, ours=side not in REFERENCE_SIDES)
            results["runs"].setdefault(side, {})[key] = [_records(r) for r in reps]
        results["load_after"][key] = _load()
        finish(results)
        save()
    del ref


def _reference_bf16_scores(args, ref, pixel_frame, tokenizer, results) -> list[float] | None:
    """The first-frame detection scores of the reference under autocast bf16 (--reference-bf16), or None
    where not asked or this CPU has no native bf16 (then the side is recorded as unavailable, and why)."""
    if not args.reference_bf16:
        return None
    why_not = bf16_cpu()
    results["reference_bf16"] = {"available": why_not is None, "reason": why_not}
    if why_not is not None:
        return None
    ref.bf16 = True
    try:
        scores = ref.detection_scores(pixel_frame, args.prompts, tokenizer)
    finally:
        ref.bf16 = False
    results["reference_bf16_first_frame_scores"] = [round(s, 6) for s in scores[:80]]
    return scores


def run_reference(args, refs, side: str, inputs, n_frames: int | None = None):
    """One run of a reference side: "reference" (fp32) or "reference-bf16" (the same model under
    torch.autocast bf16), each with its own count settings. refs: (Reference, {side: overrides})."""
    ref, overrides = refs
    pixels, h, w, tokenizer = inputs
    ref.configure(overrides[side])
    ref.bf16 = side == "reference-bf16"
    try:
        return ref.run(pixels, h, w, args.prompts, tokenizer, n_frames=n_frames)
    except Exception as exc:
        if side == "reference":
            raise
        ref.bf16_error = f"failed to run: {type(exc).__name__}: {exc}"  # the side is dropped, the run goes on
        overrides.pop(side)
        return None
    finally:
        ref.bf16 = False


def _variant_scores(args, bundles, frames, results) -> dict:
    """First-frame detection scores of each fast variant, by name. A variant at another precision scores
    detections a little differently: its thresholds come from its own first-frame scores, so that it too
    tracks N objects (ort-fp32 shares the reference's: they match)."""
    variants = results["variants"]
    own_scores = {}
    for name in args.variants:
        if name == "ort-fp32" or not variants[name]["available"]:
            continue
        try:
            predictor = load_variant(name, bundles, SCORING_OVERRIDES, args.threads)
        except Unavailable as exc:
            variants[name].update(available=False, reason=str(exc))
            continue
        choice = getattr(predictor, "backend_choice", None)
        if name == "auto" and choice is not None:  # which path the default took here, and why
            variants[name]["chose"] = {"backend": choice.backend, **choice.options, "reason": choice.reason}
        try:
            own_scores[name] = ours_detection_scores(predictor, frames[0], args.prompts)
        finally:
            predictor.close()
        results.setdefault("variant_first_frame_scores", {})[name] = [round(s, 6) for s in own_scores[name][:80]]
    return own_scores


def _variant_overrides(args, n: int, overrides: dict, own_scores: dict, results: dict) -> dict:
    """Each variant's load() overrides at n objects: the shared count settings (or its own, from its own
    scores) plus the fixed ones of our side."""
    key = str(n)
    variant_overrides = {}
    for name in args.variants:
        mine = overrides
        if name in own_scores:
            mine, mine_note = count_overrides(own_scores[name], n)
            results["overrides"][key][name] = mine
            results.setdefault("variant_count_notes", {}).setdefault(key, {})[name] = mine_note
        variant_overrides[name] = {**mine, **OURS_FIXED, "pool_objects": max(64, n)}
    return variant_overrides


def _time_count(args, bundles, frames, key, variant_overrides, refs, inputs, results, log) -> dict:
    """One object count: our variants loaded, warmed up and timed interleaved with the reference sides
    (refs: see run_reference); the records of every repetition, by side."""
    variants = results["variants"]
    predictors = {}  # loaded once per count; with --low-memory, loaded for each run and closed after it

    def ours(name, n_frames=None):
        if not args.low_memory:
            return run_ours(predictors[name], frames, args.prompts, n_frames=n_frames)
        predictor = load_variant(name, bundles, variant_overrides[name], args.threads)
        try:  # a fresh predictor: its own warm-up first, as the reference's model stays warm
            warm = run_ours(predictor, frames, args.prompts, n_frames=args.warmup_frames)
            results["warmup"].setdefault(name, {}).setdefault(key, [r.ms for r in warm])  # the first one
            return run_ours(predictor, frames, args.prompts, n_frames=n_frames)
        finally:
            predictor.close()

    for name in args.variants:
        if not variants[name]["available"]:
            continue
        try:
            predictors[name] = None if args.low_memory else load_variant(name, bundles, variant_overrides[name],
                                                                         args.threads)
        except Unavailable as exc:
            variants[name].update(available=False, reason=str(exc))
            log(f"  {name}: unavailable: {exc}")
    raw = {name: [] for name in predictors}
    _warm_up(args, ours, predictors, raw, key, results, log)
    for side in list(refs[1]):
        warm = run_reference(args, refs, side, inputs, n_frames=args.warmup_frames)
        if warm is not None:
            raw[side] = []
            results["warmup"].setdefault(side, {})[key] = [r.ms for r in warm]
    order = ["ort-fp32", *refs[1]] + [v for v in predictors if v != "ort-fp32"]
    order = [s for s in order if s in refs[1] or s in predictors]
    _interleaved_reps(args, order, ours, refs, inputs, raw, variants, log)
    for predictor in predictors.values():
        if predictor is not None:
            predictor.close()
    return raw


def _warm_up(args, ours, predictors, raw, key, results, log) -> None:
    """Warm-up (not reported): first calls at new shapes pay for allocations and kernel selection. A
    variant that fails here is marked unavailable and dropped."""
    variants = results["variants"]
    for name in [] if args.low_memory else list(predictors):  # (--low-memory: inside each run)
        try:
            warm = ours(name, n_frames=args.warmup_frames)
            results["warmup"].setdefault(name, {})[key] = [r.ms for r in warm]
        except Exception as exc:
            variants[name].update(available=False, reason=f"failed to run: {type(exc).__name__}: {exc}")
            log(f"  {name}: failed to run: {exc}")
            failed = predictors.pop(name)
            if failed is not None:
                failed.close()
            raw.pop(name)


def _interleaved_reps(args, order, ours, refs, inputs, raw, variants, log) -> None:
    """args.reps repetitions of every side in order, interleaved; a variant that fails is dropped."""
    for rep in range(args.reps):
        for side in list(order):  # a side that fails is removed from order
            if side in REFERENCE_SIDES:
                records = run_reference(args, refs, side, inputs)
                if records is None:
                    log(f"  {side}: {refs[0].bf16_error}")
                    order.remove(side)
                    raw.pop(side)
                    continue
            else:
                try:
                    records = ours(side)
                except Exception as exc:
                    variants[side].update(available=False, reason=f"failed to run: {type(exc).__name__}: {exc}")
                    log(f"  {side}: failed to run: {exc}")
                    order.remove(side)
                    raw.pop(side)
                    continue
            raw[side].append(records)
            s = summarize(records)
            log(f"  rep {rep + 1}/{args.reps} {side:<14} {s['ms']:9.1f} ms/frame  tracked {s['tracked']}")


def fidelity_stage(args, preset, bundles, results, save, log) -> None:
    from .fidelity import compare, track_clip

    fast = [v for v in args.variants if v != "ort-fp32" and results["variants"][v]["available"]]
    results["fidelity_method"] = (
        f"Both ort-fp32 and the variant run `propagate()` over the first {args.fidelity_frames} frames of each "
        f"sample clip with the prompts above and sam3track's defaults (mask NMS, hole filling and the hotstart "
        f"rules on, no cap on objects), except the detection thresholds (`score_threshold_detection` = "
        f"`new_det_thresh`), set per clip halfway between the {args.fidelity_objects}th and "
        f"{args.fidelity_objects + 1}th detection score of its first frame (about that many detections per frame; "
        "with no cap, objects are born on later frames too). "
        "Same ids: the frame's id list is identical. IoU: masks at video resolution of the ids both have.")
    if not fast:
        return
    manifest, config, tokenizer = bundle_config(bundles["fp32"].bundle)
    ref = Reference(bundles["fp32"].source, threads=args.threads)
    for name in fast:
        results["fidelity"][name] = {}
    for clip in sorted(CLIPS.glob("*.mp4")):
        frames = clip_frames(clip, 0, args.fidelity_frames)
        scores = ref.detection_scores(ref.pixels(frames[:1], config)[0], args.prompts, tokenizer)
        overrides, _ = count_overrides(scores, args.fidelity_objects)
        overrides = {k: overrides[k] for k in ("score_threshold_detection", "new_det_thresh")}
        log(f"fidelity on {clip.name}: thresholds {overrides['score_threshold_detection']:.6f}")
        base = load_variant("ort-fp32", bundles, overrides, args.threads)
        reference_tracks = track_clip(base, frames, args.prompts)
        base.close()
        for name in fast:
            if isinstance(results["fidelity"][name], str):
                continue
            try:
                predictor = load_variant(name, bundles, overrides, args.threads)
                try:
                    found = compare(reference_tracks, track_clip(predictor, frames, args.prompts))
                finally:
                    predictor.close()
            except Exception as exc:
                results["fidelity"][name] = f"failed: {type(exc).__name__}: {exc}"
                continue
            results["fidelity"][name][clip.name] = found
            log(f"  {name}: {found['same_ids_fraction']:.3f} of frames with the same ids, IoU mean {found['iou_mean']}")
        save()


def rss_stage(args, bundles, results, save, log) -> None:
    info = (bundles["fp32"] if args.rss_preset == args.preset
            else get_bundle(args.rss_preset, args.cache, seed=args.seed, log=log))
    manifest, config, tokenizer = bundle_config(info.bundle)
    frames = clip_frames(args.clip, args.start_frame, 1)
    ref = Reference(info.source, threads=args.threads)
    prompts = list(PRESETS[args.rss_preset].prompts)
    scores = ref.detection_scores(ref.pixels(frames, config)[0], prompts, tokenizer)
    del ref
    overrides, note = count_overrides(scores, args.rss_objects)
    rss = {"preset": args.rss_preset, "objects": args.rss_objects, "overrides": overrides, "count_note": note,
           "method": (f"`{args.rss_preset}` preset, {args.rss_objects} objects (controlled as above; ours keeps its "
                      f"defaults `retire_unseen_after` and `max_conditioning_frames`), prompts "
                      f"{', '.join(map(repr, prompts))}, a live stream of {args.rss_frames} frames: the continuous shot "
                      f"of {args.clip.name} frames {args.start_frame}..{args.start_frame + args.rss_shot - 1} played "
                      f"forward and backward in a loop. Ours: `session.track(frame)`; reference: "
                      f"`model(inference_session=session, frame=pixel_values)`; each result postprocessed to masks at "
                      f"video resolution. Each side in a process of its own; RSS (VmRSS) sampled every "
                      f"{args.rss_every} frames, peak = VmHWM. Growth: least-squares slope of the samples after "
                      f"frame 100. Mid-size streams: `--rss-preset mid` (1000 frames take hours on 2 cores).")}
    for side in ("ours", "reference"):
        spec = {"side": side, "bundle": str(info.bundle), "source": str(info.source), "clip": str(args.clip),
                "start_frame": args.start_frame, "shot_frames": args.rss_shot, "frames": args.rss_frames,
                "every": args.rss_every, "prompts": prompts, "overrides": overrides, "threads": args.threads,
                "ours_overrides": {**OURS_FIXED, "pool_objects": max(64, args.rss_objects)}}
        with tempfile.TemporaryDirectory() as tmp:
            spec_file, out_file = Path(tmp) / "spec.json", Path(tmp) / "out.json"
            spec_file.write_text(json.dumps(spec))
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
            log(f"RSS stream, {side}: {args.rss_frames} frames ...")
            proc = subprocess.run([sys.executable, "-m", "benchmarks.stream", str(spec_file), str(out_file)],
                                  cwd=REPO, env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                rss[side] = {"error": (proc.stderr.strip().splitlines() or ["?"])[-1]}
                log(f"  failed: {rss[side]['error']}")
                continue
            raw = json.loads(out_file.read_text())
        samples = raw["samples"]
        late = [s for s in samples if s["frames"] >= 100] or samples[1:]
        growth = slope([s["frames"] for s in late], [s["rss_mb"] for s in late])["ms_per_object"] * 100 \
            if len(late) >= 2 else float("nan")
        timed = [s["ms_median"] for s in samples if s["ms_median"] is not None]
        rss[side] = {"frames": raw["frames"], "seconds": raw["seconds"], "start_mb": samples[0]["rss_mb"],
                     "after_first_mb": samples[1]["rss_mb"], "peak_mb": raw["peak_rss_mb"],
                     "end_mb": samples[-1]["rss_mb"], "growth_mb_per_100": growth,
                     "ms_first_block": timed[1] if len(timed) > 1 else timed[0], "ms_last_block": timed[-1],
                     "tracked": "/".join(map(str, sorted({s["tracked"] for s in samples[1:]}))), "samples": samples}
        log(f"  {side}: RSS {rss[side]['start_mb']:.0f} -> peak {rss[side]['peak_mb']:.0f} -> end "
            f"{rss[side]['end_mb']:.0f} MB, {growth:+.1f} MB/100 frames")
    results["rss"] = rss
    save()


def finish(results: dict) -> None:
    """Ratios and slopes from whatever has been measured so far."""
    summary = results["summary"]
    ref, ref_bf16 = summary.get("reference", {}), summary.get("reference-bf16", {})
    results["ratios"], results["model_ratios"], results["slopes"] = {}, {}, {}
    results["bf16_ratios"] = {}  # ours / the reference under autocast bf16 (best against best)
    for side, per_n in summary.items():
        ns = sorted(per_n, key=int)
        results["slopes"][side] = slope([int(n) for n in ns], [per_n[n]["ms"]["median"] for n in ns])
        results["slopes"][side]["model_ms_per_object"] = slope(
            [int(n) for n in ns], [per_n[n]["model_ms"]["median"] for n in ns])["ms_per_object"]
        if side == "reference":
            continue
        if side != "reference-bf16" and ref_bf16:
            results["bf16_ratios"][side] = {n: per_n[n]["ms"]["median"] / ref_bf16[n]["ms"]["median"]
                                            for n in ns if n in ref_bf16}
        results["ratios"][side] = {n: per_n[n]["ms"]["median"] / ref[n]["ms"]["median"] for n in ns if n in ref}
        results["model_ratios"][side] = {n: per_n[n]["model_ms"]["median"] / ref[n]["model_ms"]["median"]
                                         for n in ns if n in ref}


def main(argv: list[str] | None = None) -> int:
    """The command line. --threads sets torch's thread count for the reference, which is process-wide:
    it is put back afterwards, so a caller in the same process (the test suite) keeps its own (the
    reference's float results depend on it)."""
    import torch

    threads = torch.get_num_threads()
    try:
        return _main(argv)
    finally:
        torch.set_num_threads(threads)


def _main(argv: list[str] | None) -> int:
    args = _arguments(argv)

    def log(msg: str) -> None:
        print(msg, flush=True)

    results = _new_results(args, argv)

    def save() -> None:
        results["machine"]["load_end"] = _load()
        (args.out / "results.json").write_text(json.dumps(results, indent=1, default=str))

    log(f"output: {args.out}")
    preset = PRESETS[args.preset]
    bundles = _bundles(args, results, log)
    save()
    time_counts(args, preset, bundles, results, save, log)
    fidelity_stage(args, preset, bundles, results, save, log)
    if args.rss_frames > 0:
        rss_stage(args, bundles, results, save, log)
    results["finished"] = time.strftime("%Y-%m-%d %H:%M")
    finish(results)
    save()
    write_reports(results, args.out)
    if args.publish:
        dest = REPO / "docs" / "benchmarks" / args.preset
        dest.mkdir(parents=True, exist_ok=True)
        for name in ("results.md", "results.json", "ms_per_frame.png", "breakdown.png"):
            shutil.copy2(args.out / name, dest / name)
        log(f"published to {dest}")
    log(f"wrote {args.out / 'results.md'}")
    return 0


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[2:]))
    ap.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    ap.add_argument("--objects", help="object counts, comma-separated (default: the preset's)")
    ap.add_argument("--frames", type=int, help="frames per run (>= 2: frame 0 births, the rest timed)")
    ap.add_argument("--reps", type=int, help="repetitions per side and object count")
    ap.add_argument("--warmup-frames", type=int, help="frames of the one warm-up run per side and count "
                    "(default: the preset's)")
    ap.add_argument("--out", type=Path, help="output folder (default: a new temporary folder)")
    ap.add_argument("--cache", type=Path, help="bundle cache (default: OUT/bundles)")
    ap.add_argument("--bundle", type=Path, help="measure this fp32 bundle of --preset instead of exporting one "
                    "(the reference loads --source, default BUNDLE/source)")
    ap.add_argument("--source", type=Path, help="the checkpoint the reference loads (with --bundle)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help=f"variants of ours to time ({', '.join(VARIANTS)}); ort-fp32 is always run")
    ap.add_argument("--reference-bf16", action="store_true",
                    help="also time the reference under torch.autocast('cpu', dtype=torch.bfloat16) (a bf16 CPU: "
                         "AVX512-BF16 or AMX), with its own thresholds from its own first-frame scores")
    ap.add_argument("--int8-graphs", default="backbone", help="graphs the ort-int8 bundle quantises, comma-separated")
    ap.add_argument("--prompts", help="text prompts, comma-separated (default: the preset's)")
    ap.add_argument("--clip", type=Path, default=CLIPS / "bikes.mp4")
    ap.add_argument("--start-frame", type=int, default=76, help="first frame of the clip (76: a continuous shot)")
    ap.add_argument("--threads", type=int, help="intra-op threads for both sides (default: each runtime's own)")
    ap.add_argument("--fidelity-frames", type=int, help="frames per sample clip for the variants' fidelity")
    ap.add_argument("--fidelity-objects", type=int, default=16)
    ap.add_argument("--rss-frames", type=int, default=1000, help="frames of the RSS stream (0: skip it)")
    ap.add_argument("--rss-every", type=int, default=50)
    ap.add_argument("--rss-preset", choices=sorted(PRESETS), default="tiny")
    ap.add_argument("--rss-objects", type=int, default=4)
    ap.add_argument("--rss-shot", type=int, default=40, help="frames of the shot looped for the stream")
    ap.add_argument("--low-memory", action="store_true",
                    help="load our predictor for each run and close it before the reference runs, so the two never "
                         "hold their weights and buffers at once (default for --preset full)")
    ap.add_argument("--publish", action="store_true", help="also copy the outputs to docs/benchmarks/<preset>/")
    return ap


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    """The parsed command line with the preset's defaults filled in and the paths made absolute."""
    ap = _parser()
    args = ap.parse_args(argv)
    preset = PRESETS[args.preset]
    args.objects = [int(n) for n in args.objects.split(",")] if args.objects else list(preset.objects)
    args.frames = args.frames or preset.frames
    args.reps = args.reps or preset.reps
    args.prompts = [p.strip() for p in args.prompts.split(",")] if args.prompts else list(preset.prompts)
    args.fidelity_frames = args.fidelity_frames or (16 if args.preset == "tiny" else 4)
    args.warmup_frames = min(args.warmup_frames or preset.warmup_frames, args.frames)
    args.low_memory = args.low_memory or args.preset == "full"
    args.variants = ["ort-fp32"] + [v for v in (s.strip() for s in args.variants.split(",")) if v and v != "ort-fp32"]
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown or args.frames < 2 or args.reps < 1 or min(args.objects) < 1:
        ap.error(f"unknown variants {unknown}" if unknown else "need --frames >= 2, --reps >= 1, objects >= 1")
    settle_paths(args, f"sam3track-bench-{args.preset}-")
    return args


def settle_paths(args: argparse.Namespace, prefix: str) -> None:
    """--out (a new temporary folder when not given), --cache (default OUT/bundles) and --clip, absolute."""
    args.out = (args.out or Path(tempfile.mkdtemp(prefix=prefix))).absolute()
    args.out.mkdir(parents=True, exist_ok=True)
    args.cache = (args.cache or args.out / "bundles").absolute()
    args.clip = args.clip.absolute()


def _new_results(args, argv: list[str] | None) -> dict:
    """results.json before anything is measured: the command, machine, code and settings."""
    return {
        "tool": "benchmarks.run", "command": "python -m benchmarks.run " + " ".join(sys.argv[1:] if argv is None else argv),
        "started": time.strftime("%Y-%m-%d %H:%M"), "finished": None, "preset": args.preset,
        "machine": machine_info(), "code": code_info(), "model": "", "bundles": {},
        "settings": {"objects": args.objects, "frames": args.frames, "reps": args.reps,
                     "warmup_frames": args.warmup_frames, "prompts": args.prompts,
                     "clip": args.clip.relative_to(REPO).as_posix() if args.clip.is_relative_to(REPO) else str(args.clip),
                     "start_frame": args.start_frame, "video_size": None, "threads_n": args.threads,
                     "threads": (f"Intra-op threads: {args.threads} on both sides (ONNX Runtime intra_op_num_threads, "
                                 f"torch.set_num_threads)." if args.threads else
                                 "Threads: each runtime's default (ONNX Runtime and torch use every core)."),
                     "counts_method": COUNTS_NOTE, "nms": NMS_NOTE, "variants": args.variants},
        "variants": {v: {"available": True, "reason": None} for v in args.variants},
        "count_notes": {}, "overrides": {}, "first_frame_scores": [], "summary": {}, "runs": {},
        "ratios": {}, "model_ratios": {}, "slopes": {}, "load_after": {},
        "fidelity": {}, "fidelity_method": "", "rss": None, "warmup": {},
    }


def _bundles(args, results: dict, log) -> dict:
    """The fp32 bundle (given or exported) and, with ort-int8, the int8 one or why not; the model described
    and every variant's backend tried once, so a missing one fails fast, before minutes of timing."""
    if args.bundle:
        source = (args.source or args.bundle / "source").absolute()
        bundles: dict[str, BundleInfo | str] = {"fp32": BundleInfo(args.preset, "fp32", args.bundle.absolute(), source, None)}
    else:
        bundles = {"fp32": get_bundle(args.preset, args.cache, seed=args.seed, log=log)}
    if "ort-int8" in args.variants:
        reason = int8_supported()
        bundles["int8"] = reason or get_bundle(args.preset, args.cache, seed=args.seed,
                                               int8=tuple(args.int8_graphs.split(",")), log=log)
        if reason:
            results["variants"]["ort-int8"].update(available=False, reason=reason)
    results["bundles"] = {k: (v if isinstance(v, str) else {"bundle": str(v.bundle), "source": str(v.source),
                                                            "export_seconds": v.export_seconds})
                          for k, v in bundles.items()}
    manifest = json.loads((bundles["fp32"].bundle / "manifest.json").read_text())
    results["model"] = _describe(args.preset, manifest)
    for name in args.variants:  # fail fast on a missing backend, before minutes of timing
        if results["variants"][name]["available"] and name != "ort-fp32":
            try:
                load_variant(name, bundles, {}, args.threads).close()
            except Unavailable as exc:
                results["variants"][name].update(available=False, reason=str(exc))
                log(f"{name}: unavailable: {exc}")
    return bundles


def write_reports(results: dict, out: Path) -> None:
    from .report import markdown, plots

    (out / "results.md").write_text(markdown(results))
    plots(results, out)


def _describe(preset: str, manifest: dict) -> str:
    cfg = manifest.get("config", {})
    pre = manifest.get("preprocessing", {})
    src = manifest.get("source", {})
    what = {"tiny": "the seeded test model (graphs/sam3/tiny.py `tiny`)",
            "mid": "the seeded `mid` model: the default Sam3VideoConfig's widths at 504 px, 4-layer ViT, 2-layer text "
                   "encoder (graphs/sam3/tiny.py)",
            "full": "the default Sam3VideoConfig at full size with seeded random weights (benchmarks/bundles.py)"}[preset]
    return (f"{what}; image {pre.get('image_size')} px, {cfg.get('detector', {}).get('num_queries')} detector queries, "
            f"{src.get('parameters', 0) / 1e6:.0f} M parameters; exporter: "
            + ", ".join(f"{k} {v}" for k, v in manifest.get("exporter", {}).items() if k != "export_seconds")
            + "; graph precisions: " + ", ".join(sorted({str(g.get("precision", "fp32"))
                                                         for g in manifest.get("graphs", {}).values()})))


if __name__ == "__main__":
    raise SystemExit(main())
