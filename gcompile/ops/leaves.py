"""Leaves (placeholder, variable, constant), the in-place write `assign`, and the dtype/shape-only ops."""
from __future__ import annotations

import numpy as np

from .. import graph as G
from ..errors import ShapeError
from .base import Op, register


class Leaf(Op):
    differentiable = False

    def infer(self, node):
        return node.attrs["shape"], node.attrs["dtype"]


@register
class Placeholder(Leaf):
    name = "placeholder"


@register
class Variable(Leaf):
    name = "variable"


@register
class Constant(Leaf):
    name = "constant"

    def infer(self, node):
        value = node.attrs["value"]
        return value.shape, value.dtype.name

    def compute(self, node):
        return node.attrs["value"]


@register
class Assign(Op):
    """assign(var, value): the step's result for `var`. The executor (and the generated program) writes it
    into the variable after every read of the variable in the same step."""

    name, differentiable = "assign", False

    def infer(self, node):
        var, value = node.inputs
        if var.op != "variable":
            raise ShapeError(f"assign: target {var.describe()} is a {var.op}, not a variable")
        if var.shape != value.shape or var.dtype != value.dtype:
            raise ShapeError(f"assign: value {value.describe()} does not match variable {var.describe()}")
        return var.shape, var.dtype

    def compute(self, node, var, value):
        return value

    def grad(self, node, g):
        return [None, None]

    def writes(self, node):
        return [node.inputs[0]]


@register
class Cast(Op):
    name = "cast"

    def infer(self, node):
        return node.inputs[0].shape, node.attrs["dtype"]

    def compute(self, node, x):
        if x.dtype.kind == "f" and node.dtype in G.FLOAT_DTYPES:
            return x  # the executor stores floats at its own precision (all float64 in gradient-check mode)
        return x.astype(node.attrs["dtype"])

    def grad(self, node, g):
        x = node.inputs[0]
        if x.dtype in G.FLOAT_DTYPES and node.dtype in G.FLOAT_DTYPES:
            return [G.cast(g, x.dtype)]
        return [None]


class Fill(Op):
    differentiable = False
    fill = 0

    def infer(self, node):
        return node.inputs[0].shape, node.inputs[0].dtype

    def compute(self, node, x):
        return np.full(x.shape, self.fill, dtype=x.dtype)

    def grad(self, node, g):
        return [None]


@register
class ZerosLike(Fill):
    name, fill = "zeros_like", 0


@register
class OnesLike(Fill):
    name, fill = "ones_like", 1
