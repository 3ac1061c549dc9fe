"""The SAM 3 family (transformers' Sam3VideoModel) over the shared core.

session.py (Sam3Session), frame_loop.py (its phases of a frame), planning.py (its heuristics, decisions
only), association.py (matching detections to tracks), objects.py (its object registry), memory.py (its
memory bank over the core's device pools), text_prompts.py, clicks.py, config.py (TrackerConfig); below,
what its bundles must hold.
"""

# the graphs a SAM 3 bundle must have (graphs/export.py writes them)
REQUIRED_GRAPHS = ("text_encoder", "backbone", "grounding_head", "propagation_decoder", "interactive_decoder",
                   "memory_encoder", "mask_init")
# manifest keys the runtime reads, as paths
REQUIRED_KEYS = (
    ("preprocessing", "image_size"), ("preprocessing", "rescale_factor"), ("preprocessing", "image_mean"),
    ("preprocessing", "image_std"), ("tokenizer", "dir"), ("tokenizer", "max_length"), ("tokenizer", "pad_token_id"),
    ("config", "heuristics"), ("config", "tracker", "low_res_mask_size"), ("config", "tracker", "feature_grid"),
    ("config", "tracker", "hidden_dim"), ("config", "tracker", "memory_dim"), ("config", "tracker", "num_maskmem"),
    ("config", "tracker", "max_cond_frame_num"), ("config", "tracker", "max_object_pointers_in_encoder"),
    ("config", "detector", "num_queries"), ("config", "tracker", "multimask_output_in_sam"),
    ("config", "tracker", "multimask_output_for_tracking"), ("config", "tracker", "multimask_min_pt_num"),
    ("config", "tracker", "multimask_max_pt_num"),
)
