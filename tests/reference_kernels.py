"""Test-side ports of the two kernels-community/cv-utils kernels that transformers' SAM 3 video model calls.

Why this module exists
----------------------
transformers 5.24.0, ``transformers/models/sam3_video/modeling_sam3_video.py``, runs mask NMS, hole
filling and sprinkle removal only through a kernel object it loads from the Hugging Face hub::

    cv_utils_kernel = get_kernel("kernels-community/cv-utils", version=1)   # _load_cv_utils_kernel_once()

and it calls exactly two attributes of that object:

* ``nms_masks`` -> ``cv_utils_kernel.generic_nms(ious, probs, iou_threshold, use_iou_matrix=True)``
  with ``ious`` float32 ``[K, K]`` (``mask_iou`` of the ``logit > 0`` masks of the K detections with
  ``prob > prob_threshold``), ``probs`` float32 ``[K]``, ``iou_threshold`` a Python float
  (``Sam3VideoModel.det_nms_thresh``, 0.1 by default), all on the model's device, K >= 1 (K == 0
  returns before the call). It must return an int64 tensor of kept indices into ``probs``; the
  wrapper turns it into a bool ``[num_det]`` keep mask with ``torch.isin``, so their order is free.
* ``_get_connected_components_with_padding`` (used twice by ``fill_holes_in_mask_scores``, once on
  ``mask <= 0`` and once on ``mask > 0``) -> ``cv_utils_kernel.cc_2d(mask.contiguous(),
  get_counts=True)`` with ``mask`` uint8 0/1 ``[N, 1, H, W]``, H and W made even by padding a zero
  row/column at the bottom/right first. It must return ``(labels, counts)``, both int32
  ``[N, 1, H, W]``; transformers only uses ``counts`` (the area of each pixel's component, 0 on
  zero pixels) and crops both back to ``[:, :, :H, :W]``.

Both calls sit inside ``try/except Exception`` that logs once and then *silently* skips the work
(keep every detection; counts ``H*W + 1`` so nothing is filled), exactly as when the kernel cannot be
loaded. A port that raised would therefore make transformers skip NMS/hole filling without failing;
:class:`ReferenceCvUtils` records every call and every exception it raised so tests can assert the
real code path ran.

The real kernel cannot be used on this machine: ``kernels`` on the reachable index stops at 0.17.2
while transformers 5.24 requires ``0.18.2 <= kernels < 0.19.0`` (``is_kernels_available()`` is False
with 0.17.2 installed); ``get_kernel`` downloads compiled binaries from the hub, which is unreachable
(``ConnectError: Name or service not known``); and cv-utils is built for ``backends = ["cuda"]`` only,
its ops registered for the CUDA dispatch key only and both entry points check ``is_cuda()``, so it
cannot run on CPU tensors even when it can be downloaded.

What each port follows
----------------------
``generic_nms`` follows ``huggingface/kernels-community`` ``cv-utils/cv_utils/generic_nms.cu``
(``generic_nms`` + ``nms_kernel_iou_impl`` + ``gather_keep_from_mask``; the same algorithm as
``ronghanghu/torch_generic_nms``, which is what facebookresearch/sam3 ``sam3/perflib/nms.py``
``generic_nms`` calls on CUDA):

* order = ``scores.sort(stable=True, descending=True)`` indices (equal scores: lower index first);
* the IoU matrix is permuted to that order; in it, row i marks column j > i as overlapped when
  ``static_cast<double>(iou[i, j]) > iou_threshold`` (strict, float32 IoU widened to double, the
  threshold a double);
* greedy in sorted order: a detection not yet removed is kept and removes all later ones its row
  marks; a removed detection removes nothing;
* returns ``order[keep]`` (int64, descending-score order); ``dets.numel() == 0`` returns an empty
  int64 tensor. dtypes float32/float64/float16 only (bfloat16 is rejected by the kernel's dispatch).

``cc_2d`` follows ``cv-utils/cv_utils/connected_components.cu`` ``connected_components_labeling_2d``
(a copy of ``ronghanghu/cc_torch``, block-based union-find after YACCLAB's BUF): inputs must be a
uint8 ``[N, 1, H, W]`` tensor with even H and W; every non-zero pixel is foreground; 2x2 blocks are
merged with their top-left, top, top-right and left blocks through foreground pixels that touch
across the block border, which is **8-connectivity**; each component's label is ``1 +`` the raster
index ``row * W + col`` of the top-left pixel of its first block (union by ``atomicMin`` leaves the
smallest block index as root), zero pixels get label 0; ``counts`` is the component's pixel count on
its pixels and 0 on zero pixels (all zeros when ``get_counts`` is False). Two implementations are
here: :func:`cc_2d_reference` (scipy.ndimage 8-connected labelling, then the kernel's label values),
used by the stand-in, and :func:`cc_2d_block_union_find`, a slow literal port of the kernel's
block/bitmask merge step, used only to check the first.

Where Meta's CPU fallbacks and the kernels differ (transformers uses the kernels' semantics)
------------------------------------------------------------------------------------------
* NMS, facebookresearch/sam3 ``sam3/perflib/nms.py`` ``generic_nms_cpu``: order =
  ``scores_np.argsort()[::-1]`` (numpy's default unstable sort, reversed: ties do not go to the lower
  index as in the kernel; for small arrays they go to the higher one), and it keeps
  ``ious <= iou_threshold`` comparing the float32 array with a Python float, which numpy >= 2 does in
  float32: an IoU of exactly ``float32(0.1)`` (e.g. 1 pixel / 10 pixels) is *kept* there but
  *suppressed* by the kernel, because ``double(float32(0.1)) = 0.10000000149 > 0.1``.
* Connected components, ``sam3/perflib/connected_components.py`` ``connected_components_cpu``:
  ``skimage.measure.label`` with its default full connectivity (8 in 2-D), so ``counts`` agree;
  its labels are dense 1..n (int64 before stacking), not the kernel's ``root index + 1``.
  (Some third-party vendorings of ``sam3_tracker_utils.py`` call ``label(..., connectivity=1)``,
  4-connectivity; that is not Meta's code and not the kernel.)

Usage
-----
::

    from tests.reference_kernels import installed_reference_kernels

    with installed_reference_kernels() as kernel:   # modeling_sam3_video.cv_utils_kernel = kernel
        ... run Sam3VideoModel / tm.nms_masks / tm.fill_holes_in_mask_scores ...
    assert kernel.calls["generic_nms"] > 0 and kernel.calls["cc_2d"] > 0 and not kernel.errors

The previous module global (None / False / a kernel) is restored on exit. Use it around the whole
reference run, including ``from_pretrained``, and with the sam3track side at its defaults
(``mask_nms`` and ``fill_holes`` on).
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from scipy import ndimage

__all__ = [
    "generic_nms_reference",
    "cc_2d_reference",
    "cc_2d_block_union_find",
    "ReferenceCvUtils",
    "installed_reference_kernels",
]

_NMS_DTYPES = (torch.float32, torch.float64, torch.float16)
_EIGHT = np.ones((3, 3), dtype=bool)


# --------------------------------------------------------------------------------------------
# generic_nms
# --------------------------------------------------------------------------------------------


def generic_nms_reference(
    dets: torch.Tensor,
    scores: torch.Tensor,
    iou_threshold: float,
    use_iou_matrix: bool,
) -> torch.Tensor:
    """Port of cv-utils ``generic_nms`` for ``use_iou_matrix=True``: kept indices, int64 [K'].

    Same argument checks as the kernel (bar ``is_cuda``), RuntimeError like ``STD_TORCH_CHECK``.
    """
    if dets.dim() != 2:
        raise RuntimeError(f"first argument should be a 2d tensor, got {dets.dim()}D")
    if scores.dim() != 1:
        raise RuntimeError(f"scores should be a 1d tensor, got {scores.dim()}D")
    if dets.size(0) != scores.size(0):
        raise RuntimeError("first argument and scores should have same number of elements in dimension 0")
    if dets.numel() == 0:
        return torch.empty((0,), dtype=torch.int64, device=dets.device)
    if not use_iou_matrix:
        # The kernel's box path (devIoU in the box dtype, float threshold) is not used by transformers.
        raise NotImplementedError("only use_iou_matrix=True is ported (the only mode transformers uses)")
    if dets.size(0) != dets.size(1):
        raise RuntimeError("when use_iou_matrix=True, first argument must be [N,N]")
    if dets.dtype not in _NMS_DTYPES:
        raise RuntimeError(f"generic_nms: unsupported dtype {dets.dtype}")

    order = torch.sort(scores, stable=True, descending=True).indices
    sorted_iou = dets.index_select(0, order).index_select(1, order)
    # static_cast<double>(iou) > iou_threshold; exact widening for float16/float32/float64.
    over = (sorted_iou.detach().cpu().to(torch.float64) > float(iou_threshold)).numpy()
    n = over.shape[0]
    removed = np.zeros(n, dtype=bool)
    keep = np.zeros(n, dtype=bool)
    for i in range(n):
        if removed[i]:
            continue
        keep[i] = True
        removed[i + 1 :] |= over[i, i + 1 :]  # only j > i (upper triangle, as the kernel's masks)
    return order[torch.from_numpy(keep).to(order.device)]


# --------------------------------------------------------------------------------------------
# cc_2d
# --------------------------------------------------------------------------------------------


def _check_cc_inputs(inputs: torch.Tensor) -> tuple[int, int, int, int]:
    if inputs.dim() != 4:
        raise RuntimeError("inputs must be [N, 1, H, W] shape")
    if inputs.dtype != torch.uint8:
        raise RuntimeError("inputs must be a uint8 type")
    n, c, h, w = (int(s) for s in inputs.shape)
    if c != 1:
        raise RuntimeError("inputs must be [N, 1, H, W] shape")
    if h % 2:
        raise RuntimeError("height must be a even number")
    if w % 2:
        raise RuntimeError("width must be a even number")
    return n, c, h, w


def _kernel_labels_and_counts(fg: np.ndarray, comp: np.ndarray, ncomp: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    """From any 8-connected labelling ``comp`` (0 = background, 1..ncomp) of one [H, W] image, the
    kernel's label values (1 + smallest block-start raster index) and per-pixel counts."""
    h = fg.shape[0]
    rows, cols = np.indices((h, w))
    block_start = (rows - rows % 2) * w + (cols - cols % 2)
    roots = np.full(ncomp + 1, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(roots, comp[fg], block_start[fg])
    sizes = np.bincount(comp[fg], minlength=ncomp + 1)
    labels = np.where(fg, roots[comp] + 1, 0).astype(np.int32)
    counts = np.where(fg, sizes[comp], 0).astype(np.int32)
    return labels, counts


def cc_2d_reference(inputs: torch.Tensor, get_counts: bool) -> list[torch.Tensor]:
    """Port of cv-utils ``cc_2d``: ``[labels, counts]``, int32 [N, 1, H, W] on the input's device."""
    n, c, h, w = _check_cc_inputs(inputs)
    arr = inputs.detach().cpu().numpy()
    labels = np.zeros((n, c, h, w), np.int32)
    counts = np.zeros((n, c, h, w), np.int32)
    for b in range(n):
        fg = arr[b, 0] != 0
        comp, ncomp = ndimage.label(fg, structure=_EIGHT)
        labels[b, 0], cnt = _kernel_labels_and_counts(fg, comp, ncomp, w)
        if get_counts:
            counts[b, 0] = cnt
    return [torch.from_numpy(labels).to(inputs.device), torch.from_numpy(counts).to(inputs.device)]


def cc_2d_block_union_find(inputs: torch.Tensor, get_counts: bool = True) -> list[torch.Tensor]:
    """Slow, literal port of the kernel's algorithm, to check :func:`cc_2d_reference` against.

    Per 2x2 block starting at even (row, col): build the 16-bit neighbourhood mask P of the 4x4
    window rows row-1..row+2, cols col-1..col+2 from the block's top-left, top-right and bottom-left
    pixels (the bottom-right pixel cannot touch an earlier block), clear the bits outside the image,
    then union with the top-left / top / top-right / left block through foreground pixels at the
    set bits. Union links the larger root to the smaller (the kernel's atomicMin), so the root of a
    component is its smallest block index.
    """
    n, c, h, w = _check_cc_inputs(inputs)
    arr = inputs.detach().cpu().numpy()
    labels_out = np.zeros((n, c, h, w), np.int32)
    counts_out = np.zeros((n, c, h, w), np.int32)

    def find(parent: dict[int, int], a: int) -> int:
        while parent[a] != a:
            a = parent[a]
        return a

    def union(parent: dict[int, int], a: int, b: int) -> None:
        ra, rb = find(parent, a), find(parent, b)
        if ra < rb:
            parent[rb] = ra
        elif rb < ra:
            parent[ra] = rb

    for b in range(n):
        img = arr[b, 0] != 0

        def px(r: int, q: int) -> bool:
            return bool(img[r, q])

        parent = {r * w + q: r * w + q for r in range(0, h, 2) for q in range(0, w, 2)}
        for r in range(0, h, 2):
            for q in range(0, w, 2):
                idx = r * w + q
                p = 0
                if px(r, q):
                    p |= 0x777
                if r + 1 < h and px(r + 1, q):
                    p |= 0x777 << 4
                if q + 1 < w and px(r, q + 1):
                    p |= 0x777 << 1
                if q == 0:
                    p &= 0xEEEE
                if q + 1 >= w:
                    p &= 0x3333
                elif q + 2 >= w:
                    p &= 0x7777
                if r == 0:
                    p &= 0xFFF0
                if r + 1 >= h:
                    p &= 0xFF
                if not p:
                    continue
                bit = lambda k: (p >> k) & 1  # noqa: E731
                if bit(0) and px(r - 1, q - 1):
                    union(parent, idx, idx - 2 * w - 2)
                if (bit(1) and px(r - 1, q)) or (bit(2) and px(r - 1, q + 1)):
                    union(parent, idx, idx - 2 * w)
                if bit(3) and px(r - 1, q + 2):
                    union(parent, idx, idx - 2 * w + 2)
                if (bit(4) and px(r, q - 1)) or (bit(8) and px(r + 1, q - 1)):
                    union(parent, idx, idx - 2)
        lab = np.zeros((h, w), np.int64)
        for r in range(h):
            for q in range(w):
                if img[r, q]:
                    lab[r, q] = find(parent, (r - r % 2) * w + (q - q % 2)) + 1
        labels_out[b, 0] = lab
        if get_counts:
            vals, cnts = np.unique(lab[img], return_counts=True)
            size = dict(zip(vals.tolist(), cnts.tolist()))
            counts_out[b, 0] = np.where(img, np.vectorize(lambda v: size.get(v, 0))(lab), 0)
    return [torch.from_numpy(labels_out), torch.from_numpy(counts_out)]


# --------------------------------------------------------------------------------------------
# The stand-in kernel object and the context manager
# --------------------------------------------------------------------------------------------


class ReferenceCvUtils:
    """Quacks like the module ``get_kernel("kernels-community/cv-utils", version=1)`` returns.

    ``calls`` counts calls per attribute name; ``log`` keeps, per call, the name and the argument
    shapes/dtypes/devices (for NMS also the threshold and the number of kept indices); ``errors``
    keeps every exception raised (transformers swallows them and silently skips the
    post-processing, so tests must check it stays empty).
    """

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.log: list[dict[str, Any]] = []
        self.errors: list[BaseException] = []

    def generic_nms(
        self, dets: torch.Tensor, scores: torch.Tensor, iou_threshold: float, use_iou_matrix: bool
    ) -> torch.Tensor:
        self.calls["generic_nms"] += 1
        self.log.append({
            "name": "generic_nms",
            "dets": (tuple(dets.shape), dets.dtype, dets.device.type),
            "scores": (tuple(scores.shape), scores.dtype, scores.device.type),
            "iou_threshold": iou_threshold,
            "use_iou_matrix": use_iou_matrix,
        })
        try:
            kept = generic_nms_reference(dets, scores, iou_threshold, use_iou_matrix)
        except Exception as e:  # recorded, then re-raised into transformers' try/except
            self.errors.append(e)
            raise
        self.log[-1]["kept"] = int(kept.numel())
        return kept

    def cc_2d(self, inputs: torch.Tensor, get_counts: bool) -> list[torch.Tensor]:
        self.calls["cc_2d"] += 1
        self.log.append({
            "name": "cc_2d",
            "inputs": (tuple(inputs.shape), inputs.dtype, inputs.device.type),
            "get_counts": get_counts,
        })
        try:
            return cc_2d_reference(inputs, get_counts)
        except Exception as e:
            self.errors.append(e)
            raise


@contextlib.contextmanager
def installed_reference_kernels(kernel: ReferenceCvUtils | None = None) -> Iterator[ReferenceCvUtils]:
    """Set ``modeling_sam3_video.cv_utils_kernel`` to ``kernel`` (a new :class:`ReferenceCvUtils`
    by default) for the duration of the block; restore the previous value on exit."""
    from transformers.models.sam3_video import modeling_sam3_video as tm

    kernel = ReferenceCvUtils() if kernel is None else kernel
    previous = tm.cv_utils_kernel
    tm.cv_utils_kernel = kernel
    try:
        yield kernel
    finally:
        tm.cv_utils_kernel = previous
