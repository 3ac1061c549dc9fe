"""Drawing tracked objects onto a frame: tinted masks, outlines, boxes and labels."""

from __future__ import annotations

import cv2
import numpy as np

from sam3track.errors import VideoError
from sam3track.results import FrameResult

# Tableau's 20-colour palette (matplotlib "tab20"), RGB. Indexed by ``object_id % 20`` rather
# than by a hash so an object keeps its colour across frames, runs and machines, and ids
# 0..19 never share a colour.
PALETTE: np.ndarray = np.array(
    [
        (31, 119, 180), (174, 199, 232), (255, 127, 14), (255, 187, 120),
        (44, 160, 44), (152, 223, 138), (214, 39, 40), (255, 152, 150),
        (148, 103, 189), (197, 176, 213), (140, 86, 75), (196, 156, 148),
        (227, 119, 194), (247, 182, 210), (127, 127, 127), (199, 199, 199),
        (188, 189, 34), (219, 219, 141), (23, 190, 207), (158, 218, 229),
    ],
    dtype=np.uint8,
)  # fmt: skip

_FONT = cv2.FONT_HERSHEY_SIMPLEX


def color_for(object_id: int) -> tuple[int, int, int]:
    """The RGB colour of an object id (stable: palette[id % 20])."""
    r, g, b = PALETTE[int(object_id) % len(PALETTE)]
    return int(r), int(g), int(b)


def label_for(result: FrameResult, i: int) -> str:
    """``"id <id> <prompt> <score>"`` for object ``i`` of ``result`` (prompt omitted if unknown)."""
    prompt = result.prompts[i] if i < len(result.prompts) else ""
    parts = [f"id {int(result.object_ids[i])}"]
    if prompt:
        parts.append(prompt)
    parts.append(f"{float(result.scores[i]):.2f}")
    return " ".join(parts)


def draw_objects(
    rgb: np.ndarray,
    result: FrameResult,
    *,
    alpha: float = 0.5,
    draw_boxes: bool = True,
    draw_labels: bool = True,
) -> np.ndarray:
    """Return a copy of ``rgb`` with every object of ``result`` drawn on it.

    Masks are blended with the object's colour at ``alpha``; each mask gets a 2-pixel outline
    and each object a thin box and a label ``"id <id> <prompt> <score:.2f>"`` above the box
    (inside it when the box touches the top edge). Objects are drawn in list order, so later
    ones cover earlier ones where they overlap. Pixels away from every mask, outline, box and
    label are left exactly as they were.
    """
    if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype != np.uint8:
        raise VideoError(
            f"frame {result.frame_index}: cannot draw on an image of shape {rgb.shape} and "
            f"dtype {rgb.dtype}; pass an [H, W, 3] uint8 RGB frame"
        )
    height, width = rgb.shape[:2]
    if len(result) and result.masks.shape[1:] != (height, width):
        raise VideoError(
            f"frame {result.frame_index}: masks are {result.masks.shape[2]}x"
            f"{result.masks.shape[1]} but the frame is {width}x{height}; draw each result on "
            f"the frame it came from"
        )
    out = rgb.copy()
    if not len(result):
        return out

    # Work on each mask's bounding crop only: objects are usually small next to the frame.
    crops = [_crop(np.asarray(m, dtype=bool)) for m in result.masks]

    # Masks first (all objects), then outlines/boxes/labels, so no tint covers a label.
    for i, crop in enumerate(crops):
        if crop is None:
            continue
        (y0, y1, x0, x1), mask = crop
        region = out[y0:y1, x0:x1]
        color = np.asarray(color_for(result.object_ids[i]), np.float32)
        blended = region[mask].astype(np.float32) * (1.0 - alpha) + color * alpha
        region[mask] = np.clip(np.rint(blended), 0, 255).astype(np.uint8)

    for i, crop in enumerate(crops):
        color = color_for(result.object_ids[i])
        if crop is not None:
            (y0, _, x0, _), mask = crop
            contours, _ = cv2.findContours(
                mask.astype(np.uint8), cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE, offset=(x0, y0)
            )
            cv2.drawContours(out, contours, -1, color, thickness=2, lineType=cv2.LINE_8)
        box = result.boxes_xyxy[i]
        if not np.all(np.isfinite(box)):
            continue
        x0, y0, x1, y1 = (int(round(float(v))) for v in box)
        x0, x1 = sorted((min(max(x0, 0), width - 1), min(max(x1, 0), width - 1)))
        y0, y1 = sorted((min(max(y0, 0), height - 1), min(max(y1, 0), height - 1)))
        if draw_boxes:
            cv2.rectangle(out, (x0, y0), (x1, y1), color, thickness=1, lineType=cv2.LINE_8)
        if draw_labels:
            _draw_label(out, label_for(result, i), x0, y0, color)
    return out


def _crop(mask: np.ndarray) -> tuple[tuple[int, int, int, int], np.ndarray] | None:
    """``((y0, y1, x0, x1), mask[y0:y1, x0:x1])`` of a mask's bounding box; None if empty."""
    rows = np.flatnonzero(mask.any(axis=1))
    if rows.size == 0:
        return None
    cols = np.flatnonzero(mask.any(axis=0))
    y0, y1, x0, x1 = int(rows[0]), int(rows[-1]) + 1, int(cols[0]), int(cols[-1]) + 1
    return (y0, y1, x0, x1), mask[y0:y1, x0:x1]


def _draw_label(out: np.ndarray, text: str, x: int, y: int, color: tuple[int, int, int]) -> None:
    """A filled tag in the object's colour with black or white text, whichever reads better."""
    height, width = out.shape[:2]
    scale = max(0.4, min(1.0, height / 900))
    thickness = 1
    (tw, th), baseline = cv2.getTextSize(text, _FONT, scale, thickness)
    tag_h = th + baseline + 4
    top = y - tag_h if y - tag_h >= 0 else y  # above the box, or inside it at the top edge
    left = min(max(x, 0), max(width - tw - 4, 0))
    cv2.rectangle(out, (left, top), (left + tw + 4, top + tag_h), color, thickness=cv2.FILLED)
    luminance = 0.299 * color[0] + 0.587 * color[1] + 0.114 * color[2]
    ink = (0, 0, 0) if luminance > 140 else (255, 255, 255)
    cv2.putText(
        out, text, (left + 2, top + th + 2), _FONT, scale, ink, thickness, cv2.LINE_AA
    )
