"""How closely a fast variant (OpenVINO, bf16, int8) follows ONNX Runtime fp32 on the sample clips.

Both run propagate() over the first frames of each clip with sam3track's defaults (mask NMS, hole
filling, the hotstart rules on) except the detection thresholds, which are set per clip halfway between
the n-th and (n+1)-th detection score of its first frame (so about n detections per frame; no cap on
objects, so births and removals happen). Per frame: the same object ids or not; per object present in
both: mask IoU at video resolution.
"""

from __future__ import annotations

import numpy as np


def track_clip(predictor, frames: np.ndarray, prompts) -> list[tuple[list[int], dict[int, np.ndarray]]]:
    with predictor.start_session(frames) as session:
        for text in prompts:
            session.add_prompt(frame_index=0, text=text)
        return [(r.object_ids.tolist(), {int(i): m for i, m in zip(r.object_ids, r.masks)})
                for r in session.propagate()]


def compare(base, other) -> dict:
    same, ious, objects = 0, [], []
    for (ids_a, masks_a), (ids_b, masks_b) in zip(base, other):
        same += ids_a == ids_b
        objects.append(len(ids_a))
        for i in set(ids_a) & set(ids_b):
            a, b = masks_a[i], masks_b[i]
            union = np.logical_or(a, b).sum()
            ious.append(1.0 if union == 0 else float(np.logical_and(a, b).sum() / union))
    return {"frames": len(base), "same_ids_fraction": same / max(len(base), 1),
            "iou_mean": float(np.mean(ious)) if ious else None, "iou_min": float(np.min(ious)) if ious else None,
            "object_frames_compared": len(ious), "objects_per_frame_fp32": objects,
            "distinct_ids_fp32": len({i for ids, _ in base for i in ids})}
