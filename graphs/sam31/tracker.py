"""SAM 3.1's tracker as torch modules, filled from Meta's checkpoint (``tracker.model.*``) by an explicit map.

This module names them all; the code is in three files by role: tracker_parts.py (the building blocks and
the builder's constants), tracker_model.py (Sam31Tracker and its checkpoint key map) and tracker_graphs.py
(the graph wrappers PropagationDecoder, MemoryEncoder, InteractiveDecoder and MaskInit; their inputs and
outputs in tracker_specs.py). What is reused from transformers, what is new, and the builder's constants:
docs/sam31.md, "The tracker".
"""

from __future__ import annotations

from .tracker_graphs import (GRAPH_MODULES, InteractiveDecoder, MaskInit, MemoryEncoder, PropagationDecoder,
                             TrackerGraph, select_outputs)
from .tracker_model import (IGNORED, INTERNAL_PREFIX, PREFIX, MappingError, Sam31Tracker, _count, _prompt_encoder,
                            grid_from_state_dict, ignored_reason, tracker_keys)
from .tracker_parts import (BACKBONE_STRIDE, DECODER_HEADS, MASK_INPUT_BIAS, MASK_INPUT_SCALE, MEMORY_ATTENTION_HEADS,
                            ROPE_THETA, SIGMOID_BIAS_FOR_MEM_ENC, SIGMOID_SCALE_FOR_MEM_ENC, STABILITY_DELTA,
                            STABILITY_THRESH, DecoupledMemoryLayer, LayerNorm2d, MaskUpscaling, MemoryAttention,
                            MultiplexMaskDecoder, MultiplexMemoryEncoder, SamMaskHead, axial_rope_tables, mlp, mlp_keys,
                            random_fourier_dense_pe, rope, sine_1d, sine_position_encoding, stability_scores, take_best,
                            two_way_keys, two_way_transformer, upscaling_keys)

__all__ = [
    "MEMORY_ATTENTION_HEADS", "DECODER_HEADS", "ROPE_THETA", "SIGMOID_SCALE_FOR_MEM_ENC",
    "SIGMOID_BIAS_FOR_MEM_ENC", "STABILITY_DELTA", "STABILITY_THRESH", "MASK_INPUT_SCALE", "MASK_INPUT_BIAS",
    "BACKBONE_STRIDE", "LayerNorm2d", "mlp", "mlp_keys", "random_fourier_dense_pe", "sine_position_encoding",
    "sine_1d", "axial_rope_tables", "rope", "DecoupledMemoryLayer", "MemoryAttention", "two_way_transformer",
    "two_way_keys", "MaskUpscaling", "upscaling_keys", "MultiplexMaskDecoder", "SamMaskHead", "take_best",
    "stability_scores", "MultiplexMemoryEncoder", "PREFIX", "INTERNAL_PREFIX", "IGNORED", "MappingError",
    "Sam31Tracker", "tracker_keys", "ignored_reason", "_count", "_prompt_encoder", "grid_from_state_dict",
    "TrackerGraph", "PropagationDecoder", "MemoryEncoder", "select_outputs", "InteractiveDecoder", "MaskInit",
    "GRAPH_MODULES",
]
