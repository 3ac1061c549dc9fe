"""A smoke kit for a machine with CANN and an NPU: convert, describe, run every gear, track a clip, report.

    python -m om.smoke --bundle BUNDLE --soc Ascend910B2 --out report/ [--frames 30] [--clip VIDEO]

BUNDLE is a plain sam3track bundle exported with --attention plain. The report (report.md, report.json,
the atc logs and CANN's process logs) is what to send back. Without CANN (no atc on PATH or no pyacl) it
runs end to end on sam3track's fake atc and pyacl emulator and says so on its first line. What each
step checks and how to read the report: docs/ascend.md, "The smoke kit".
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path

from sam3track.bundle import Bundle
from sam3track.errors import Sam3TrackError

from . import smoke_runs
from .atc import cann_version
from .convert import convert_bundle

REPO_CLIP = Path(__file__).resolve().parents[1] / "examples" / "clips" / "bikes.mp4"
CLIP_START = 76  # one continuous shot of bikes.mp4 (tests/test_static_shapes.py)


def _pyacl_available() -> bool:
    try:
        import acl  # noqa: F401
    except ImportError:
        return False
    return True


@contextlib.contextmanager
def target(out: Path, soc: str):
    """("hardware", None) with CANN's atc on PATH and pyacl importable, CANN's process logs kept under
    out/ascend-logs (ASCEND_PROCESS_LOG_PATH [CANN env var reference]); else ("emulated", emulator):
    the fake atc first on PATH and the pyacl emulator installed, compiled models checked against soc."""
    if shutil.which("atc") and _pyacl_available():
        old = os.environ.get("ASCEND_PROCESS_LOG_PATH")
        os.environ["ASCEND_PROCESS_LOG_PATH"] = str(out / "ascend-logs")
        try:
            yield "hardware", None
        finally:
            if old is None:
                os.environ.pop("ASCEND_PROCESS_LOG_PATH", None)
            else:
                os.environ["ASCEND_PROCESS_LOG_PATH"] = old
        return
    from sam3track.testing.acl_emulator import install
    from sam3track.testing.fake_atc import install_fake_atc

    bin_dir = out / "emulated-bin"
    install_fake_atc(bin_dir)
    old_path = os.environ["PATH"]
    os.environ["PATH"] = f"{bin_dir}{os.pathsep}{old_path}"
    try:
        with install(soc_version=soc) as emulator:
            yield "emulated", emulator
    finally:
        os.environ["PATH"] = old_path


def models_and_gears(om_dir: Path, source: Bundle, repeats: int) -> tuple[dict, dict]:
    """Per graph: the desc next to the manifest, and every gear against ONNX Runtime (smoke_runs)."""
    from sam3track.backends import create_backend

    bundle = Bundle.open(om_dir)
    om = bundle.om_manifest
    models, gears = {}, {}
    backend = create_backend("acl", "npu:0")
    try:
        acl = backend._acl  # the backend's pyacl, its context current in this thread
        for name, entry in om["graphs"].items():
            got = smoke_runs.describe(acl, om_dir / entry["om_file"])
            want = smoke_runs.expected(entry)
            models[name] = {"desc": got, "manifest": want, "issues": smoke_runs.compare_desc(got, want)}
            try:
                graph = backend.load(name, str(bundle.graph_path(name)), bundle.compiled(name))
                gears[name] = {"precision": entry["precision"], "runs": smoke_runs.run_gears(
                    backend, graph, name, source.manifest["graphs"][name], entry, om_dir / entry["onnx"]["file"],
                    source.manifest, repeats)}
            except Sam3TrackError as exc:
                gears[name] = {"precision": entry["precision"], "error": str(exc)}
    finally:
        backend.close()
    return models, gears


def clip_frames(clip: Path, count: int):
    import numpy as np

    from sam3track.video import open_video

    with open_video(clip) as video:
        start = CLIP_START if clip == REPO_CLIP else 0
        return np.stack([video.read(i) for i in range(start, start + count)])


def run(bundle: Path, soc: str, out: Path, frames: int, clip: Path, prompts: list[str], repeats: int, log=print,
        **load_options) -> dict:
    """Every step, into one report dict (written by write_report)."""
    out.mkdir(parents=True, exist_ok=True)
    source = Bundle.open(bundle)
    report = {"bundle": str(bundle), "family": source.manifest.get("family", "sam3"), "soc": soc,
              "host": f"{platform.system()} {platform.machine()} python {platform.python_version()}"}
    with target(out, soc) as (kind, emulator):
        report["target"] = kind
        report["cann_version"] = cann_version()
        started = time.perf_counter()
        log(f"[{kind}] converting {bundle} for {soc} (atc --log=info, logs in {out / 'atc-logs'})")
        om = convert_bundle(bundle, soc, out / "om-bundle", overwrite=True, atc_log="info",
                            atc_log_dir=out / "atc-logs", log=lambda *_: None)
        report["conversion"] = {"seconds": time.perf_counter() - started, "graphs": {
            g: {"mode": e["mode"], "om_file": e["om_file"], "precision": e["precision"], "command": e["atc_command"]}
            for g, e in om["graphs"].items()}}
        log(f"[{kind}] describing and running every graph at every gear")
        report["models"], report["graphs"] = models_and_gears(out / "om-bundle", source, repeats)
        log(f"[{kind}] tracking {frames} frames of {clip.name} ({', '.join(prompts)})")
        report["tracking"] = smoke_runs.track_clip(bundle, out / "om-bundle", clip_frames(clip, frames), prompts,
                                                   **load_options)
        if emulator is not None:
            report["emulator_errors"] = list(emulator.stats.errors)
    report["verdicts"] = verdicts(report)
    return report


def verdicts(report: dict) -> list[str]:
    """One line per thing that does not hold (empty: every check held)."""
    found = []
    for name, model in report["models"].items():
        found += [f"{name}: desc {issue}" for issue in model["issues"]]
    for name, graph in report["graphs"].items():
        if "error" in graph:
            found.append(f"{name}: could not run: {graph['error']}")
        elif graph["precision"] == "origin":
            worst = max((r["worst_rel"] for r in graph["runs"]), default=0.0)
            if worst > smoke_runs.FP32_REL:
                found.append(f"{name}: relative error {worst:.3g} against ONNX Runtime (fp32 bound {smoke_runs.FP32_REL})")
    t = report["tracking"]
    if t["frames_with_same_ids"] != t["frames"] or (t["iou_mean"] is not None and t["iou_mean"] < 0.99):
        found.append(f"tracking: same ids on {t['frames_with_same_ids']}/{t['frames']} frames, mean IoU {t['iou_mean']}")
    return found


def write_report(out: Path, report: dict) -> None:
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str))
    (out / "report.md").write_text(markdown(report))


def markdown(report: dict) -> str:
    emulated = report["target"] == "emulated"
    lines = [("**EMULATED: no CANN on this machine (atc or pyacl missing). This report ran sam3track's fake atc "
              "and pyacl emulator; it proves the kit runs, nothing about hardware.**") if emulated else
             f"**Hardware run**: CANN {report['cann_version'] or 'version unknown'}, SoC {report['soc']}.", "",
             f"# om.smoke report: {report['bundle']} ({report['family']})", "",
             f"Host: {report['host']}. Conversion: {report['conversion']['seconds']:.1f} s.", "",
             "## Verdicts", ""]
    lines += [f"- {v}" for v in report["verdicts"]] or ["- every check held"]
    lines += ["", "## Graphs (every compiled gear against ONNX Runtime)", "",
              "| graph | mode | precision | gear | worst rel. error | median ms |", "|---|---|---|---|---|---|"]
    for name, graph in report["graphs"].items():
        mode = report["conversion"]["graphs"][name]["mode"]
        if "error" in graph:
            lines.append(f"| {name} | {mode} | {graph['precision']} | - | error: {graph['error'][:80]} | - |")
            continue
        for r in graph["runs"]:
            gear = ", ".join(f"{a}={v}" for a, v in r["gear"].items()) or "static"
            lines.append(f"| {name} | {mode} | {graph['precision']} | {gear} | {r['worst_rel']:.2e} | "
                         f"{1000 * r['seconds']:.2f} |")
    t = report["tracking"]
    lines += ["", "## Tracking", "", f"{t['frames']} frames, prompts {', '.join(t['prompts'])}: same ids on "
              f"{t['frames_with_same_ids']} frames, mask IoU mean {t['iou_mean']}, min {t['iou_min']} "
              f"({t['objects_on_frame_0']} objects on frame 0); ONNX Runtime {t['seconds']['onnxruntime']:.1f} s, "
              f"acl {t['seconds']['acl']:.1f} s.", "",
              "## Model descs", "", "Each .om's desc next to om_manifest.json: report.json, \"models\". Issues:", ""]
    lines += [f"- {g}: {i}" for g, m in report["models"].items() for i in m["issues"]] or ["- none"]
    if emulated:
        lines += ["", "Timings above are the emulator's (ONNX Runtime on this CPU), not an NPU's."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m om.smoke", description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", type=Path, required=True, help="a sam3track bundle exported with --attention plain")
    parser.add_argument("--soc", required=True, help="ATC --soc_version: 'Ascend' + npu-smi's Chip Name")
    parser.add_argument("--out", type=Path, required=True, help="report folder (replaced files: report.*, om-bundle/)")
    parser.add_argument("--frames", type=int, default=30, help="frames of the tracking clip (default 30)")
    parser.add_argument("--clip", type=Path, default=REPO_CLIP, help="video to track (default the repo's bikes.mp4)")
    parser.add_argument("--prompt", nargs="+", default=["person"], help="text prompts of the tracking run")
    parser.add_argument("--repeats", type=int, default=3, help="runs per gear for the timing (median)")
    parser.add_argument("--det-threshold", type=float, help="new_det_thresh of both tracking runs (default: the "
                                                            "bundle's)")
    args = parser.parse_args(argv)
    options = {} if args.det_threshold is None else {"new_det_thresh": args.det_threshold}
    try:
        report = run(args.bundle, args.soc, args.out, args.frames, args.clip, args.prompt, args.repeats, **options)
    except Sam3TrackError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    write_report(args.out, report)
    print(f"{'EMULATED (no CANN): ' if report['target'] == 'emulated' else ''}report in {args.out / 'report.md'}; "
          f"{len(report['verdicts'])} verdict(s) against")
    return 0 if not report["verdicts"] else 1


if __name__ == "__main__":
    sys.exit(main())
