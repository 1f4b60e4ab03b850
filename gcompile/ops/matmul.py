"""matmul(a, b, trans_a, trans_b) = op(a) @ op(b) for 2-D operands, op(m) = m.T when its flag is set."""
from __future__ import annotations

from .. import graph as G
from ..errors import ShapeError
from .base import Op, register, require_float, same_dtype


@register
class Matmul(Op):
    name = "matmul"

    def infer(self, node):
        a, b = node.inputs
        ta, tb = node.attrs["trans_a"], node.attrs["trans_b"]
        for x in (a, b):
            if x.ndim != 2:
                raise ShapeError(f"matmul: operands must be 2-D, got {a.describe()} @ {b.describe()}")
            require_float("matmul", x)
        dtype = same_dtype("matmul", a, b)
        m, k = a.shape[::-1] if ta else a.shape
        k2, n = b.shape[::-1] if tb else b.shape
        if k != k2:
            sa = f"{a.describe()}{'.T' if ta else ''}"
            sb = f"{b.describe()}{'.T' if tb else ''}"
            raise ShapeError(f"matmul: inner dimensions differ: {sa} @ {sb} ({k} != {k2})")
        return (m, n), dtype

    def compute(self, node, a, b):
        if node.attrs["trans_a"]:
            a = a.T
        if node.attrs["trans_b"]:
            b = b.T
        return a @ b

    def grad(self, node, g):
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
