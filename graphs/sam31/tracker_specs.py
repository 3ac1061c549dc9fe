"""Names, dtypes and symbolic shapes of the SAM 3.1 tracker graphs' inputs and outputs, and seeded samples.

Same conventions as graphs/sam3/specs.py (TensorSpec / GraphSpec from there): int32 indices and ids, float32
masks and flags (1.0 = true), no int64 or bool at a boundary. Named dynamic axes:

- buckets: buckets in one call (any mix of tracker states); objects: objects in one call;
- memories / pointers: memory / pointer-frame entries per bucket (padded; *_valid marks real ones);
- memory_rows / image_rows / pointer_rows: rows of the device pools;
- points: prompt points per object; mask_side: the memory encoder's mask side (14F or 16F).

The pool and index layout (what one row holds, what each index means) is the contract with the runtime;
it is documented on tracker.PropagationDecoder and in check's ``meta_memory_selection``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..spec_types import GraphSpec, TensorSpec
from . import tracker

GRAPHS = ("propagation_decoder", "memory_encoder", "interactive_decoder", "mask_init")


@dataclass(frozen=True)
class TrackerDims:
    """Sizes of the tracker graphs, from the loaded tracker (its tensors) and the grid F."""

    channels: int  # C (256)
    grid: int  # F = image_size / 14
    slots: int  # multiplex count K (16)
    masks_per_slot: int  # the multiplex decoder's multimask outputs (3)
    interactive_masks: int  # the interactive decoder's multimask outputs (3)
    num_maskmem: int  # temporal encodings of memories (7)
    max_object_pointers: int = 16  # Meta's max_obj_ptrs_in_encoder (a builder constant)

    @property
    def mask_size(self) -> int:  # low-resolution masks: 4F
        return 4 * self.grid

    @property
    def image_size(self) -> int:
        return tracker.BACKBONE_STRIDE * self.grid

    @classmethod
    def from_tracker(cls, trk: "tracker.Sam31Tracker") -> "TrackerDims":
        return cls(channels=trk.channels, grid=trk.grid, slots=trk.slots,
                   masks_per_slot=trk.mask_decoder.masks_per_slot,
                   interactive_masks=trk.interactive_head.mask_tokens.shape[0] - 1, num_maskmem=trk.num_maskmem)

    @classmethod
    def from_inputs(cls, inputs: dict[str, tuple]) -> "TrackerDims":
        """From a tracker graph's input shapes (name -> shape, e.g. an ONNX session's): C and F from its
        frame features, K from slot_valid where it has one; the counts no input shows are Meta's (3
        multimask outputs, 7 temporal encodings, 16 slots)."""
        feat = inputs.get("tracker_feat") or inputs["interactive_feat"]
        slots = inputs["slot_valid"][1] if "slot_valid" in inputs else 16
        return cls(channels=feat[1], grid=feat[2], slots=slots, masks_per_slot=3, interactive_masks=3, num_maskmem=7)


def graph_specs(d: TrackerDims) -> dict[str, GraphSpec]:
    c, g, k, l = d.channels, d.grid, d.slots, d.mask_size
    hw = g * g

    def head(prefix):
        return (TensorSpec(f"{prefix}_s0", "float32", (1, c // 8, 4 * g, 4 * g)),
                TensorSpec(f"{prefix}_s1", "float32", (1, c // 4, 2 * g, 2 * g)),
                TensorSpec(prefix, "float32", (1, c, g, g)))

    tracker_head, interactive_head = head("tracker_feat"), head("interactive_feat")
    per_bucket = ("buckets", "memories")
    per_pointer = ("buckets", "pointers")
    return {
        "propagation_decoder": GraphSpec(
            "propagation_decoder", tracker.PropagationDecoder,
            inputs=tracker_head + (
                TensorSpec("memory_pool", "float32", ("memory_rows", hw, c)),
                TensorSpec("image_pool", "float32", ("image_rows", hw, c)),
                TensorSpec("pointer_pool", "float32", ("pointer_rows", k, c)),
                TensorSpec("memory_index", "int32", per_bucket),
                TensorSpec("memory_image_index", "int32", per_bucket),
                TensorSpec("memory_slot", "int32", per_bucket),
                TensorSpec("memory_valid", "float32", per_bucket),
                TensorSpec("pointer_index", "int32", per_pointer),
                TensorSpec("pointer_offset", "float32", per_pointer),
                TensorSpec("pointer_valid", "float32", per_pointer),
                TensorSpec("slot_valid", "float32", ("buckets", k)),
            ),
            outputs=(
                TensorSpec("low_res_masks", "float32", ("buckets", k, 1, l, l)),
                TensorSpec("iou_scores", "float32", ("buckets", k, d.masks_per_slot)),
                TensorSpec("object_score_logits", "float32", ("buckets", k, 1)),
                TensorSpec("object_pointer", "float32", ("buckets", k, c)),
            ),
        ),
        "memory_encoder": GraphSpec(
            "memory_encoder", tracker.MemoryEncoder,
            inputs=(
                tracker_head[2],
                TensorSpec("mask_logits", "float32", ("buckets", k, "mask_side", "mask_side")),
                TensorSpec("slot_valid", "float32", ("buckets", k)),
                TensorSpec("conditioning", "float32", ("buckets", k)),
                TensorSpec("object_score_logits", "float32", ("buckets", k)),
            ),
            outputs=(TensorSpec("maskmem_features", "float32", ("buckets", hw, c)),
                     TensorSpec("image_features", "float32", (1, hw, c))),
        ),
        "interactive_decoder": GraphSpec(
            "interactive_decoder", tracker.InteractiveDecoder,
            inputs=interactive_head + (
                TensorSpec("point_coords", "float32", ("objects", "points", 2)),
                TensorSpec("point_labels", "int32", ("objects", "points")),
                TensorSpec("mask_prompt", "float32", ("objects", 1, l, l)),
                TensorSpec("use_mask_prompt", "float32", ("objects",)),
                TensorSpec("multimask", "float32", ("objects",)),
            ),
            outputs=(
                TensorSpec("low_res_masks", "float32", ("objects", 1, l, l)),
                TensorSpec("iou_scores", "float32", ("objects", d.interactive_masks)),
                TensorSpec("object_score_logits", "float32", ("objects", 1)),
                TensorSpec("object_pointer", "float32", ("objects", c)),
            ),
        ),
        "mask_init": GraphSpec(
            "mask_init", tracker.MaskInit,
            inputs=(interactive_head[2], TensorSpec("mask_logits", "float32", ("objects", 1, l, l))),
            outputs=(
                TensorSpec("low_res_masks", "float32", ("objects", 1, l, l)),
                TensorSpec("object_pointer", "float32", ("objects", c)),
                TensorSpec("object_score_logits", "float32", ("objects", 1)),
            ),
        ),
    }


# Sizes used while tracing: 2 or more everywhere, so no axis is mistaken for a broadcastable 1; the memory
# encoder is traced with 14F masks so its resize to 16F is in the graph (at 16F it is an exact identity).
def trace_sizes(d: TrackerDims) -> dict[str, int]:
    return dict(buckets=2, memories=2, pointers=2, memory_rows=5, image_rows=3, pointer_rows=5, objects=2, points=3,
                mask_side=14 * d.grid)


# ------------------------------------------------------------------------------------ sample inputs
def sample_inputs(spec: GraphSpec, d: TrackerDims, sizes: dict[str, int], seed: int = 0) -> dict[str, torch.Tensor]:
    """Seeded inputs with the given size for each symbolic axis, valid for the graph's semantics (every
    bucket has at least one real memory, pointer and slot; indices point into the pools)."""
    gen = torch.Generator().manual_seed(seed)
    sizes = dict(sizes)

    def shape_of(t):
        return tuple(sizes[x] if isinstance(x, str) else x for x in t.shape)

    def rand(*shape):
        return torch.rand(shape, generator=gen)

    def randn(*shape):
        return torch.randn(shape, generator=gen)

    out: dict[str, torch.Tensor] = {}
    for t in spec.inputs:
        shape = shape_of(t)
        if t.name in POOL_INDICES and spec.name == "propagation_decoder":
            continue  # below, from the pools
        if t.name == "memory_pool":
            out[t.name] = randn(*shape).to(torch.bfloat16).float()  # stored bf16-rounded, as the encoder writes them
        elif t.name == "pointer_pool":
            out[t.name] = randn(*shape)
        elif t.name == "slot_valid":
            valid = rand(*shape) > 0.3
            valid[:, 0] = True
            out[t.name] = valid
        elif t.name == "conditioning":
            out[t.name] = rand(*shape) > 0.7
        elif t.name == "object_score_logits":
            out[t.name] = randn(*shape) * 5
        elif t.name == "mask_logits" and spec.name == "memory_encoder":
            low = randn(shape[0], shape[1], d.mask_size, d.mask_size) * 4
            out[t.name] = torch.nn.functional.interpolate(low, size=shape[2:], mode="bilinear", align_corners=False)
        elif t.name == "mask_logits":  # detector logits: two-valued blobs (no upsampled pixel lands on 0)
            blobs = torch.nn.functional.avg_pool2d(randn(*shape), 5, stride=1, padding=2) > 0.15
            out[t.name] = torch.where(blobs, 6.0, -7.0)
        elif t.name == "point_coords":
            out[t.name] = rand(*shape) * d.image_size
        elif t.name == "point_labels":
            labels = torch.randint(0, 2, shape, generator=gen)
            if shape[1] >= 2:
                labels[0, :2] = torch.tensor([2, 3])  # a box: its two corners first
            out[t.name] = labels
        elif t.name == "mask_prompt":
            out[t.name] = torch.clamp(randn(*shape) * 20, -32, 32)
        elif t.name in ("use_mask_prompt", "multimask"):
            out[t.name] = rand(*shape) > 0.5
        else:
            out[t.name] = randn(*shape)
    if spec.name == "propagation_decoder":
        out.update(pool_layout(sizes, d, gen))
    return {t.name: out[t.name].to(_DTYPES[t.dtype]) for t in spec.inputs}


POOL_INDICES = ("memory_index", "memory_image_index", "memory_slot", "memory_valid", "pointer_index", "pointer_offset",
                "pointer_valid")
_DTYPES = {"float32": torch.float32, "int32": torch.int32}


def pool_layout(sizes: dict[str, int], d: TrackerDims, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Index tensors of a propagation call: each bucket gets 1..memories real memory entries and
    1..pointers real pointer entries at random pool rows (bucket 0 uses every entry); padding entries
    point at random rows with random slots and offsets, which the graph must ignore."""
    b, n, p = sizes["buckets"], sizes["memories"], sizes["pointers"]
    count_n = torch.randint(1, n + 1, (b,), generator=gen)
    count_p = torch.randint(1, p + 1, (b,), generator=gen)
    count_n[0], count_p[0] = n, p
    return dict(
        memory_index=torch.randint(0, sizes["memory_rows"], (b, n), generator=gen),
        memory_image_index=torch.randint(0, sizes["image_rows"], (b, n), generator=gen),
        memory_slot=torch.randint(0, d.num_maskmem, (b, n), generator=gen),
        memory_valid=torch.arange(n)[None] < count_n[:, None],
        pointer_index=torch.randint(0, sizes["pointer_rows"], (b, p), generator=gen),
        pointer_offset=torch.randint(0, d.max_object_pointers, (b, p), generator=gen).float() / (d.max_object_pointers - 1),
        pointer_valid=torch.arange(p)[None] < count_p[:, None],
    )
