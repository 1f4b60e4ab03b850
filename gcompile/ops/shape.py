"""Ops that move elements without arithmetic: transpose, reshape, broadcast_to."""
from __future__ import annotations

import numpy as np

from .. import graph as G
from ..errors import ShapeError
from .base import Op, register


@register
class Transpose(Op):
    name = "transpose"

    def infer(self, node):
        x, perm = node.inputs[0], node.attrs["perm"]
        if sorted(perm) != list(range(x.ndim)):
            raise ShapeError(f"transpose: perm {perm} is not a permutation of the {x.ndim} axes of "
                             f"{x.describe()}")
        return tuple(x.shape[p] for p in perm), x.dtype

    def compute(self, node, x):
        return np.transpose(x, node.attrs["perm"]).copy()  # C order; ascontiguousarray makes 0-d into (1,)

    def grad(self, node, g):
        return [G.transpose(g, tuple(np.argsort(node.attrs["perm"])))]


@register
class Reshape(Op):
    name = "reshape"

    def infer(self, node):
        x, shape = node.inputs[0], list(node.attrs["shape"])
        if shape.count(-1) > 1 or any(d < -1 for d in shape):
            raise ShapeError(f"reshape: invalid target shape {tuple(shape)} for {x.describe()}")
        if -1 in shape:
            known = int(np.prod([d for d in shape if d != -1], dtype=np.int64))
            if known == 0 or x.size % known:
                raise ShapeError(f"reshape: cannot infer -1 in {tuple(shape)} from {x.describe()} "
                                 f"({x.size} elements)")
            shape[shape.index(-1)] = x.size // known
            node.attrs["shape"] = tuple(shape)
        if int(np.prod(shape, dtype=np.int64)) != x.size:
            raise ShapeError(f"reshape: cannot reshape {x.describe()} ({x.size} elements) to {tuple(shape)} "
                             f"({int(np.prod(shape, dtype=np.int64))} elements)")
        return tuple(shape), x.dtype

    def compute(self, node, x):
        return x.reshape(node.attrs["shape"])

    def grad(self, node, g):
        return [G.reshape(g, node.inputs[0].shape)]


@register
class BroadcastTo(Op):
    name = "broadcast_to"

    def infer(self, node):
        x, shape = node.inputs[0], tuple(node.attrs["shape"])
        ok = len(shape) >= x.ndim and all(
            xd in (1, sd) for xd, sd in zip(x.shape[::-1], shape[::-1]))
        if not ok:
            raise ShapeError(f"broadcast_to: cannot broadcast {x.describe()} to {shape}")
        return shape, x.dtype

    def compute(self, node, x):
        return np.broadcast_to(x, node.attrs["shape"]).copy()

    def grad(self, node, g):
        return [g]  # autodiff sums over the broadcast axes
