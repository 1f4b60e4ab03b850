"""Registry and the shared shape rules (broadcasting) of the op library."""
from __future__ import annotations

from ..errors import GCompileError, ShapeError

OPS: dict[str, "Op"] = {}


class Op:
    """Base of every op. Subclasses set `name` and override what applies to them."""

    name = ""
    differentiable = True

    def infer(self, node):
        raise NotImplementedError(self.name)

    def compute(self, node, *values):
        raise NotImplementedError(self.name)

    def grad(self, node, g):
        """Gradient nodes for each input (None: no gradient flows there)."""
        raise GCompileError(f"{self.name}: no gradient rule (node {node.describe()})")

    def writes(self, node) -> list:
        """The variables the node writes in place (the schedule puts it after their other readers)."""
        return []


def register(cls):
    op = cls()
    if op.name in OPS:
        raise GCompileError(f"op {op.name!r} registered twice")
    OPS[op.name] = op
    return cls


def get_op(name: str) -> Op:
    try:
        return OPS[name]
    except KeyError:
        raise GCompileError(f"unknown op {name!r}") from None


def broadcast_shapes(op: str, *nodes) -> tuple:
    """numpy's broadcasting rule, with an error that names the op, the nodes and their shapes."""
    ndim = max(len(n.shape) for n in nodes)
    out = []
    for axis in range(ndim):
        dims = {n.shape[axis - ndim + len(n.shape)] for n in nodes if axis - ndim + len(n.shape) >= 0}
        dims.discard(1)
        if len(dims) > 1:
            shapes = " and ".join(n.describe() for n in nodes)
            raise ShapeError(f"{op}: shapes do not broadcast: {shapes} (axis {axis - ndim} has sizes "
                             f"{sorted(dims)})")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def same_dtype(op: str, *nodes) -> str:
    dtypes = {n.dtype for n in nodes}
    if len(dtypes) != 1:
        raise ShapeError(f"{op}: operands have different dtypes: " + ", ".join(n.describe() for n in nodes)
                         + " (insert gc.cast)")
    return dtypes.pop()


def require_float(op: str, node) -> None:
    if node.dtype not in ("float32", "float64"):
        raise ShapeError(f"{op}: needs a float input, got {node.describe()} (insert gc.cast)")
