"""ROI align as Meta's geometry encoder calls it (``torchvision.ops.roi_align(features, boxes, 7)``:
spatial_scale 1, sampling_ratio -1, aligned False), without torchvision.

The exported graph holds ONNX's own RoiAlign; in torch it is torchvision's CPU kernel restated with
tensors. Why not torchvision, the ONNX attributes, the kernel's rules and the open Ascend question:
docs/sam31.md, "ROI align".
"""

from __future__ import annotations

import math

import torch


def _axis(start: torch.Tensor, end: torch.Tensor, out: int, size: int):
    """One axis of one box (float32 0-d tensors, the kernel's arithmetic): the samples' low / high indices,
    their weights, and the sample count per bin."""
    extent = torch.clamp(end - start, min=1.0)
    bin_size = extent / out
    grid = max(int(math.ceil(float(extent / out))), 1)
    pos = (start + torch.arange(out, dtype=torch.float32)[:, None] * bin_size
           + (torch.arange(grid, dtype=torch.float32) + 0.5) * bin_size / grid).reshape(-1)
    inside = ((pos >= -1.0) & (pos <= size)).float()
    pos = pos.clamp(min=0.0)
    low = pos.floor().long()
    at_edge = low >= size - 1
    low = torch.where(at_edge, torch.full_like(low, size - 1), low)
    high = torch.where(at_edge, low, low + 1)
    pos = torch.where(at_edge, low.float(), pos)
    frac = pos - low.float()
    return low, high, (1.0 - frac) * inside, frac * inside, grid


def roi_align_reference(features: torch.Tensor, rois: torch.Tensor, batch_index: torch.Tensor, out: int):
    """features [B, C, H, W], rois [N, 4] (x0, y0, x1, y1 in feature pixels), batch_index [N] -> [N, C, out, out]."""
    h, w = features.shape[-2:]
    rois = rois.float()
    pooled = []
    for n in range(rois.shape[0]):
        x0, y0, x1, y1 = rois[n]
        yl, yh, wyl, wyh, gy = _axis(y0, y1, out, h)
        xl, xh, wxl, wxh, gx = _axis(x0, x1, out, w)
        f = features[int(batch_index[n])]
        value = sum(f[:, ys][:, :, xs] * (wy[:, None] * wx[None, :])
                    for ys, wy in ((yl, wyl), (yh, wyh)) for xs, wx in ((xl, wxl), (xh, wxh)))
        pooled.append(value.view(-1, out, gy, out, gx).sum(dim=(2, 4)) / (gy * gx))
    return torch.stack(pooled) if pooled else features.new_zeros(0, features.shape[1], out, out)


@torch.library.custom_op("sam3track::roi_align", mutates_args=())
def _roi_align_op(features: torch.Tensor, rois: torch.Tensor, batch_index: torch.Tensor, out: int) -> torch.Tensor:
    return roi_align_reference(features, rois, batch_index, out)


@_roi_align_op.register_fake
def _(features, rois, batch_index, out):
    return features.new_empty(rois.shape[0], features.shape[1], out, out)


def _roi_align_symbolic(g, features, rois, batch_index, out):
    from torch.onnx.symbolic_helper import _get_const

    side = _get_const(out, "i", "out")
    return g.op("RoiAlign", features, rois, batch_index, coordinate_transformation_mode_s="output_half_pixel",
                mode_s="avg", output_height_i=side, output_width_i=side, sampling_ratio_i=0, spatial_scale_f=1.0)


torch.onnx.register_custom_op_symbolic("sam3track::roi_align", _roi_align_symbolic, 16)


def roi_align(features: torch.Tensor, rois: torch.Tensor, batch_index: torch.Tensor, out: int) -> torch.Tensor:
    """See the module docstring; batch_index int64 [N]."""
    return _roi_align_op(features, rois, batch_index, out)
