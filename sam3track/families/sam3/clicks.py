"""SAM 3's clicks and boxes per object and frame, kept as the reference keeps them.

A prompt is stored as the reference's processor stores it (transformers
`Sam3TrackerVideoProcessor.process_new_points_or_boxes_for_video_frame`): one list of points per
(object, frame); new clicks are appended to the frame's earlier ones unless `clear_old_points`; a box
can only start a frame's prompt. Coordinates are kept in video pixels and scaled to the model's input
size only when the interactive decoder is called. Checking the clicks is the core's (prompts.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...errors import PromptError
from ...prompts import BOX_TOP_LEFT, ClickPrompt, parse_clicks  # noqa: F401  (parse_clicks: the old path)


@dataclass
class ClickBook:
    """The clicks and boxes of every object, per frame (the reference's point_inputs_per_obj)."""

    prompts: dict[int, dict[int, ClickPrompt]] = field(default_factory=dict)  # obj id -> frame -> prompt

    def merged(self, obj_id: int, frame: int, new: ClickPrompt, clear_old: bool, where: str) -> ClickPrompt:
        """What the object's prompt on `frame` becomes with `new` added (nothing stored yet)."""
        old = self.prompts.get(obj_id, {}).get(frame)
        if clear_old or old is None:
            return new
        if (new.labels >= BOX_TOP_LEFT).any():
            raise PromptError(f"{where}: a box must come before any click on a frame; object {obj_id} already has "
                              f"clicks on frame {frame}: pass clear_old_points=True to start that frame over")
        return ClickPrompt(np.concatenate([old.coords, new.coords]), np.concatenate([old.labels, new.labels]))

    def store(self, obj_id: int, frame: int, prompt: ClickPrompt) -> None:
        self.prompts.setdefault(obj_id, {})[frame] = prompt

    def frames(self) -> set[int]:
        return {f for per_frame in self.prompts.values() for f in per_frame}

    def drop(self, obj_id: int) -> None:
        self.prompts.pop(obj_id, None)

    def clear(self) -> None:
        self.prompts.clear()


def use_multimask(config, is_init: bool, num_points: int) -> bool:
    """transformers `Sam3TrackerVideoModel._use_multimask` (box corners count as points)."""
    return bool(config.multimask_output_in_sam
                and (is_init or config.multimask_output_for_tracking)
                and config.multimask_min_pt_num <= num_points <= config.multimask_max_pt_num)
