"""The one configuration object, filled from the bundle manifest (the checkpoint's own config)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .errors import Sam3TrackError


class ConfigError(Sam3TrackError, TypeError):
    """An unknown configuration option, or a value of the wrong type."""


@dataclass(frozen=True)
class TrackerConfig:
    # preprocessing
    image_size: int
    rescale_factor: float
    image_mean: tuple[float, float, float]
    image_std: tuple[float, float, float]
    text_length: int
    pad_token_id: int
    # model geometry
    low_res_mask_size: int
    feature_grid: int
    hidden_dim: int
    memory_dim: int
    num_queries: int
    # memory bank
    num_maskmem: int
    max_cond_frame_num: int
    max_object_pointers_in_encoder: int
    # detection and association heuristics (transformers' Sam3VideoConfig defaults, per checkpoint)
    score_threshold_detection: float
    det_nms_thresh: float
    assoc_iou_thresh: float
    trk_assoc_iou_thresh: float
    new_det_thresh: float
    recondition_on_trk_masks: bool
    hotstart_delay: int
    hotstart_unmatch_thresh: int
    hotstart_dup_thresh: int
    suppress_unmatched_only_within_hotstart: bool
    init_trk_keep_alive: int
    max_trk_keep_alive: int
    min_trk_keep_alive: int
    suppress_overlapping_based_on_recent_occlusion_threshold: float
    decrease_trk_keep_alive_for_empty_masklets: bool
    fill_hole_area: int
    max_num_objects: int
    recondition_every_nth_frame: int
    high_conf_thresh: float
    high_iou_thresh: float
    # Meta's model runs mask NMS and hole filling; transformers skips both without the `kernels`
    # package. On by default; switch both off to compare with transformers.
    mask_nms: bool = True
    fill_holes: bool = True
    # transformers couples objects of different prompts in three ways: while nothing at all is tracked
    # every detection starts an object, whatever its score; on frames where objects are born every
    # tracked object's memory of that frame is re-encoded from its thresholded mask; and when objects
    # are also removed, the updated id list is paired with the previous masks by position. True
    # reproduces all three (parity); False applies the first rule per prompt, keeps each object's own
    # planning-phase memory and mask, so prompts never affect each other.
    match_reference_quirks: bool = True

    @classmethod
    def from_manifest(cls, manifest: dict, **overrides) -> "TrackerConfig":
        pre, cfg = manifest["preprocessing"], manifest["config"]
        values = dict(
            image_size=pre["image_size"], rescale_factor=pre["rescale_factor"],
            image_mean=tuple(pre["image_mean"]), image_std=tuple(pre["image_std"]),
            text_length=manifest["tokenizer"]["max_length"], pad_token_id=manifest["tokenizer"]["pad_token_id"],
            low_res_mask_size=cfg["tracker"]["low_res_mask_size"], feature_grid=cfg["tracker"]["feature_grid"],
            hidden_dim=cfg["tracker"]["hidden_dim"], memory_dim=cfg["tracker"]["memory_dim"],
            num_queries=cfg["detector"]["num_queries"], num_maskmem=cfg["tracker"]["num_maskmem"],
            max_cond_frame_num=cfg["tracker"]["max_cond_frame_num"],
            max_object_pointers_in_encoder=cfg["tracker"]["max_object_pointers_in_encoder"],
        )
        names = {f.name for f in dataclasses.fields(cls)}
        values.update({k: v for k, v in cfg["heuristics"].items() if k in names})
        unknown = set(overrides) - names
        if unknown:
            raise ConfigError(f"unknown configuration options {sorted(unknown)}; the names are the fields "
                              "of sam3track.config.TrackerConfig")
        for name, value in overrides.items():
            kind = type(values[name]) if name in values else None
            if kind is not None and not isinstance(value, kind) and not (kind is float and isinstance(value, int)):
                raise ConfigError(f"configuration option {name} takes {kind.__name__} values, not {value!r}")
        values.update(overrides)
        return cls(**values)
