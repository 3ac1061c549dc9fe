"""torch.nn.functional.interpolate(mode="bilinear", align_corners=False), with and without antialias, in
numpy float32 on [N, H, W] planes: Meta's SAM 3.1 moves masks between the 4F, 14F, 16F and video
resolutions with both (which one where is named at each call site), and the thresholds that follow
(> 0, > 0.5) see values exactly on the edge, so the arithmetic follows torch's CPU kernels:

- plain bilinear: source = max(scale * (dst + 0.5) - 0.5, 0), two taps, width pass then height pass
  (``out = h0 * (w0 * x00 + w1 * x01) + h1 * (w0 * x10 + w1 * x11)``);
- antialiased: a triangle filter stretched by the scale when shrinking, weights normalised, applied
  along the width first, then along the height (aten's separable AA kernel).

``bilinear_positive`` (masks at video size) and ``bilinear_antialias_over`` (births) give the same
values computed around each object only: an output whose taps read nothing of the object is known
without arithmetic.
"""

from __future__ import annotations

import functools

import numpy as np


_CHUNK = 8  # planes per pass of bilinear()
# The windowed resizes loop over planes in Python (50-100 us each) and gain nothing on masks that fill
# the plane (128 such planes to 256 x 256: 48 ms windowed, 28 whole): below this many pixels in a plane
# (source or result) the whole stack is resized at once
WINDOW_MIN_PIXELS = 1 << 17


@functools.lru_cache(maxsize=64)
def _linear_taps(in_size: int, out_size: int):
    scale = np.float32(in_size / out_size)
    # one rounding for scale * (dst + 0.5) - 0.5: torch's kernel compiles to a fused multiply-add
    src = ((np.arange(out_size, dtype=np.float64) + 0.5) * np.float64(scale) - 0.5).astype(np.float32)
    src = np.maximum(src, np.float32(0.0))
    i0 = src.astype(np.int64)
    i1 = np.minimum(i0 + 1, in_size - 1)
    l1 = (src - i0.astype(np.float32)).astype(np.float32)
    l0 = (np.float32(1.0) - l1).astype(np.float32)
    return i0, i1, l0, l1


def bilinear(x: np.ndarray, height: int, width: int) -> np.ndarray:
    """[N, h, w] -> float32 [N, height, width], F.interpolate(bilinear, align_corners=False)."""
    x = np.asarray(x, np.float32)
    n, h, w = x.shape
    if (h, w) == (height, width):
        return x.copy()
    yi0, yi1, yl0, yl1 = _linear_taps(h, height)
    xi0, xi1, xl0, xl1 = _linear_taps(w, width)
    out = np.empty((n, height, width), np.float32)
    # done in place on chunks of planes that stay in cache (14x faster at 128 masks of 128 -> 512 than
    # on the whole stack, bit for bit the same)
    for s in range(0, n, _CHUNK):
        _bilinear_steps(x[s:s + _CHUNK], (xi0, xi1, xl0, xl1), (yi0, yi1, yl0, yl1), out[s:s + _CHUNK])
    return out


def _bilinear_steps(planes: np.ndarray, cols, rows, out: np.ndarray) -> None:
    """bilinear()'s float32 arithmetic on [k, h', w'] planes into out [k, rows, cols]: the width pass
    on the source rows, then the height combination, with the taps (index 0, index 1, weight 0,
    weight 1) given for each output column and row (indices into `planes`). The same products and sums
    as torch's kernel writes in one expression: out = h0 * (w0 * x00 + w1 * x01) + h1 * (...)."""
    xi0, xi1, xl0, xl1 = cols
    yi0, yi1, yl0, yl1 = rows
    part = np.take(planes, xi0, axis=2)
    part *= xl0
    tap = np.take(planes, xi1, axis=2)
    tap *= xl1
    part += tap  # [k, source rows, output columns]
    np.take(part, yi0, axis=1, out=out)
    out *= yl0[:, None]
    tap = np.take(part, yi1, axis=1)
    tap *= yl1[:, None]
    out += tap


def bilinear_positive(x: np.ndarray, height: int, width: int) -> np.ndarray:
    """bool [N, height, width]: bilinear(x, height, width) > 0, resized only inside each plane's window.

    An output pixel whose four taps hold no value > 0 is not > 0 (weights >= 0 times values <= 0 sum to
    <= 0; a NaN tap, or -inf times a zero weight, gives NaN): False without arithmetic. A plane's window
    is the output rows and columns whose taps reach a source row or column holding a value > 0; inside
    it every pixel is computed with bilinear()'s float32 steps on the same taps and weights, so the
    result is bit for bit bilinear(x) > 0 (a small object in a large frame costs its box, not the frame).
    """
    x = np.asarray(x, np.float32)
    n, h, w = x.shape
    if (h, w) == (height, width):
        return x > 0
    if n == 0 or height * width < WINDOW_MIN_PIXELS:
        return bilinear(x, height, width) > 0
    out = np.zeros((n, height, width), bool)
    yi0, yi1, yl0, yl1 = _linear_taps(h, height)
    xi0, xi1, xl0, xl1 = _linear_taps(w, width)
    reached = x > 0
    for i in np.flatnonzero(reached.reshape(n, -1).any(axis=1)):
        rows, cols = np.flatnonzero(reached[i].any(axis=1)), np.flatnonzero(reached[i].any(axis=0))
        # taps are non-decreasing in the output index: the window is where tap 1 >= the first reached
        # index and tap 0 <= the last
        r0, r1 = np.searchsorted(yi1, rows[0], "left"), np.searchsorted(yi0, rows[-1], "right")
        c0, c1 = np.searchsorted(xi1, cols[0], "left"), np.searchsorted(xi0, cols[-1], "right")
        if r0 >= r1 or c0 >= c1:  # shrinking: no output pixel reads the reached rows or columns
            continue
        first, last = yi0[r0], yi1[r1 - 1] + 1  # the source rows the window's output rows read
        o = np.empty((1, r1 - r0, c1 - c0), np.float32)
        _bilinear_steps(x[i:i + 1, first:last], (xi0[c0:c1], xi1[c0:c1], xl0[c0:c1], xl1[c0:c1]),
                        (yi0[r0:r1] - first, yi1[r0:r1] - first, yl0[r0:r1], yl1[r0:r1]), o)
        np.greater(o[0], 0, out=out[i, r0:r1, c0:c1])
    return out


@functools.lru_cache(maxsize=64)
def _aa_taps(in_size: int, out_size: int):
    """aten's _compute_weights_aa in float32: center = float(scale * (i + 0.5)), the filter argument
    (j + xmin - center + 0.5) * invscale, weights normalised by their float32 sum."""
    f32 = np.float32
    scale = f32(in_size / out_size)
    support = scale if scale >= 1.0 else f32(1.0)
    invscale = f32(1.0) / scale if scale >= 1.0 else f32(1.0)
    centers = (np.float64(scale) * (np.arange(out_size) + 0.5)).astype(f32)
    xmin = np.maximum((centers - support + f32(0.5)).astype(np.int64), 0)
    xmax = np.minimum((centers + support + f32(0.5)).astype(np.int64), in_size)
    taps = int((xmax - xmin).max())
    idx = xmin[:, None] + np.arange(taps)[None]
    arg = (((idx.astype(f32) - centers[:, None]).astype(np.float64) + 0.5) * np.float64(invscale)).astype(f32)
    arg = np.abs(arg)
    weights = np.where(arg < f32(1.0), f32(1.0) - arg, f32(0.0)).astype(f32)
    weights[idx >= xmax[:, None]] = 0.0
    total = np.zeros(out_size, f32)
    for k in range(taps):  # sequential float32 sum, as the kernel adds them
        total = (total + weights[:, k]).astype(f32)
    weights = (weights / total[:, None]).astype(f32)
    return np.minimum(idx, in_size - 1), weights


def _aa_axis(x: np.ndarray, size: int, axis: int) -> np.ndarray:
    idx, weights = _aa_taps(x.shape[axis], size)
    return _aa_apply(x, idx, weights, axis)


def _aa_apply(x: np.ndarray, idx: np.ndarray, weights: np.ndarray, axis: int) -> np.ndarray:
    """Output j along `axis` = sum over k of x[idx[j, k]] * weights[j, k]: t = x0 * w0, then
    t += x_k * w_k with one rounding per step (the kernel's fused multiply-adds: the float32 product is
    exact in float64, so one float64 add and one rounding to float32). Done in place on chunks of planes
    that stay in cache: the same operations as on the whole stack, bit for bit (it was 3.6 s of a
    128-object birth frame)."""
    size = idx.shape[0]
    shape = [1] * x.ndim
    shape[axis] = size
    w64 = [weights[:, k].reshape(shape).astype(np.float64) for k in range(idx.shape[1])]
    out_shape = list(x.shape)
    out_shape[axis] = size
    out = np.empty(out_shape, np.float32)
    for s in range(0, x.shape[0], _CHUNK):
        part, o = x[s:s + _CHUNK], out[s:s + _CHUNK]
        taken = np.empty(o.shape, np.float64)
        acc = np.empty(o.shape, np.float64)
        for k in range(idx.shape[1]):
            taken[...] = np.take(part, idx[:, k], axis=axis)
            taken *= w64[k]
            if k == 0:
                o[...] = taken
            else:
                acc[...] = o
                acc += taken
                o[...] = acc
    return out


def bilinear_antialias(x: np.ndarray, height: int, width: int) -> np.ndarray:
    """[N, h, w] -> float32 [N, height, width], F.interpolate(bilinear, align_corners=False,
    antialias=True): width first, then height."""
    x = np.asarray(x, np.float32)
    if x.shape[2] != width:
        x = _aa_axis(x, width, 2)
    if x.shape[1] != height:
        x = _aa_axis(x, height, 1)
    return np.array(x, np.float32, copy=True)


def bilinear_antialias_over(x: np.ndarray, height: int, width: int, background: float) -> np.ndarray:
    """bilinear_antialias(x, height, width) bit for bit (a NaN as a NaN, its sign aside), for planes that
    hold `background` outside a small part (a birth's mask in a video-size frame): every output pixel
    whose taps (all of them, zero weights included) read only `background` is the resize of a constant
    plane, computed once; each plane's window around the rest is resized with bilinear_antialias's own
    steps."""
    x = np.asarray(x, np.float32)
    n, h, w = x.shape
    if n == 0 or max(h * w, height * width) < WINDOW_MIN_PIXELS:
        return bilinear_antialias(x, height, width)
    fill = np.float32(background)
    out = np.empty((n, height, width), np.float32)
    out[...] = bilinear_antialias(np.full((1, h, w), fill, np.float32), height, width)[0]
    rows_taps = _aa_taps(h, height) if h != height else None
    cols_taps = _aa_taps(w, width) if w != width else None
    differs = x.view(np.int32) != fill.view(np.int32)  # by bits: -0 and NaN are not the background
    for i in np.flatnonzero(differs.reshape(n, -1).any(axis=1)):
        r0, r1, first, last = _aa_window(rows_taps, np.flatnonzero(differs[i].any(axis=1)))
        c0, c1, _, _ = _aa_window(cols_taps, np.flatnonzero(differs[i].any(axis=0)))
        if r0 >= r1 or c0 >= c1:  # not seen: antialiased taps cover every source index
            continue
        plane = x[i:i + 1, first:last]  # the source rows the window's rows read
        if cols_taps is None:
            plane = plane[:, :, c0:c1]
        else:
            plane = _aa_apply(plane, cols_taps[0][c0:c1], cols_taps[1][c0:c1], 2)
        if rows_taps is not None:
            plane = _aa_apply(plane, rows_taps[0][r0:r1] - first, rows_taps[1][r0:r1], 1)
        out[i, r0:r1, c0:c1] = plane[0]
    return out


def _aa_window(taps, reached: np.ndarray) -> tuple[int, int, int, int]:
    """The output range [start, stop) whose taps read an index in reached[0]..reached[-1], and the
    source range [first, last) those outputs read; without taps (no resize) the same range."""
    if taps is None:
        return int(reached[0]), int(reached[-1]) + 1, int(reached[0]), int(reached[-1]) + 1
    idx = taps[0]  # each row's taps ascend, and every tap is non-decreasing over the outputs
    start = int(np.searchsorted(idx[:, -1], reached[0], "left"))
    stop = int(np.searchsorted(idx[:, 0], reached[-1], "right"))
    if start >= stop:
        return start, stop, 0, 0
    return start, stop, int(idx[start, 0]), int(idx[stop - 1, -1]) + 1
