"""Clicks and boxes as every family takes them: checked once, in video pixels.

`parse_clicks` turns add_prompt's points, labels and box into one ClickPrompt (a box becomes its two
corners, labels 2 and 3, before the clicks, as SAM's processors store it) or raises a PromptError
naming the call and the value at fault.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import PromptError, PromptTypeError, shown

POSITIVE, NEGATIVE, BOX_TOP_LEFT, BOX_BOTTOM_RIGHT = 1, 0, 2, 3


@dataclass
class ClickPrompt:
    """Every point given for one object on one frame, in the order the decoder reads them."""

    coords: np.ndarray  # float32 [P, 2], (x, y) in video pixels
    labels: np.ndarray  # int32 [P]: 1 positive, 0 negative, 2 / 3 box corners

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def model_coords(self, image_size: int, height: int, width: int) -> np.ndarray:
        scale = np.asarray([image_size / width, image_size / height], np.float32)
        return (self.coords * scale).astype(np.float32)


def _as_array(value, what: str, where: str) -> np.ndarray:
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise PromptTypeError(f"{where}: {what} {shown(value)} must be numbers") from None
    if not np.all(np.isfinite(arr)):
        raise PromptError(f"{where}: {what} {shown(value)} contains a value that is not a finite number")
    return arr


def parse_clicks(points, labels, boxes, height: int, width: int, where: str) -> ClickPrompt:
    """Check one add_prompt call's points, labels and box (video pixels) and return them as the
    decoder reads them (box corners first). Every error names the value at fault."""
    coords = np.zeros((0, 2), np.float32)
    point_labels = np.zeros((0,), np.int32)
    if points is not None and np.size(points) == 0:  # an empty list is no points
        if labels is not None and np.size(labels):
            raise PromptError(f"{where}: labels {shown(labels)} were given without points")
        points = labels = None
    if boxes is not None and np.size(boxes) == 0:
        boxes = None
    if points is not None:
        arr = _as_array(points, "points", where)
        if arr.ndim == 1 and arr.size == 2:
            arr = arr[None]
        if arr.ndim != 2 or arr.shape[1] != 2:
            raise PromptError(f"{where}: points {shown(points)} must be a list of [x, y] pairs, e.g. [[120, 80]]")
        outside = (arr[:, 0] < 0) | (arr[:, 0] > width) | (arr[:, 1] < 0) | (arr[:, 1] > height)
        if outside.any():
            i = int(np.flatnonzero(outside)[0])
            raise PromptError(f"{where}: point {i} {arr[i].tolist()} lies outside the {width}x{height} frame; give "
                              "points in video pixels, x from 0 to the width and y from 0 to the height")
        coords = arr.astype(np.float32)
        if labels is None:
            point_labels = np.full(len(coords), POSITIVE, np.int32)
        else:
            lab = np.asarray(labels)
            if lab.ndim == 0:
                lab = lab[None]
            if lab.ndim != 1 or lab.shape[0] != len(coords):
                raise PromptError(f"{where}: {len(coords)} points need {len(coords)} labels, got {shown(labels)}")
            if lab.dtype == bool or lab.dtype.kind not in "iuf":  # the values 0 / 1, not True / False or text
                raise PromptTypeError(f"{where}: labels {shown(labels)} must be whole numbers, each 1 (on the "
                                      "object) or 0 (not on it)")
            if not all(v in (0, 1) for v in lab.tolist()):
                raise PromptError(f"{where}: labels {shown(labels)} must each be 1 (on the object) or 0 (not on it)")
            point_labels = lab.astype(np.int32)
    elif labels is not None:
        raise PromptError(f"{where}: labels {shown(labels)} were given without points")
    if boxes is not None:
        arr = _as_array(boxes, "box", where)
        if arr.ndim == 2 and arr.shape[0] == 1:
            arr = arr[0]
        if arr.shape != (4,):
            raise PromptError(f"{where}: box {shown(boxes)} must be one [x0, y0, x1, y1] (one box per call)")
        x0, y0, x1, y1 = arr.tolist()
        if x1 < x0 or y1 < y0:
            raise PromptError(f"{where}: box {arr.tolist()} has x1 < x0 or y1 < y0; give [x0, y0, x1, y1] with the "
                              "top-left corner first")
        if x0 < 0 or y0 < 0 or x1 > width or y1 > height:
            raise PromptError(f"{where}: box {arr.tolist()} reaches outside the {width}x{height} frame")
        corners = np.asarray([[x0, y0], [x1, y1]], np.float32)
        coords = np.concatenate([corners, coords])
        point_labels = np.concatenate([np.asarray([BOX_TOP_LEFT, BOX_BOTTOM_RIGHT], np.int32), point_labels])
    if len(point_labels) == 0:
        raise PromptError(f"{where}: no point and no box given; give points=[[x, y], ...] and/or boxes=[x0, y0, x1, y1]")
    return ClickPrompt(coords, point_labels)


def box_rows(boxes, expected: str, error: type[Exception] = PromptError) -> np.ndarray:
    """``boxes`` as float64 [N, 4] (one box or a list of boxes); else ``error`` with ``expected`` (what a
    box list looks like, naming the call) and the value given."""
    try:
        rows = np.asarray(boxes, np.float64)
    except (TypeError, ValueError):
        rows = None
    if rows is None or rows.ndim not in (1, 2) or rows.shape[-1] != 4 or rows.size == 0:
        raise error(f"{expected}, not {shown(boxes)}")
    return rows.reshape(-1, 4)
