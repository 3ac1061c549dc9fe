"""SAM 3.1's tracker as torch modules, filled from Meta's checkpoint (``tracker.model.*``) by an explicit map.

Written from Meta's code as read (facebookresearch/sam3 at 96914d2, see /work/notes/sam31_architecture.md
section 3), not copied from it. Where the notes call a part identical to SAM 3's tracker, transformers'
Sam3TrackerVideo classes are reused: the two-way transformer of both mask decoders, the interactive
prompt encoder, the memory fuser and the small MLPs. New: the decoupled memory attention, the multiplex
mask decoder (16 slots decoded jointly), the multiplex memory encoder (32-channel muxed mask input), the
pointer path, and the graph wrappers at the bottom of this file.

Sizes come from tensor shapes. What no tensor says is a constant of Meta's builder
(``model_builder.py:863-1051``) and named here: attention heads, the stability-fallback thresholds, the
memory encoder's sigmoid scale and bias, the -10/+10 logits of mask inputs. The feature grid F is not in
the tracker's tensors either (it is image_size / 14): callers pass it.

Graph wrappers (one per exported graph; inputs and outputs in graphs/sam31/tracker_specs.py):
- PropagationDecoder: memory attention + multiplex mask decoder + object pointers, all buckets in one call,
  each bucket's memories and pointers gathered from device pools by index;
- MemoryEncoder: one memory map per bucket from its 16 slot masks (stored rounded to bfloat16);
- InteractiveDecoder: clicks / boxes (+ a mask prompt) on the memory-free interactive head;
- MaskInit: births and reconditioning from detector mask logits (Meta's ``_use_mask_as_output``).
"""

from __future__ import annotations

import math
import re

import torch
import torch.nn.functional as F
from torch import nn

from ..ops import NO_OBJ_SCORE, attention, resize_antialiased, round_to_bfloat16

PREFIX = "tracker.model."
INTERNAL_PREFIX = "sam2_predictor.model."  # Meta's internal name; its loader renames it to PREFIX

# Constants of Meta's builder that no tensor shape gives.
MEMORY_ATTENTION_HEADS = 8  # SimpleRoPEAttention(256, 8 heads): head_dim 32
DECODER_HEADS = 8  # both TwoWayTransformer(depth 2, 256, mlp 2048, 8 heads)
ROPE_THETA = 10000.0
SIGMOID_SCALE_FOR_MEM_ENC, SIGMOID_BIAS_FOR_MEM_ENC = 2.0, -1.0  # mask_for_mem = sigmoid(m) * 2 - 1
STABILITY_DELTA, STABILITY_THRESH = 0.05, 0.98  # interactive decoder's dynamic_multimask_via_stability
MASK_INPUT_SCALE, MASK_INPUT_BIAS = 20.0, -10.0  # _use_mask_as_output: binary mask -> -10 / +10 logits
BACKBONE_STRIDE = 14

# Checkpoint keys this export reads elsewhere or not at all, and why.
IGNORED = (
    (r"(sam_mask_decoder|interactive_sam_mask_decoder)\.conv_s[01]\.(weight|bias)",
     "applied to neck levels 0 / 1 by the backbone and interactive_neck graphs (the detector export), as "
     "Meta precomputes them per frame: the tracker graphs take tracker_feat_s0/_s1 and interactive_feat_s0/_s1"),
)


class MappingError(ValueError):
    pass


# ------------------------------------------------------------------------------------- small parts
class LayerNorm2d(nn.Module):
    """LayerNorm over channels of [N, C, H, W] (Meta's LayerNorm2d: mean, biased variance, eps 1e-6)."""

    def __init__(self, channels: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))
        self.eps = eps

    def forward(self, x):
        u = x.mean(1, keepdim=True)
        s = (x - u).pow(2).mean(1, keepdim=True)
        return self.weight[:, None, None] * ((x - u) / torch.sqrt(s + self.eps)) + self.bias[:, None, None]


def mlp(in_dim: int, hidden: int, out_dim: int, layers: int):
    """Meta's 3-layer ReLU MLP (sam MLP / model_misc MLP) as transformers' FeedForward."""
    from transformers.models.sam3_tracker_video.modeling_sam3_tracker_video import Sam3TrackerVideoFeedForward

    return Sam3TrackerVideoFeedForward(in_dim, hidden, out_dim, layers)


def mlp_keys(meta: str, ours: str, layers: int) -> dict[str, str]:
    """Meta MLP ``layers.0 .. layers.L-1`` -> FeedForward ``proj_in, layers.0 .., proj_out``."""
    names = ["proj_in"] + [f"layers.{i}" for i in range(layers - 2)] + ["proj_out"]
    return {f"{ours}.{n}.{p}": f"{meta}.layers.{i}.{p}" for i, n in enumerate(names) for p in ("weight", "bias")}


def random_fourier_dense_pe(gaussian: torch.Tensor, size: int) -> torch.Tensor:
    """PositionEmbeddingRandom((size, size)): [1, C, size, size] (random-Fourier features of cell centres)."""
    centres = (torch.arange(size, dtype=torch.float32) + 0.5) / size
    y, x = torch.meshgrid(centres, centres, indexing="ij")
    coords = 2 * torch.stack([x, y], dim=-1) - 1
    coords = 2 * math.pi * (coords @ gaussian)
    return torch.cat([torch.sin(coords), torch.cos(coords)], dim=-1).permute(2, 0, 1)[None]


def sine_position_encoding(channels: int, size: int) -> torch.Tensor:
    """PositionEmbeddingSine(channels, normalize=True, scale 2*pi) of a size x size map: [1, C, size, size]
    (the neck's encoding; the stored image_pos_enc of every frame and the current frame's src_pos)."""
    half = channels // 2
    steps = torch.arange(1, size + 1, dtype=torch.float32)
    embed = steps / (steps[-1:] + 1e-6) * (2 * math.pi)
    dim_t = 10000.0 ** (2 * (torch.arange(half, dtype=torch.float32) // 2) / half)
    pos = embed[:, None] / dim_t  # [size, half]
    pos = torch.stack((pos[:, 0::2].sin(), pos[:, 1::2].cos()), dim=2).flatten(1)
    pos_y = pos[:, None, :].expand(size, size, half)
    pos_x = pos[None, :, :].expand(size, size, half)
    return torch.cat((pos_y, pos_x), dim=2).permute(2, 0, 1)[None]


def sine_1d(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """get_1d_sine_pe(positions, dim): [..., dim] = (sin | cos) of positions / 10000^(2*(i//2)/(dim/2))."""
    half = dim // 2
    dim_t = 10000.0 ** (2 * (torch.arange(half, dtype=torch.float32) // 2) / half)
    pos = positions[..., None] / dim_t
    return torch.cat([pos.sin(), pos.cos()], dim=-1)


def axial_rope_tables(head_dim: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """compute_axial_cis(head_dim, size, size) in real form: cos and signed sin [size*size, head_dim].

    Pairs (x[2i], x[2i+1]) rotate; the first head_dim/4 pairs by the column, the rest by the row, each
    at frequencies theta^(-4k/head_dim). ``rope`` applies them (x * cos + pair_swap(x) * sin)."""
    freqs = 1.0 / (ROPE_THETA ** (torch.arange(0, head_dim, 4)[: head_dim // 4].float() / head_dim))
    t = torch.arange(size * size, dtype=torch.float32)
    t_x, t_y = t % size, torch.div(t, size, rounding_mode="floor")
    angles = torch.cat([torch.outer(t_x, freqs), torch.outer(t_y, freqs)], dim=-1)  # [HW, head_dim / 2]
    cos = angles.cos().repeat_interleave(2, dim=-1)
    sin = angles.sin().repeat_interleave(2, dim=-1) * torch.tensor([-1.0, 1.0]).repeat(head_dim // 2)
    return cos, sin


def rope(x, cos, signed_sin, swap):
    """RoPE on the last axis, x * cos + pair_swap(x) * signed_sin: the complex product of Meta's
    apply_rotary_enc written with real products (as modules._rope). The pair swap is a Gather with the
    constant permutation ``swap`` (modules._rope's unflatten / flip / flatten would lose the exporter's
    dynamic bucket axis, see MemoryAttention._heads)."""
    return x * cos + torch.index_select(x, -1, swap) * signed_sin


# ------------------------------------------------------------------------------- memory attention
class DecoupledMemoryLayer(nn.Module):
    """DecoupledTransformerDecoderLayerv2 (pre-norm, GELU): RoPE self-attention, then cross-attention whose
    queries add a projection of the *current image* and whose keys add a projection of the *stored image*
    of each memory frame (Meta's save_image_features), then an MLP. Parameter names are Meta's."""

    def __init__(self, d: int, ffn: int):
        super().__init__()
        for name in ("self_attn_q_proj", "self_attn_k_proj", "self_attn_v_proj", "self_attn_out_proj",
                     "cross_attn_q_proj", "cross_attn_k_proj", "cross_attn_v_proj", "cross_attn_out_proj",
                     "image_cross_attn_q_proj", "image_cross_attn_k_proj"):
            setattr(self, name, nn.Linear(d, d))
        self.linear1, self.linear2 = nn.Linear(d, ffn), nn.Linear(ffn, d)
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)


class MemoryAttention(nn.Module):
    """TransformerEncoderDecoupledCrossAttention for B buckets with key padding.

    current [1, HW, C] (the frame's propagation features, shared by all buckets); keys per bucket:
    n*HW spatial memory tokens then T pointer tokens. Padding keys (valid 0) are masked, so a bucket with
    fewer memories gets what Meta's unpadded call gives. Returns [B, HW, C] (use_image_in_output=False).
    """

    def __init__(self, layers: int, d: int, ffn: int, heads: int, grid: int):
        super().__init__()
        self.layers = nn.ModuleList(DecoupledMemoryLayer(d, ffn) for _ in range(layers))
        self.norm = nn.LayerNorm(d)
        self.heads, self.head_dim = heads, d // heads
        self.scale = self.head_dim ** -0.5  # scaled_dot_product_attention's default
        cos, sin = axial_rope_tables(self.head_dim, grid)
        self.register_buffer("rope_cos", cos[:, None, :], persistent=False)  # [HW, 1, D]: broadcast over heads
        self.register_buffer("rope_sin", sin[:, None, :], persistent=False)
        self.register_buffer("rope_swap", torch.arange(self.head_dim).reshape(-1, 2).flip(-1).reshape(-1),
                             persistent=False)
        self.attention_mode = "plain"

    def _heads(self, x):
        # reshape with the sizes read off x, not unflatten: after an unflatten the ONNX exporter's shape
        # inference fell back to the traced sizes, and constant folding froze the bucket count into the
        # attention's output Reshape
        return x.reshape(x.shape[0], x.shape[1], self.heads, self.head_dim)

    def _rope_spatial(self, k):
        """RoPE on n*HW spatial keys [B, n*HW, H, D]: the query table repeated over the n memory frames
        (Meta's rope_k_repeat), as a broadcast over a frames axis rather than a repeat."""
        b, hw = k.shape[0], self.rope_cos.shape[0]
        k = k.reshape(b, -1, hw, self.heads, self.head_dim)  # [B, n, HW, H, D]
        return self._rope(k).reshape(b, -1, self.heads, self.head_dim)

    def _rope(self, x):
        return rope(x, self.rope_cos, self.rope_sin, self.rope_swap)

    def forward(self, current, current_pos, memory, memory_image, memory_image_pos, pointers, pointer_pos, valid):
        """memory [B, n*HW, C], memory_image [B, n*HW, C] (stored image features of the same frames),
        memory_image_pos [B, n*HW, C] (their sine encoding + temporal encoding), pointers [B, T, C],
        pointer_pos [B, T, C], valid [B, n*HW + T] float."""
        b = memory.shape[0]
        output = current + 0.1 * current_pos  # pos_enc_at_input; [1, HW, C] until the first cross-attention
        values = torch.cat([memory, pointers], dim=1)
        for layer in self.layers:
            x = layer.norm1(output)  # self-attention: no position encoding, RoPE on q and k
            q = self._rope(self._heads(layer.self_attn_q_proj(x)))
            k = self._rope(self._heads(layer.self_attn_k_proj(x)))
            v = self._heads(layer.self_attn_v_proj(x))
            output = output + layer.self_attn_out_proj(attention(q, k, v, None, self.scale, self.attention_mode))

            x = layer.norm2(output)
            q = layer.image_cross_attn_q_proj(current) + layer.cross_attn_q_proj(x)
            q = self._rope(self._heads(q)).expand(b, -1, -1, -1)
            # keys: position encodings added after the projections; Meta pads memory_image with zeros for the
            # pointer rows, so their image term is the projection's bias alone
            k_spatial = (layer.image_cross_attn_k_proj(memory_image) + layer.cross_attn_k_proj(memory)
                         + memory_image_pos)
            k_pointer = layer.image_cross_attn_k_proj.bias + layer.cross_attn_k_proj(pointers) + pointer_pos
            k = torch.cat([self._rope_spatial(self._heads(k_spatial)), self._heads(k_pointer)], dim=1)
            v = self._heads(layer.cross_attn_v_proj(values))
            output = output + layer.cross_attn_out_proj(attention(q, k, v, valid, self.scale, self.attention_mode))

            x = layer.norm3(output)
            output = output + layer.linear2(F.gelu(layer.linear1(x)))
        return self.norm(output)


# ------------------------------------------------------------------------------------ mask decoders
def two_way_transformer(d: int, mlp_dim: int, layers: int, downsample: int):
    from transformers.models.sam3_tracker_video.configuration_sam3_tracker_video import (
        Sam3TrackerVideoMaskDecoderConfig)
    from transformers.models.sam3_tracker_video.modeling_sam3_tracker_video import Sam3TrackerVideoTwoWayTransformer

    config = Sam3TrackerVideoMaskDecoderConfig(hidden_size=d, mlp_dim=mlp_dim, num_hidden_layers=layers,
                                               num_attention_heads=DECODER_HEADS,
                                               attention_downsample_rate=downsample)
    config._attn_implementation_internal = "eager"
    return Sam3TrackerVideoTwoWayTransformer(config)


def two_way_keys(meta: str, ours: str, layers: int) -> dict[str, str]:
    """Meta's sam.transformer.TwoWayTransformer -> transformers' Sam3TrackerVideoTwoWayTransformer."""
    keys = {}

    def attn(m, o):
        for proj in ("q_proj", "k_proj", "v_proj"):
            for p in ("weight", "bias"):
                keys[f"{o}.{proj}.{p}"] = f"{m}.{proj}.{p}"
        for p in ("weight", "bias"):
            keys[f"{o}.o_proj.{p}"] = f"{m}.out_proj.{p}"

    for i in range(layers):
        m, o = f"{meta}.layers.{i}", f"{ours}.layers.{i}"
        for name in ("self_attn", "cross_attn_token_to_image", "cross_attn_image_to_token"):
            attn(f"{m}.{name}", f"{o}.{name}")
        for p in ("weight", "bias"):
            for j in (1, 2, 3, 4):
                keys[f"{o}.layer_norm{j}.{p}"] = f"{m}.norm{j}.{p}"
            keys[f"{o}.mlp.proj_in.{p}"] = f"{m}.mlp.lin1.{p}"
            keys[f"{o}.mlp.proj_out.{p}"] = f"{m}.mlp.lin2.{p}"
    attn(f"{meta}.final_attn_token_to_image", f"{ours}.final_attn_token_to_image")
    for p in ("weight", "bias"):
        keys[f"{ours}.layer_norm_final_attn.{p}"] = f"{meta}.norm_final_attn.{p}"
    return keys


class MaskUpscaling(nn.Module):
    """output_upscaling with the high-resolution levels added: gelu(LN(convT(x) + s1)), gelu(convT(.) + s0)."""

    def __init__(self, d: int):
        super().__init__()
        self.conv1 = nn.ConvTranspose2d(d, d // 4, kernel_size=2, stride=2)
        self.norm = LayerNorm2d(d // 4)
        self.conv2 = nn.ConvTranspose2d(d // 4, d // 8, kernel_size=2, stride=2)

    def forward(self, x, s0, s1):
        x = F.gelu(self.norm(self.conv1(x) + s1))
        return F.gelu(self.conv2(x) + s0)


def upscaling_keys(meta: str, ours: str) -> dict[str, str]:
    pairs = (("conv1", "0"), ("norm", "1"), ("conv2", "3"))
    return {f"{ours}.{o}.{p}": f"{meta}.output_upscaling.{m}.{p}" for o, m in pairs for p in ("weight", "bias")}


class MultiplexMaskDecoder(nn.Module):
    """MultiplexMaskDecoder (multimask_outputs_only, no prompt tokens): per bucket 16 object-score tokens,
    16 IoU tokens and 16 x 3 mask tokens, decoded jointly by one two-way transformer over that bucket's
    memory-conditioned map. Each slot's 3 mask tokens get output_valid_embed[slot] or
    output_invalid_embed[slot] (add_output_suppression_embeddings) by whether the slot holds an object.
    Returns masks [B, K, 3, 4F, 4F], iou [B, K, 3] (no sigmoid), object scores [B, K, 1], mask tokens
    [B, K, 3, C]."""

    def __init__(self, d: int, slots: int, masks_per_slot: int, mlp_dim: int, layers: int, downsample: int):
        super().__init__()
        self.slots, self.masks_per_slot = slots, masks_per_slot
        self.obj_score_token = nn.Parameter(torch.zeros(slots, d))
        self.iou_token = nn.Parameter(torch.zeros(slots, d))
        self.mask_tokens = nn.Parameter(torch.zeros(slots * masks_per_slot, d))
        self.transformer = two_way_transformer(d, mlp_dim, layers, downsample)
        self.upscaling = MaskUpscaling(d)
        self.hypernetworks = nn.ModuleList(mlp(d, d, d // 8, 3) for _ in range(masks_per_slot))
        self.iou_head = mlp(d, d, masks_per_slot, 3)
        self.obj_score_head = mlp(d, d, 1, 3)

    def forward(self, pix_feat, dense_pe, s0, s1, slot_embed):
        b, c, h, w = pix_feat.shape
        k, m = self.slots, self.masks_per_slot
        mask_tokens = self.mask_tokens.reshape(1, k, m, c) + slot_embed[:, :, None, :]  # [B, K, M, C]
        tokens = torch.cat([self.obj_score_token.expand(b, -1, -1), self.iou_token.expand(b, -1, -1),
                            mask_tokens.reshape(b, k * m, c)], dim=1)
        # no dense prompt: the image embeddings go in as they are
        hs, src = self.transformer(point_embeddings=tokens[:, None], image_embeddings=pix_feat,
                                   image_positional_embeddings=dense_pe.expand(b, -1, -1, -1),
                                   attention_similarity=None)
        hs = hs[:, 0]
        obj_tokens, iou_tokens, mask_out = hs[:, :k], hs[:, k:2 * k], hs[:, 2 * k:].reshape(b, k, m, c)
        up = self.upscaling(src[:, 0].transpose(1, 2).reshape(b, c, h, w), s0, s1)  # [B, C/8, 4h, 4w]
        hyper = torch.stack([self.hypernetworks[i](mask_out[:, :, i]) for i in range(m)], dim=2)  # [B, K, M, C/8]
        masks = (hyper.reshape(b, k * m, -1) @ up.flatten(2)).reshape(b, k, m, up.shape[-2], up.shape[-1])
        return masks, self.iou_head(iou_tokens), self.obj_score_head(obj_tokens), mask_out


class SamMaskHead(nn.Module):
    """The interactive SAM mask decoder (sam/mask_decoder.py MaskDecoder, IoU head without sigmoid), all
    outputs: masks [N, 4, 4F, 4F] (token 0 single-mask, 1..3 multimask), iou [N, 4], mask tokens
    [N, 4, C], object score [N, 1]. ``with_masks=False`` skips the upscaling (a caller that needs the
    tokens only). The choice between single and multimask output is the callers' (select_*)."""

    def __init__(self, d: int, mask_tokens: int, mlp_dim: int, layers: int, downsample: int):
        super().__init__()
        self.obj_score_token = nn.Parameter(torch.zeros(1, d))
        self.iou_token = nn.Parameter(torch.zeros(1, d))
        self.mask_tokens = nn.Parameter(torch.zeros(mask_tokens, d))
        self.transformer = two_way_transformer(d, mlp_dim, layers, downsample)
        self.upscaling = MaskUpscaling(d)
        self.hypernetworks = nn.ModuleList(mlp(d, d, d // 8, 3) for _ in range(mask_tokens))
        self.iou_head = mlp(d, d, mask_tokens, 3)
        self.obj_score_head = mlp(d, d, 1, 3)

    def forward(self, pix_feat, dense_pe, sparse, dense, s0=None, s1=None, with_masks=True):
        """pix_feat [1, C, F, F] (one frame, shared), sparse [N, P', C], dense [N, C, F, F]."""
        n = sparse.shape[0]
        c, h, w = pix_feat.shape[1:]
        m = self.mask_tokens.shape[0]
        tokens = torch.cat([self.obj_score_token, self.iou_token, self.mask_tokens], dim=0)
        tokens = torch.cat([tokens.expand(n, -1, -1), sparse], dim=1)
        hs, src = self.transformer(point_embeddings=tokens[:, None], image_embeddings=pix_feat + dense,
                                   image_positional_embeddings=dense_pe.expand(n, -1, -1, -1),
                                   attention_similarity=None)
        hs = hs[:, 0]
        mask_out = hs[:, 2:2 + m]
        iou, score = self.iou_head(hs[:, 1]), self.obj_score_head(hs[:, 0])
        if not with_masks:
            return None, iou, mask_out, score
        up = self.upscaling(src[:, 0].transpose(1, 2).reshape(n, c, h, w), s0, s1)
        hyper = torch.stack([self.hypernetworks[i](mask_out[:, i]) for i in range(m)], dim=1)  # [N, M, C/8]
        masks = (hyper @ up.flatten(2)).reshape(n, m, up.shape[-2], up.shape[-1])
        return masks, iou, mask_out, score


def take_best(values, index, axis: int):
    """values[..., index, ...] along ``axis``: index has the dims of values before ``axis``; the result
    has values' shape without ``axis``."""
    idx = index
    for _ in range(values.dim() - index.dim() - 1):
        idx = idx[..., None]
    idx = idx.unsqueeze(axis)
    shape = list(values.shape)
    shape[axis] = 1
    return torch.gather(values, axis, idx.expand(shape)).squeeze(axis)


def stability_scores(mask_logits):
    """IoU of the mask thresholded at +delta and at -delta (1 where both are empty), per mask."""
    flat = mask_logits.flatten(-2)
    inter = (flat > STABILITY_DELTA).float().sum(-1)
    union = (flat > -STABILITY_DELTA).float().sum(-1)
    return torch.where(union > 0, inter / torch.clamp(union, min=1.0), torch.ones_like(union))


# ------------------------------------------------------------------------------------ memory encoder
class MultiplexMemoryEncoder(nn.Module):
    """SimpleMaskEncoder with the multiplex SimpleMaskDownSampler: per bucket a [32, 16F, 16F] input
    (16 slot masks in [-1, 1] | 16 conditioning planes) -> 4 x (conv k3 s2, LayerNorm2d, GELU) -> conv 1x1,
    added to pix_feat_proj(frame features), then the fuser (2 CXBlocks). out_proj is Identity (256 -> 256);
    the sine position encoding it returns is never read by the decoupled attention, so it is not built."""

    def __init__(self, channels: list[int], d: int, fuser_layers: int, fuser_hidden: int, fuser_kernel: int,
                 mask_size: int):
        super().__init__()
        from transformers.models.sam3_tracker_video.configuration_sam3_tracker_video import Sam3TrackerVideoConfig
        from transformers.models.sam3_tracker_video.modeling_sam3_tracker_video import Sam3TrackerVideoMemoryFuser

        layers = []
        for cin, cout in zip(channels[:-1], channels[1:]):
            layers += [nn.Conv2d(cin, cout, kernel_size=3, stride=2, padding=1), LayerNorm2d(cout), nn.GELU()]
        layers.append(nn.Conv2d(channels[-1], d, kernel_size=1))
        self.downsampler = nn.Sequential(*layers)  # indices as Meta's mask_downsampler.encoder
        self.pix_feat_proj = nn.Conv2d(d, d, kernel_size=1)
        config = Sam3TrackerVideoConfig(memory_fuser_num_layers=fuser_layers, memory_fuser_embed_dim=d,
                                        memory_fuser_intermediate_dim=fuser_hidden,
                                        memory_fuser_kernel_size=fuser_kernel,
                                        memory_fuser_padding=fuser_kernel // 2)
        self.fuser = Sam3TrackerVideoMemoryFuser(config)
        self.mask_size = mask_size  # SimpleMaskDownSampler.interpol_size: 16F

    def forward(self, pix_feat, mask_input):
        if mask_input.shape[-1] != self.mask_size:
            # Meta resizes with antialias=True; it only ever upsamples here (14F -> 16F), where torch's
            # antialiased weights are the bilinear ones (rounding aside), so a plain Resize
            mask_input = F.interpolate(mask_input, size=(self.mask_size, self.mask_size), mode="bilinear",
                                       align_corners=False)
        return self.fuser(self.pix_feat_proj(pix_feat) + self.downsampler(mask_input))


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


# ---------------------------------------------------------------------------------------- graphs
class TrackerGraph(nn.Module):
    """Base of the graph wrappers: holds the tracker; ``attention_mode`` (ops.ATTENTION_MODES) is set by
    the exporter and reaches the memory attention (the two-way transformers are switched by
    ops.transformers_attention around the export)."""

    def __init__(self, tracker: Sam31Tracker):
        super().__init__()
        self.trk = tracker

    @property
    def attention_mode(self):
        return self.trk.memory_attention.attention_mode

    @attention_mode.setter
    def attention_mode(self, mode):
        self.trk.memory_attention.attention_mode = mode


class PropagationDecoder(TrackerGraph):
    """One propagation step for B buckets (Meta's _prepare_memory_conditioned_features + _forward_sam_heads
    on the propagation path), every bucket's memories and pointers gathered from the pools by index.

    Per bucket b and memory entry j: memory_pool[memory_index[b, j]] is the bucket's stored memory map of
    one frame, image_pool[memory_image_index[b, j]] the stored image features of that same frame,
    memory_slot[b, j] its temporal-encoding index (maskmem_tpos_enc row, Meta's tpos v2), memory_valid 1/0.
    Per pointer entry j: pointer_pool[pointer_index[b, j]] holds the bucket's 16 slot pointers of one frame,
    pointer_offset[b, j] = |frame distance| / (min(num_frames, 16) - 1), pointer_valid 1/0.
    slot_valid [B, 16]: 1 where the slot holds an object (not padding, not a removed hole).

    Outputs per bucket and slot, as Meta's propagation step leaves them before demux: low_res_masks (the
    best of the 3 by predicted IoU; NO_OBJ_SCORE where the object score is <= 0), iou_scores (the 3 raw
    IoU predictions), object_score_logits, object_pointer (0 in empty slots: what Meta stores, mux).
    """

    def forward(self, tracker_feat_s0, tracker_feat_s1, tracker_feat, memory_pool, image_pool, pointer_pool,
                memory_index, memory_image_index, memory_slot, memory_valid, pointer_index, pointer_offset,
                pointer_valid, slot_valid):
        trk = self.trk
        b, n = memory_index.shape
        p = pointer_index.shape[1]
        c, g, k = trk.channels, trk.grid, trk.slots
        hw = g * g
        current = tracker_feat.flatten(2).transpose(1, 2)  # [1, HW, C]

        memory = memory_pool[memory_index.reshape(-1)].reshape(b, n * hw, c)
        memory_image = image_pool[memory_image_index.reshape(-1)].reshape(b, n * hw, c)
        tpos = trk.maskmem_tpos_enc.reshape(-1, c)[memory_slot.reshape(-1)].reshape(b, n, 1, c)
        # Meta: image_pos_enc (the sine encoding) + maskmem_tpos_enc[slot] for every stored frame
        memory_image_pos = (trk.image_pos[:, None] + tpos).reshape(b, n * hw, c)

        pointers = pointer_pool[pointer_index.reshape(-1)].reshape(b, p * k, c)
        pointer_pos = trk.obj_ptr_tpos_proj(sine_1d(pointer_offset, trk.obj_ptr_tpos_proj.in_features))  # [B, P, C]: one per pointer frame,
        pointer_pos = pointer_pos[:, :, None, :].expand(b, p, k, c).reshape(b, p * k, c)  # shared by its 16 slots

        valid = torch.cat([memory_valid[:, :, None].expand(b, n, hw).reshape(b, n * hw),
                           pointer_valid[:, :, None].expand(b, p, k).reshape(b, p * k)], dim=1)
        conditioned = trk.memory_attention(current, trk.image_pos, memory, memory_image, memory_image_pos,
                                           pointers, pointer_pos, valid)
        pix_feat = conditioned.transpose(1, 2).reshape(b, c, g, g)

        slot_valid_ = slot_valid[:, :, None]
        slot_embed = slot_valid_ * trk.output_valid_embed + (1 - slot_valid_) * trk.output_invalid_embed
        masks, iou, score, tokens = trk.mask_decoder(pix_feat, trk.propagation_dense_pe, tracker_feat_s0,
                                                     tracker_feat_s1, slot_embed)
        masks = torch.where((score > 0)[..., None, None], masks, torch.full((), NO_OBJ_SCORE))
        # multimask_output is always on in propagation (_use_multimask(False, None)): best predicted IoU
        best = torch.argmax(iou, dim=-1)  # [B, K]
        low_res = take_best(masks, best, axis=2)[:, :, None]  # [B, K, 1, 4F, 4F]
        pointer = trk.pointer(trk.obj_ptr_proj, take_best(tokens, best, axis=2), score)
        return low_res, iou, score, pointer * slot_valid_


class MemoryEncoder(TrackerGraph):
    """One memory map per bucket (Meta's _encode_new_memory for the buckets of a tracker state, stored
    bf16 as _run_memory_encoder stores it).

    mask_logits [B, 16, h, h] at h = 14F (births / clicks: the consolidated masks) or 16F (propagated
    frames: low-res logits upsampled by the caller, after its non-overlap rules), one slot per plane;
    slot_valid [B, 16]; conditioning [B, 16] (1 = in the frame's conditioning_objects);
    object_score_logits [B, 16]. As Meta muxes them, empty slots give mask 0 (not -1), conditioning 0 and a
    score of 0, so they add no_obj_embed_spatial[slot] like absent objects do.
    Outputs maskmem_features [B, HW, C] (rounded to bfloat16: one memory_pool row per bucket) and
    image_features [1, HW, C] (the frame's features in the image_pool row layout).
    """

    def forward(self, tracker_feat, mask_logits, slot_valid, conditioning, object_score_logits):
        trk = self.trk
        b, k, h, w = mask_logits.shape
        valid = slot_valid[:, :, None, None] > 0.5
        prob = torch.sigmoid(mask_logits) * SIGMOID_SCALE_FOR_MEM_ENC + SIGMOID_BIAS_FOR_MEM_ENC
        masks = torch.where(valid, prob, torch.zeros((), dtype=prob.dtype))
        cond = (conditioning * slot_valid)[:, :, None, None].expand(b, k, h, w)
        features = trk.memory_encoder(tracker_feat, torch.cat([masks, cond], dim=1))  # [B, C, F, F]
        absent = 1.0 - (object_score_logits > 0).to(features.dtype) * slot_valid
        no_obj = (absent[:, :, None] * trk.no_obj_embed_spatial).sum(dim=1)  # [B, C]
        features = round_to_bfloat16(features + no_obj[:, :, None, None])
        return features.flatten(2).transpose(1, 2), tracker_feat.flatten(2).transpose(1, 2)


def select_outputs(trk, masks, iou, tokens, score, multimask):
    """Meta's interactive choice per row: multimask rows take the best of masks 1..3 by predicted IoU (and
    its token); single-mask rows take mask 0, or the best multimask when mask 0 is unstable
    (dynamic_multimask_via_stability), with token 0 either way. Masks of absent rows -> NO_OBJ_SCORE.
    Returns low_res [N, 1, L, L], iou [N, 3] (single rows: their one score in every column), pointer."""
    best = torch.argmax(iou[:, 1:], dim=-1)  # [N]
    best_mask, best_iou = take_best(masks[:, 1:], best, 1), take_best(iou[:, 1:], best, 1)
    stable = stability_scores(masks[:, 0]) >= STABILITY_THRESH  # [N]
    single_mask = torch.where(stable[:, None, None], masks[:, 0], best_mask)
    single_iou = torch.where(stable, iou[:, 0], best_iou)
    pick = multimask > 0.5
    low_res = torch.where(pick[:, None, None], best_mask, single_mask)
    low_res = torch.where((score > 0)[:, :, None], low_res, torch.full((), NO_OBJ_SCORE))[:, None]
    iou_out = torch.where(pick[:, None], iou[:, 1:], single_iou[:, None].expand_as(iou[:, 1:]))
    token = torch.where(pick[:, None], take_best(tokens[:, 1:], best, 1), tokens[:, 0])
    return low_res, iou_out, trk.pointer(trk.interactive_obj_ptr_proj, token, score)


class InteractiveDecoder(TrackerGraph):
    """Clicks and boxes for N objects on one frame (Meta's _forward_sam_heads, interactive path): the
    memory-free interactive head (interactive neck + interactivity_no_mem_embed), the prompt encoder with
    the points (box = corners labelled 2 / 3; -1 = padding point), an optional mask prompt (the previous
    low-res logits of a refinement, clamped by the caller as Meta clamps them to +-32).

    point_coords [N, P, 2] (x, y in model-input pixels), point_labels [N, P] int32; mask_prompt
    [N, 1, 4F, 4F], use_mask_prompt [N] (0: the prompt encoder's no_mask_embed); multimask [N] (Meta's
    _use_multimask: 1 for 0 or 1 points, else 0). Both choices are computed for every row.
    Outputs low_res_masks [N, 1, L, L], iou_scores [N, 3], object_score_logits [N, 1],
    object_pointer [N, C] (interactive_obj_ptr_proj; no_obj_ptr_linear where absent).
    """

    def forward(self, interactive_feat_s0, interactive_feat_s1, interactive_feat, point_coords, point_labels,
                mask_prompt, use_mask_prompt, multimask):
        trk = self.trk
        sparse = trk.sparse_points(point_coords, point_labels)
        dense_mask = trk.prompt_encoder.mask_embed(mask_prompt)
        no_mask = trk.prompt_encoder.no_mask_embed.weight.reshape(1, -1, 1, 1)
        dense = torch.where(use_mask_prompt[:, None, None, None] > 0.5, dense_mask, no_mask)
        masks, iou, tokens, score = trk.interactive_head(trk.interactive_pix(interactive_feat), trk.interactive_dense_pe,
                                                         sparse, dense, interactive_feat_s0, interactive_feat_s1)
        low_res, iou_out, pointer = select_outputs(trk, masks, iou, tokens, score, multimask)
        return low_res, iou_out, score, pointer


class MaskInit(TrackerGraph):
    """New objects (births) and reconditioning from detector mask logits (Meta's _use_mask_as_output).

    mask_logits [N, 1, 4F, 4F]: the detector's low-res logits (or the reconditioned mask). As Meta
    prepares them: bilinear to 16F, > 0. The binary mask becomes the output (-10 / +10 logits, antialiased
    to 4F); interactive_mask_downsample of it is the mask prompt of the interactive head (one -1 point,
    single-mask output), whose token 0 gives the pointer.
    Outputs low_res_masks [N, 1, 4F, 4F], object_pointer [N, C], object_score_logits [N, 1] (+10 for a
    non-empty mask, -10 for an empty one).
    """

    def forward(self, interactive_feat, mask_logits):
        trk = self.trk
        n = mask_logits.shape[0]
        size = 16 * trk.grid  # input_mask_size
        mask = (F.interpolate(mask_logits, size=(size, size), mode="bilinear", align_corners=False) > 0).float()
        low_res = resize_antialiased(mask * MASK_INPUT_SCALE + MASK_INPUT_BIAS, (4 * trk.grid, 4 * trk.grid))
        prompt = trk.interactive_mask_downsample(mask)
        points = torch.zeros(n, 1, 2, dtype=mask.dtype)
        labels = -torch.ones(n, 1, dtype=torch.int32)
        _, _, tokens, score = trk.interactive_head(trk.interactive_pix(interactive_feat), trk.interactive_dense_pe,
                                                   trk.sparse_points(points, labels),
                                                   trk.prompt_encoder.mask_embed(prompt), with_masks=False)
        pointer = trk.pointer(trk.interactive_obj_ptr_proj, tokens[:, 0], score)  # multimask off: token 0
        # Meta applies the no-object rule a second time, now by the mask's emptiness, to the pointer that
        # already went through it by the decoder's score: an empty mask whose decoder score is <= 0 gets
        # no_obj_ptr_linear twice (its comment calls this harmless; it is not idempotent)
        visible = (mask.flatten(1) > 0).any(dim=1, keepdim=True).to(pointer.dtype)
        pointer = visible * pointer + (1 - visible) * trk.no_obj_ptr_linear(pointer)
        return low_res, pointer, visible * MASK_INPUT_SCALE + MASK_INPUT_BIAS


GRAPH_MODULES = {"propagation_decoder": PropagationDecoder, "memory_encoder": MemoryEncoder,
                 "interactive_decoder": InteractiveDecoder, "mask_init": MaskInit}
