"""SAM 3.1's tracker as torch modules, filled from Meta's checkpoint (``tracker.model.*``) by an explicit map.

Written from Meta's code as read (facebookresearch/sam3 at 96914d2, see /work/notes/sam31_architecture.md
section 3), not copied from it. Where the notes call a part identical to SAM 3's tracker, transformers'
Sam3TrackerVideo classes are reused: the two-way transformer of both mask decoders, the interactive
prompt encoder, the memory fuser and the small MLPs. New: the decoupled memory attention, the multiplex
mask decoder (16 slots decoded jointly), the multiplex memory encoder (32-channel muxed mask input), the
pointer path, and the graph wrappers.

Sizes come from tensor shapes. What no tensor says is a constant of Meta's builder
(``model_builder.py:863-1051``) and named in tracker_parts.py: attention heads, the stability-fallback
thresholds, the memory encoder's sigmoid scale and bias, the -10/+10 logits of mask inputs. The feature
grid F is not in the tracker's tensors either (it is image_size / 14): callers pass it.

Graph wrappers (one per exported graph; inputs and outputs in graphs/sam31/tracker_specs.py):
- PropagationDecoder: memory attention + multiplex mask decoder + object pointers, all buckets in one call,
  each bucket's memories and pointers gathered from device pools by index;
- MemoryEncoder: one memory map per bucket from its 16 slot masks (stored rounded to bfloat16);
- InteractiveDecoder: clicks / boxes (+ a mask prompt) on the memory-free interactive head;
- MaskInit: births and reconditioning from detector mask logits (Meta's ``_use_mask_as_output``).

This module names them all; the code is in three files by role: tracker_parts.py (the building blocks and
the builder's constants), tracker_model.py (Sam31Tracker and its checkpoint key map) and tracker_graphs.py
(the graph wrappers).
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
