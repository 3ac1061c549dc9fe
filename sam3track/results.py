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
    # object score); the score of the object at its birth for objects born on this frame
    tracker_probs: np.ndarray | None = None

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
