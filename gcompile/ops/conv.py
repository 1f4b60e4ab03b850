"""Window ops of convolutional networks, layout NCHW. Each is a gather: every output element reads a small
window of its input, so kernels need no atomics and sum in a fixed order (runtime/gc_kernels_conv.h).

- im2col(x)        (N, C, H, W) -> (N, C*KH*KW, OH*OW): the patches; conv2d = weights (Cout, C*KH*KW) @ patches
- col2im(cols)     its adjoint (the gradient of im2col): each pixel sums the patch entries that copied it
- max_pool2d(x), avg_pool2d(x), and their gradients max_pool2d_grad(x, g), avg_pool2d_grad(g);
  max_pool2d_select(x, h), the gradient of max_pool2d_grad (second derivatives)

Attributes: `kernel` (KH, KW), `stride` and `padding` (the same along both axes; zeros pad im2col and
avg_pool2d — the average counts padding, like PyTorch's default — and -inf pads max_pool2d).
Max-pool ties: the first maximum of a window in row-major order takes the gradient (what the kernels and
numpy's argmax both do).
"""
from __future__ import annotations

import numpy as np

from .. import graph as G
from ..errors import ShapeError
from .base import Op, register, require_float


def windows_of(size: int, kernel: int, stride: int, padding: int) -> int:
    """Windows along an axis of `size` (no checks: see out_size)."""
    return (size + 2 * padding - kernel) // stride + 1


def out_size(op: str, x, size: int, kernel: int, stride: int, padding: int) -> int:
    """windows_of, with the checks that make it positive and an error naming op and input otherwise."""
    if stride < 1 or padding < 0 or kernel < 1:
        raise ShapeError(f"{op}: kernel {kernel}, stride {stride}, padding {padding} on {x.describe()}: "
                         f"need kernel >= 1, stride >= 1, padding >= 0")
    if size + 2 * padding < kernel:
        raise ShapeError(f"{op}: kernel {kernel} is larger than the padded input ({size} + 2*{padding}) of "
                         f"{x.describe()}")
    return windows_of(size, kernel, stride, padding)


def window_shape(op: str, node, x) -> tuple:
    """(OH, OW) of the window op `node` over image x (N, C, H, W)."""
    if x.ndim != 4:
        raise ShapeError(f"{op}: expected an NCHW image (4-D), got {x.describe()}")
    (kh, kw), s, p = node.attrs["kernel"], node.attrs["stride"], node.attrs["padding"]
    return out_size(op, x, x.shape[2], kh, s, p), out_size(op, x, x.shape[3], kw, s, p)


def windows(node, x, fill):
    """Yield (kh, kw, view) where view (N, C, OH, OW) is x (padded with `fill`) at window offset (kh, kw)."""
    (kh_, kw_), s, p = node.attrs["kernel"], node.attrs["stride"], node.attrs["padding"]
    oh, ow = windows_of(x.shape[2], kh_, s, p), windows_of(x.shape[3], kw_, s, p)
    xp = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)), constant_values=fill)
    for kh in range(kh_):
        for kw in range(kw_):
            yield kh, kw, xp[:, :, kh:kh + s * (oh - 1) + 1:s, kw:kw + s * (ow - 1) + 1:s]


def scatter_windows(node, image_shape, parts, dtype):
    """The adjoint of `windows`: sum parts (kh, kw) -> (N, C, OH, OW) into an image, in the order given."""
    (kh_, kw_), s, p = node.attrs["kernel"], node.attrs["stride"], node.attrs["padding"]
    n, c, h, w = image_shape
    oh, ow = windows_of(h, kh_, s, p), windows_of(w, kw_, s, p)
    xp = np.zeros((n, c, h + 2 * p, w + 2 * p), dtype=dtype)
    for (kh, kw), part in parts:
        xp[:, :, kh:kh + s * (oh - 1) + 1:s, kw:kw + s * (ow - 1) + 1:s] += part
    return xp[:, :, p:p + h, p:p + w]


@register
class Im2col(Op):
    name = "im2col"

    def infer(self, node):
        x = node.inputs[0]
        require_float(self.name, x)
        oh, ow = window_shape(self.name, node, x)
        kh, kw = node.attrs["kernel"]
        return (x.shape[0], x.shape[1] * kh * kw, oh * ow), x.dtype

    def compute(self, node, x):
        n, c = x.shape[:2]
        kh, kw = node.attrs["kernel"]
        patches = np.stack([v for _, _, v in windows(node, x, 0)], axis=2)   # (N, C, KH*KW, OH, OW)
        return patches.reshape(n, c * kh * kw, -1)

    def grad(self, node, g):
        x = node.inputs[0]
        return [G.col2im(g, x.shape[2:], node.attrs["kernel"], node.attrs["stride"], node.attrs["padding"])]


@register
class Col2im(Op):
    name = "col2im"

    def infer(self, node):
        cols = node.inputs[0]
        require_float(self.name, cols)
        (kh, kw), s, p = node.attrs["kernel"], node.attrs["stride"], node.attrs["padding"]
        h, w = node.attrs["image_size"]
        if cols.ndim != 3 or cols.shape[1] % (kh * kw):
            raise ShapeError(f"col2im: expected patches (N, C*{kh}*{kw}, OH*OW), got {cols.describe()}")
        oh, ow = out_size(self.name, cols, h, kh, s, p), out_size(self.name, cols, w, kw, s, p)
        if cols.shape[2] != oh * ow:
            raise ShapeError(f"col2im: patches {cols.describe()} do not come from a {h}x{w} image with kernel "
                             f"{kh}x{kw}, stride {s}, padding {p} ({oh}x{ow} windows)")
        return (cols.shape[0], cols.shape[1] // (kh * kw), h, w), cols.dtype

    def compute(self, node, cols):
        n, c, h, w = node.shape
        (kh_, kw_), s, p = node.attrs["kernel"], node.attrs["stride"], node.attrs["padding"]
        oh, ow = windows_of(h, kh_, s, p), windows_of(w, kw_, s, p)
        parts = cols.reshape(n, c, kh_, kw_, oh, ow)
        return scatter_windows(node, node.shape, (((kh, kw), parts[:, :, kh, kw]) for kh in range(kh_)
                                                  for kw in range(kw_)), cols.dtype)

    def grad(self, node, g):
        return [G.im2col(g, node.attrs["kernel"], node.attrs["stride"], node.attrs["padding"])]


class Pool(Op):
    def infer(self, node):
        x = node.inputs[0]
        require_float(self.name, x)
        (kh, kw), p = node.attrs["kernel"], node.attrs["padding"]
        if 2 * p > min(kh, kw):
            raise ShapeError(f"{self.name}: padding {p} is more than half the kernel {kh}x{kw} (a window would "
                             f"hold only padding) on {x.describe()}")
        return x.shape[:2] + window_shape(self.name, node, x), x.dtype


@register
class MaxPool2d(Pool):
    name = "max_pool2d"

    def compute(self, node, x):
        return np.max(np.stack([v for _, _, v in windows(node, x, -np.inf)]), axis=0)

    def grad(self, node, g):
        x = node.inputs[0]
        return [G.Node("max_pool2d_grad", (x, g), dict(node.attrs))]


@register
class AvgPool2d(Pool):
    name = "avg_pool2d"

    def compute(self, node, x):
        kh, kw = node.attrs["kernel"]
        total = sum(v for _, _, v in windows(node, x, 0))
        return total / x.dtype.type(kh * kw)

    def grad(self, node, g):
        return [G.Node("avg_pool2d_grad", (g,), dict(node.attrs, image_size=node.inputs[0].shape[2:]))]


@register
class MaxPool2dGrad(Op):
    """max_pool2d_grad(x, g): each window's g goes to the window's first maximum of x (row-major order)."""
    name = "max_pool2d_grad"

    def infer(self, node):
        x, g = node.inputs
        expected = x.shape[:2] + window_shape(self.name, node, x)
        if g.shape != expected or g.dtype != x.dtype:
            raise ShapeError(f"max_pool2d_grad: gradient {g.describe()} does not match the pooled shape "
                             f"{expected} of {x.describe()}")
        return x.shape, x.dtype

    def compute(self, node, x, g):
        kw_ = node.attrs["kernel"][1]
        first = first_max(node, x)
        parts = (((kh, kw), np.where(first == kh * kw_ + kw, g, 0).astype(g.dtype)) for kh, kw, _ in
                 windows(node, x, 0))
        return scatter_windows(node, x.shape, parts, g.dtype)

    def grad(self, node, g):
        # linear in g (the routing by x's maxima); constant in x where the maxima do not change, so no gradient
        x = node.inputs[0]
        return [None, G.Node("max_pool2d_select", (x, g), dict(node.attrs))]


@register
class MaxPool2dSelect(Op):
    """max_pool2d_select(x, h): at each window of x, h's pixel where x has the window's first maximum — the
    adjoint of max_pool2d_grad in its gradient (second derivatives through max pooling)."""
    name = "max_pool2d_select"

    def infer(self, node):
        x, h = node.inputs
        if h.shape != x.shape or h.dtype != x.dtype:
            raise ShapeError(f"max_pool2d_select: {h.describe()} must have the shape and dtype of {x.describe()}")
        return x.shape[:2] + window_shape(self.name, node, x), x.dtype

    def compute(self, node, x, h):
        values = np.stack([v for _, _, v in windows(node, h, 0)])
        return np.take_along_axis(values, first_max(node, x)[None], axis=0)[0]

    def grad(self, node, g):
        return [None, G.Node("max_pool2d_grad", (node.inputs[0], g), dict(node.attrs))]


def first_max(node, x) -> np.ndarray:
    """(N, C, OH, OW): each window's offset kh * KW + kw of its first maximum of x (a NaN above all); where
    the image's values are all -inf, the first of them (padding is not in the image), as gc_window_argmax."""
    values = np.stack([v for _, _, v in windows(node, x, -np.inf)])
    first = np.argmax(values, axis=0)
    real = np.stack([v for _, _, v in windows(node, np.ones(x.shape, np.int8), 0)]) > 0
    only_inf = ~np.any(real & ~(values == -np.inf), axis=0)
    return np.where(only_inf, np.argmax(real, axis=0), first)


@register
class AvgPool2dGrad(Op):
    name = "avg_pool2d_grad"

    def infer(self, node):
        g = node.inputs[0]
        (kh, kw), s, p = node.attrs["kernel"], node.attrs["stride"], node.attrs["padding"]
        h, w = node.attrs["image_size"]
        expected = (out_size(self.name, g, h, kh, s, p), out_size(self.name, g, w, kw, s, p))
        if g.ndim != 4 or g.shape[2:] != expected:
            raise ShapeError(f"avg_pool2d_grad: gradient {g.describe()} does not match {h}x{w} images pooled to "
                             f"{expected}")
        return g.shape[:2] + (h, w), g.dtype

    def compute(self, node, g):
        kh_, kw_ = node.attrs["kernel"]
        parts = (((kh, kw), g) for kh in range(kh_) for kw in range(kw_))
        return scatter_windows(node, node.shape, parts, g.dtype) / g.dtype.type(kh_ * kw_)

    def grad(self, node, g):
        return [G.avg_pool2d(g, node.attrs["kernel"], node.attrs["stride"], node.attrs["padding"])]
