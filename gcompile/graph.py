"""The graph IR: nodes with static shapes and dtypes, and the API that builds them.

A Node is one value in a computation: an op name, input nodes, attributes, a static shape and a dtype.
Shapes and dtypes are inferred when the node is created (the op's `infer` rule), so a malformed graph fails
at the line of the model file that built it, with a ShapeError naming the op, the nodes and the shapes.

The graph is the set of nodes reachable from whatever outputs a caller names; there is no global graph
object. `topological_order` and `format_graph` give the deterministic order and the stable text that every
pass and test relies on.
"""
from __future__ import annotations

import itertools
from typing import Iterable, Sequence

import numpy as np

from .errors import ShapeError

DTYPES = ("float32", "float64", "int32", "uint8")
FLOAT_DTYPES = ("float32", "float64")

_ids = itertools.count()


def canonical_dtype(dtype) -> str:
    name = np.dtype(dtype).name
    if name not in DTYPES:
        raise ShapeError(f"unsupported dtype {name!r}; gcompile supports {', '.join(DTYPES)}")
    return name


class Node:
    """One value of the graph. Build nodes with the API functions, not with this constructor."""

    __slots__ = ("id", "name", "op", "inputs", "attrs", "shape", "dtype")
    __array_priority__ = 1000  # numpy scalars on the left defer to Node's reflected operators

    def __init__(self, op: str, inputs: Sequence["Node"], attrs: dict | None = None, name: str | None = None):
        from .ops import get_op

        self.id = next(_ids)
        self.op = op
        self.inputs = tuple(inputs)
        self.attrs = dict(attrs or {})
        self.name = name or f"{op}_{self.id}"
        self.shape, self.dtype = get_op(op).infer(self)
        self.shape = tuple(int(d) for d in self.shape)

    # --- convenience --------------------------------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * np.dtype(self.dtype).itemsize

    def describe(self) -> str:
        """`name (shape) dtype` — the phrase error messages use for a node."""
        return f"{self.name} {self.shape} {self.dtype}"

    def __repr__(self) -> str:
        return f"<Node {self.op} {self.describe()}>"

    # Nodes are graph vertices: identity semantics for hashing and equality.
    __hash__ = object.__hash__

    # --- operators (numpy broadcasting; Python scalars adopt the tensor's dtype) --------------------
    def __add__(self, other): return add(self, other)
    def __radd__(self, other): return add(other, self)
    def __sub__(self, other): return sub(self, other)
    def __rsub__(self, other): return sub(other, self)
    def __mul__(self, other): return mul(self, other)
    def __rmul__(self, other): return mul(other, self)
    def __truediv__(self, other): return div(self, other)
    def __rtruediv__(self, other): return div(other, self)
    def __matmul__(self, other): return matmul(self, as_node(other, like=self))
    def __rmatmul__(self, other): return matmul(as_node(other, like=self), self)
    def __neg__(self): return neg(self)
    def __pos__(self): return self

    def __pow__(self, exponent): return pow(self, exponent)

    @property
    def T(self) -> "Node":
        return transpose(self)


# ---------------------------------------------------------------------------------------------
# Leaves
# ---------------------------------------------------------------------------------------------
def placeholder(name: str, shape: Sequence[int], dtype="float32") -> Node:
    """A value fed at run time (a batch of inputs or labels)."""
    return Node("placeholder", (), {"shape": tuple(shape), "dtype": canonical_dtype(dtype)}, name=name)


def variable(name: str, shape: Sequence[int] | None = None, init=None, dtype="float32", trainable=True) -> Node:
    """A value held across steps (a parameter or optimizer state).

    `init` is an initializer from `gc.init` or an explicit ndarray (then `shape` may be omitted)."""
    from . import init as initializers

    if isinstance(init, np.ndarray) or np.isscalar(init):
        value = np.asarray(init)
        if shape is not None and tuple(shape) != value.shape:
            raise ShapeError(f"variable {name!r}: shape {tuple(shape)} does not match the initial value's "
                             f"shape {value.shape}")
        shape = value.shape
        init = initializers.Constant(value)
    elif init is None:
        init = initializers.zeros()
    if shape is None:
        raise ShapeError(f"variable {name!r}: give a shape or an ndarray initial value")
    return Node("variable", (), {"shape": tuple(shape), "dtype": canonical_dtype(dtype), "init": init,
                                 "trainable": trainable}, name=name)


def constant(value, dtype=None, name: str | None = None) -> Node:
    """A value fixed at compile time. Scalars are emitted as literals; arrays as initialized data."""
    arr = np.asarray(value)
    if dtype is None:
        dtype = "int32" if arr.dtype.kind in "iub" else "float32"
    arr = arr.astype(canonical_dtype(dtype))
    return Node("constant", (), {"value": arr}, name=name)


def as_node(value, like: Node | None = None) -> Node:
    """Nodes pass through; Python numbers and arrays become constants (of `like`'s dtype for numbers)."""
    if isinstance(value, Node):
        return value
    if like is not None and np.isscalar(value):
        return constant(value, dtype=like.dtype)
    return constant(value)


# ---------------------------------------------------------------------------------------------
# Op constructors (the public graph API). Each is a thin wrapper: the rules live in gcompile.ops.
# ---------------------------------------------------------------------------------------------
def _binary(op: str, a, b) -> Node:
    if not isinstance(a, Node) and not isinstance(b, Node):
        raise ShapeError(f"{op}: at least one operand must be a graph node")
    a = as_node(a, like=b if isinstance(b, Node) else None)
    b = as_node(b, like=a)
    return Node(op, (a, b))


def add(a, b): return _binary("add", a, b)
def sub(a, b): return _binary("sub", a, b)
def mul(a, b): return _binary("mul", a, b)
def div(a, b): return _binary("div", a, b)
def maximum(a, b): return _binary("maximum", a, b)
def minimum(a, b): return _binary("minimum", a, b)
def greater_equal(a, b): return _binary("greater_equal", a, b)
def equal(a, b): return _binary("equal", a, b)
def neg(x): return Node("neg", (x,))
def exp(x): return Node("exp", (x,))
def log(x): return Node("log", (x,))
def sqrt(x): return Node("sqrt", (x,))
def tanh(x): return Node("tanh", (x,))
def sigmoid(x): return Node("sigmoid", (x,))
def relu(x): return Node("relu", (x,))
def relu_grad(x, g): return Node("relu_grad", (x, g))
def isfinite(x): return Node("isfinite", (x,))
def zeros_like(x): return Node("zeros_like", (x,))
def ones_like(x): return Node("ones_like", (x,))


def where(cond, a, b):
    """a where cond is nonzero, else b (broadcasting all three); a Python number adopts the other's dtype."""
    if not isinstance(cond, Node):
        raise ShapeError(f"where: the condition must be a graph node, got {type(cond).__name__}")
    if not isinstance(a, Node) and not isinstance(b, Node):
        raise ShapeError("where: at least one of the two values must be a graph node")
    a = as_node(a, like=b if isinstance(b, Node) else None)
    return Node("where", (cond, a, as_node(b, like=a)))


def pow(x, exponent: float):  # noqa: A001 - mirrors numpy's name
    if isinstance(exponent, Node):
        raise ShapeError(f"pow: exponent must be a Python number, got node {exponent.describe()}")
    return Node("pow", (x,), {"exponent": float(exponent)})


def cast(x, dtype):
    return Node("cast", (x,), {"dtype": canonical_dtype(dtype)})


def matmul(a, b, trans_a: bool = False, trans_b: bool = False):
    return Node("matmul", (a, b), {"trans_a": bool(trans_a), "trans_b": bool(trans_b)})


def transpose(x, perm: Sequence[int] | None = None):
    if perm is None:
        perm = tuple(reversed(range(len(x.shape))))
    return Node("transpose", (x,), {"perm": tuple(int(p) for p in perm)})


def reshape(x, shape: Sequence[int]):
    return Node("reshape", (x,), {"shape": tuple(int(d) for d in shape)})


def broadcast_to(x, shape: Sequence[int]):
    return Node("broadcast_to", (x,), {"shape": tuple(int(d) for d in shape)})


def _reduce(op, x, axis, keepdims):
    return Node(op, (x,), {"axes": normalize_axes(axis, len(x.shape), op, x), "keepdims": bool(keepdims)})


def reduce_sum(x, axis=None, keepdims=False): return _reduce("reduce_sum", x, axis, keepdims)
def reduce_mean(x, axis=None, keepdims=False): return _reduce("reduce_mean", x, axis, keepdims)
def reduce_max(x, axis=None, keepdims=False): return _reduce("reduce_max", x, axis, keepdims)


def softmax(x, axis: int = -1):
    return Node("softmax", (x,), {"axis": normalize_axes(axis, len(x.shape), "softmax", x)[0]})


def log_softmax(x, axis: int = -1):
    return Node("log_softmax", (x,), {"axis": normalize_axes(axis, len(x.shape), "log_softmax", x)[0]})


def one_hot(labels, depth: int, dtype="float32"):
    return Node("one_hot", (labels,), {"depth": int(depth), "dtype": canonical_dtype(dtype)})


def softmax_cross_entropy(logits, labels):
    """Mean over the batch of -log softmax(logits)[label]; `labels` are class indices (B,) of an integer
    dtype, or one-hot / probability rows (B, C) of the logits' dtype. Returns a scalar (shape ())."""
    if isinstance(labels, Node) and labels.dtype in FLOAT_DTYPES:
        if logits.ndim != 2 or labels.shape != logits.shape or labels.dtype != logits.dtype:
            raise ShapeError(f"softmax_cross_entropy: float labels {labels.describe()} must be one-hot rows of the "
                             f"logits' shape and dtype, with logits {logits.describe()} of shape (batch, classes) "
                             f"(class indices are int32 or uint8)")
        batch = logits.shape[0]
        return neg(reduce_sum(labels * log_softmax(logits, axis=-1))) * (1.0 / batch)
    return Node("softmax_cross_entropy", (logits, labels))


def assign(var: Node, value: Node):
    """Write `value` into variable `var` at the end of the step (all reads in the step see the old value)."""
    return Node("assign", (var, value))


def normalize_axes(axis, ndim: int, op: str, x: Node) -> tuple:
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    out = []
    for a in axes:
        if not -ndim <= a < ndim:
            raise ShapeError(f"{op}: axis {a} is out of range for {x.describe()} ({ndim} dimensions)")
        out.append(int(a) % ndim if ndim else 0)
    if len(set(out)) != len(out):
        raise ShapeError(f"{op}: repeated axis in {axes} for {x.describe()}")
    return tuple(sorted(out))


# ---------------------------------------------------------------------------------------------
# Traversal and printing
# ---------------------------------------------------------------------------------------------
def topological_order(outputs: Iterable[Node]) -> list[Node]:
    """Inputs before users; deterministic: depth-first from the outputs, inputs in order."""
    order, seen = [], set()
    for root in outputs:
        if root in seen:
            continue
        stack = [(root, iter(root.inputs))]
        seen.add(root)
        while stack:
            node, it = stack[-1]
            child = next((c for c in it if c not in seen), None)
            if child is None:
                stack.pop()
                order.append(node)
            else:
                seen.add(child)
                stack.append((child, iter(child.inputs)))
    return order


def format_attr(value) -> str:
    if isinstance(value, np.ndarray):
        if value.ndim == 0:
            return str(value[()])  # shortest text of the value at its own precision: float32 0.1 prints 0.1
        if value.size <= 4:
            return np.array2string(value.ravel(), separator=",").replace(" ", "")
        return f"<array {value.shape}>"
    if isinstance(value, float):
        return repr(value)
    if hasattr(value, "describe"):
        return value.describe()
    return str(value).replace(" ", "")


def format_graph(outputs: Iterable[Node], numbering: dict | None = None,
                 order: Sequence[Node] | None = None) -> str:
    """Stable text of the graph reachable from `outputs`: one node per line, `%i` numbering in
    topological order (or in `order`, e.g. a schedule), named leaves show their names. Tests compare
    this text."""
    outputs = list(outputs)
    order = topological_order(outputs) if order is None else list(order)
    num = numbering if numbering is not None else {}
    for n in order:
        num.setdefault(n, len(num))
    lines = []
    for n in order:
        args = ", ".join(f"%{num[i]}" for i in n.inputs)
        attrs = {k: v for k, v in n.attrs.items() if k not in ("shape", "dtype") or not n.inputs}
        if n.op in ("placeholder", "variable"):
            attrs = {"name": n.name, **({"init": attrs["init"]} if "init" in attrs else {})}
        attr_text = ", ".join(f"{k}={format_attr(v)}" for k, v in sorted(attrs.items()))
        body = n.op + (f"({args})" if n.inputs else "") + (f" {{{attr_text}}}" if attr_text else "")
        shape = ",".join(map(str, n.shape))
        lines.append(f"%{num[n]} = {body} : {n.dtype}[{shape}]")
    outs = ", ".join(f"%{num[o]}" for o in outputs)
    lines.append(f"return {outs}")
    return "\n".join(lines)
