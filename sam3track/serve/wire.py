"""The request API's outputs as JSON for ``sam3track serve``: masks as COCO RLE (what ``--json`` and
:class:`~sam3track.sinks.JsonSink` write), numbers as lists, and back to :class:`FrameResult` for the
downloads."""

from __future__ import annotations

import math

import numpy as np

from sam3track.results import FrameResult
from sam3track.sinks import decode_rle, encode_rle


def _number(value) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None  # JSON has no NaN


def outputs_to_wire(outputs: dict) -> dict:
    """``FrameResult.to_official()`` as JSON: ``out_binary_masks`` becomes one RLE per object."""
    return {
        "out_obj_ids": [int(i) for i in outputs["out_obj_ids"]],
        "out_probs": [_number(p) for p in outputs["out_probs"]],
        "out_boxes_xywh": [[_number(v) for v in box] for box in np.asarray(outputs["out_boxes_xywh"]).reshape(-1, 4)],
        "out_binary_masks": [encode_rle(m) for m in outputs["out_binary_masks"]],
        "frame_stats": None,
    }


def response_to_wire(response: dict) -> dict:
    """A request API response with its ``outputs`` (if any) as JSON."""
    if "outputs" not in response:
        return dict(response)
    return {**response, "outputs": outputs_to_wire(response["outputs"])}


def without_object(outputs: dict, obj_id: int) -> dict:
    """``outputs`` (JSON form) without object ``obj_id``."""
    keep = [i for i, o in enumerate(outputs["out_obj_ids"]) if o != obj_id]
    return {name: ([values[i] for i in keep] if name.startswith("out_") else values)
            for name, values in outputs.items()}


def result_from_wire(frame_index: int, outputs: dict, height: int, width: int) -> FrameResult:
    """A :class:`FrameResult` (masks decoded, boxes in pixels) from the JSON outputs of one frame."""
    ids = np.asarray(outputs["out_obj_ids"], np.int64).reshape(-1)
    xywh = np.asarray([[np.nan if v is None else v for v in box] for box in outputs["out_boxes_xywh"]],
                      np.float32).reshape(-1, 4) * np.asarray([width, height, width, height], np.float32)
    boxes = np.concatenate([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], axis=1)
    masks = np.zeros((len(ids), height, width), bool)
    for i, rle in enumerate(outputs["out_binary_masks"]):
        masks[i] = decode_rle(rle)
    scores = np.asarray([0.0 if p is None else p for p in outputs["out_probs"]], np.float32).reshape(-1)
    return FrameResult(frame_index=int(frame_index), object_ids=ids, scores=scores, boxes_xyxy=boxes, masks=masks,
                       prompts=[""] * len(ids))
