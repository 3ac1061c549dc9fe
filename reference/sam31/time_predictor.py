"""Time Meta's SAM 3.1 video predictor per frame at controlled object counts (reference env).

    <env>/venv/bin/python reference/sam31/time_predictor.py --checkpoint DIR/sam3.1_multiplex.pt \
        --objects 1,16,64,128 --frames 4 --out OUT.json [--clip bikes.mp4 --text bike --threads 2 --reps 1]

The speed side of issue 12's benchmark (benchmarks/ runs this by subprocess, one repetition per call, so
its repetitions interleave with sam3track's). Per object count N the predictor is built by Meta's
builder with ``max_num_objects=N`` (its cap; Meta's default is 16) and driven only through
``handle_request`` / ``handle_stream_request``: ``add_prompt`` (text) on frame 0, then
``propagate_in_video`` forward. N objects are born on frame 0 by the thresholds rule of run_scenarios.py
(halfway between the N-th and (N+1)-th detection score of a probe session), and the cap keeps later
births from adding any. The same overrides on every count, recorded in the output: thresholds, mask NMS
off (``det_nms_thresh=0``: with overlapping random boxes it keeps one detection), masklet confirmation off
(with random weights it never confirms, and every propagated frame would come out empty), and
``hotstart_delay=0`` (the hotstart rules remove nobody, so the count holds).

Written to OUT.json: per N, the seconds of the add_prompt request and of every propagated frame
(wall time between yields; Meta grounds frames in batches of 16 before tracking them, so only their
mean, ``per_frame_s``, is a per-frame cost: backbone, detection, tracking of every bucket,
post-processing), the object count of each response, the thresholds and overrides, and the run's facts (threads, torch).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import shim  # noqa: E402  (puts Meta's source on sys.path)

import common  # noqa: E402
import driver  # noqa: E402
import run_scenarios  # noqa: E402

OVERRIDES = {"det_nms_thresh": 0.0, "masklet_confirmation_enable": False, "hotstart_delay": 0}


def time_count(pred, folder: Path, text: str, n: int, scores: list[float]) -> dict:
    m = pred.model
    threshold, why = run_scenarios.threshold_for(scores, n)
    overrides = {"score_threshold_detection": threshold, "new_det_thresh": threshold, **OVERRIDES}
    saved = {k: getattr(m, k) for k in overrides}
    for k, v in overrides.items():
        setattr(m, k, v)
    d = driver.Driver(pred, log=lambda *_: None)
    try:
        d.start(folder)
        d.request("text", type="add_prompt", frame_index=0, text=text)
        d.stream("forward", propagation_direction="forward", start_frame_index=0)
        d.close()
    finally:
        for k, v in saved.items():
            setattr(m, k, v)
    responses = d.results()["responses"]
    return {
        "objects_asked": n, "threshold": why,
        "overrides": {k: {"meta_value": saved[k], "value": v} for k, v in overrides.items()},
        "add_prompt_s": responses[0]["seconds"], "add_prompt_objects": responses[0]["n_obj"],
        "frames": [r["frame_index"] for r in responses[1:]],
        "frame_s": [r["seconds"] for r in responses[1:]],
        # Meta grounds frames in batches (use_batched_grounding, 16 frames a batch) before it tracks them, so
        # the first yield carries the batch's detector time: only the mean over the frames is per-frame
        "propagate_s": sum(r["seconds"] for r in responses[1:]),
        "per_frame_s": sum(r["seconds"] for r in responses[1:]) / max(1, len(responses) - 1),
        "frame_objects": [r["n_obj"] for r in responses[1:]],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--objects", default="1,16,64,128")
    ap.add_argument("--frames", type=int, default=4)
    ap.add_argument("--clip", default="bikes.mp4")
    ap.add_argument("--text", default="bike")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--clips", type=Path, default=common.CLIPS)
    a = ap.parse_args(argv)
    counts = [int(x) for x in a.objects.split(",")]
    common.setup_threads(a.threads)
    numerics = shim.install(dict(shim.DEFAULT_NUMERICS))
    cfg = common.read_config(a.checkpoint)
    config = {k: cfg[k] for k in shim.CONFIG_KEYS}
    out = {"checkpoint": str(a.checkpoint), "clip": a.clip, "text": a.text, "frames": a.frames,
           "numerics": numerics, "facts": common.run_facts(a.threads), "counts": {}}
    with tempfile.TemporaryDirectory(prefix="sam31-time-") as tmp:
        frames = common.decode_frames(a.clips / a.clip, a.frames)
        folder = common.write_png_folder(frames, Path(tmp) / "frames")
        out["frame_sha256"] = common.frame_sha256(frames)
        scores = None
        for n in counts:
            t = time.time()
            pred = shim.build_predictor(config=config, checkpoint_path=str(a.checkpoint), max_num_objects=n)
            build_s = time.time() - t
            if scores is None:  # the detector's scores do not depend on the cap
                scores = run_scenarios.probe_scores(pred, folder, a.text, 0, {})[0]
            if len(scores) <= n:
                raise SystemExit(f"error: frame 0 of {a.clip} has {len(scores)} detections for {a.text!r}; "
                                 f"{n} objects need {n + 1}")
            out["counts"][str(n)] = {"build_s": round(build_s, 2), **time_count(pred, folder, a.text, n, scores)}
            r = out["counts"][str(n)]
            print(f"N={n}: add_prompt {r['add_prompt_s']:.2f} s ({r['add_prompt_objects']} objects), frames "
                  f"{[round(s, 2) for s in r['frame_s']]} s, objects {r['frame_objects']}", flush=True)
            del pred
    common.write_json(a.out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
