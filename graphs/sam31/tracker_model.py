"""Sam31Tracker: every module and parameter of SAM 3.1's tracker, filled from Meta's checkpoint
(``tracker.model.*``) by an explicit key map (graphs/sam31/tracker.py says how it is sized and built).
"""

from __future__ import annotations

import re

import torch
from torch import nn

from .tracker_parts import (BACKBONE_STRIDE, MEMORY_ATTENTION_HEADS, MemoryAttention, MultiplexMaskDecoder,
                            MultiplexMemoryEncoder, SamMaskHead, mlp, mlp_keys, random_fourier_dense_pe,
                            sine_position_encoding, two_way_keys, upscaling_keys)

PREFIX = "tracker.model."
INTERNAL_PREFIX = "sam2_predictor.model."  # Meta's internal name; its loader renames it to PREFIX

# Checkpoint keys this export reads elsewhere or not at all, and why.
IGNORED = (
    (r"(sam_mask_decoder|interactive_sam_mask_decoder)\.conv_s[01]\.(weight|bias)",
     "applied to neck levels 0 / 1 by the backbone and interactive_neck graphs (the detector export), as "
     "Meta precomputes them per frame: the tracker graphs take tracker_feat_s0/_s1 and interactive_feat_s0/_s1"),
)


class MappingError(ValueError):
    pass


# ----------------------------------------------------------------------------------------- tracker
class Sam31Tracker(nn.Module):
    """Every tracker module and parameter, filled by ``from_state_dict``. ``grid`` = F (image_size / 14)."""

    def __init__(self, shapes: dict[str, tuple], grid: int):
        super().__init__()
        s = shapes
        d = s["output_valid_embed"][1]
        slots = s["output_valid_embed"][0]
        self.grid, self.channels, self.slots = grid, d, slots
        self.num_maskmem = s["maskmem_tpos_enc"][0]

        ffn = s["transformer.encoder.layers.0.linear1.weight"][0]
        self.memory_attention = MemoryAttention(_count(s, r"transformer\.encoder\.layers\.(\d+)\."), d, ffn,
                                                MEMORY_ATTENTION_HEADS, grid)

        def decoder_sizes(prefix):
            return dict(mlp_dim=s[f"{prefix}.transformer.layers.0.mlp.lin1.weight"][0],
                        layers=_count(s, rf"{re.escape(prefix)}\.transformer\.layers\.(\d+)\."),
                        downsample=d // s[f"{prefix}.transformer.layers.0.cross_attn_token_to_image.q_proj.weight"][0])

        masks_per_slot = s["sam_mask_decoder.mask_tokens.weight"][0] // slots
        self.mask_decoder = MultiplexMaskDecoder(d, slots, masks_per_slot, **decoder_sizes("sam_mask_decoder"))
        self.interactive_head = SamMaskHead(d, s["interactive_sam_mask_decoder.mask_tokens.weight"][0],
                                            **decoder_sizes("interactive_sam_mask_decoder"))
        self.prompt_encoder = _prompt_encoder(s, d, grid)

        # encoder.{3i} conv, {3i+1} LayerNorm2d, {3i+2} GELU per stride-2 stage, then the 1x1 conv last
        n_down = (_count(s, r"maskmem_backbone\.mask_downsampler\.encoder\.(\d+)\.weight") - 1) // 3
        ladder = [s["maskmem_backbone.mask_downsampler.encoder.0.weight"][1]]
        ladder += [s[f"maskmem_backbone.mask_downsampler.encoder.{3 * i}.weight"][0] for i in range(n_down)]
        self.memory_encoder = MultiplexMemoryEncoder(
            ladder, d, _count(s, r"maskmem_backbone\.fuser\.layers\.(\d+)\."),
            s["maskmem_backbone.fuser.layers.0.pwconv1.weight"][0],
            s["maskmem_backbone.fuser.layers.0.dwconv.weight"][-1], mask_size=16 * grid)
        if ladder[0] != 2 * slots:
            raise MappingError(f"memory encoder input has {ladder[0]} channels, expected 2 x {slots} slots")

        self.obj_ptr_proj = mlp(d, d, d, _count(s, r"obj_ptr_proj\.layers\.(\d+)\.weight"))
        self.interactive_obj_ptr_proj = mlp(d, d, d, _count(s, r"interactive_obj_ptr_proj\.layers\.(\d+)\.weight"))
        self.no_obj_ptr_linear = nn.Linear(d, d)
        self.obj_ptr_tpos_proj = nn.Linear(*reversed(s["obj_ptr_tpos_proj.weight"]))
        k = s["interactive_mask_downsample.weight"][-1]
        self.interactive_mask_downsample = nn.Conv2d(1, 1, kernel_size=k, stride=k)
        for name in ("maskmem_tpos_enc", "interactivity_no_mem_embed", "no_obj_embed_spatial", "output_valid_embed",
                     "output_invalid_embed"):
            setattr(self, name, nn.Parameter(torch.zeros(s[name])))
        # random-Fourier matrices (Meta buffers): the dense position encodings are computed from them
        self.register_buffer("propagation_pe_gaussian", torch.zeros(s["image_pe_layer.positional_encoding_gaussian_matrix"]))
        # constants of the grid (not in the state dict)
        self.register_buffer("image_pos", sine_position_encoding(d, grid).flatten(2).transpose(1, 2), persistent=False)

    # ---- derived constants (after loading)
    def finalize(self):
        """Constants computed from loaded tensors: the two dense position encodings."""
        self.register_buffer("propagation_dense_pe", random_fourier_dense_pe(self.propagation_pe_gaussian, self.grid),
                             persistent=False)
        gaussian = self.prompt_encoder.shared_embedding.positional_embedding
        self.register_buffer("interactive_dense_pe", random_fourier_dense_pe(gaussian, self.grid), persistent=False)
        return self

    # ---- shared pieces of the graphs
    def pointer(self, proj, token, score):
        """Object pointer of a decoder token: proj(token), then no_obj_ptr_linear where the score says absent
        (use_linear_no_obj_ptr: vis * p + (1 - vis) * no_obj_ptr_linear(p))."""
        p = proj(token)
        visible = (score > 0).to(p.dtype)
        return visible * p + (1 - visible) * self.no_obj_ptr_linear(p)

    def interactive_pix(self, interactive_feat):
        """_get_interactive_pix_mem: the interactive neck's level 2 + interactivity_no_mem_embed (always
        memory-free, also for clicks on tracked frames)."""
        return interactive_feat + self.interactivity_no_mem_embed.reshape(1, -1, 1, 1)

    def sparse_points(self, coords, labels):
        """Prompt encoder points [N, P, 2] (image pixels), labels [N, P] int (-1 = not a point) -> [N, P+1, C]:
        the pad point (0, 0) / -1 appended, as Meta's PromptEncoder does without boxes."""
        return self.prompt_encoder._embed_points(coords[:, None], labels[:, None], pad=True)[:, 0]

    def key_map(self) -> dict[str, str | tuple[str, ...]]:
        """Our state-dict key -> Meta's key (relative to tracker.model.); a tuple is concatenated."""
        keys: dict[str, str | tuple[str, ...]] = {}
        for name, _ in self.memory_attention.named_parameters():
            keys[f"memory_attention.{name}"] = f"transformer.encoder.{name}"
        for ours, meta, n_masks in (("mask_decoder", "sam_mask_decoder", self.mask_decoder.masks_per_slot),
                                    ("interactive_head", "interactive_sam_mask_decoder",
                                     self.interactive_head.mask_tokens.shape[0])):
            head = getattr(self, ours)
            keys.update(two_way_keys(f"{meta}.transformer", f"{ours}.transformer", len(head.transformer.layers)))
            keys.update(upscaling_keys(meta, f"{ours}.upscaling"))
            for i in range(n_masks):
                keys.update(mlp_keys(f"{meta}.output_hypernetworks_mlps.{i}", f"{ours}.hypernetworks.{i}", 3))
            keys.update(mlp_keys(f"{meta}.iou_prediction_head", f"{ours}.iou_head", 3))
            keys.update(mlp_keys(f"{meta}.pred_obj_score_head", f"{ours}.obj_score_head", 3))
            for t in ("obj_score_token", "iou_token", "mask_tokens"):
                keys[f"{ours}.{t}"] = f"{meta}.{t}.weight"
        pe = "interactive_sam_prompt_encoder"
        keys["prompt_encoder.shared_embedding.positional_embedding"] = f"{pe}.pe_layer.positional_encoding_gaussian_matrix"
        keys["prompt_encoder.point_embed.weight"] = tuple(f"{pe}.point_embeddings.{i}.weight" for i in range(
            self.prompt_encoder.point_embed.weight.shape[0]))
        keys["prompt_encoder.not_a_point_embed.weight"] = f"{pe}.not_a_point_embed.weight"
        keys["prompt_encoder.no_mask_embed.weight"] = f"{pe}.no_mask_embed.weight"
        for ours, meta in (("conv1", 0), ("layer_norm1", 1), ("conv2", 3), ("layer_norm2", 4), ("conv3", 6)):
            for p in ("weight", "bias"):
                keys[f"prompt_encoder.mask_embed.{ours}.{p}"] = f"{pe}.mask_downscaling.{meta}.{p}"
        for name, _ in self.memory_encoder.downsampler.named_parameters():
            keys[f"memory_encoder.downsampler.{name}"] = f"maskmem_backbone.mask_downsampler.encoder.{name}"
        for p in ("weight", "bias"):
            keys[f"memory_encoder.pix_feat_proj.{p}"] = f"maskmem_backbone.pix_feat_proj.{p}"
        for i in range(len(self.memory_encoder.fuser.layers)):
            for ours, meta in (("depthwise_conv", "dwconv"), ("layer_norm", "norm"), ("pointwise_conv1", "pwconv1"),
                               ("pointwise_conv2", "pwconv2")):
                for p in ("weight", "bias"):
                    keys[f"memory_encoder.fuser.layers.{i}.{ours}.{p}"] = f"maskmem_backbone.fuser.layers.{i}.{meta}.{p}"
            keys[f"memory_encoder.fuser.layers.{i}.scale"] = f"maskmem_backbone.fuser.layers.{i}.gamma"
        keys.update(mlp_keys("obj_ptr_proj", "obj_ptr_proj", len(self.obj_ptr_proj.layers) + 2))
        keys.update(mlp_keys("interactive_obj_ptr_proj", "interactive_obj_ptr_proj",
                             len(self.interactive_obj_ptr_proj.layers) + 2))
        for m in ("no_obj_ptr_linear", "obj_ptr_tpos_proj", "interactive_mask_downsample"):
            for p in ("weight", "bias"):
                keys[f"{m}.{p}"] = f"{m}.{p}"
        for name in ("maskmem_tpos_enc", "interactivity_no_mem_embed", "no_obj_embed_spatial", "output_valid_embed",
                     "output_invalid_embed"):
            keys[name] = name
        keys["propagation_pe_gaussian"] = "image_pe_layer.positional_encoding_gaussian_matrix"
        return keys

    @classmethod
    def from_state_dict(cls, state_dict: dict, grid: int) -> "Sam31Tracker":
        """Strict: every tracker.model.* key is used or in IGNORED, every module tensor is filled with a tensor
        of its shape; otherwise one MappingError naming the keys."""
        meta = tracker_keys(state_dict)
        model = cls({k: tuple(v.shape) for k, v in meta.items()}, grid)
        ours = model.state_dict()
        mapping = model.key_map()
        problems = [f"module tensor {k} has no checkpoint key" for k in ours if k not in mapping]
        problems += [f"map entry {k} is not a module tensor" for k in mapping if k not in ours]
        used: set[str] = set()
        filled = {}
        for k, src in mapping.items():
            if k not in ours:
                continue
            srcs = src if isinstance(src, tuple) else (src,)
            missing = [m for m in srcs if m not in meta]
            if missing:
                problems.append(f"{k}: checkpoint keys {[PREFIX + m for m in missing]} not found")
                continue
            used.update(srcs)
            value = torch.cat([meta[m] for m in srcs]) if len(srcs) > 1 else meta[srcs[0]]
            if tuple(value.shape) != tuple(ours[k].shape):
                problems.append(f"{k}: shape {tuple(ours[k].shape)} != {PREFIX}{src} {tuple(value.shape)}")
                continue
            filled[k] = value.to(torch.float32)
        unused = [m for m in meta if m not in used and ignored_reason(m) is None]
        problems += [f"checkpoint key {PREFIX}{m} is not used and not in IGNORED" for m in unused]
        if problems:
            raise MappingError("SAM 3.1 tracker weights do not map:\n  " + "\n  ".join(problems))
        model.load_state_dict(filled, strict=True)
        return model.eval().finalize()


def tracker_keys(state_dict: dict) -> dict[str, torch.Tensor]:
    """The tracker's tensors by key relative to tracker.model. (Meta's internal sam2_predictor.model.
    prefix accepted, as Meta's loader accepts it)."""
    out = {}
    for k, v in state_dict.items():
        for prefix in (PREFIX, INTERNAL_PREFIX):
            if k.startswith(prefix):
                out[k[len(prefix):]] = v
    if not out:
        raise MappingError(f"no {PREFIX}* keys: not a SAM 3.1 checkpoint's state dict")
    return out


def ignored_reason(key: str) -> str | None:
    """Why a tracker key (relative to tracker.model.) is not read by the tracker graphs, or None."""
    for pattern, reason in IGNORED:
        if re.fullmatch(pattern, key):
            return reason
    return None


def _count(shapes: dict, pattern: str) -> int:
    """1 + the largest index (the pattern's group, matched from the key's start) the keys show."""
    found = set()
    for k in shapes:
        m = re.match(pattern, k)
        if m:
            found.add(int(m.group(1)))
    if not found:
        raise MappingError(f"no checkpoint key matches {pattern}")
    return max(found) + 1


def _prompt_encoder(s: dict, d: int, grid: int):
    """transformers' Sam3TrackerVideoPromptEncoder sized from the interactive prompt encoder's tensors."""
    from transformers.models.sam3_tracker_video.configuration_sam3_tracker_video import (
        Sam3TrackerVideoPromptEncoderConfig)
    from transformers.models.sam3_tracker_video.modeling_sam3_tracker_video import Sam3TrackerVideoPromptEncoder

    pe = "interactive_sam_prompt_encoder"
    points = _count(s, rf"{pe}\.point_embeddings\.(\d+)\.")
    config = Sam3TrackerVideoPromptEncoderConfig(
        hidden_size=d, image_size=grid * BACKBONE_STRIDE, patch_size=BACKBONE_STRIDE,
        mask_input_channels=s[f"{pe}.mask_downscaling.3.weight"][0], num_point_embeddings=points)
    return Sam3TrackerVideoPromptEncoder(config)


def grid_from_state_dict(state_dict: dict) -> int | None:
    """F = image_size / 14 from the detector ViT's RoPE tables (checkpoint.rope_sides), when the state
    dict has them; None otherwise (then callers pass image_size)."""
    from .checkpoint import rope_sides

    rows = [v.shape[0] for k, v in state_dict.items() if re.fullmatch(
        r"detector\.backbone\.vision_backbone\.trunk\.blocks\.\d+\.attn\.freqs_cis", k)]
    sides = rope_sides(rows)
    return None if sides is None else sides[0]
