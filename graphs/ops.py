"""Torch pieces every family's graphs share: memory attention in its export forms (ATTENTION_MODES),
torch's antialiased resize in exportable form, per-object masks as channels for resizing, and bf16
rounding written as float32 arithmetic."""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

from .bf16_rounding import SPLITTER

NO_OBJ_SCORE = -1024.0  # what the tracker writes into masks of objects it thinks are absent


def _resize_matrix(in_size: int, out_size: int) -> torch.Tensor:
    """[out, in] matrix of torch's antialiased bilinear resize along one axis (it is a linear map)."""
    # Resize one-hot columns along H; the width of 2 (left as is) sidesteps torch returning a constant
    # for antialiased resizes of width-1 images.
    eye = torch.eye(in_size, dtype=torch.float64).reshape(in_size, 1, in_size, 1).expand(-1, -1, -1, 2)
    cols = F.interpolate(eye, size=(out_size, 2), mode="bilinear", align_corners=False, antialias=True)
    return cols[..., 0].reshape(in_size, out_size).t().contiguous().float()


def resize_antialiased(x: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """The reference's ``F.interpolate(..., mode="bilinear", antialias=True)`` in exportable form.

    ONNX export (dynamo=False) has no antialiased resize. Downsampling becomes two matrix products with
    the separable weights torch itself uses; antialiased upsampling equals plain bilinear (measured:
    < 5e-6 on unit-scale logits), so it becomes an ordinary Resize.
    """
    in_h, in_w = int(x.shape[-2]), int(x.shape[-1])
    if size[0] >= in_h and size[1] >= in_w:
        return F.interpolate(x, size=size, mode="bilinear", align_corners=False)
    return _resize_matrix(in_h, size[0]) @ x @ _resize_matrix(in_w, size[1]).t()


def objects_as_channels(masks: torch.Tensor) -> torch.Tensor:
    """[N, 1, H, W] -> [1, N, H, W]: N one-channel images become one image of N channels (N >= 1).

    Resizes and element-wise work on per-object masks go through this form. Plane by plane the arithmetic
    is the same (ONNX Runtime's outputs are bit for bit those of the [N, 1] form), but OpenVINO's CPU resize
    and element-wise kernels vectorise over channels (docs/speed.md, "Masks as channels"). A Reshape, not a
    Squeeze: the exporter cannot prove a dimension is 1 after a Resize and would emit an If node for a
    Squeeze, which ATC may refuse."""
    if masks.shape[1] != 1:
        raise ValueError(f"objects_as_channels takes [N, 1, H, W] masks, got {tuple(masks.shape)}")
    return masks.reshape(1, -1, *masks.shape[-2:])


def channels_as_objects(planes: torch.Tensor) -> torch.Tensor:
    """[1, N, H, W] -> [N, 1, H, W]: the inverse of objects_as_channels."""
    return planes.reshape(-1, 1, *planes.shape[-2:])


def _key_padding_bias(valid: torch.Tensor) -> torch.Tensor:
    """float [N, L] (1 valid, 0 padding) -> additive attention bias [N, 1, 1, L]: 0 or -inf."""
    zero = torch.zeros((), dtype=torch.float32)
    ninf = torch.full((), float("-inf"), dtype=torch.float32)
    return torch.where(valid > 0.5, zero, ninf)[:, None, None, :]


def _attend(q, k, v, bias=None, scale=1.0):
    logits = torch.matmul(q, k.transpose(-1, -2)) * scale
    if bias is not None:
        logits = logits + bias
    return torch.matmul(torch.softmax(logits, dim=-1), v)


# How the memory attention is exported (graphs.export --attention; recorded in the manifest):
# - "fused": ONNX Runtime's com.microsoft MultiHeadAttention, which never materialises the
#   [N, heads, HW, K*HW + P] score tensor (its CPU and CUDA kernels tile it);
# - "plain": MatMul + Softmax + MatMul, standard ops only, for converters that reject custom domains
#   (ATC). Same arithmetic, same inputs and outputs: the runtime does not know which one it runs.
ATTENTION_MODES = ("fused", "plain")
# Padding keys get this logit (after scaling) in the fused form: exp() of it minus any real logit is an
# exact 0 in float32 (below -104), and it stays finite in float16, so a row whose keys are all padding
# gets a finite (unused) uniform softmax rather than NaN.
_PADDING_LOGIT = -1e4


class _FusedMultiHeadAttention(torch.autograd.Function):
    """q [N, S, H*D], k [N, L, H*D], v [N, L, H*Dv] -> [N, S, H*Dv]; exported as one fused op."""

    @staticmethod
    def forward(ctx, q, k, v, heads: int, scale: float):
        def split(t):
            return t.reshape(t.shape[0], t.shape[1], heads, -1).transpose(1, 2)

        out = _attend(split(q), split(k), split(v), None, scale)
        return out.transpose(1, 2).reshape(q.shape[0], q.shape[1], -1)

    @staticmethod
    def symbolic(g, q, k, v, heads, scale):
        out = g.op("com.microsoft::MultiHeadAttention", q, k, v, num_heads_i=heads, scale_f=scale)
        out.setType(q.type().with_sizes([None, None, None]))  # the exporter has no shape function for it
        return out


TRANSFORMERS_FUSED = "sam3track_fused"  # the attention implementation name registered with transformers


def _transformers_fused_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                                  is_causal=False, **kwargs):
    """transformers' attention-function signature (q, k, v [B, H, S, D]; returns [B, S, H, D], weights)
    on the fused op. Calls with a mask (text padding, relative-position biases, causal) keep the
    standard ops: the op's mask inputs would leave its fast path anyway."""
    from transformers.models.sam3.modeling_sam3 import eager_attention_forward

    if attention_mask is not None or is_causal or dropout:
        return eager_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout)
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    out = attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), None, scale, "fused")
    return out.unflatten(-1, (query.shape[1], -1)), None


@contextlib.contextmanager
def transformers_attention(module: nn.Module, mode: str):
    """Export the transformers attention layers inside `module` in `mode` (ATTENTION_MODES): "fused"
    switches their configs to the fused function for the duration, "plain" to the standard-op one."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(TRANSFORMERS_FUSED, _transformers_fused_attention)
    # masks are built per implementation name: ours gets eager's additive masks (and runs eager with them)
    AttentionMaskInterface.register(TRANSFORMERS_FUSED, eager_mask)
    configs = {id(m.config): m.config for m in module.modules()
               if hasattr(getattr(m, "config", None), "_attn_implementation_internal")}
    saved = {key: config._attn_implementation_internal for key, config in configs.items()}
    try:
        for config in configs.values():
            config._attn_implementation_internal = TRANSFORMERS_FUSED if mode == "fused" else "eager"
        yield
    finally:
        for key, config in configs.items():
            config._attn_implementation_internal = saved[key]


def attention(q, k, v, valid, scale: float, mode: str):
    """q [N, S, H, D], k [N, L, H, D], v [N, L, H, Dv] (sequence before heads, as projections give them),
    valid [N, L] float (1 real, 0 padding) or None -> [N, S, H*Dv], in the form `mode` names
    (ATTENTION_MODES)."""
    n, s, heads = q.shape[0], q.shape[1], q.shape[2]
    if mode == "plain":
        bias = None if valid is None else _key_padding_bias(valid)
        out = _attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), bias, scale)
        return out.transpose(1, 2).reshape(n, s, -1)
    if valid is not None:
        # Key padding as one more feature (q: 1/scale, k: 0 or the padding logit), so the op needs no
        # mask input: with one, ONNX Runtime leaves its fastest kernel.
        q = torch.cat([q, torch.full_like(q[..., :1], 1.0 / scale)], dim=-1)
        penalty = ((1.0 - valid) * _PADDING_LOGIT)[:, :, None, None].expand(-1, -1, heads, -1)
        k = torch.cat([k, penalty], dim=-1)
    return _FusedMultiHeadAttention.apply(q.flatten(2), k.flatten(2), v.flatten(2), int(heads), float(scale))


def round_to_bfloat16(x: torch.Tensor) -> torch.Tensor:
    """``x`` rounded to the nearest bfloat16 (ties to even), kept in float32, with a Mul and two
    Subs: Veltkamp's split, exact in IEEE float32 arithmetic. The same values as torch's
    ``x.to(torch.bfloat16).float()``, but a Cast to BFLOAT16 is not portable: OpenVINO's Convert
    rounds differently (a quarter of the elements one bf16 step off, enough to flip mask pixels a
    few frames later). The splitter overflows float16: graphs meant to compute in reduced precision
    get the Cast form back (graphs/bf16_rounding.py).
    """
    scaled = x * SPLITTER
    return scaled - (scaled - x)
