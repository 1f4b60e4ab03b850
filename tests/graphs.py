"""Graphs the pass tests share: the MNIST MLP program and random DAGs (a hypothesis strategy)."""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

import gcompile as gc


def mlp_program(batch: int, dims=(784, 256, 100, 10), lr=0.1) -> gc.Program:
    """relu MLP with softmax_cross_entropy and SGD; named output "logits"."""
    x = gc.placeholder("x", (batch, dims[0]))
    y = gc.placeholder("y", (batch,), dtype="int32")
    h, params = x, []
    for i, (fan_in, fan_out) in enumerate(zip(dims, dims[1:]), start=1):
        W = gc.variable(f"W{i}", (fan_in, fan_out), init=gc.init.normal(0.1, seed=i))
        b = gc.variable(f"b{i}", (fan_out,), init=gc.init.normal(0.1, seed=100 + i))
        params += [W, b]
        h = h @ W + b
        if i < len(dims) - 1:
            h = gc.relu(h)
    loss = gc.softmax_cross_entropy(h, y)
    return gc.Program(loss, params, optimizer=gc.SGD(lr=lr), outputs={"logits": h})


def mlp_feed(prog: gc.Program, seed=0) -> dict:
    rng = np.random.RandomState(seed)
    x, y = prog.inputs
    classes = prog.outputs["logits"].shape[1]
    return {x: rng.rand(*x.shape).astype("float32"), y: rng.randint(0, classes, y.shape).astype("int32")}


# --- random graphs -----------------------------------------------------------------------------
UNARY = (gc.neg, gc.relu, gc.tanh, gc.sigmoid)
BINARY = (gc.add, gc.sub, gc.mul, gc.maximum)
STEP_KINDS = ("unary", "binary", "scalar", "matmul", "reduce", "reshape", "transpose", "broadcast",
              "repeat", "assign")


def broadcastable(a, b) -> bool:
    return all(x == y or 1 in (x, y) for x, y in zip(a.shape[::-1], b.shape[::-1]))


def add_step(pool: list, kind: str, i: int, j: int, p: int, assigned: dict) -> None:
    """Append one node to `pool` built from pool[-1-i], pool[-1-j] (recent nodes; indices wrap) and a small
    parameter p; a step that does not fit the operands' shapes adds a unary node instead. An assign goes to
    `assigned` (variable -> assign), not to the pool: nothing reads it, as in a training step."""
    a, b = pool[-1 - i % len(pool)], pool[-1 - j % len(pool)]
    node = None
    if kind == "binary" and broadcastable(a, b):
        node = BINARY[p % 4](a, b)
    elif kind == "scalar":    # the constants simplify's identities look for
        node = (gc.add, gc.sub, gc.mul, gc.div)[p % 4](a, (0.0, 1.0, 2.0, 0.5)[p // 4 % 4])
    elif kind == "matmul" and a.ndim == 2 and b.ndim == 2:
        for ta, tb in ((False, False), (True, False), (False, True), (True, True)):
            if a.shape[0 if ta else 1] == b.shape[1 if tb else 0]:
                node = gc.matmul(a, b, trans_a=ta, trans_b=tb)
                break
    elif kind == "reduce" and a.ndim:
        node = (gc.reduce_sum, gc.reduce_mean, gc.reduce_max)[p % 3](a, axis=p % a.ndim, keepdims=p % 2 == 0)
    elif kind == "reshape":
        node = gc.reshape(a, ((-1,), (1, -1), (-1, 1), a.shape)[p % 4])
    elif kind == "transpose":
        node = gc.transpose(a) if p % 2 else gc.transpose(a, tuple(range(a.ndim)))
    elif kind == "broadcast" and a.ndim < gc.graph.MAX_NDIM:
        node = gc.broadcast_to(a, ((2,) + a.shape, a.shape)[p % 2])
    elif kind == "repeat" and a.inputs and a.op != "assign":     # same op, inputs and attrs: a CSE target
        node = gc.Node(a.op, a.inputs, a.attrs)
    elif kind == "assign":
        targets = [v for v in pool if v.op == "variable" and v.shape == a.shape and v not in assigned]
        if targets and a.op != "variable":
            assigned[targets[0]] = gc.assign(targets[0], a)
            return
    pool.append(node if node is not None else UNARY[p % 4](a))


@st.composite
def random_graphs(draw, max_steps=20, prefix=""):
    """(outputs, feed): a random DAG over two placeholders and two variables of random small shapes (their
    names start with `prefix`, so several graphs can share one program).
    Outputs are every assign, the last node and some others, never a leaf nor a view of an assigned
    variable (after the step such a view would show the new value, the reference executor the old one)."""
    dims = st.sampled_from((1, 2, 3, 4))
    matrix, vector = st.tuples(dims, dims), st.tuples(dims)
    shapes = [draw(matrix), draw(vector), draw(matrix), draw(vector)]
    leaves = [gc.placeholder(f"{prefix}p0", shapes[0]), gc.placeholder(f"{prefix}p1", shapes[1]),
              gc.variable(f"{prefix}v0", shapes[2], init=gc.init.normal(1.0, seed=1)),
              gc.variable(f"{prefix}v1", shapes[3], init=gc.init.normal(1.0, seed=2))]
    pool, assigned = list(leaves), {}
    step = st.tuples(st.sampled_from(STEP_KINDS), st.integers(0, 3), st.integers(0, 7), st.integers(0, 15))
    steps = draw(st.lists(step, min_size=6, max_size=max_steps))
    for step in steps:
        add_step(pool, *step, assigned)
    picks = draw(st.lists(st.integers(0, len(pool) - 1), max_size=4))
    outputs = [pool[-1]] + [pool[k] for k in picks]
    outputs = [n for n in dict.fromkeys(outputs) if n.inputs and root_variable(n) not in assigned]
    outputs = (outputs or [gc.neg(pool[-1])]) + list(assigned.values())
    rng = np.random.RandomState(draw(st.integers(0, 2**16)))
    used = gc.topological_order(outputs)
    feed = {p: rng.randn(*p.shape).astype("float32") for p in leaves[:2] if p in used}
    return outputs, feed


def root_variable(n):
    while n.op == "reshape":
        n = n.inputs[0]
    return n
