"""The graph IR: nodes with static shapes and dtypes, and the API that builds them.

A Node is one value in a computation: an op name, input nodes, attributes, a static shape and a dtype.
Shapes and dtypes are inferred when the node is created (the op's `infer` rule), so a malformed graph fails
at the line of the model file that built it, with a ShapeError naming the op, the nodes and the shapes.

The graph is the set of nodes reachable from whatever outputs a caller names; there is no global graph
object. `topological_order` and `format_graph` give the deterministic order and the stable text that every
pass and test relies on.
"""
from __future__ import annotations

import contextlib
import itertools
import threading
from typing import Iterable, Sequence

import numpy as np

from .errors import ShapeError

DTYPES = ("float32", "float64", "int32", "uint8")
MAX_NDIM = 8   # the generated tables (and the data and checkpoint readers) hold at most 8 dimensions
FLOAT_DTYPES = ("float32", "float64")

NODE_IDS = itertools.count()   # every node's id, in the order they were made
_phases = threading.local()   # .stack: the phases this thread's nodes are being made in (phase())
PHASES = ("fwd", "bwd", "update")


@contextlib.contextmanager
def phase(name: str):
    """Nodes this thread makes inside are of phase `name`: "bwd" (gradients), "update" (the optimizer, the
    guard) — what the generated kernels' comments say of each node they implement. Outside any, "fwd"; an
    assign is "update"."""
    assert name in PHASES, name
    stack = _phases.__dict__.setdefault("stack", [])
    stack.append(name)
    try:
        yield
    finally:
        stack.pop()


def current_phase() -> str:
    stack = getattr(_phases, "stack", None)
    return stack[-1] if stack else "fwd"


def canonical_dtype(dtype) -> str:
    """The dtype's name, one of DTYPES (numpy's spellings accepted: np.float32, 'f4', 'double')."""
    supported = f"gcompile supports {', '.join(DTYPES)}"
    if dtype is None:     # (numpy reads None as float64)
        raise ShapeError(f"dtype None: give one; {supported}")
    try:
        name = np.dtype(dtype).name
    except (TypeError, ValueError):
        raise ShapeError(f"unknown dtype {dtype!r}; {supported}") from None
    if name not in DTYPES:
        given = repr(name) if dtype == name else f"{dtype!r} ({name})"
        raise ShapeError(f"unsupported dtype {given}; {supported}")
    return name


def shown(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def converted(value, dtype: str | None, what: str) -> np.ndarray:
    """value (a number, sequence or array) as an array of `dtype` (None: int32 for integers and booleans,
    float32 otherwise), refused where that would change it: a fraction, NaN or an infinity into an integer
    type, a number out of the type's range (a finite float that would become inf), anything that is not a real
    number. Floats round to a float type's precision."""
    if dtype is not None:
        dtype = canonical_dtype(dtype)
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError, OverflowError) as e:
        raise ShapeError(f"{what}: {shown(value)} is not an array of numbers ({e})") from None
    if dtype is None:
        dtype = "int32" if arr.dtype.kind in "iub" else "float32"
    target = np.dtype(dtype)
    if arr.dtype == object and arr.size and all(isinstance(v, int) for v in arr.flat):   # ints beyond 64 bits
        if target.kind != "f":
            raise ShapeError(f"{what}: {shown(value)} is out of the range of {dtype}")
        arr = arr.astype(np.float64)
    if arr.dtype.kind not in "biuf":
        raise ShapeError(f"{what}: {shown(value)} is not a real number (numpy makes it {arr.dtype})")
    if target.kind in "iu" and arr.size:
        if arr.dtype.kind == "f" and not (np.isfinite(arr).all() and (arr == np.trunc(arr)).all()):
            raise ShapeError(f"{what}: {shown(value)} is not a whole number, as a {dtype} value must be (cast "
                             f"the other operand to a float type)")
        info = np.iinfo(target)
        if arr.min() < info.min or arr.max() > info.max:
            raise ShapeError(f"{what}: {shown(value)} is out of the range of {dtype} [{info.min}, {info.max}]")
    with np.errstate(over="ignore"):
        out = arr.astype(target)
    if target.kind == "f" and arr.dtype.kind == "f" and (np.isfinite(arr) & ~np.isfinite(out)).any():
        raise ShapeError(f"{what}: {shown(value)} is out of the range of {dtype}")
    return out


class Node:
    """One value of the graph. Build nodes with the API functions, not with this constructor."""

    __slots__ = ("id", "name", "op", "inputs", "attrs", "shape", "dtype", "phase")
    __array_priority__ = 1000  # numpy scalars on the left defer to Node's reflected operators

    def __init__(self, op: str, inputs: Sequence["Node"], attrs: dict | None = None, name: str | None = None):
        from .ops import get_op

        self.id = next(NODE_IDS)
        self.op = op
        self.inputs = tuple(i if isinstance(i, Node) else as_node(i, what=op) for i in inputs)
        self.attrs = dict(attrs or {})
        if name is not None and (not isinstance(name, str) or any(ord(c) < 32 or ord(c) == 127 for c in name)):
            # (the generated code's comments and tables carry names: a newline would end a comment)
            raise ShapeError(f"{op}: name {name!r} must be a string without control characters")
        self.name = name or f"{op}_{self.id}"
        self.phase = "update" if op == "assign" else current_phase()
        self.shape, self.dtype = get_op(op).infer(self)
        self.shape = tuple(int(d) for d in self.shape)
        if len(self.shape) > MAX_NDIM:
            raise ShapeError(f"{op}: {self.name} would have {len(self.shape)} dimensions {self.shape}; gcompile "
                             f"supports at most {MAX_NDIM}")

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
    def __matmul__(self, other): return matmul(self, as_node(other, like=self, what="matmul"))
    def __rmatmul__(self, other): return matmul(as_node(other, like=self, what="matmul"), self)
    def __neg__(self): return neg(self)
    def __pos__(self): return self

    def __pow__(self, exponent): return pow(self, exponent)

    @property
    def T(self) -> "Node":
        return transpose(self)


# ---------------------------------------------------------------------------------------------
# Leaves
# ---------------------------------------------------------------------------------------------
def checked_shape(where: str, shape) -> tuple[int, ...]:
    """A static shape as given, checked: a sequence of whole numbers, each at least 1 (a static shape holds
    values in every dimension; 2.5 is not silently 2, nor -3 left to fail at compile time). `where` names
    the node in the error."""
    dims = whole_numbers(where, "shape", shape)
    for d in dims:
        if d < 1:
            raise ShapeError(f"{where}: shape {dims!r} has a dimension of {d}; every dimension must be at least 1")
    return dims


def is_whole(value) -> bool:
    """An int or numpy integer, not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def leaf_shape(op: str, name: str, shape) -> tuple[int, ...]:
    """A placeholder's or variable's shape (checked_shape)."""
    return checked_shape(f"{op} {name!r}", shape)


def rebuilt(node: Node, inputs: Sequence[Node]) -> Node:
    """node made again over other inputs (a pass's rewrite): its op, attributes, name and phase kept."""
    return node if tuple(inputs) == node.inputs else in_phase_of(node, Node(node.op, inputs, node.attrs,
                                                                            name=node.name))


def in_phase_of(node: Node, new: Node) -> Node:
    """`new`, which stands for `node` (a rewrite of it), given node's phase."""
    new.phase = node.phase
    return new


def placeholder(name: str, shape: Sequence[int], dtype="float32") -> Node:
    """A value fed at run time (a batch of inputs or labels)."""
    return Node("placeholder", (), {"shape": leaf_shape("placeholder", name, shape),
                                    "dtype": canonical_dtype(dtype)}, name=name)


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
    return Node("variable", (), {"shape": leaf_shape("variable", name, shape), "dtype": canonical_dtype(dtype),
                                 "init": init, "trainable": trainable}, name=name)


def constant(value, dtype=None, name: str | None = None, what: str = "constant") -> Node:
    """A value fixed at compile time (without `dtype`: int32 for integers and booleans, float32 otherwise),
    refused where the dtype cannot hold it (`converted`). Scalars are emitted as literals; arrays as
    initialized data."""
    return Node("constant", (), {"value": converted(value, dtype, what)}, name=name)


def as_node(value, like: Node | None = None, what: str = "constant") -> Node:
    """Nodes pass through; Python numbers, sequences and arrays become constants, of `like`'s dtype where
    there is a `like` (the other operand: as numpy's Python scalars do) — refused where that dtype cannot hold
    them (2.5 or 2**31 beside an int32 node)."""
    if isinstance(value, Node):
        return value
    return constant(value, dtype=like.dtype if like is not None else None,
                    what=f"{what}: an operand beside {like.describe()}" if like is not None else what)


# ---------------------------------------------------------------------------------------------
# Op constructors (the public graph API). Each is a thin wrapper: the rules live in gcompile.ops.
# ---------------------------------------------------------------------------------------------
def _binary(op: str, a, b) -> Node:
    if not isinstance(a, Node) and not isinstance(b, Node):
        raise ShapeError(f"{op}: at least one operand must be a graph node")
    a = as_node(a, like=b if isinstance(b, Node) else None, what=op)
    b = as_node(b, like=a, what=op)
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
def cos(x): return Node("cos", (x,))
def sin(x): return Node("sin", (x,))
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
    a = as_node(a, like=b if isinstance(b, Node) else None, what="where")
    return Node("where", (cond, a, as_node(b, like=a, what="where")))


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
    return Node("transpose", (x,), {"perm": whole_numbers("transpose", "perm", perm)})


def reshape(x, shape: Sequence[int]):
    return Node("reshape", (x,), {"shape": whole_numbers("reshape", "shape", shape)})   # (-1: the rest)


def whole_numbers(op: str, what: str, values) -> tuple[int, ...]:
    """A sequence of whole numbers as ints (their ranges are the op's infer's to check): 3.9 is not silently 3."""
    try:
        items = tuple(values)
    except TypeError:
        raise ShapeError(f"{op}: {what} must be a sequence of whole numbers, not {values!r}") from None
    for v in items:
        if not is_whole(v):
            raise ShapeError(f"{op}: {what} {items!r} has {v!r}, not a whole number")
    return tuple(int(v) for v in items)


def broadcast_to(x, shape: Sequence[int]):
    return Node("broadcast_to", (x,), {"shape": checked_shape("broadcast_to", shape)})


def _reduce(op, x, axis, keepdims):
    return Node(op, (x,), {"axes": normalize_axes(axis, len(x.shape), op, x), "keepdims": bool(keepdims)})


def reduce_sum(x, axis=None, keepdims=False): return _reduce("reduce_sum", x, axis, keepdims)
def reduce_mean(x, axis=None, keepdims=False): return _reduce("reduce_mean", x, axis, keepdims)
def reduce_max(x, axis=None, keepdims=False): return _reduce("reduce_max", x, axis, keepdims)


def softmax(x, axis: int = -1):
    return Node("softmax", (x,), {"axis": one_axis(axis, "softmax", x)})


def log_softmax(x, axis: int = -1):
    return Node("log_softmax", (x,), {"axis": one_axis(axis, "log_softmax", x)})


def one_axis(axis, op: str, x) -> int:
    """The one axis an op like softmax normalizes over (a whole number; a tuple of axes is refused)."""
    x = as_node(x)
    if not is_whole(axis):
        raise ShapeError(f"{op}: axis must be one whole number, not {axis!r}, for {x.describe()}")
    return normalize_axes(axis, len(x.shape), op, x)[0]


def one_hot(labels, depth: int, dtype="float32"):
    if not is_whole(depth) or depth < 1:
        raise ShapeError(f"one_hot: depth must be a whole number of at least 1, not {depth!r}")
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


# ---------------------------------------------------------------------------------------------
# Convolutional networks (layout NCHW; the window ops' rules are in gcompile/ops/conv.py)
# ---------------------------------------------------------------------------------------------
def _window(op: str, kernel, stride, padding) -> dict:
    """A window op's attributes, checked: a kernel of one whole number or a pair of them, a whole stride (None:
    the kernel's height KH, the pools' default) and padding (their ranges are the op's infer's to check). 1.5
    is not silently 1."""
    try:
        pair = (kernel, kernel) if is_whole(kernel) else tuple(kernel)
    except TypeError:
        pair = ()
    if len(pair) != 2 or not all(is_whole(k) for k in pair):
        raise ShapeError(f"{op}: kernel must be a whole number or a pair of them, not {kernel!r}")
    stride = pair[0] if stride is None else stride
    for name, value in (("stride", stride), ("padding", padding)):
        if not is_whole(value):
            raise ShapeError(f"{op}: {name} must be a whole number, not {value!r}")
    return {"kernel": tuple(int(k) for k in pair), "stride": int(stride), "padding": int(padding)}


def im2col(x, kernel, stride: int = 1, padding: int = 0):
    """Patches of x (N, C, H, W) -> (N, C*KH*KW, OH*OW): row (c, kh, kw), column (oh, ow)."""
    return Node("im2col", (x,), _window("im2col", kernel, stride, padding))


def col2im(cols, image_size, kernel, stride: int = 1, padding: int = 0):
    """The adjoint of im2col: (N, C*KH*KW, OH*OW) -> (N, C, H, W), overlapping patch entries summed."""
    return Node("col2im", (cols,), {**_window("col2im", kernel, stride, padding),
                                    "image_size": whole_numbers("col2im", "image_size", image_size)})


def conv2d(x, w, b=None, stride: int = 1, padding: int = 0):
    """Cross-correlation of x (N, C, H, W) with weights w (Cout, C, KH, KW), plus bias b (Cout,) if given.

    Lowered as one GEMM per example: w viewed as (Cout, C*KH*KW) times the example's patches
    (C*KH*KW, OH*OW) gives (Cout, OH*OW), already NCHW; the bias is an elementwise consumer of the GEMM."""
    if x.ndim != 4 or w.ndim != 4 or w.shape[1] != x.shape[1]:
        raise ShapeError(f"conv2d: expected x (N, C, H, W) and w (Cout, C, KH, KW) with the same C, got "
                         f"{x.describe()} and {w.describe()}")
    if x.dtype not in FLOAT_DTYPES or w.dtype != x.dtype:
        raise ShapeError(f"conv2d: x and w must be float values of one dtype, got {x.describe()} and {w.describe()}")
    n, c, h, wd = x.shape
    cout, _, kh, kw = w.shape
    _window("conv2d", (kh, kw), stride, padding)
    from .ops.conv import out_size   # the errors name conv2d, not the im2col it is lowered to
    oh, ow = out_size("conv2d", x, h, kh, stride, padding), out_size("conv2d", x, wd, kw, stride, padding)
    if (kh, kw, stride, padding) == (1, 1, 1, 0):
        cols = reshape(x, (n, c, h * wd))  # a 1x1 convolution reads the image itself
    else:
        cols = im2col(x, (kh, kw), stride, padding)
    out = matmul(reshape(w, (cout, c * kh * kw)), cols)                      # (N, Cout, OH*OW)
    if b is not None:
        if b.shape != (cout,):
            raise ShapeError(f"conv2d: bias {b.describe()} must have shape ({cout},) for weights {w.describe()}")
        out = out + per_image(b, (n, cout, 1))
    return reshape(out, (n, cout, oh, ow))


def per_image(v, shape):
    """Per-channel values v (C,) broadcast to `shape` (N, C, 1, ...): each example gets its own copy. Added to
    an (N, C, ...) image, the gradient then sums in two parallel stages — over each image, then over the
    batch — rather than in one long reduction per channel (C outputs would leave most of a GPU idle)."""
    return broadcast_to(reshape(v, (1,) + tuple(shape[1:])), shape)


def max_pool2d(x, kernel, stride: int | None = None, padding: int = 0):
    """Max over kernel windows (padding counts as -inf); stride defaults to the kernel's height KH, on both axes
    (a (2, 3) kernel moves 2 along W too: give stride for another)."""
    return Node("max_pool2d", (x,), _window("max_pool2d", kernel, stride, padding))


def avg_pool2d(x, kernel, stride: int | None = None, padding: int = 0):
    """Mean over kernel windows (padding counts as zeros, divided by KH*KW); stride defaults to the kernel's
    height KH, on both axes."""
    return Node("avg_pool2d", (x,), _window("avg_pool2d", kernel, stride, padding))


def global_avg_pool(x):
    """(N, C, H, W) -> (N, C): the mean of each channel."""
    if x.ndim != 4:
        raise ShapeError(f"global_avg_pool: expected an NCHW image (4-D), got {x.describe()}")
    return reduce_mean(x, (2, 3))


def flatten(x):
    """(N, ...) -> (N, everything else): a view."""
    return reshape(x, (x.shape[0], -1))


def mode_select(train_value, eval_value, train_updates=()):
    """train_value when the graph runs a training step, eval_value when it evaluates; the assign nodes in
    train_updates join every training step (see gcompile/modes.py)."""
    return Node("mode_select", (train_value, eval_value), {"train_updates": tuple(train_updates)})


def batch_norm(x, gamma, beta, running_mean, running_var, momentum: float = 0.1, eps: float = 1e-5):
    """Batch normalization over every axis but 1 (the channels) of x (N, C) or (N, C, H, W).

    Training: batch mean and (biased) variance normalize x; running_mean and running_var (variables) move
    toward them by `momentum` (the variance unbiased, as PyTorch does). Evaluation: the running values.
    Composed of reductions and elementwise ops, so the normalization is one elementwise chain."""
    if x.ndim < 2:
        raise ShapeError(f"batch_norm: x {x.describe()} must have a batch axis and a channel axis, (N, C) or "
                         "(N, C, H, W)")
    c = x.shape[1]
    for v in (gamma, beta, running_mean, running_var):
        if v.shape != (c,) or v.dtype != x.dtype:
            raise ShapeError(f"batch_norm: {v.describe()} must have shape ({c},) and x's dtype, for x "
                             f"{x.describe()}")
    count = x.size // c
    if count < 2:
        raise ShapeError(f"batch_norm: {x.describe()} has {count} value per channel; batch statistics need 2")
    # statistics in two stages (over each image, then over the batch) and per-channel values broadcast per
    # image (see per_image): every reduction of the step and of its gradient has N*C or C*N-sized work
    images = (x.shape[0], c) + (1,) * (x.ndim - 2)
    inner = tuple(range(2, x.ndim))

    def batch_mean(v):
        return reduce_mean(reduce_mean(v, inner, keepdims=True) if inner else v, 0, keepdims=True)

    def channels(v):
        return per_image(reshape(v, (c,)), images)

    mean = batch_mean(x)
    centered = x - broadcast_to(mean, images)
    var = batch_mean(centered * centered)
    train = centered * channels(gamma / sqrt(reshape(var, (c,)) + eps)) + channels(beta)
    evaluated = (x - channels(running_mean)) * channels(gamma / sqrt(running_var + eps)) + channels(beta)
    updates = [assign(running_mean, running_mean * (1.0 - momentum) + reshape(mean, (c,)) * momentum),
               assign(running_var, running_var * (1.0 - momentum)
                      + reshape(var, (c,)) * (momentum * count / (count - 1)))]
    return mode_select(train, evaluated, updates)


def step_counter() -> Node:
    """The int32 scalar variable `step`: the number of training steps done. gc.Program increments it once per
    step; dropout masks and learning-rate schedules read it. One node per process, shared by every graph."""
    global _step
    if _step is None:
        from .init import Constant
        _step = variable("step", (), init=Constant(0), dtype="int32", trainable=False)
    return _step


_step = None


def dropout(x, rate: float, seed: int):
    """Training: x * mask, the mask 0 with probability `rate`, else 1 / (1 - rate), fresh each step
    (Philox4x32-10 of (element, step), key `seed`: give each dropout its own seed). Evaluation: x."""
    if rate == 0:
        return x
    mask = Node("dropout_mask", (step_counter(),), {"shape": x.shape, "rate": float(rate), "seed": int(seed),
                                                     "dtype": x.dtype})
    return mode_select(x * mask, x)


def normalize_axes(axis, ndim: int, op: str, x: Node) -> tuple:
    if axis is None:
        return tuple(range(ndim))
    try:
        axes = (axis,) if is_whole(axis) else tuple(axis)
    except TypeError:
        axes = (axis,)
    out = []
    for a in axes:
        if not is_whole(a):
            raise ShapeError(f"{op}: axis {a!r} is not a whole number, for {x.describe()}")
        if not -ndim <= a < ndim:
            raise ShapeError(f"{op}: axis {a} is out of range for {x.describe()} ({ndim} dimensions)")
        out.append(int(a) % ndim if ndim else 0)
    if len(set(out)) != len(out):
        raise ShapeError(f"{op}: repeated axis in {axes} for {x.describe()}")
    return tuple(sorted(out))


# ---------------------------------------------------------------------------------------------
# Traversal and printing
# ---------------------------------------------------------------------------------------------
def topological_order(outputs: Iterable[Node], inputs_of=lambda node: node.inputs, done=()) -> list[Node]:
    """Inputs before users; deterministic: depth-first from the outputs, inputs in order. `inputs_of(node)`
    names the edges to follow (default: all inputs); nodes in `done` and what only they reach are left out."""
    order, seen = [], set(done)
    for root in outputs:
        if root in seen:
            continue
        stack = [(root, iter(inputs_of(root)))]
        seen.add(root)
        while stack:
            node, it = stack[-1]
            child = next((c for c in it if c not in seen), None)
            if child is None:
                stack.pop()
                order.append(node)
            else:
                seen.add(child)
                stack.append((child, iter(inputs_of(child))))
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
    if isinstance(value, tuple) and value and all(isinstance(v, Node) for v in value):
        return "[" + ",".join(v.name for v in value) + "]"   # nodes an attribute refers to (train_updates)
    if callable(value):   # a plain function as an initializer: its name, not its address (the build key hashes
        # this text: an address differs in every process; the values it makes are hashed apart)
        name = getattr(value, "__qualname__", None) or type(value).__qualname__
        return f"<{getattr(value, '__module__', None) or '?'}.{name}>".replace(" ", "")
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
