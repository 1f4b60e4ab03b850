"""matmul(a, b, trans_a, trans_b) = op(a) @ op(b), op(m) = m with its last two axes swapped when its flag is
set. Operands are 2-D matrices or 3-D stacks of them (numpy's matmul): a 2-D operand, or a stack of one, is
shared by every matrix of the other operand's stack. Convolutions use this form: one weight matrix times
each example's patches (the runtime's batched GEMM)."""
from __future__ import annotations

from .. import graph as G
from ..errors import ShapeError
from .base import Op, register, require_float, same_dtype


def inner_size(a, trans_a: bool) -> int:
    """K of op(a) @ op(b), read off A (a node or an array): its last axis, or with trans_a the one before."""
    return a.shape[-2] if trans_a else a.shape[-1]


@register
class Matmul(Op):
    name = "matmul"

    def infer(self, node):
        a, b = node.inputs
        ta, tb = node.attrs["trans_a"], node.attrs["trans_b"]
        for x in (a, b):
            if x.ndim not in (2, 3):
                raise ShapeError(f"matmul: operands must be 2-D (or 3-D stacks), got {a.describe()} @ "
                                 f"{b.describe()}")
            require_float("matmul", x)
        dtype = same_dtype("matmul", a, b)
        m, k = a.shape[-1 if ta else -2], inner_size(a, ta)
        k2, n = b.shape[-2:][::-1] if tb else b.shape[-2:]
        if k != k2:
            sa = f"{a.describe()}{'.T' if ta else ''}"
            sb = f"{b.describe()}{'.T' if tb else ''}"
            raise ShapeError(f"matmul: inner dimensions differ: {sa} @ {sb} ({k} != {k2})")
        stacks = {x.shape[0] for x in (a, b) if x.ndim == 3}
        if len(stacks - {1}) > 1:
            raise ShapeError(f"matmul: stacks of different sizes: {a.describe()} @ {b.describe()}")
        if not stacks:
            return (m, n), dtype
        return (max(stacks), m, n), dtype

    def compute(self, node, a, b):
        if node.attrs["trans_a"]:
            a = a.swapaxes(-1, -2)
        if node.attrs["trans_b"]:
            b = b.swapaxes(-1, -2)
        return a @ b

    def grad(self, node, g):
        # a stack's gradient w.r.t. a shared matrix comes back stacked; autodiff sums it over the stack
        a, b = node.inputs
        ta, tb = node.attrs["trans_a"], node.attrs["trans_b"]
        if not ta and not tb:    # C = A B
            return [G.matmul(g, b, trans_b=True), G.matmul(a, g, trans_a=True)]
        if ta and not tb:        # C = A^T B
            return [G.matmul(b, g, trans_b=True), G.matmul(a, g)]
        if not ta and tb:        # C = A B^T
            return [G.matmul(g, b), G.matmul(g, a, trans_a=True)]
        return [G.matmul(b, g, trans_a=True, trans_b=True),   # C = A^T B^T
                G.matmul(g, a, trans_a=True, trans_b=True)]
