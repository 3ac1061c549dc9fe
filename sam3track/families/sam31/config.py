"""The one SAM 3.1 configuration object, filled from the manifest (Meta's builder values, exported by
graphs/sam31/export.py as config.heuristics and config.tracker). No defaults of its own: every value the
runtime reads comes from the manifest or from an explicit keyword override at load time."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ...config import ConfigError, check_override_names, refuse_fixed

REQUIRED_GRAPHS = ("text_encoder", "backbone", "interactive_neck", "grounding_head", "propagation_decoder",
                   "memory_encoder", "interactive_decoder", "mask_init")

# manifest sections -> the fields taken from them
_HEURISTICS = (
    "score_threshold_detection", "new_det_thresh", "det_nms_thresh", "det_nms_use_iom",
    "suppress_det_close_to_boundary", "assoc_iou_thresh", "trk_assoc_iou_thresh", "hotstart_delay",
    "hotstart_unmatch_thresh", "hotstart_dup_thresh", "suppress_unmatched_only_within_hotstart",
    "suppress_overlapping_based_on_recent_occlusion_threshold", "allow_unoccluded_to_suppress",
    "init_trk_keep_alive", "max_trk_keep_alive", "min_trk_keep_alive",
    "decrease_trk_keep_alive_for_empty_masklets", "fill_hole_area", "sprinkle_removal_area",
    "recondition_every_nth_frame", "use_iom_recondition", "iom_thresh_recondition", "iou_thresh_recondition",
    "masklet_confirmation_enable", "masklet_confirmation_consecutive_det_thresh", "max_num_objects",
    "bucket_capacity", "reconstruction_bbox_iou_thresh", "o2o_matching_masklets_enable", "postprocess_batch_size",
)
_TRACKER = (
    "multiplex_count", "num_maskmem", "max_obj_ptrs_in_encoder", "max_cond_frames_in_attn", "image_size",
    "low_res_mask_size", "input_mask_size", "hidden_dim", "sam_image_embedding_size", "multimask_min_pt_num",
    "multimask_max_pt_num", "multimask_output_in_sam", "non_overlap_masks_for_output",
)
REQUIRED_KEYS = (
    ("preprocessing", "image_size"), ("preprocessing", "image_mean"), ("preprocessing", "image_std"),
    ("preprocessing", "storage_dtype"), ("tokenizer", "dir"), ("tokenizer", "max_length"),
    ("tokenizer", "pad_token_id"), ("config", "detector", "num_queries"),
    *(("config", "heuristics", k) for k in _HEURISTICS), *(("config", "tracker", k) for k in _TRACKER),
)
# what the graphs were exported with: an override would break them
FIXED_BY_MODEL = frozenset(_TRACKER) | {"text_length", "pad_token_id", "image_mean", "image_std", "num_queries",
                                        "bucket_capacity"}


@dataclass(frozen=True)
class Sam31Config:
    # preprocessing (Meta's image-folder loader: PIL bilinear resize, frames stored as float16)
    image_mean: tuple[float, float, float]
    image_std: tuple[float, float, float]
    text_length: int
    pad_token_id: int
    num_queries: int
    # tracker geometry
    multiplex_count: int
    num_maskmem: int
    max_obj_ptrs_in_encoder: int
    max_cond_frames_in_attn: int
    image_size: int
    low_res_mask_size: int
    input_mask_size: int
    hidden_dim: int
    sam_image_embedding_size: int
    multimask_min_pt_num: int
    multimask_max_pt_num: int
    multimask_output_in_sam: bool
    non_overlap_masks_for_output: bool
    # heuristics (Sam3MultiplexBase / the builder)
    score_threshold_detection: float
    new_det_thresh: float
    det_nms_thresh: float
    det_nms_use_iom: bool
    suppress_det_close_to_boundary: bool
    assoc_iou_thresh: float
    trk_assoc_iou_thresh: float
    hotstart_delay: int
    hotstart_unmatch_thresh: int
    hotstart_dup_thresh: int
    suppress_unmatched_only_within_hotstart: bool
    suppress_overlapping_based_on_recent_occlusion_threshold: float
    allow_unoccluded_to_suppress: bool
    init_trk_keep_alive: int
    max_trk_keep_alive: int
    min_trk_keep_alive: int
    decrease_trk_keep_alive_for_empty_masklets: bool
    fill_hole_area: int
    sprinkle_removal_area: int
    recondition_every_nth_frame: int
    use_iom_recondition: bool
    iom_thresh_recondition: float
    iou_thresh_recondition: float
    masklet_confirmation_enable: bool
    masklet_confirmation_consecutive_det_thresh: int
    max_num_objects: int
    bucket_capacity: int
    reconstruction_bbox_iou_thresh: float
    o2o_matching_masklets_enable: bool
    postprocess_batch_size: int

    @property
    def feature_grid(self) -> int:
        return self.sam_image_embedding_size

    @classmethod
    def from_manifest(cls, manifest: dict, **overrides) -> "Sam31Config":
        pre, cfg, tok = manifest["preprocessing"], manifest["config"], manifest["tokenizer"]
        values = dict(image_mean=tuple(pre["image_mean"]), image_std=tuple(pre["image_std"]),
                      text_length=tok["max_length"], pad_token_id=tok["pad_token_id"],
                      num_queries=cfg["detector"]["num_queries"])
        values.update({k: cfg["tracker"][k] for k in _TRACKER})
        values.update({k: cfg["heuristics"][k] for k in _HEURISTICS})
        if pre["image_size"] != values["image_size"]:
            raise ConfigError(f"the manifest's preprocessing.image_size {pre['image_size']} differs from "
                              f"config.tracker.image_size {values['image_size']}; export the bundle again")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        check_override_names(overrides, fields, " for a SAM 3.1 bundle", "sam3track.families.sam31.config.Sam31Config")
        for name, value in overrides.items():
            refuse_fixed(name, FIXED_BY_MODEL)
            want = type(values[name])
            ok = isinstance(value, bool) if want is bool else (
                isinstance(value, (int, float)) and not isinstance(value, bool)
                and (want is float or float(value).is_integer()))
            if not ok:
                raise ConfigError(f"configuration option {name} takes a {want.__name__}, not {value!r}")
            values[name] = want(value)
        if values["o2o_matching_masklets_enable"]:
            raise ConfigError("o2o_matching_masklets_enable is not supported (Meta's SAM 3.1 asserts it is off)")
        if values["bucket_capacity"] != values["multiplex_count"]:
            raise ConfigError(f"bucket_capacity {values['bucket_capacity']} differs from the graphs' multiplex "
                              f"count {values['multiplex_count']}; export the bundle again")
        return cls(**values)
