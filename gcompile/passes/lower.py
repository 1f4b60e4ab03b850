"""lower: each scheduled node becomes a kernel spec — a template macro name and plain values.

This is where the decisions are made: index arithmetic for broadcasting, transposes and reductions is
turned into C expressions here, and launch shapes are chosen here, so the templates only substitute.
Views (reshape), leaves and scalar constants produce no kernel. What one kernel computes is exactly one
node (fusing several nodes into one kernel is the fuse pass's job, a later issue).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from ..errors import GCompileError
from ..gemm_tiles import choose_tile
from ..graph import Node
from ..ops import get_op
from ..ops.conv import windows_of
from ..ops.elementwise import Elementwise
from ..ops.random import dropout_threshold
from .plan_memory import is_literal, storage_root

C_TYPES = {"float32": "float", "float64": "double", "int32": "int32_t", "uint8": "uint8_t"}
NO_KERNEL = {"placeholder", "variable", "constant", "reshape"}


@dataclass
class Kernel:
    """One kernel: `kind` names the template macro; every other field is a plain value."""
    kind: str
    name: str                    # C identifier, unique in the program
    comment: str                 # the graph node(s) it implements, with shapes
    values: dict = field(default_factory=dict)


def c_literal(value, dtype: str) -> str:
    if dtype in ("float32", "float64"):
        v = float(value)
        if np.isnan(v):
            return "NAN"
        if np.isinf(v):
            return "INFINITY" if v > 0 else "-INFINITY"
        text = repr(v)
        return text + "f" if dtype == "float32" else text
    return str(int(value))


def strides(shape) -> list[int]:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return out[::-1]


def linear_index(var: str, shape, coefficients) -> str:
    """C expression for sum_d coord_d(var) * coefficients[d], coord_d taken from flat index `var` over `shape`.
    Unit dimensions and zero coefficients vanish; an identity mapping comes out as `var` itself."""
    if list(coefficients) == strides(shape):
        return var
    terms = []
    for d, (size, stride, coef) in enumerate(zip(shape, strides(shape), coefficients)):
        if size == 1 or coef == 0:
            continue
        coord = var if d == 0 else f"({var} % {size * stride})"
        coord = f"{coord} / {stride}" if stride != 1 else coord
        terms.append(f"({coord}) * {coef}" if coef != 1 else f"({coord})")
    return " + ".join(terms) or "0"


def broadcast_coefficients(in_shape, out_shape) -> list[int]:
    """Strides of the input, aligned to the output's dimensions, 0 where the input is broadcast."""
    lead = len(out_shape) - len(in_shape)
    st = strides(in_shape)
    return [0 if d < lead or in_shape[d - lead] == 1 else st[d - lead] for d in range(len(out_shape))]


def blocks_for(n: int) -> int:
    """Blocks of 256 threads for n independent elements; grid-stride loops cover what is left over."""
    return max(1, min((n + 255) // 256, 8192))


def map_values(out: str, n: int, expr: str) -> dict:
    return {"out": out, "n": n, "expr": expr, "blocks": blocks_for(n)}


def c_name(node: Node, index: int) -> str:
    return f"k{index}_{re.sub(r'[^0-9A-Za-z_]', '_', node.name)}"


def describe(node: Node) -> str:
    args = ", ".join(f"{i.name} {list(i.shape)}" for i in node.inputs)
    return f"{node.name} = {node.op}({args}) -> {list(node.shape)} {node.dtype}"


class Lowering:
    def __init__(self, plan, direction: str, precision: str = "fp32"):
        self.plan = plan
        self.direction = direction
        self.precision = precision     # "fp32" or "tf32": the GEMMs' arithmetic (gemm_tiles.py)

    def pointer(self, node: Node, const=True) -> str:
        """C expression of a node's typed pointer into the arena `A`."""
        ctype = C_TYPES[node.dtype]
        return f"(({'const ' if const else ''}{ctype}*)(A + {self.plan.offset_of(node, self.direction)}))"

    def operand(self, node: Node, index_expr: str) -> str:
        """C expression of one element of an input: scalar constants become literals."""
        root = storage_root(node)
        if is_literal(root):
            return c_literal(root.attrs["value"].reshape(-1)[0], node.dtype)
        return f"{self.pointer(node)}[{index_expr}]"

    def kernel(self, node: Node, index: int) -> Kernel | None:
        if node.op in NO_KERNEL:
            return None
        name, comment = c_name(node, index), f"{self.direction}: {describe(node)}"
        method = getattr(self, "lower_" + node.op, None)
        if method is None:
            if isinstance(get_op(node.op), Elementwise):
                method = self.lower_elementwise
            else:
                raise GCompileError(f"lower: no kernel for op {node.op!r} (node {node.describe()})")
        kind, values = method(node)
        return Kernel(kind, name, comment, values)

    # --- elementwise family: out[i] = expr(inputs at broadcast indices) -----------------------
    def map_kernel(self, node: Node, expr: str):
        return "map", map_values(self.pointer(node, const=False), node.size, expr)

    def lower_elementwise(self, node: Node):
        operands = [self.operand(x, linear_index("i", node.shape, broadcast_coefficients(x.shape, node.shape)))
                    for x in node.inputs]
        attrs = {k: c_literal(v, node.dtype) for k, v in node.attrs.items() if isinstance(v, float)}
        expr = get_op(node.op).c_expr.format(*operands, **attrs)
        return self.map_kernel(node, f"({C_TYPES[node.dtype]})({expr})")

    def lower_cast(self, node: Node):
        (x,) = node.inputs
        return self.map_kernel(node, f"({C_TYPES[node.dtype]})({self.operand(x, 'i')})")

    def lower_assign(self, node: Node):
        var, value = node.inputs
        return "map", map_values(self.pointer(var, const=False), node.size, self.operand(value, "i"))

    def lower_zeros_like(self, node: Node):
        return self.map_kernel(node, f"({C_TYPES[node.dtype]})0")

    def lower_ones_like(self, node: Node):
        return self.map_kernel(node, f"({C_TYPES[node.dtype]})1")

    def lower_broadcast_to(self, node: Node):
        (x,) = node.inputs
        return self.map_kernel(node, self.operand(x, linear_index("i", node.shape,
                                                                  broadcast_coefficients(x.shape, node.shape))))

    def lower_transpose(self, node: Node):
        (x,) = node.inputs
        in_strides = strides(x.shape)
        coefficients = [in_strides[p] for p in node.attrs["perm"]]
        return self.map_kernel(node, self.operand(x, linear_index("i", node.shape, coefficients)))

    def lower_one_hot(self, node: Node):
        (labels,) = node.inputs
        depth = node.attrs["depth"]
        return self.map_kernel(node, f"({C_TYPES[node.dtype]})({self.operand(labels, f'i / {depth}')} == "
                                     f"(int32_t)(i % {depth}) ? 1 : 0)")

    # --- reductions: out[o] = reduce_r in[base(o) + offset(r)] --------------------------------
    def reduction(self, node: Node, combine: str, init: str, scale: float | None):
        (x,) = node.inputs
        axes = node.attrs["axes"]
        x_strides = strides(x.shape)
        kept = [d for d in range(x.ndim) if d not in axes]
        kept_shape = [x.shape[d] for d in kept]
        red_shape = [x.shape[d] for d in axes]
        count = int(np.prod(red_shape, dtype=np.int64))
        base = linear_index("o", kept_shape, [x_strides[d] for d in kept]) if kept else "0"
        offset = linear_index("r", red_shape, [x_strides[d] for d in axes]) if axes else "0"
        return "reduce", {
            "out": self.pointer(node, const=False), "in": self.pointer(x), "outputs": node.size,
            "count": count, "base": base, "offset": offset, "combine": combine, "init": init,
            "scale": c_literal(scale, node.dtype) if scale is not None else None,
            "ctype": C_TYPES[node.dtype],
            # the cpu target sums floats in double (see runtime/gc_kernels_cpu.h); the cuda target in T
            "acc_ctype": "double" if node.dtype in ("float32", "float64") else C_TYPES[node.dtype],
            # few elements per output: one thread per output; many: one block per output, tree-reduced
            "per_block": count > 64, "blocks": blocks_for(node.size),
        }

    def lower_reduce_sum(self, node):
        return self.reduction(node, "add", "0", None)

    def lower_reduce_mean(self, node):
        x = node.inputs[0]
        return self.reduction(node, "add", "0", 1.0 / max(1, x.size // max(1, node.size)))

    def lower_reduce_max(self, node):
        return self.reduction(node, "max", "-INFINITY", None)

    # --- the rest -------------------------------------------------------------------------
    def lower_matmul(self, node: Node):
        a, b = node.inputs
        m, n = node.shape[-2:]
        ta, tb = node.attrs["trans_a"], node.attrs["trans_b"]
        k = a.shape[-2] if ta else a.shape[-1]
        batch = node.shape[0] if node.ndim == 3 else 1
        # a stack's matrices follow each other; a shared matrix (2-D, or a stack of one) has stride 0
        sa, sb = ((x.shape[-2] * x.shape[-1] if x.ndim == 3 and x.shape[0] > 1 else 0) for x in (a, b))
        precision = self.precision if node.dtype == "float32" else "fp32"   # tf32 is for float32 only
        return "matmul", {"a": self.pointer(a), "b": self.pointer(b), "c": self.pointer(node, const=False),
                          "m": m, "n": n, "k": k, "trans_a": int(ta), "trans_b": int(tb),
                          "ctype": C_TYPES[node.dtype], "batch": batch, "sa": sa, "sb": sb, "sc": m * n,
                          "tile": choose_tile(m, n, k, ta, tb, precision, batch)}

    def softmax_like(self, node: Node, log: bool):
        (x,) = node.inputs
        axis = node.attrs["axis"]
        outer = int(np.prod(x.shape[:axis], dtype=np.int64))
        inner = int(np.prod(x.shape[axis + 1:], dtype=np.int64))
        return "softmax", {"in": self.pointer(x), "out": self.pointer(node, const=False), "outer": outer,
                           "length": x.shape[axis], "inner": inner, "log": int(log),
                           "ctype": C_TYPES[node.dtype]}

    def lower_softmax(self, node):
        return self.softmax_like(node, False)

    def lower_log_softmax(self, node):
        return self.softmax_like(node, True)

    def lower_softmax_cross_entropy(self, node: Node):
        logits, labels = node.inputs
        return "softmax_cross_entropy", {
            "logits": self.pointer(logits), "labels": self.pointer(labels), "out": self.pointer(node, const=False),
            "batch": logits.shape[0], "classes": logits.shape[1], "ctype": C_TYPES[node.dtype],
            "label_ctype": C_TYPES[labels.dtype]}

    # --- convolutional networks: one gather per output element (runtime/gc_kernels_conv.h) ------------
    def window(self, node: Node, image_shape) -> str:
        """The gc_window literal of a window op over images of `image_shape` (N, C, H, W)."""
        n, c, h, w = image_shape
        (kh, kw), s, p = node.attrs["kernel"], node.attrs["stride"], node.attrs["padding"]
        oh, ow = windows_of(h, kh, s, p), windows_of(w, kw, s, p)
        return f"gc_window{{{n}, {c}, {h}, {w}, {kh}, {kw}, {oh}, {ow}, {s}, {p}}}"

    def lower_im2col(self, node: Node):
        (x,) = node.inputs
        ctype = C_TYPES[node.dtype]
        return self.map_kernel(node, f"gc_im2col_at<{ctype}>({self.pointer(x)}, {self.window(node, x.shape)}, i)")

    def lower_col2im(self, node: Node):
        (cols,) = node.inputs
        ctype = C_TYPES[node.dtype]
        return self.map_kernel(node, f"gc_col2im_at<{ctype}>({self.pointer(cols)}, "
                                     f"{self.window(node, node.shape)}, i)")

    def pool(self, node: Node, is_max: bool):
        (x,) = node.inputs
        ctype = C_TYPES[node.dtype]
        return self.map_kernel(node, f"gc_pool_at<{ctype}, {str(is_max).lower()}>({self.pointer(x)}, "
                                     f"{self.window(node, x.shape)}, i)")

    def lower_max_pool2d(self, node):
        return self.pool(node, True)

    def lower_avg_pool2d(self, node):
        return self.pool(node, False)

    def lower_max_pool2d_grad(self, node: Node):
        x, g = node.inputs
        ctype = C_TYPES[node.dtype]
        return self.map_kernel(node, f"gc_pool_grad_at<{ctype}, true>({self.pointer(x)}, {self.pointer(g)}, "
                                     f"{self.window(node, x.shape)}, i)")

    def lower_avg_pool2d_grad(self, node: Node):
        (g,) = node.inputs
        ctype = C_TYPES[node.dtype]
        return self.map_kernel(node, f"gc_pool_grad_at<{ctype}, false>(({ctype}*)0, {self.pointer(g)}, "
                                     f"{self.window(node, node.shape)}, i)")

    def lower_dropout_mask(self, node: Node):
        (step,) = node.inputs
        rate, seed = node.attrs["rate"], node.attrs["seed"]
        keep = c_literal(1.0 / (1.0 - rate), node.dtype)  # the literal rounds as numpy's dtype.type() does
        return self.map_kernel(node, f"gc_dropout_mask_at<{C_TYPES[node.dtype]}>(i, {self.operand(step, '0')}, "
                                     f"{seed}ull, {dropout_threshold(rate)}u, {keep})")


def lower(schedules: dict[str, list[Node]], plan, precision: str = "fp32") -> dict[str, list[Kernel]]:
    """Kernel specs for each schedule, in schedule order. Kernel names are unique across schedules."""
    out, index = {}, 0
    for direction, order in schedules.items():
        lowering, kernels = Lowering(plan, direction, precision), []
        for node in order:
            kernel = lowering.kernel(node, index)
            if kernel is not None:
                kernels.append(kernel)
                index += 1
        out[direction] = kernels
    return out
