"""Reductions over a set of axes (attribute `axes`, sorted, non-negative) with `keepdims`."""
from __future__ import annotations

import numpy as np

from .. import graph as G
from ..errors import ShapeError
from .base import Op, register


def kept_shape(node) -> tuple:
    """The reduced shape with the reduced axes kept as 1 (what the gradient broadcasts from)."""
    x, axes = node.inputs[0], node.attrs["axes"]
    return tuple(1 if i in axes else d for i, d in enumerate(x.shape))


def expand_back(node, value):
    """Broadcast a value of the reduction's output shape back to its input's shape."""
    return G.broadcast_to(G.reshape(value, kept_shape(node)), node.inputs[0].shape)


class Reduce(Op):
    def infer(self, node):
        x, axes, keepdims = node.inputs[0], node.attrs["axes"], node.attrs["keepdims"]
        if any(x.shape[a] == 0 for a in axes) and self.name == "reduce_max":
            raise ShapeError(f"reduce_max: empty axis in {x.describe()}")
        if keepdims:
            return kept_shape(node), x.dtype
        return tuple(d for i, d in enumerate(x.shape) if i not in axes), x.dtype

    def count(self, node) -> int:
        x = node.inputs[0]
        return int(np.prod([x.shape[a] for a in node.attrs["axes"]], dtype=np.int64))


@register
class ReduceSum(Reduce):
    name = "reduce_sum"
    def compute(self, node, x): return np.sum(x, axis=node.attrs["axes"], keepdims=node.attrs["keepdims"])
    def grad(self, node, g): return [expand_back(node, g)]


@register
class ReduceMean(Reduce):
    name = "reduce_mean"
    def compute(self, node, x):
        axes, keep = node.attrs["axes"], node.attrs["keepdims"]
        if x.dtype.kind in "iu":   # the sum in int64, truncated toward zero (np.mean's float64 rounds above 2^53)
            total = np.sum(x, axis=axes, keepdims=keep, dtype=np.int64)
            return (np.sign(total) * (np.abs(total) // self.count(node))).astype(x.dtype)
        return np.mean(x, axis=axes, keepdims=keep)
    def grad(self, node, g): return [expand_back(node, g) * (1.0 / self.count(node))]


@register
class ReduceMax(Reduce):
    """Gradient is shared equally between tied maxima (as JAX does)."""
    name = "reduce_max"
    def compute(self, node, x): return np.max(x, axis=node.attrs["axes"], keepdims=node.attrs["keepdims"])
    def grad(self, node, g):
        x = node.inputs[0]
        hit = G.equal(x, expand_back(node, node))
        ties = expand_back(node, G.reduce_sum(hit, node.attrs["axes"], keepdims=node.attrs["keepdims"]))
        return [expand_back(node, g) * hit / ties]
