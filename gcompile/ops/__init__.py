"""The op library. Each op lives in one class, in one module by family, holding side by side:

- `infer(node)`      its shape and dtype rule (raises ShapeError naming the op, the nodes and the shapes),
- `compute(node, *values)`  its numpy semantics (the reference executor calls this),
- `grad(node, g)`    its gradient rule, written with the graph API (so gradients of gradients work),
- `c_expr`           for elementwise ops, the C expression codegen substitutes into fused kernels.

`get_op(name)` finds an op; `register` (a class decorator) adds one.
"""
from .base import OPS, Op, get_op, register  # noqa: F401
from . import conv, elementwise, leaves, matmul, mode, nn, random, reduce, shape  # noqa: F401  (registration)
