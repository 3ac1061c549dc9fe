"""Names, dtypes and symbolic shapes of every graph's inputs and outputs, plus seeded sample inputs.

Graph inputs use only types every target handles well (Ascend's ATC included): int32 ids and
indices, float32 masks and flags (1.0 = true); no int64 or bool crosses a graph boundary.

One table drives the exporter (dynamic axes), the manifest (what the runtime binds) and the checker
(which sizes of each dynamic axis to try).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..spec_types import GraphSpec, TensorSpec
from . import modules


@dataclass(frozen=True)
class Dims:
    """Concrete sizes of the checkpoint, read from its config."""

    image_size: int
    text_length: int
    text_width: int
    channels: int  # tracker / FPN width C
    memory_channels: int
    grid: int  # tokens per side of the last feature level
    mask_size: int  # low-resolution mask side L
    num_queries: int
    num_masks: int  # masks the tracker's decoder returns per tracked object (propagation iou_scores width)
    num_multimask_outputs: int  # masks of the decoder's multimask output (interactive iou_scores width)
    vocab_size: int

    @classmethod
    def from_model(cls, model) -> "Dims":
        cfg = model.config
        trk = model.tracker_model
        return cls(
            image_size=cfg.detector_config.image_size,
            text_length=cfg.detector_config.text_config.max_position_embeddings,
            text_width=cfg.detector_config.detr_encoder_config.hidden_size,
            channels=trk.hidden_dim,
            memory_channels=trk.mem_dim,
            grid=trk.backbone_feature_sizes[-1][0],
            mask_size=trk.prompt_encoder.mask_input_size[0],
            num_queries=cfg.detector_config.detr_decoder_config.num_queries,
            num_masks=trk.config.mask_decoder_config.num_multimask_outputs if trk._use_multimask(False, None) else 1,
            num_multimask_outputs=trk.config.mask_decoder_config.num_multimask_outputs,
            vocab_size=cfg.detector_config.text_config.vocab_size,
        )


def graph_specs(d: Dims) -> dict[str, GraphSpec]:
    return {**_detector_specs(d), **_tracker_specs(d)}


def _tracker_head(d: Dims) -> tuple[TensorSpec, ...]:
    """The backbone's tracker levels of one image, as the tracker graphs take them."""
    g, c = d.grid, d.channels
    return (
        TensorSpec("tracker_feat_s0", "float32", (1, c // 8, 4 * g, 4 * g)),
        TensorSpec("tracker_feat_s1", "float32", (1, c // 4, 2 * g, 2 * g)),
        TensorSpec("tracker_feat", "float32", (1, c, g, g)),
    )


def _batched(specs, axis="images"):
    return tuple(TensorSpec(t.name, t.dtype, (axis,) + t.shape[1:]) for t in specs)


def _detector_specs(d: Dims) -> dict[str, GraphSpec]:
    """text_encoder, backbone and grounding_head."""
    g, c, l, s = d.grid, d.channels, d.mask_size, d.image_size
    detector_head = tuple(
        TensorSpec(f"detector_fpn{i}", "float32", (1, c, (4 >> i) * g, (4 >> i) * g)) for i in range(3)
    )
    return {
        "text_encoder": GraphSpec(
            "text_encoder", modules.TextEncoder,
            inputs=(TensorSpec("input_ids", "int32", ("prompts", d.text_length)),
                    TensorSpec("attention_mask", "int32", ("prompts", d.text_length))),
            outputs=(TensorSpec("text_features", "float32", ("prompts", d.text_length, d.text_width)),),
        ),
        "backbone": GraphSpec(
            "backbone", modules.Backbone,
            inputs=(TensorSpec("pixel_values", "float32", ("images", 3, s, s)),),
            outputs=_batched(detector_head) + _batched(_tracker_head(d)),
        ),
        "grounding_head": GraphSpec(
            "grounding_head", modules.GroundingHead,
            inputs=detector_head + (
                TensorSpec("text_features", "float32", ("prompts", d.text_length, d.text_width)),
                TensorSpec("text_mask", "int32", ("prompts", d.text_length)),
            ),
            outputs=(
                TensorSpec("pred_logits", "float32", ("prompts", d.num_queries)),
                TensorSpec("presence_logits", "float32", ("prompts", 1)),
                TensorSpec("pred_boxes", "float32", ("prompts", d.num_queries, 4)),
                TensorSpec("pred_masks", "float32", ("prompts", d.num_queries, l, l)),
            ),
        ),
    }


def _memory_inputs(d: Dims) -> tuple[TensorSpec, ...]:
    """The memory pools and each object's padded indices into them, as both decoders take them."""
    hw, c, cm = d.grid * d.grid, d.channels, d.memory_channels
    return (
        TensorSpec("memory_pool", "float32", ("memory_rows", hw, cm)),
        TensorSpec("memory_index", "int32", ("objects", "memories")),
        TensorSpec("memory_slot", "int32", ("objects", "memories")),
        TensorSpec("memory_valid", "float32", ("objects", "memories")),
        TensorSpec("pointer_pool", "float32", ("pointer_rows", c)),
        TensorSpec("pointer_index", "int32", ("objects", "pointers")),
        TensorSpec("pointer_offset", "float32", ("objects", "pointers")),
        TensorSpec("pointer_valid", "float32", ("objects", "pointers")),
    )


def _decoder_outputs(d: Dims, num_masks: int) -> tuple[TensorSpec, ...]:
    l = d.mask_size
    return (
        TensorSpec("low_res_masks", "float32", ("objects", 1, l, l)),
        TensorSpec("iou_scores", "float32", ("objects", num_masks)),
        TensorSpec("object_score_logits", "float32", ("objects", 1)),
        TensorSpec("object_pointer", "float32", ("objects", d.channels)),
    )


def _tracker_specs(d: Dims) -> dict[str, GraphSpec]:
    """propagation_decoder, interactive_decoder, memory_encoder and mask_init."""
    c, l, hw = d.channels, d.mask_size, d.grid * d.grid
    tracker_head, memory_inputs = _tracker_head(d), _memory_inputs(d)
    return {
        "propagation_decoder": GraphSpec(
            "propagation_decoder", modules.PropagationDecoder,
            inputs=tracker_head + memory_inputs,
            outputs=_decoder_outputs(d, d.num_masks),
        ),
        "interactive_decoder": GraphSpec(
            "interactive_decoder", modules.InteractiveDecoder,
            inputs=tracker_head + memory_inputs + (
                TensorSpec("use_memory", "float32", ("objects",)),
                TensorSpec("point_coords", "float32", ("objects", "points", 2)),
                TensorSpec("point_labels", "int32", ("objects", "points")),
                TensorSpec("multimask", "float32", ("objects",)),
            ),
            outputs=_decoder_outputs(d, d.num_multimask_outputs),
        ),
        "memory_encoder": GraphSpec(
            "memory_encoder", modules.MemoryEncoder,
            inputs=(
                tracker_head[2],
                TensorSpec("mask_logits", "float32", ("objects", 1, l, l)),
                TensorSpec("object_score_logits", "float32", ("objects", 1)),
                TensorSpec("binarize", "float32", ("objects",)),
                TensorSpec("via_image", "float32", ("objects",)),
            ),
            outputs=(TensorSpec("maskmem_features", "float32", ("objects", hw, d.memory_channels)),),
        ),
        "mask_init": GraphSpec(
            "mask_init", modules.MaskInit,
            inputs=(tracker_head[2], TensorSpec("masks", "float32", ("objects", 1, l, l))),
            outputs=(
                TensorSpec("low_res_masks", "float32", ("objects", 1, l, l)),
                TensorSpec("object_pointer", "float32", ("objects", c)),
                TensorSpec("object_score_logits", "float32", ("objects", 1)),
            ),
        ),
    }


# ------------------------------------------------------------------------------------ sample inputs
def sample_inputs(spec: GraphSpec, d: Dims, sizes: dict[str, int], seed: int = 0) -> dict[str, torch.Tensor]:
    """Seeded inputs with the given size for each symbolic axis, valid for that graph's semantics."""
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}

    sizes = dict(sizes)
    if "objects" in sizes and "memories" in sizes:  # pools hold every object's entries, shuffled
        sizes.setdefault("memory_rows", sizes["objects"] * sizes["memories"])
        sizes.setdefault("pointer_rows", sizes["objects"] * sizes["pointers"])

    def shape_of(t):
        return tuple(sizes[x] if isinstance(x, str) else x for x in t.shape)

    for t in spec.inputs:
        shape = shape_of(t)
        if t.name == "input_ids":
            ids = torch.randint(0, d.vocab_size - 2, shape, generator=gen)
            lengths = torch.randint(2, d.text_length + 1, (shape[0],), generator=gen)
            out[t.name] = ids
            out["attention_mask"] = (torch.arange(d.text_length)[None] < lengths[:, None]).long()
        elif t.name == "attention_mask":
            continue
        elif t.name == "text_mask":
            lengths = torch.randint(1, d.text_length + 1, (shape[0],), generator=gen)
            out[t.name] = (torch.arange(d.text_length)[None] < lengths[:, None]).long()
        elif t.name == "pixel_values":
            out[t.name] = torch.rand(shape, generator=gen) * 2 - 1
        elif t.name in ("memory_index", "pointer_index", "memory_slot", "memory_valid", "pointer_valid",
                        "pointer_offset"):
            continue  # filled below from the pools
        elif t.name == "memory_pool":
            out[t.name] = torch.randn(shape, generator=gen).to(torch.bfloat16).float()
        elif t.name == "pointer_pool":
            out[t.name] = torch.randn(shape, generator=gen)
        elif t.name == "mask_logits":
            out[t.name] = torch.randn(shape, generator=gen) * 8
        elif t.name == "masks":
            blobs = torch.randn(shape, generator=gen)
            out[t.name] = (F_smooth(blobs) > 0.3).float()
        elif t.name in ("binarize", "via_image", "use_memory", "multimask"):
            out[t.name] = torch.rand(shape, generator=gen) > 0.5
        elif t.name == "point_coords":
            out[t.name] = torch.rand(shape, generator=gen) * d.image_size
        elif t.name == "point_labels":
            labels = torch.randint(0, 2, shape, generator=gen)
            if shape[1] >= 2:
                labels[0, :2] = torch.tensor([2, 3])  # a box: its two corners first
            out[t.name] = labels
        elif t.name == "object_score_logits":
            out[t.name] = torch.randn(shape, generator=gen) * 5
        elif t.dtype == "float32":
            out[t.name] = torch.randn(shape, generator=gen)
        else:
            raise AssertionError(f"no sample rule for {spec.name}.{t.name}")

    if spec.name in ("propagation_decoder", "interactive_decoder"):
        out.update(_memory_layout(sizes, gen))
    return {t.name: as_spec_dtype(out[t.name], t) for t in spec.inputs}


_TORCH_DTYPES = {"float32": torch.float32, "int32": torch.int32}


def as_spec_dtype(value: torch.Tensor, spec: TensorSpec) -> torch.Tensor:
    """A sample in the dtype the graph takes (bool flags become 1.0 / 0.0)."""
    return value.to(_TORCH_DTYPES[spec.dtype])


def F_smooth(x: torch.Tensor) -> torch.Tensor:
    """Blur noise into blobs so sample masks look like objects, not salt and pepper."""
    k = torch.ones(1, 1, 5, 5) / 25
    return torch.nn.functional.conv2d(x, k, padding=2)


def _memory_layout(sizes: dict[str, int], gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Each object gets between 1 and K memories and between 1 and P pointers; the rest is padding."""
    n, k, p = sizes["objects"], sizes["memories"], sizes["pointers"]
    counts_k = torch.randint(1, k + 1, (n,), generator=gen)
    counts_p = torch.randint(1, p + 1, (n,), generator=gen)
    counts_k[0], counts_p[0] = k, p  # one object uses every slot
    memory_valid = torch.arange(k)[None] < counts_k[:, None]
    pointer_valid = torch.arange(p)[None] < counts_p[:, None]
    memory_index = torch.randperm(n * k, generator=gen)[: n * k].reshape(n, k)
    pointer_index = torch.randperm(n * p, generator=gen).reshape(n, p)
    memory_slot = torch.randint(0, 7, (n, k), generator=gen)
    memory_slot[:, 0] = 6  # the conditioning frame's slot
    pointer_offset = torch.randint(-15, 16, (n, p), generator=gen).float() / 15.0
    pointer_offset[:, 0] = 0.0
    # Padding entries point at row 0 with junk slots; the graph must ignore them.
    memory_index = torch.where(memory_valid, memory_index, torch.zeros_like(memory_index))
    pointer_index = torch.where(pointer_valid, pointer_index, torch.zeros_like(pointer_index))
    return dict(memory_index=memory_index, memory_slot=memory_slot, memory_valid=memory_valid,
                pointer_index=pointer_index, pointer_offset=pointer_offset, pointer_valid=pointer_valid)
