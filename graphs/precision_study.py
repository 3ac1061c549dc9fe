"""What ATC's default precision would do to tracking, measured without an NPU (docs/ascend.md, "Precision").

    python -m graphs.precision_study OUT

ATC's default --precision_mode_v2 is fp16: every op with a float16 kernel computes in float16. Its
stand-in here is ONNX Runtime's float16 conversion of a graph (graphs.export --fp16: weights and
arithmetic in float16, inputs and outputs float32). On the tiny seeded SAM 3 model (plain attention) it
prints each graph's drift against the torch modules (graphs.check) with all graphs in float16, then a
40-frame, two-prompt tracking run against the float32 bundle with all graphs, all but the text encoder,
and each graph alone in float16: frames with the same ids and mask IoU.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

GRAPHS = ("text_encoder", "backbone", "grounding_head", "propagation_decoder", "interactive_decoder",
          "memory_encoder", "mask_init")
CLIP = Path(__file__).resolve().parents[1] / "examples" / "clips" / "bikes.mp4"
PROMPTS = ("person", "bike")


def _bundle(root: Path, name: str, fp16: tuple[str, ...]) -> Path:
    from .sam3.export import export_bundle

    out = root / name
    if not out.exists():
        export_bundle(None, out, tiny_seed=0, log=lambda *_: None, attention="plain", fp16=fp16)
    return out


def drift_per_graph(bundle: Path) -> dict:
    """graphs.check of a bundle: per graph the worst relative error over its cases and whether every case
    is within its precision's bound."""
    from .sam3.check import run_checks

    per: dict[str, dict] = {}
    for row in run_checks(bundle, log=lambda *_: None):
        g = per.setdefault(row.graph, {"worst_rel": 0.0, "ok": True, "cases": 0})
        g["worst_rel"], g["ok"], g["cases"] = max(g["worst_rel"], float(row.rel)), g["ok"] and row.ok, g["cases"] + 1
    return per


def _frames() -> np.ndarray:
    from sam3track.video import open_video

    with open_video(CLIP) as video:
        return np.stack([video.read(i) for i in range(76, 116)])  # one continuous shot


def track(bundle: Path, frames: np.ndarray) -> list:
    import sam3track

    with sam3track.load(bundle, new_det_thresh=0.3) as predictor:
        session = predictor.start_session(frames)
        for text in PROMPTS:
            session.add_prompt(frame_index=0, text=text)
        results = list(session.propagate())
        session.close()
    return results


def compare(want: list, got: list) -> dict:
    same, ious = 0, []
    for a, b in zip(want, got):
        if a.object_ids.tolist() != b.object_ids.tolist():
            continue
        same += 1
        for m, n in zip(a.masks, b.masks):
            union = np.logical_or(m, n).sum()
            ious.append(1.0 if union == 0 else float(np.logical_and(m, n).sum() / union))
    return {"frames_with_same_ids": same, "frames": len(want), "iou_mean": float(np.mean(ious)) if ious else None,
            "iou_min": float(np.min(ious)) if ious else None}


def main(argv: list[str] | None = None) -> int:
    root = Path((argv or sys.argv[1:] or ["precision-study"])[0])
    root.mkdir(parents=True, exist_ok=True)
    frames = _frames()
    want = track(_bundle(root, "fp32", ()), frames)
    report = {"drift_all_fp16": drift_per_graph(_bundle(root, "fp16", GRAPHS)), "tracking": {}}
    variants = {"all": GRAPHS, "all but text_encoder": tuple(g for g in GRAPHS if g != "text_encoder")}
    variants.update({f"only {g}": (g,) for g in GRAPHS})
    for label, fp16 in variants.items():
        name = "fp16" if fp16 == GRAPHS else "fp16-" + "-".join(fp16) if len(fp16) == 1 else "fp16-but-text"
        report["tracking"][label] = compare(want, track(_bundle(root, name, fp16), frames))
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
