"""The building blocks of SAM 3.1's tracker (graphs/sam31/tracker.py): the decoupled memory attention, the
multiplex and interactive mask decoders, the multiplex memory encoder and their small parts, with the
constants of Meta's builder that no tensor shape gives. Sam31Tracker (tracker_model.py) puts them together.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..ops import attention

# Constants of Meta's builder that no tensor shape gives.
MEMORY_ATTENTION_HEADS = 8  # SimpleRoPEAttention(256, 8 heads): head_dim 32
DECODER_HEADS = 8  # both TwoWayTransformer(depth 2, 256, mlp 2048, 8 heads)
ROPE_THETA = 10000.0
SIGMOID_SCALE_FOR_MEM_ENC, SIGMOID_BIAS_FOR_MEM_ENC = 2.0, -1.0  # mask_for_mem = sigmoid(m) * 2 - 1
STABILITY_DELTA, STABILITY_THRESH = 0.05, 0.98  # interactive decoder's dynamic_multimask_via_stability
MASK_INPUT_SCALE, MASK_INPUT_BIAS = 20.0, -10.0  # _use_mask_as_output: binary mask -> -10 / +10 logits
BACKBONE_STRIDE = 14


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
        # tiled, not broadcast: OpenVINO's CPU plugin fuses a [1] + [N] add of two convolutions' outputs
        # (mask_init's dense prompt is one) into an in-place sum and refuses every call of N >= 2
        image = pix_feat.repeat(n, 1, 1, 1) + dense
        hs, src = self.transformer(point_embeddings=tokens[:, None], image_embeddings=image,
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
        # The frame's projection runs once and is tiled over the buckets: with a broadcasting add instead,
        # OpenVINO's CPU plugin fuses the add into the [1, ...] convolution as an in-place sum and fails
        # for two or more buckets ("Can not clone with new dims", openvino 2026.4.1).
        masks = self.downsampler(mask_input)
        return self.fuser(self.pix_feat_proj(pix_feat).repeat(masks.shape[0], 1, 1, 1) + masks)
