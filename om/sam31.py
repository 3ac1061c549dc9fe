"""What om.convert compiles for a SAM 3.1 bundle (manifest ``family: "sam3.1"``): default gears, the pool
capacities of the propagation decoder, and the one axis rule ATC's gear profiles must follow.

SAM 3.1 tracks objects in buckets of ``multiplex_count`` (16) slots, so the tracker graphs batch buckets,
not objects (graphs/sam31/tracker_specs.py). The plan per graph, and why: docs/ascend.md, "SAM 3.1
bundles" and "The SAM 3.1 plan per graph".
"""

from __future__ import annotations

FAMILY = "sam3.1"
# One bucket pool of POOL_BUCKETS buckets: the 64 objects SAM 3's pools hold by default
# (TrackerConfig.pool_objects) in buckets of 16.
POOL_OBJECTS = 64
SPARE_ENTRIES = 8  # per bucket beyond the recent window, as SAM 3's pools (conditioning frames, pinned frames)

# The boxes of one boxes add_prompt a converted bundle takes (more: convert with --gears boxes=...)
BOX_GEARS = (1, 2, 4, 8)

# Axis rules a compiled gear must satisfy, per graph: sizes -> allowed. The graph itself runs prompts 1
# (one prompt for every image) or prompts = images; the grounding head is compiled for prompts =
# images only: its 5 inputs with a -1 exceed the 4 values a --dynamic_dims profile takes
# (om/atc_rules.py), and with the two axes tied it is dynamic batch over image-prompt rows (one
# prompt for several images is the same prompt repeated per row).
ALLOWED = {
    "grounding_head": lambda s: s["prompts"] == s["images"],
    "box_grounding_head": lambda s: s["prompts"] in (1, s["images"]),
}


# Axes a graph is compiled at one size whatever --gears says, so that its --dynamic_dims profiles keep
# within the 4 values ATC takes (om/atc_rules.py): the box grounding head runs on the frame of a boxes
# add_prompt, one image and one prompt (varying images too: 9 values); the memory encoder runs one
# bucket per call (buckets x mask sides: 6 values; the runtime chunks buckets).
FIXED = {"box_grounding_head": {"images": (1,), "prompts": (1,)}, "memory_encoder": {"buckets": (1,)}}


def capacities(manifest: dict) -> dict[str, int]:
    """Fixed sizes of the propagation decoder's pool axes from a SAM 3.1 manifest's tracker config.

    - memories = max_cond_frames_in_attn + num_maskmem - 1: the selected conditioning frames plus the
      num_maskmem - 1 most recent frames of one bucket (Meta: at most 4 + 6 = 10);
    - pointers = max_cond_frames_in_attn + max_obj_ptrs_in_encoder - 1 (Meta: 4 + 15 = 19);
    - memory_rows = image_rows = 1 + buckets * (num_maskmem + 8) and pointer_rows = 1 + buckets *
      (max_obj_ptrs_in_encoder + 8) for POOL_OBJECTS objects in buckets of multiplex_count slots, plus
      row 0, which padding entries point at. A frame's image features are shared by its buckets, so
      image_rows never needs more than memory_rows.
    """
    trk = manifest["config"]["tracker"]
    cond, maskmem, ptrs = trk["max_cond_frames_in_attn"], trk["num_maskmem"], trk["max_obj_ptrs_in_encoder"]
    buckets = pool_buckets(manifest)
    rows = 1 + buckets * (maskmem + SPARE_ENTRIES)
    return {"memories": cond + maskmem - 1, "pointers": cond + ptrs - 1, "memory_rows": rows, "image_rows": rows,
            "pointer_rows": 1 + buckets * (ptrs + SPARE_ENTRIES)}


def pool_buckets(manifest: dict) -> int:
    slots = manifest["config"]["tracker"]["multiplex_count"]
    return -(-POOL_OBJECTS // slots)


def mask_sides(manifest: dict) -> tuple[int, int]:
    """The memory encoder's two mask sides: 14F (the image size: consolidated masks) and 16F (4x the
    low-resolution masks: propagated frames)."""
    trk = manifest["config"]["tracker"]
    grid = trk["image_size"] // trk["backbone_stride"]
    return 14 * grid, 16 * grid


def default_gears(manifest: dict, base: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """``base`` (sam3track.call_sizes.DEFAULT_GEARS: objects, prompts, images, points) plus buckets at
    powers of two up to the pool's buckets, mask_side at its two sizes and the pool axes at one size each."""
    n = pool_buckets(manifest)
    buckets = tuple(sorted({min(2 ** i, n) for i in range(n.bit_length() + 1)}))
    return {**base, "buckets": buckets, "mask_side": mask_sides(manifest), "boxes": BOX_GEARS,
            **{axis: (size,) for axis, size in capacities(manifest).items()}}


def graph_gears(base: dict[str, tuple[int, ...]]) -> dict[str, dict[str, tuple[int, ...]]]:
    """Per-graph defaults (where an axis was not given with --gears): grounding_head's images run at
    the prompt gears (its rows are image-prompt pairs); box_grounding_head runs one image, one prompt
    (FIXED); memory_encoder one bucket (FIXED), so only its mask sides vary."""
    return {"grounding_head": {"images": base["prompts"]}}


def notes(plan) -> list[str]:
    """What the om_manifest records about a SAM 3.1 graph's plan (GraphPlan ``plan``), in words."""
    name, axes = plan.graph, plan.axes
    if name == "box_grounding_head":
        return [f"boxes at {', '.join(map(str, axes.get('boxes', ())))}: a call is padded to the next gear with "
                "box_valid 0 (no token attends to a padding box); more boxes need --gears boxes=..."]
    if name == "grounding_head" and plan.varying:
        return ["rows are image-prompt pairs (prompt i with image i): images and prompts take one batch gear; "
                "one prompt for several images runs as that prompt repeated per row"]
    if name == "propagation_decoder":
        pools = ", ".join(f"{a}={axes[a][-1]}" for a in ("memories", "pointers", "memory_rows", "image_rows",
                                                          "pointer_rows") if a in axes)
        return [f"pool axes fixed at capacities ({pools}, om.sam31.capacities); fewer real entries are padded "
                "with memory_valid / pointer_valid 0 (masked out of the attention), unused pool rows are never "
                "indexed (row 0 is the padding row); padding buckets repeat a real one and are dropped"]
    if name == "memory_encoder" and len(axes.get("mask_side", ())) > 1:
        return ["mask_side at 14F (births, clicks) and 16F (propagated frames), both call shapes: the graph "
                "resizes 14F to 16F itself; one bucket per call (buckets x mask sides would need 6 values per "
                "--dynamic_dims profile, ATC takes 4), the runtime runs a frame's buckets as chunks of one"]
    return []
