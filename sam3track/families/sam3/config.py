"""SAM 3's one configuration object, filled from the bundle manifest (the checkpoint's own config)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ...config import ConfigError, check_override_names, refuse_fixed


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
    # when the tracker's SAM head gives 3 masks and keeps the best (transformers _use_multimask): with
    # multimask_output_in_sam, on initial conditioning frames (or any frame with
    # multimask_output_for_tracking) when the point count is within [multimask_min_pt_num,
    # multimask_max_pt_num]; a box counts as 2 points
    multimask_output_in_sam: bool
    multimask_output_for_tracking: bool
    multimask_min_pt_num: int
    multimask_max_pt_num: int
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
    # package. On by default; switch both off to compare with transformers without it.
    mask_nms: bool = True
    fill_holes: bool = True
    # transformers couples objects of different prompts in three ways: while nothing at all is tracked
    # every detection starts an object, whatever its score; on frames where objects are born every
    # tracked object's memory of that frame is re-encoded from its thresholded mask; and when objects
    # are also removed, the updated id list is paired with the previous masks by position, so masks are
    # shown under the wrong ids. False (the default) applies the first rule per prompt and keeps each
    # object's own memory and mask, so prompts never affect each other; True reproduces all three, for
    # comparing with transformers frame by frame.
    match_reference_quirks: bool = False
    # Long videos and streams (sam3track's own policy; the reference keeps every object and every
    # conditioning frame forever, so its memory and per-frame time grow without bound):
    # an object whose mask stays empty this many frames is retired (removed, its id never reused);
    # 0 never retires, as the reference.
    retire_unseen_after: int = 300
    # at most this many conditioning frames per object (births, reconditioned frames); the one
    # farthest from the current frame goes first. The reference attends to every one of them;
    # 0 keeps all, as the reference.
    max_conditioning_frames: int = 16
    # The device pools of memories and object pointers have a fixed size, set when a session starts
    # (a static-shape backend compiles them into its graphs): room for this many objects tracked at
    # once, with the typical memories each. Births beyond it are not made, as beyond max_num_objects
    # (one CapacityWarning names the count); a frame the pools still cannot hold raises CapacityError
    # naming this setting, and changes nothing.
    pool_objects: int = 64
    # A click that refines a text-detected object drops that object's detector-made conditioning frames
    # (its birth, reconditioned frames) within this many frames of the click, so the frames around the
    # correction follow it rather than the detection it corrects (Meta's official predictor,
    # refinement_detector_cond_frame_removal_window). 0 keeps them all.
    refinement_cond_frame_window: int = 16
    # Memories and object pointers of frames tracked earlier leave the device pools once the next frame
    # no longer reads them; outside live streams they go to a host store, so that a correction on a
    # frame tracked long ago (or a pass started in the middle) reads what the reference reads. The
    # store keeps up to memory_store_ram_mib MiB in host memory, then up to memory_store_disk_mib MiB
    # in one unnamed temporary file (gone on close, or if the process dies); beyond both the oldest go
    # first. 0 and 0: no store (such reads use what the device still holds); one-pass runs (the CLI,
    # batch: start_session(keep_history=False)) keep none. docs/corrections.md has the sizes per config.
    memory_store_ram_mib: int = 256
    memory_store_disk_mib: int = 16384
    # The memory one propagation_decoder call may take (MiB): each object attends from every image
    # token to every memory token, and ONNX Runtime makes that attention whole (full size: about 1 GB
    # per object at 7 memories; 16 objects in one call went past 10 GB). Calls on the objects axis
    # (propagation, memory encoder, mask init, clicks) hold as many objects as fit
    # (call_sizes.objects_per_call); 0: half the memory available when the bundle is loaded (within
    # the process's cgroup limit). ONNX Runtime on the CPU without gears= only (OpenVINO does not split
    # by memory: one call with dynamic shapes, at most 16 objects with static ones).
    memory_budget_mib: int = 0

    def capacities(self) -> dict[str, int]:
        """The fixed sizes of the propagation decoder's bounded axes (an OM bundle compiles these;
        om.convert reads them from here):
        - memories: the spatial memories one object attends to (selected conditioning frames + the
          num_maskmem-1 recent frames);
        - pointers: one object's object pointers (every kept conditioning frame + max_ptr-1 recent ones);
        - memory_rows, pointer_rows: the pools, room for pool_objects objects with 8 entries each
          beyond the recent window (conditioning frames, frames pinned for a "both" pass), + the zero row."""
        kept_cond = self.max_conditioning_frames or 16  # "keep all" is bounded here only for fixed-size graphs
        selected_cond = self.max_cond_frame_num if self.max_cond_frame_num != -1 else kept_cond
        return {
            "memories": selected_cond + self.num_maskmem - 1,
            "pointers": kept_cond + self.max_object_pointers_in_encoder - 1,
            "memory_rows": 1 + self.pool_objects * (self.num_maskmem + ROWS_BEYOND_WINDOW),
            "pointer_rows": 1 + self.pool_objects * (self.max_object_pointers_in_encoder + ROWS_BEYOND_WINDOW),
        }

    def objects_held(self, memory_rows: int, pointer_rows: int) -> int:
        """How many objects pools of these sizes hold at once: the inverse of capacities() (pool_objects
        for pools sized from this config; an OM bundle's pools are the sizes it was compiled for)."""
        return min((memory_rows - 1) // (self.num_maskmem + ROWS_BEYOND_WINDOW),
                   (pointer_rows - 1) // (self.max_object_pointers_in_encoder + ROWS_BEYOND_WINDOW))

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
            **{name: cfg["tracker"][name] for name in _MULTIMASK if name in cfg["tracker"]},
        )
        fields = {f.name: f for f in dataclasses.fields(cls)}
        values.update({k: v for k, v in cfg["heuristics"].items() if k in fields})
        missing = sorted(n for n, f in fields.items() if n not in values and f.default is dataclasses.MISSING)
        if missing:
            raise ConfigError(f"the bundle's manifest has no value for {', '.join(missing)}; export the bundle again")
        for name, value in values.items():
            _check(name, value, "the bundle's manifest")
        check_override_names(overrides, fields, "", "sam3track.config.TrackerConfig")
        for name, value in overrides.items():
            refuse_fixed(name, FIXED_BY_MODEL)
            _check(name, value, "the override")
        values.update(overrides)
        return cls(**values)


# Pool rows per object beyond its recent window (conditioning frames, frames pinned for a "both" pass)
ROWS_BEYOND_WINDOW = 8
# Geometry and preprocessing the graphs were exported with: changing them breaks the graphs.
FIXED_BY_MODEL = frozenset({"image_size", "rescale_factor", "image_mean", "image_std", "text_length", "pad_token_id",
                            "low_res_mask_size", "feature_grid", "hidden_dim", "memory_dim", "num_queries",
                            "num_maskmem", "multimask_output_in_sam", "multimask_output_for_tracking",
                            "multimask_min_pt_num", "multimask_max_pt_num"})
_MULTIMASK = ("multimask_output_in_sam", "multimask_output_for_tracking", "multimask_min_pt_num",
              "multimask_max_pt_num")
_PROBABILITIES = ("score_threshold_detection", "det_nms_thresh", "assoc_iou_thresh", "trk_assoc_iou_thresh",
                  "new_det_thresh", "suppress_overlapping_based_on_recent_occlusion_threshold", "high_conf_thresh",
                  "high_iou_thresh")
# (smallest value, or None) for whole-number fields
_WHOLE_NUMBERS = {
    "hotstart_delay": 0, "hotstart_unmatch_thresh": 0, "hotstart_dup_thresh": 0, "fill_hole_area": 0,
    "recondition_every_nth_frame": 0, "retire_unseen_after": 0, "max_conditioning_frames": 0, "max_num_objects": 1,
    "pool_objects": 1, "refinement_cond_frame_window": 0, "memory_store_ram_mib": 0, "memory_store_disk_mib": 0,
    "memory_budget_mib": 0,
    "num_maskmem": 1, "max_cond_frame_num": -1, "max_object_pointers_in_encoder": 1, "image_size": 1,
    "text_length": 1, "pad_token_id": 0, "low_res_mask_size": 1, "feature_grid": 1, "hidden_dim": 1,
    "memory_dim": 1, "num_queries": 1, "init_trk_keep_alive": None, "max_trk_keep_alive": None,
    "min_trk_keep_alive": None, "multimask_min_pt_num": 0, "multimask_max_pt_num": 0,
}
_FLAGS = ("recondition_on_trk_masks", "suppress_unmatched_only_within_hotstart",
          "decrease_trk_keep_alive_for_empty_masklets", "mask_nms", "fill_holes", "match_reference_quirks",
          "multimask_output_in_sam", "multimask_output_for_tracking")


def _check(name: str, value, where: str) -> None:
    """One field's type and range; a ConfigError naming the field, the value and where it came from."""
    def fail(what: str):
        raise ConfigError(f"configuration option {name} in {where} {what}, not {value!r}")

    if name in _FLAGS:
        if not isinstance(value, bool):
            fail("takes true or false")
    elif name in _WHOLE_NUMBERS:
        if not isinstance(value, int) or isinstance(value, bool):
            fail("takes a whole number")
        low = _WHOLE_NUMBERS[name]
        if low is not None and value < low:
            fail(f"must be at least {low}" + (" (-1 means no limit)" if low == -1 else ""))
        if name == "max_cond_frame_num" and value == 0:
            fail("must be -1 (no limit) or at least 1")
    elif name in _PROBABILITIES:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
            fail("takes a number from 0 to 1")
    elif name == "rescale_factor":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
            fail("takes a positive number")
    elif name in ("image_mean", "image_std"):
        if (not isinstance(value, tuple) or len(value) != 3
                or not all(isinstance(v, (int, float)) and abs(v) < float("inf") for v in value)
                or (name == "image_std" and not all(v > 0 for v in value))):
            fail("takes three finite numbers" + (", all positive" if name == "image_std" else ""))
