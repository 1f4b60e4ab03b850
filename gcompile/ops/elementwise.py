"""Elementwise ops (numpy broadcasting). `c_expr` is the C expression of one element: `{0}`, `{1}` are
the operands, `{name}` an attribute; fused kernels substitute these (the same text serves C++ and CUDA,
whose math functions are overloaded for float and double). A NaN operand gives NaN as in numpy (and
PyTorch): relu, maximum and minimum do not swallow it, so the numerical guard sees what the reference sees
(`x != x` holds for NaN only)."""
from __future__ import annotations

import numpy as np

from .. import graph as G
from .base import Op, broadcast_shapes, register, require_float, same_dtype


class Elementwise(Op):
    arity = 1
    float_only = False
    c_expr = ""
    wraps = False   # on int32, c_expr runs on uint32_t operands: it wraps as numpy's int32 arrays do (signed
                    # overflow is undefined in C++: the compiler folded `x + 1 >= x` to 1 at INT32_MAX)

    def c_text(self, attrs: dict) -> str:
        """The C expression of a node with these attributes (c_expr, unless an attribute picks another)."""
        return self.c_expr

    def infer(self, node):
        if self.float_only:
            for x in node.inputs:
                require_float(self.name, x)
        return broadcast_shapes(self.name, *node.inputs), same_dtype(self.name, *node.inputs)


# --- binary arithmetic ---------------------------------------------------------------------------
@register
class Add(Elementwise):
    name, arity, c_expr, wraps = "add", 2, "({0} + {1})", True
    def compute(self, node, a, b): return a + b
    def grad(self, node, g): return [g, g]


@register
class Sub(Elementwise):
    name, arity, c_expr, wraps = "sub", 2, "({0} - {1})", True
    def compute(self, node, a, b): return a - b
    def grad(self, node, g): return [g, -g]


@register
class Mul(Elementwise):
    name, arity, c_expr, wraps = "mul", 2, "({0} * {1})", True
    def compute(self, node, a, b): return a * b
    def grad(self, node, g):
        a, b = node.inputs
        return [g * b, g * a]


@register
class Div(Elementwise):
    name, arity, c_expr = "div", 2, "({0} / {1})"
    def compute(self, node, a, b):
        if node.dtype not in G.FLOAT_DTYPES:  # C's `/` on integers truncates toward zero; numpy's // floors
            with np.errstate(divide="ignore", over="ignore"):   # x / 0 is 0, INT32_MIN / -1 wraps: defined
                q = np.floor_divide(a, b)
                return q + ((q < 0) & (q * b != a))
        return a / b
    def grad(self, node, g):
        a, b = node.inputs
        return [g / b, -(g * a) / (b * b)]


@register
class Maximum(Elementwise):
    name, arity, c_expr = "maximum", 2, "({0} >= {1} || {0} != {0} ? {0} : {1})"
    def compute(self, node, a, b): return np.maximum(a, b)
    def grad(self, node, g):
        a, b = node.inputs
        pick_a = G.greater_equal(a, b)
        return [g * pick_a, g * (1.0 - pick_a)]


@register
class Minimum(Elementwise):
    name, arity, c_expr = "minimum", 2, "({0} <= {1} || {0} != {0} ? {0} : {1})"
    def compute(self, node, a, b): return np.minimum(a, b)
    def grad(self, node, g):
        a, b = node.inputs
        pick_a = G.greater_equal(b, a)
        return [g * pick_a, g * (1.0 - pick_a)]


# --- masks: 1 where the comparison holds, else 0, in the operands' dtype --------------------------
@register
class GreaterEqual(Elementwise):
    name, arity, c_expr, differentiable = "greater_equal", 2, "({0} >= {1} ? 1 : 0)", False
    def compute(self, node, a, b): return (a >= b).astype(a.dtype)
    def grad(self, node, g): return [None, None]


@register
class Equal(Elementwise):
    name, arity, c_expr, differentiable = "equal", 2, "({0} == {1} ? 1 : 0)", False
    def compute(self, node, a, b): return (a == b).astype(a.dtype)
    def grad(self, node, g): return [None, None]


# --- unary ------------------------------------------------------------------------------------
@register
class Neg(Elementwise):
    name, c_expr, wraps = "neg", "(-{0})", True
    def compute(self, node, x): return -x
    def grad(self, node, g): return [-g]


@register
class Exp(Elementwise):
    name, c_expr, float_only = "exp", "exp({0})", True
    def compute(self, node, x): return np.exp(x)
    def grad(self, node, g): return [g * node]


@register
class Log(Elementwise):
    name, c_expr, float_only = "log", "log({0})", True
    def compute(self, node, x): return np.log(x)
    def grad(self, node, g): return [g / node.inputs[0]]


@register
class Sqrt(Elementwise):
    name, c_expr, float_only = "sqrt", "sqrt({0})", True
    def compute(self, node, x): return np.sqrt(x)
    def grad(self, node, g): return [g * 0.5 / node]


@register
class Tanh(Elementwise):
    name, c_expr, float_only = "tanh", "tanh({0})", True
    def compute(self, node, x): return np.tanh(x)
    def grad(self, node, g): return [g * (1.0 - node * node)]


@register
class Cos(Elementwise):
    name, c_expr, float_only = "cos", "cos({0})", True
    def compute(self, node, x): return np.cos(x)
    def grad(self, node, g): return [-(g * G.sin(node.inputs[0]))]


@register
class Sin(Elementwise):
    name, c_expr, float_only = "sin", "sin({0})", True
    def compute(self, node, x): return np.sin(x)
    def grad(self, node, g): return [g * G.cos(node.inputs[0])]


@register
class Sigmoid(Elementwise):
    name, float_only = "sigmoid", True
    c_expr = "({0} >= 0 ? 1 / (1 + exp(-{0})) : exp({0}) / (1 + exp({0})))"
    def compute(self, node, x):
        e = np.exp(-np.abs(x))
        return np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype)
    def grad(self, node, g): return [g * node * (1.0 - node)]


@register
class Relu(Elementwise):
    name, c_expr = "relu", "({0} <= 0 ? 0 : {0})"
    def compute(self, node, x): return np.maximum(x, 0).astype(x.dtype)
    def grad(self, node, g): return [G.relu_grad(node.inputs[0], g)]


@register
class ReluGrad(Elementwise):
    """g where x > 0, else 0: the backward of relu, an op of its own so GEMM epilogues can absorb it."""
    name, arity, c_expr = "relu_grad", 2, "({0} > 0 ? {1} : 0)"
    def compute(self, node, x, g): return np.where(x > 0, g, 0).astype(g.dtype)
    def grad(self, node, g): return [None, G.relu_grad(node.inputs[0], g)]


@register
class Pow(Elementwise):
    """x ** exponent for a scalar exponent (attribute `exponent`)."""
    name, c_expr, float_only = "pow", "pow({0}, {exponent})", True
    def c_text(self, attrs):   # numpy takes sqrt for 0.5: NaN at -inf and -0 at -0, where C's pow gives inf and 0
        return "sqrt({0})" if attrs["exponent"] == 0.5 else self.c_expr
    def compute(self, node, x): return np.power(x, node.attrs["exponent"]).astype(x.dtype)
    def grad(self, node, g):
        e = node.attrs["exponent"]
        x = node.inputs[0]
        if e == 0.0:   # x ** 0 is 1 everywhere (0 ** 0 too): 0 * x ** -1 would be NaN at 0
            return [G.zeros_like(x)]
        return [g * (e * G.pow(x, e - 1.0)) if e != 1.0 else g]


# --- selection and the finiteness test (the numerical guard of gcompile/optim.py uses both) --------------
@register
class Where(Elementwise):
    """where(cond, a, b): a where cond is nonzero, else b. cond may have any dtype; a and b share one."""
    name, arity, c_expr = "where", 3, "({0} ? {1} : {2})"
    def infer(self, node):
        _, a, b = node.inputs
        return broadcast_shapes(self.name, *node.inputs), same_dtype(self.name, a, b)
    def compute(self, node, cond, a, b): return np.where(cond != 0, a, b)
    def grad(self, node, g):
        cond = node.inputs[0]
        return [None, G.where(cond, g, 0.0), G.where(cond, 0.0, g)]


@register
class IsFinite(Elementwise):
    """1 where x is neither infinite nor NaN, else 0, in x's dtype (a mask, as equal's)."""
    name, c_expr, float_only, differentiable = "isfinite", "(isfinite({0}) ? 1 : 0)", True, False
    def compute(self, node, x): return np.isfinite(x).astype(x.dtype)
    def grad(self, node, g): return [None]
