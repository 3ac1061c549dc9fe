"""The per-frame image features Meta's SAM 3.1 predictor hands its tracker (reference env).

    <env>/venv/bin/python reference/sam31/dump_frame_features.py --checkpoint DIR/sam3.1_multiplex.pt --out OUT

The predictor is built and loaded as in run_scenarios.py. A session on the first frames of a clip (PNG
folder, Meta's own image-folder loader) gets a text ``add_prompt`` on frame 0 and a forward propagation,
with a detection threshold no score reaches (nothing is born, so only the per-frame image path runs).
Every call of ``run_backbone_and_detection`` is recorded right after it returns, from the
``feature_cache`` entry it fills for its frame, which is what the tracker then reads:

  OUT/features.npz  per call c: ``c/image`` (the stored frame, float16 [3,S,S], Meta's preprocessing),
                    ``c/propagation_<l>`` and ``c/interactive_<l>`` (l = 0, 1, 2: the propagation and
                    interactive neck levels, 0 / 1 after their SAM decoder's conv_s0 / conv_s1),
                    ``c/<neck>_conv_in_<l>`` (l = 0, 1: the levels as those convs received them, i.e.
                    after any bfloat16 rounding), and ``rgb/<i>`` (the decoded uint8 frames [H,W,3])
  OUT/index.json    per call: frame index, whether the batched grounding path ran, and how many
                    bfloat16 storage casts the shim served during it (shim P8b)

A text add_prompt runs the single-frame grounding path; propagation runs the batched one (16-frame
chunks), which handles the prompt frame again.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import shim  # noqa: E402  (puts Meta's source on sys.path)

import common  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

NOTHING_BORN = 2.0  # a detection threshold no probability reaches


def _bf16_casts() -> int:
    return sum(v for k, v in shim.REWRITES.items() if "bfloat16" in k)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--clip", default="bikes.mp4")
    ap.add_argument("--frames", type=int, default=3)
    ap.add_argument("--text", default="bike")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    common.setup_threads(a.threads)
    numerics = shim.install({})
    cfg = common.read_config(a.checkpoint)
    config = {k: cfg[k] for k in shim.CONFIG_KEYS}
    t0 = time.time()
    pred = shim.build_predictor(config=config, checkpoint_path=str(a.checkpoint))
    m = pred.model
    m.score_threshold_detection = m.new_det_thresh = NOTHING_BORN
    m.det_nms_thresh = 0.0
    frames = common.decode_frames(common.CLIPS / a.clip, a.frames)
    arrays: dict[str, np.ndarray] = {f"rgb/{i}": f for i, f in enumerate(frames)}
    calls: list[dict] = []
    orig = m.run_backbone_and_detection

    convs = {"propagation": m.tracker.sam_mask_decoder, "interactive": m.tracker.interactive_sam_mask_decoder}

    def recorded(*args, **kw):
        before = _bf16_casts()
        c = len(calls)
        hooks = []
        for name, dec in convs.items():
            for lvl, conv in enumerate((dec.conv_s0, dec.conv_s1)):
                def hook(mod, inputs, _key=f"{c}/{name}_conv_in_{lvl}"):
                    arrays[_key] = inputs[0].detach().float().cpu().numpy()
                hooks.append(conv.register_forward_pre_hook(hook))
        try:
            out = orig(*args, **kw)
        finally:
            for h in hooks:
                h.remove()
        frame_idx = int(kw["frame_idx"])
        image, cache = kw["feature_cache"][frame_idx]
        arrays[f"{c}/image"] = image.detach().cpu().numpy()
        for name, key in (("propagation", "sam2_backbone_out"), ("interactive", "interactive")):
            for lvl, x in enumerate(cache[key]["backbone_fpn"]):
                arrays[f"{c}/{name}_{lvl}"] = x.tensors.detach().float().cpu().numpy()
        calls.append({"call": c, "frame_index": frame_idx, "batched_grounding": bool(kw.get("use_batched_grounding")),
                      "bf16_storage_casts": _bf16_casts() - before, "image_dtype": str(image.dtype)})
        return out

    m.run_backbone_and_detection = recorded
    with tempfile.TemporaryDirectory(prefix="sam31-frames-") as tmp:
        folder = common.write_png_folder(frames, Path(tmp) / "frames")
        with torch.inference_mode():
            sid = pred.handle_request(dict(type="start_session", resource_path=str(folder)))["session_id"]
            pred.handle_request(dict(type="add_prompt", session_id=sid, frame_index=0, text=a.text))
            for _ in pred.handle_stream_request(dict(type="propagate_in_video", session_id=sid,
                                                     propagation_direction="forward", start_frame_index=0)):
                pass
            pred.handle_request(dict(type="close_session", session_id=sid))
    a.out.mkdir(parents=True, exist_ok=True)
    with open(a.out / "features.npz.partial", "wb") as f:
        np.savez_compressed(f, **arrays)
    (a.out / "features.npz.partial").rename(a.out / "features.npz")
    common.write_json(a.out / "index.json", {
        "checkpoint": str(a.checkpoint), "config": config, "numerics": numerics, "clip": a.clip,
        "frame_sha256": common.frame_sha256(frames), "text": a.text, "calls": calls,
        "facts": common.run_facts(a.threads), "total_s": round(time.time() - t0, 2)})
    print(f"done: {len(calls)} calls in {time.time() - t0:.1f} s -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
