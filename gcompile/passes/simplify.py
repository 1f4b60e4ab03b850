"""simplify: dead code, common subexpressions and the cheap, sure algebraic identities.

`simplify(outputs)` returns new output nodes that compute the same values:

- dead code: only what is reachable from `outputs` is kept (the graph has no other nodes);
- common subexpressions: nodes with the same op, the same inputs (after substitution) and equal attributes
  become one node (arrays in attributes compare by value, so constants of equal value and dtype merge);
- folding: an op whose inputs are all scalar constants becomes a scalar constant (computed by the op's own
  numpy rule in the node's dtype, as the reference executor would), and so does ones_like/zeros_like of a
  scalar (so the `ones_like(loss)` that seeds autodiff folds away);
- identities, only where the surviving operand already has the result's shape (dtypes always agree):
  x*1, 1*x, x/1, x+0, 0+x, x-0, where "1" / "0" is a scalar constant or ones_like / zeros_like of anything;
  reshape or broadcast_to to the input's own shape, transpose by the identity permutation, and
  reshape(reshape(x)) -> reshape(x).

Placeholders and variables keep their identity (the same Node objects come back; they are never merged).
`assign` nodes are never removed or merged: they are writes, not values. A node whose inputs did not change
is returned as is; one whose inputs changed is rebuilt under its old name. An output that simplifies to
another node (e.g. `reshape(x, x.shape)`) is returned as that node, with that node's name. Simplify all the
outputs of a program (train step and eval outputs) in one call, so the nodes they share stay one node.

Every rule is bit-exact but one: x+0 -> x keeps a -0.0 in x that the original turned into +0.0 (the two
compare equal; XLA's algebraic simplifier makes the same choice).

Left to later passes: fusion of elementwise chains (fuse), anything that needs shape-changing rewrites
(e.g. x*0, ones_like(x)*c for non-scalar x, transpose chains) and all reordering (schedule).
"""
from __future__ import annotations

import numpy as np

from .. import graph as G
from ..graph import Node
from ..ops import get_op

IDENTITY_LEAVES = ("placeholder", "variable")


def simplify(outputs: list[Node]) -> list[Node]:
    replaced: dict[Node, Node] = {}   # old node -> the node that now computes its value
    canonical: dict[tuple, Node] = {}  # CSE table: key -> the first node with that key
    for node in G.topological_order(outputs):
        if node.op in IDENTITY_LEAVES:
            replaced[node] = node
            continue
        inputs = tuple(replaced[i] for i in node.inputs)
        new = G.rebuilt(node, inputs)
        new = rewrite(new)
        if new.op not in IDENTITY_LEAVES + ("assign",):
            new = canonical.setdefault(cse_key(new), new)
        assert (new.shape, new.dtype) == (node.shape, node.dtype), f"simplify changed {node.describe()}"
        replaced[node] = new
    return [replaced[o] for o in outputs]


def rewrite(n: Node) -> Node:
    """The node computing n's value after one folding/identity step (n itself when no rule applies)."""
    if n.op == "assign":
        return n
    if n.op in ("ones_like", "zeros_like") and n.shape == ():
        return G.in_phase_of(n, G.constant(1 if n.op == "ones_like" else 0, dtype=n.dtype, name=n.name))
    if n.inputs and n.shape == () and all(is_scalar_constant(i) for i in n.inputs):
        value = get_op(n.op).compute(n, *(i.attrs["value"] for i in n.inputs))
        return G.in_phase_of(n, G.constant(value, dtype=n.dtype, name=n.name))
    x = n.inputs[0] if n.inputs else None
    if n.op in ("reshape", "broadcast_to") and x.shape == n.shape:
        return x
    if n.op == "transpose" and n.attrs["perm"] == tuple(range(n.ndim)):
        return x
    if n.op == "reshape" and x.op == "reshape":
        root = x.inputs[0]
        return root if root.shape == n.shape else G.in_phase_of(n, Node("reshape", (root,), n.attrs, name=n.name))
    if n.op in ("mul", "div", "add", "sub"):
        a, b = n.inputs
        neutral = is_one if n.op in ("mul", "div") else is_zero
        if neutral(b) and a.shape == n.shape:
            return a
        if n.op in ("mul", "add") and neutral(a) and b.shape == n.shape:
            return b
    return n


def is_scalar_constant(n: Node) -> bool:
    return n.op == "constant" and n.shape == ()


def is_one(n: Node) -> bool:
    return n.op == "ones_like" or (is_scalar_constant(n) and n.attrs["value"] == 1)


def is_zero(n: Node) -> bool:
    return n.op == "zeros_like" or (is_scalar_constant(n) and n.attrs["value"] == 0)


def cse_key(n: Node) -> tuple:
    return (n.op, n.inputs, tuple(sorted((k, frozen(v)) for k, v in n.attrs.items())))


def frozen(value):
    """A hashable stand-in for an attribute value; arrays by dtype, shape and bytes."""
    if isinstance(value, np.ndarray):
        return ("ndarray", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, (tuple, list)):
        return tuple(frozen(v) for v in value)
    return (type(value).__name__, value)
