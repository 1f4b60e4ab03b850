"""Reverse-mode autodiff on the graph: `gradients(y, xs)` appends gradient nodes to the same graph.

Gradient rules live with their ops (`Op.grad`) and are written with the graph API, so the result is an
ordinary graph: it can be differentiated again, executed, or compiled. Broadcasting is undone here, once,
for every op: a gradient wider than its input is summed over the broadcast axes.
"""
from __future__ import annotations

from typing import Sequence

from . import graph as G
from .errors import GCompileError
from .graph import Node
from .ops import get_op


def sum_to_shape(g: Node, shape: tuple) -> Node:
    """Sum `g` over the axes numpy broadcasting added or stretched to turn `shape` into g.shape."""
    if g.shape == tuple(shape):
        return g
    lead = g.ndim - len(shape)
    axes = list(range(lead)) + [lead + i for i, d in enumerate(shape) if d == 1 and g.shape[lead + i] != 1]
    summed = G.reduce_sum(g, axes, keepdims=True) if axes else g
    return G.reshape(summed, shape)


def gradients(y: Node, xs: Sequence[Node], grad_y: Node | None = None) -> list[Node]:
    """d(sum of y * grad_y)/dx for each x in xs; grad_y defaults to ones. Inputs y does not depend on get
    zeros of their shape. The nodes it makes are of the backward phase (graph.phase)."""
    with G.phase("bwd"):
        return differentiate(y, xs, grad_y)


def differentiate(y: Node, xs: Sequence[Node], grad_y: Node | None) -> list[Node]:
    if y.dtype not in G.FLOAT_DTYPES:
        raise GCompileError(f"gradients: cannot differentiate {y.describe()}: not a float value")
    if grad_y is None:
        grad_y = G.ones_like(y)
    elif grad_y.shape != y.shape or grad_y.dtype != y.dtype:
        raise GCompileError(f"gradients: grad_y {grad_y.describe()} must have y's shape and dtype, {y.shape} "
                            f"{y.dtype}")

    contributions: dict[Node, list[Node]] = {y: [grad_y]}
    for node in reversed(G.topological_order([y])):
        parts = contributions.pop(node, None)
        if not parts or not node.inputs:
            if parts:
                contributions[node] = parts  # keep leaves' gradients for the lookup below
            continue
        g = parts[0]
        for p in parts[1:]:
            g = g + p
        contributions[node] = [g]
        op = get_op(node.op)
        if not op.differentiable:
            continue
        for x, gx in zip(node.inputs, op.grad(node, g)):
            if gx is None or x.dtype not in G.FLOAT_DTYPES:
                continue
            contributions.setdefault(x, []).append(sum_to_shape(gx, x.shape))

    result = []
    for x in xs:
        parts = contributions.get(x)
        if not parts:
            result.append(G.zeros_like(x))
            continue
        g = parts[0]
        for p in parts[1:]:
            g = g + p
        result.append(g)
    return result
