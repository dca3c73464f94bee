"""Convolution and pooling as Slide stencils over one image in HWC layout, and their references.

A spatial layer's term works on one image laid out [H][W][C] (channels innermost, so a pixel's
channels are one vector for the device). Its neighbourhoods come from Lift's stencil patterns:
Pad, then Slide over rows and over columns, then a reorder so that each output pixel holds its
[kh][kw][C] window. A convolution applies a Linear layer to each flattened window (the frontend
writes it so; that this is one matrix multiply of the im2col matrix is found by rewriting).
Pooling reduces each window with VVMax or VVAdd; a depthwise convolution multiplies each
window by its channel's filter taps elementwise and sums them.

The numpy references work on NCHW arrays in float64, written from PyTorch's definitions and
independent of the IR.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from egraph_rules.ir import T, Term, comp, fout, lifted, shape_of, ta, tp, ty


@dataclass(frozen=True)
class Window:
    """A 2-d sliding window: kernel, stride, padding and dilation per axis (rows, columns)."""

    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]

    def span(self, axis: int) -> int:
        """Input extent one window covers along an axis (dilation spreads the taps)."""
        return self.dilation[axis] * (self.kernel[axis] - 1) + 1

    def out_size(self, size: int, axis: int) -> int:
        """Output length along an axis (PyTorch's floor rule); <= 0 when the window does not fit."""
        return (size + 2 * self.padding[axis] - self.span(axis)) // self.stride[axis] + 1


class Stages:
    """A composition built stage by stage, each stage made from the current value type."""

    def __init__(self, t: Term):
        self.t = t
        self.parts: list[Term] = []

    def then(self, f: Term) -> Stages:
        self.parts.append(f)
        self.t = fout(f)
        return self


def add_images(t: Term) -> Term:
    """A pair of [H][W][C] images -> their sum, pixel by pixel (channel vectors added)."""
    h, w, c = shape_of(t)
    vec, row = t.args[0].args[0], t.args[0]
    per_row = T("Comp", T("Map", T("VVAdd", tp(vec, vec)), w), T("Zip", tp(row, row)))
    return T("Comp", T("Map", per_row, h), T("Zip", tp(t, t)))


def windows(s: Stages, win: Window, fill: float = 0.0) -> Stages:
    """[H][W][C] -> [OH][OW][kh][kw][C]: padding with `fill` (Pad for zeros, PadWith otherwise),
    then a Slide over rows and one over columns; a dilated window keeps every d-th element of
    its span (Slide 1 d, then Join)."""
    ph, pw = win.padding

    def pad(n: int, t: Term) -> Term:
        return T("PadWith", n, n, fill, t) if fill else T("Pad", n, n, t)

    if ph:
        s.then(pad(ph, s.t))
    if pw:
        s.then(lifted(s.t, 1, lambda e: pad(pw, e)))
    dilate = [None, None]
    for axis in (0, 1):
        d = win.dilation[axis]
        if d > 1:
            dilate[axis] = lambda e, d=d: T("Comp", T("Join", fout(T("Slide", 1, d, e))), T("Slide", 1, d, e))
    s.then(T("Slide", win.span(0), win.stride[0], s.t))
    if dilate[0]:
        s.then(lifted(s.t, 1, dilate[0]))
    s.then(lifted(s.t, 2, lambda e: T("Slide", win.span(1), win.stride[1], e)))
    if dilate[1]:
        s.then(lifted(s.t, 3, dilate[1]))
    return s.then(lifted(s.t, 1, lambda e: T("Transpose", e)))


def flatten_window(t: Term) -> Term:
    """[kh][kw][C] -> [kh*kw*C], taps in (row, column, channel) order."""
    rows = lifted(t, 1, lambda e: T("Join", e))
    return T("Comp", T("Join", fout(rows)), rows)


def to_hwc(t: Term) -> Term:
    """[C][H][W] -> [H][W][C]."""
    first = T("Transpose", t)
    return T("Comp", lifted(fout(first), 1, lambda e: T("Transpose", e)), first)


def to_chw(t: Term) -> Term:
    """[H][W][C] -> [C][H][W]."""
    first = lifted(t, 1, lambda e: T("Transpose", e))
    return T("Comp", T("Transpose", fout(first)), first)


def chw_to_hwc(t: Term, c: int, h: int, w: int) -> Term:
    """[C*H*W] in channel-major order (PyTorch's Flatten of NCHW) -> [H*W*C], pixel-major."""
    rows = T("Split", h * w, t)
    planes = T("Map", T("Split", w, fout(rows).args[0]), c)
    hwc = to_hwc(fout(planes))
    return comp(flatten_window(fout(hwc)), hwc, planes, rows)


def conv_weight(w: Term) -> Term:
    """OIHW weights [O][C][kh][kw] -> [O][kh*kw*C], each filter flattened like a window."""
    filt = ty(w).args[0]
    per = T("Comp", flatten_window(fout(to_hwc(filt))), to_hwc(filt))
    return T("App", T("Map", per, ty(w).args[1]), w)


def block_diagonal(w: Term, groups: int) -> Term:
    """Grouped OIHW weights [O][C/G][kh][kw] -> the dense [O][C][kh][kw] whose group g's filters
    see only group g's channels (zeros elsewhere), so a grouped convolution is a dense one, one
    GEMM. The diagonal comes from layout alone: each group's block padded by G zero blocks,
    joined, cut to G*G blocks and split into rows of G puts block g at row g, column g."""
    g = groups
    blocks = T("Split", ty(w).args[1] // g, ty(w))  # [G][og][cg][kh][kw]
    one = T("Split", 1, fout(blocks))  # [G][1][og][cg][kh][kw]
    padded = T("Map", T("Pad", 0, g, fout(one).args[0]), g)  # [G][G+1][og][cg][kh][kw]
    joined = T("Join", fout(padded))
    cut = T("Slice", 0, g * g, fout(joined))
    square = T("Split", g, fout(cut))  # [G][G][og][cg][kh][kw]
    rows = lifted(fout(square), 1, lambda e: T("Transpose", e))  # [G][og][G][cg][kh][kw]
    chans = lifted(fout(rows), 2, lambda e: T("Join", e))  # [G][og][C][kh][kw]
    dense = comp(T("Join", fout(chans)), chans, rows, square, cut, joined, padded, one, blocks)
    return T("App", dense, w)


def conv(s: Stages, win: Window, w: Term, b: Term | None) -> Stages:
    """Dense convolution: a Linear layer on every flattened window, pixels as rows."""
    windows(s, win)
    oh, ow = shape_of(s.t)[:2]
    s.then(T("Join", s.t))
    flat = flatten_window(s.t.args[0])
    wf = conv_weight(w)
    k_t = fout(flat)
    layer = T("Linear", wf, b, k_t) if b is not None else T("LinearNB", wf, k_t)
    s.then(T("Map", T("Comp", layer, flat), oh * ow))
    return s.then(T("Split", ow, s.t))


def depthwise_conv(s: Stages, win: Window, w: Term, b: Term | None) -> Stages:
    """Depthwise convolution (groups = channels): per pixel, the window's vectors times the
    filter taps [kh][kw][C] elementwise, summed over the taps, plus the bias."""
    windows(s, win)
    win_t = s.t.args[0].args[0]
    kh, kw, _ = shape_of(win_t)
    vec = win_t.args[0].args[0]
    per_channel = T("Map", T("Join", ty(w).args[0]), ty(w).args[1])  # [C][1][kh][kw] -> [C][kh][kw]
    taps = T("App", T("Comp", to_hwc(fout(per_channel)), per_channel), w)
    row_t = ta(vec, kw)
    add = T("VVAdd", tp(vec, vec))
    row = T("Comp", T("Reduce", add, row_t), T("Comp", T("Map", T("VVMul", tp(vec, vec)), kw), T("Zip", tp(row_t, row_t))))
    per = T("Comp", T("Reduce", add, ta(vec, kh)),
            T("Comp", T("Map", row, kh), T("Comp", T("Zip", tp(win_t, win_t)), T("Fork", T("Id", win_t), T("Const", taps, win_t)))))
    if b is not None:
        per = T("Comp", add, T("Fork", per, T("Const", b, win_t)))
    return s.then(lifted(s.t, 2, lambda e: per))


def pool(s: Stages, win: Window, kind: str, scale: Term | None, flat: bool) -> Stages:
    """Max or average pooling: each window's [C] vectors reduced with VVMax or VVAdd; the average
    multiplies the sum by `scale` (1/taps). Max pooling pads with -inf, as PyTorch does (average
    pooling counts zeros). A `flat` window (of the stack's input, which the host lays out) is
    flattened and reduced once, so that map-reduce-interchange-moved can make each step a row
    of windows; otherwise (a view of an image computed on chip, whose taps no strided view can
    flatten) its rows are reduced first, then the row results."""
    windows(s, win, -math.inf if kind == "max" else 0.0)
    win_t = s.t.args[0].args[0]
    kh, kw, _ = shape_of(win_t)
    vec = win_t.args[0].args[0]
    op = T("VVMax" if kind == "max" else "VVAdd", tp(vec, vec))
    if flat:
        per = T("Comp", T("Reduce", op, ta(vec, kh * kw)), T("Join", win_t))
    else:
        per = T("Comp", T("Reduce", op, ta(vec, kh)), T("Map", T("Reduce", op, ta(vec, kw)), kh))
    if scale is not None:
        per = T("Comp", T("VVMul", tp(vec, vec)), T("Fork", per, T("Const", scale, win_t)))
    return s.then(lifted(s.t, 2, lambda e: per))


def elementwise(s: Stages, op: str) -> Stages:
    """An activation applied to every pixel's channel vector."""
    return s.then(lifted(s.t, 2, lambda e: T(op, e)))


# ---------------------------------------------------------------- references (NCHW, float64)


def _taps(x: np.ndarray, win: Window, oh: int, ow: int, pad_value: float = 0.0):
    """(i, j, x values under tap (i, j) for every output pixel: [N][C][OH][OW])."""
    (ph, pw), (sh, sw), (dh, dw) = win.padding, win.stride, win.dilation
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=pad_value)
    for i in range(win.kernel[0]):
        for j in range(win.kernel[1]):
            yield i, j, xp[:, :, i * dh : i * dh + sh * (oh - 1) + 1 : sh, j * dw : j * dw + sw * (ow - 1) + 1 : sw]


def conv_reference(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, win: Window, groups: int) -> np.ndarray:
    """PyTorch's Conv2d: out[n, o] = b[o] + sum over the group's channels c and taps (i, j) of
    w[o, c, i, j] * padded x[n, c, oh*s + i*d, ow*s + j*d]."""
    n, c, h, wd = x.shape
    o = w.shape[0]
    oh, ow = win.out_size(h, 0), win.out_size(wd, 1)
    out = np.zeros((n, o, oh, ow))
    cg, og = c // groups, o // groups
    for i, j, patch in _taps(x.astype(np.float64), win, oh, ow):
        for g in range(groups):
            wg = w[g * og : (g + 1) * og, :, i, j].astype(np.float64)
            out[:, g * og : (g + 1) * og] += np.einsum("oc,nchw->nohw", wg, patch[:, g * cg : (g + 1) * cg])
    if b is not None:
        out += b.astype(np.float64)[None, :, None, None]
    return out


def pool_reference(x: np.ndarray, win: Window, kind: str) -> np.ndarray:
    """PyTorch's MaxPool2d (padded with -inf) / AvgPool2d (zero padding counted in the divisor)."""
    oh, ow = win.out_size(x.shape[2], 0), win.out_size(x.shape[3], 1)
    patches = [p for _, _, p in _taps(x.astype(np.float64), win, oh, ow, -np.inf if kind == "max" else 0.0)]
    if kind == "max":
        return np.max(patches, axis=0)
    return np.sum(patches, axis=0) / len(patches)
