"""simplify: printed IR before/after for each rule, identity of leaves and assigns, and equal numbers under
the reference executor on random graphs and on a training step of the MNIST MLP."""
from textwrap import dedent

import numpy as np
import pytest
from hypothesis import given, settings

import gcompile as gc
from gcompile.passes import simplify
from graphs import mlp_feed, mlp_program, random_graphs


def text(s: str) -> str:
    return dedent(s).strip()


def x_and_w():
    return gc.placeholder("x", (2, 3)), gc.variable("W", (3, 4))


def test_common_subexpressions_merge_and_leaves_keep_identity():
    x, W = x_and_w()
    outputs = [gc.relu(x @ W) + gc.relu(x @ W)]
    assert gc.format_graph(outputs) == text("""
        %0 = placeholder {name=x} : float32[2,3]
        %1 = variable {init=constant(0.0), name=W} : float32[3,4]
        %2 = matmul(%0, %1) {trans_a=False, trans_b=False} : float32[2,4]
        %3 = relu(%2) : float32[2,4]
        %4 = matmul(%0, %1) {trans_a=False, trans_b=False} : float32[2,4]
        %5 = relu(%4) : float32[2,4]
        %6 = add(%3, %5) : float32[2,4]
        return %6""")
    after = simplify(outputs)
    assert gc.format_graph(after) == text("""
        %0 = placeholder {name=x} : float32[2,3]
        %1 = variable {init=constant(0.0), name=W} : float32[3,4]
        %2 = matmul(%0, %1) {trans_a=False, trans_b=False} : float32[2,4]
        %3 = relu(%2) : float32[2,4]
        %4 = add(%3, %3) : float32[2,4]
        return %4""")
    matmul = after[0].inputs[0].inputs[0]
    assert matmul.inputs[0] is x and matmul.inputs[1] is W
    assert after[0].name == outputs[0].name   # rebuilt under its old name


def test_unchanged_graph_comes_back_as_is():
    x, W = x_and_w()
    outputs = [gc.relu(x @ W), gc.tanh(x)]
    assert all(a is b for a, b in zip(simplify(outputs), outputs))


def test_equal_leaves_are_not_merged():
    x1, x2 = gc.placeholder("x1", (3,)), gc.placeholder("x2", (3,))
    v1, v2 = gc.variable("v1", (3,)), gc.variable("v2", (3,))
    outputs = [x1 + x2, v1 + v2]
    assert gc.format_graph(simplify(outputs)) == gc.format_graph(outputs)


def test_constants_merge_by_value_and_dtype():
    a = gc.constant(np.array([1.0, 2.0, 3.0]))
    b = gc.constant(np.array([1.0, 2.0, 3.0]))
    c = gc.constant(np.array([1, 2, 3]))            # int32: not equal to a
    d = gc.constant(np.array([1.0, 2.0, 4.0]))
    after = simplify([a, b, c, d])
    assert after[0] is a and after[1] is a and after[2] is c and after[3] is d
    x = gc.placeholder("x", (3,))
    assert gc.format_graph(simplify([x * 2.0 + x * 2.0])) == text("""
        %0 = placeholder {name=x} : float32[3]
        %1 = constant {value=2.0} : float32[]
        %2 = mul(%0, %1) : float32[3]
        %3 = add(%2, %2) : float32[3]
        return %3""")


def test_attributes_must_be_equal_to_merge():
    x = gc.placeholder("x", (2, 3))
    outputs = [gc.reduce_sum(x, axis=0), gc.reduce_sum(x, axis=1), gc.reduce_sum(x, axis=0, keepdims=True)]
    assert len(set(simplify(outputs))) == 3
    assert len(set(simplify([gc.reduce_sum(x, axis=0), gc.reduce_sum(x, axis=0)]))) == 1
    # array constants merge by dtype, shape and bytes: the same bytes in two shapes are two constants
    a, b = (gc.constant(np.zeros(shape, np.float32)) for shape in ((2, 3), (3, 2)))
    assert [n.shape for n in simplify([a, b])] == [(2, 3), (3, 2)]
    assert len(set(simplify([a, gc.constant(np.zeros((2, 3), np.float32))]))) == 1


X = gc.placeholder("x", (2, 3))
ROW = gc.placeholder("row", (3,))
IDENTITIES = {                                  # name: (output, the node it simplifies to)
    "x*1": (X * 1.0, X),
    "1*x": (1.0 * X, X),
    "x/1": (X / 1.0, X),
    "x+0": (X + 0.0, X),
    "0+x": (0.0 + X, X),
    "x-0": (X - 0.0, X),
    "x*ones_like(row)": (X * gc.ones_like(ROW), X),
    "x+zeros_like(row)": (X + gc.zeros_like(ROW), X),
    "reshape to own shape": (gc.reshape(X, (2, 3)), X),
    "broadcast_to own shape": (gc.broadcast_to(X, (2, 3)), X),
    "identity transpose": (gc.transpose(X, (0, 1)), X),
    "reshape of reshape back": (gc.reshape(gc.reshape(X, (6,)), (2, 3)), X),
}


@pytest.mark.parametrize("name", IDENTITIES)
def test_identity(name):
    out, expected = IDENTITIES[name]
    assert simplify([gc.relu(out)])[0].inputs[0] is expected


KEPT = {                                        # look like identities but are not (shape, side or value)
    "row*ones_like(x) widens": ROW * gc.ones_like(X),
    "0-x": 0.0 - X,
    "1/x": 1.0 / X,
    "x*2": X * 2.0,
    "x*0": X * 0.0,
    "x*[1,1,1] (not a scalar)": X * gc.constant(np.ones(3)),
    "transpose": gc.transpose(X),
    "broadcast_to wider": gc.broadcast_to(X, (4, 2, 3)),
}


@pytest.mark.parametrize("name", KEPT)
def test_not_an_identity(name):
    out = gc.relu(KEPT[name])
    assert gc.format_graph(simplify([out])) == gc.format_graph([out])


def test_reshape_of_reshape_becomes_one_reshape():
    x = gc.placeholder("x", (2, 3))
    out = gc.reshape(gc.reshape(x, (3, 2)), (6,))
    assert gc.format_graph(simplify([out])) == text("""
        %0 = placeholder {name=x} : float32[2,3]
        %1 = reshape(%0) : float32[6]
        return %1""")


def test_scalar_constants_and_scalar_fills_fold():
    x = gc.placeholder("x", (4, 2))
    loss = gc.reduce_sum(x)
    seed = gc.ones_like(loss) * gc.constant(0.25) + gc.zeros_like(loss)   # what autodiff starts from
    out = x * (seed * gc.constant(2.0))
    assert gc.format_graph([out]) == text("""
        %0 = placeholder {name=x} : float32[4,2]
        %1 = reduce_sum(%0) {axes=(0,1), keepdims=False} : float32[]
        %2 = ones_like(%1) : float32[]
        %3 = constant {value=0.25} : float32[]
        %4 = mul(%2, %3) : float32[]
        %5 = zeros_like(%1) : float32[]
        %6 = add(%4, %5) : float32[]
        %7 = constant {value=2.0} : float32[]
        %8 = mul(%6, %7) : float32[]
        %9 = mul(%0, %8) : float32[4,2]
        return %9""")
    assert gc.format_graph(simplify([out])) == text("""
        %0 = placeholder {name=x} : float32[4,2]
        %1 = constant {value=0.5} : float32[]
        %2 = mul(%0, %1) : float32[4,2]
        return %2""")


def test_assigns_are_never_merged_or_removed():
    v, w = gc.variable("v", (3,)), gc.variable("w", (3,))
    first, second = gc.assign(v, w * 1.0), gc.assign(v, w * 1.0)
    after = simplify([first, second, gc.assign(w, w)])
    assert gc.format_graph(after) == text("""
        %0 = variable {init=constant(0.0), name=v} : float32[3]
        %1 = variable {init=constant(0.0), name=w} : float32[3]
        %2 = assign(%0, %1) : float32[3]
        %3 = assign(%0, %1) : float32[3]
        %4 = assign(%1, %1) : float32[3]
        return %2, %3, %4""")
    assert after[0] is not after[1]
    assert [a.name for a in after[:2]] == [first.name, second.name]


@settings(max_examples=300, deadline=None)
@given(random_graphs())
def test_random_graphs_compute_the_same_numbers(graph):
    outputs, feed = graph
    after = simplify(outputs)
    assert len(gc.topological_order(after)) <= len(gc.topological_order(outputs))
    with np.errstate(all="ignore"):
        want = gc.NumpyExecutor(outputs).run(feed)
        got = gc.NumpyExecutor(after).run(feed)
    for w, g in zip(want, got):
        np.testing.assert_array_equal(g, w)


def test_mlp_training_step_is_unchanged():
    prog = mlp_program(batch=16, dims=(20, 12, 8, 5))
    feed = mlp_feed(prog)
    before = prog.train_outputs + [prog.outputs["logits"]]
    after = simplify(before)
    assert len(gc.topological_order(after)) < len(gc.topological_order(before))
    reference, simplified = gc.NumpyExecutor(before), gc.NumpyExecutor(after)
    for step in range(3):
        want, got = reference.run(feed), simplified.run(feed)
        np.testing.assert_array_equal(got[0], want[0])      # loss
        np.testing.assert_array_equal(got[-1], want[-1])    # logits
        for p in prog.params:
            np.testing.assert_array_equal(simplified.get_variable(p.name), reference.get_variable(p.name))
