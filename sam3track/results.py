"""What one frame of tracking returns to the user."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class FrameResult:
    """Objects visible on one frame, at the original video resolution.

    Arrays are indexed by object: ``object_ids[i]`` owns ``scores[i]``, ``boxes_xyxy[i]``,
    ``tracker_probs[i]``, ``masks[i]`` and ``prompts[i]``.
    """

    frame_index: int
    object_ids: np.ndarray  # int64 [N]
    scores: np.ndarray  # float32 [N], detection score of the object (the reference's obj_id_to_score)
    boxes_xyxy: np.ndarray  # float32 [N, 4], pixels of the original frame
    masks: np.ndarray  # bool [N, H, W]
    prompts: list[str] = field(default_factory=list)  # the text prompt each object came from ("" if clicked)
    # float32 [N], the tracker's probability that the object is present on this frame (sigmoid of its
    # object score; the reference's obj_id_to_tracker_score, which decides who keeps an overlapping
    # pixel); the score of the object at its birth for objects born on this frame. Zeros when a
    # FrameResult is built without it (e.g. read back from JSON).
    tracker_probs: np.ndarray | None = None
    # ids the reference's own output leaves out: SAM 3.1 keeps the object a click call was for in that
    # call's result even when its mask is empty (so `r.object_ids[-1]` names a new object), where Meta's
    # predictor drops every empty mask. to_official() leaves them out as Meta does.
    official_omits: tuple[int, ...] = ()

    def __post_init__(self):
        if self.tracker_probs is None:
            self.tracker_probs = np.zeros(self.object_ids.shape, np.float32)

    def __len__(self) -> int:
        return int(self.object_ids.shape[0])

    @property
    def height(self) -> int:
        return int(self.masks.shape[1])

    @property
    def width(self) -> int:
        return int(self.masks.shape[2])

    def to_official(self) -> dict:
        """This frame in the output format of Meta's SAM 3 video predictor (its ``_postprocess_output``).

        ``out_obj_ids`` int64 [N]; ``out_probs`` float32 [N], each object's score (``scores``, the
        official ``obj_id_to_score``); ``out_boxes_xywh`` float32 [N, 4], ``(x0 / W, y0 / H, w / W,
        h / H)`` from ``boxes_xyxy`` (inclusive pixel corners, as ``masks_to_boxes`` gives them, so
        ``w = x1 - x0``); ``out_binary_masks`` bool [N, H, W]; ``frame_stats`` None. Arrays are copies.
        Objects in ``official_omits`` are left out.
        """
        h, w = self.height, self.width
        shown = ~np.isin(np.asarray(self.object_ids, np.int64), list(self.official_omits))
        boxes = np.asarray(self.boxes_xyxy, np.float32).reshape(-1, 4)[shown]
        xywh = np.concatenate([boxes[:, :2], boxes[:, 2:] - boxes[:, :2]], axis=1)
        xywh /= np.asarray([w, h, w, h], np.float32)
        return {
            "out_obj_ids": np.asarray(self.object_ids, np.int64)[shown],
            "out_probs": np.asarray(self.scores, np.float32)[shown],
            "out_boxes_xywh": xywh.astype(np.float32),
            "out_binary_masks": np.asarray(self.masks, bool)[shown],
            "frame_stats": None,
        }

    @classmethod
    def empty(cls, frame_index: int, height: int, width: int) -> "FrameResult":
        return cls(
            frame_index=frame_index,
            object_ids=np.zeros((0,), np.int64),
            scores=np.zeros((0,), np.float32),
            boxes_xyxy=np.zeros((0, 4), np.float32),
            masks=np.zeros((0, height, width), bool),
            prompts=[],
            tracker_probs=np.zeros((0,), np.float32),
        )
