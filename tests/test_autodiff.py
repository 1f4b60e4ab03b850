"""Reverse-mode autodiff, in the style of the dlsys autodiff assignment: small graphs, exact answers.

Values are small integers and halves evaluated in float64, so the arithmetic is exact and the tests use
exact equality where the math is exact."""
import numpy as np
import pytest

import gcompile as gc
from opcheck import run64, uniform

X2 = np.array([[1.0, 2.0, 3.0], [-0.5, 4.0, -2.0]])
X3 = np.array([[2.0, -1.0, 0.5], [3.0, 1.5, -4.0]])


def places(*names, shape=(2, 3)):
    return [gc.placeholder(n, shape) for n in names]


def evaluate(outputs, feed):
    return gc.NumpyExecutor(outputs, dtype="float64").run(feed)


def test_identity():
    (x2,) = places("x2")
    (g,) = gc.gradients(x2, [x2])
    y, gv = evaluate([x2, g], {x2: X2})
    np.testing.assert_array_equal(y, X2)
    np.testing.assert_array_equal(gv, np.ones_like(X2))


def test_add_by_const():
    (x2,) = places("x2")
    y = 5 + x2
    (g,) = gc.gradients(y, [x2])
    yv, gv = evaluate([y, g], {x2: X2})
    np.testing.assert_array_equal(yv, X2 + 5)
    np.testing.assert_array_equal(gv, np.ones_like(X2))


def test_mul_by_const():
    (x2,) = places("x2")
    y = 5 * x2
    (g,) = gc.gradients(y, [x2])
    yv, gv = evaluate([y, g], {x2: X2})
    np.testing.assert_array_equal(yv, X2 * 5)
    np.testing.assert_array_equal(gv, np.full_like(X2, 5))


def test_add_two_vars():
    x2, x3 = places("x2", "x3")
    y = x2 + x3
    g2, g3 = gc.gradients(y, [x2, x3])
    yv, g2v, g3v = evaluate([y, g2, g3], {x2: X2, x3: X3})
    np.testing.assert_array_equal(yv, X2 + X3)
    np.testing.assert_array_equal(g2v, np.ones_like(X2))
    np.testing.assert_array_equal(g3v, np.ones_like(X3))


def test_mul_two_vars():
    x2, x3 = places("x2", "x3")
    y = x2 * x3
    g2, g3 = gc.gradients(y, [x2, x3])
    yv, g2v, g3v = evaluate([y, g2, g3], {x2: X2, x3: X3})
    np.testing.assert_array_equal(yv, X2 * X3)
    np.testing.assert_array_equal(g2v, X3)
    np.testing.assert_array_equal(g3v, X2)


def test_add_mul_mix_1():
    x1, x2, x3 = places("x1", "x2", "x3")
    y = x1 + x2 * x3 * x1
    g1, g2, g3 = gc.gradients(y, [x1, x2, x3])
    X1 = np.array([[1.0, -2.0, 0.5], [2.0, 3.0, -1.0]])
    yv, g1v, g2v, g3v = evaluate([y, g1, g2, g3], {x1: X1, x2: X2, x3: X3})
    np.testing.assert_array_equal(yv, X1 + X2 * X3 * X1)
    np.testing.assert_array_equal(g1v, 1 + X2 * X3)
    np.testing.assert_array_equal(g2v, X3 * X1)
    np.testing.assert_array_equal(g3v, X2 * X1)


def test_add_mul_mix_2():
    x1, x2, x3, x4 = places("x1", "x2", "x3", "x4")
    y = x1 + x2 * x3 * x4
    grads = gc.gradients(y, [x1, x2, x3, x4])
    X1, X4 = np.full((2, 3), 2.0), np.array([[1.0, 0.5, -1.0], [2.0, -2.0, 3.0]])
    yv, g1v, g2v, g3v, g4v = evaluate([y, *grads], {x1: X1, x2: X2, x3: X3, x4: X4})
    np.testing.assert_array_equal(yv, X1 + X2 * X3 * X4)
    np.testing.assert_array_equal(g1v, np.ones_like(X1))
    np.testing.assert_array_equal(g2v, X3 * X4)
    np.testing.assert_array_equal(g3v, X2 * X4)
    np.testing.assert_array_equal(g4v, X2 * X3)


def test_add_mul_mix_3():
    x2, x3 = places("x2", "x3")
    z = x2 * x2 + x2 + x3 + 3
    y = z * z + x3
    g2, g3 = gc.gradients(y, [x2, x3])
    yv, g2v, g3v = evaluate([y, g2, g3], {x2: X2, x3: X3})
    Z = X2 * X2 + X2 + X3 + 3
    np.testing.assert_array_equal(yv, Z * Z + X3)
    np.testing.assert_array_equal(g2v, 2 * Z * (2 * X2 + 1))
    np.testing.assert_array_equal(g3v, 2 * Z + 1)


def test_variable_used_several_times_sums_contributions():
    (x,) = places("x")
    y = x + x + x * x - x / 2
    (g,) = gc.gradients(y, [x])
    (gv,) = evaluate([g], {x: X2})
    np.testing.assert_array_equal(gv, 1.5 + 2 * X2)


def test_grad_of_grad_cubic():
    (x,) = places("x")
    y = x * x * x
    (g,) = gc.gradients(y, [x])
    (gg,) = gc.gradients(g, [x])
    (ggg,) = gc.gradients(gg, [x])
    gv, ggv, gggv = evaluate([g, gg, ggg], {x: X2})
    np.testing.assert_array_equal(gv, 3 * X2 * X2)
    np.testing.assert_array_equal(ggv, 6 * X2)
    np.testing.assert_array_equal(gggv, np.full_like(X2, 6))


def test_second_derivative_through_tanh_and_exp():
    """y = tanh(x) * exp(x / 2); y'' from the graph against the closed form and against central differences
    of the graph's own y'."""
    x = gc.placeholder("x", (7,))
    y = gc.tanh(x) * gc.exp(x * 0.5)
    (g,) = gc.gradients(y, [x])
    (gg,) = gc.gradients(g, [x])
    xv = np.linspace(-2.0, 1.5, 7)
    gv, ggv = evaluate([g, gg], {x: xv})

    t, e = np.tanh(xv), np.exp(xv / 2)
    dt, ddt = 1 - t * t, -2 * t * (1 - t * t)
    np.testing.assert_allclose(gv, dt * e + t * e / 2, rtol=1e-12)
    np.testing.assert_allclose(ggv, ddt * e + dt * e + t * e / 4, rtol=1e-12)

    h = 1e-5
    (g_plus,) = evaluate([g], {x: xv + h})
    (g_minus,) = evaluate([g], {x: xv - h})
    np.testing.assert_allclose(ggv, (g_plus - g_minus) / (2 * h), rtol=1e-7)


def test_hessian_vector_product_through_softmax_cross_entropy():
    logits, v = gc.placeholder("logits", (3, 4)), gc.placeholder("v", (3, 4))
    labels = gc.placeholder("labels", (3,), dtype="int32")
    loss = gc.softmax_cross_entropy(logits, labels)
    (g,) = gc.gradients(loss, [logits])
    (hv,) = gc.gradients(gc.reduce_sum(g * v), [logits])
    z, vv, lv = uniform((3, 4), seed=1), uniform((3, 4), seed=2), np.array([0, 3, 1])
    (hvv,) = evaluate([hv], {logits: z, v: vv, labels: lv})
    p = np.exp(z) / np.exp(z).sum(1, keepdims=True)
    expected = (p * vv - p * (p * vv).sum(1, keepdims=True)) / 3  # diag(p) - p p^T, per row, over the batch
    # 1e-7, not 1e-12: the graph's constant 1/3 (the batch mean) is a float32 constant even in float64 mode
    np.testing.assert_allclose(hvv, expected, rtol=1e-7, atol=1e-15)


def test_matmul_two_vars():
    x, w = gc.placeholder("x", (3, 2)), gc.placeholder("w", (2, 4))
    y = x @ w
    gx, gw = gc.gradients(y, [x, w])
    XV = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    WV = np.array([[7.0, 8.0, 9.0, 10.0], [11.0, 12.0, 13.0, 14.0]])
    yv, gxv, gwv = evaluate([y, gx, gw], {x: XV, w: WV})
    ones = np.ones((3, 4))
    np.testing.assert_array_equal(yv, XV @ WV)
    np.testing.assert_array_equal(gxv, ones @ WV.T)
    np.testing.assert_array_equal(gwv, XV.T @ ones)


def test_unreachable_input_gets_zeros_of_its_shape():
    x, w = gc.placeholder("x", (2, 3)), gc.variable("w", (4, 5), init=gc.init.ones())
    y = x * 2
    gx, gw = gc.gradients(y, [x, w])
    assert gw.shape == (4, 5) and gw.dtype == "float32"
    gxv, gwv = evaluate([gx, gw], {x: X2})
    np.testing.assert_array_equal(gxv, np.full((2, 3), 2.0))
    np.testing.assert_array_equal(gwv, np.zeros((4, 5)))


def test_input_reached_only_through_integers_gets_zeros():
    x = gc.placeholder("x", (2, 3))
    y = gc.cast(gc.cast(x, "int32"), "float32") * 3
    (g,) = gc.gradients(y, [x])
    (gv,) = evaluate([g], {x: X2})
    np.testing.assert_array_equal(gv, np.zeros((2, 3)))


def test_grad_y_weights_the_output():
    x = gc.placeholder("x", (2, 3))
    gy = gc.placeholder("gy", (2, 3))
    y = x * x
    (g,) = gc.gradients(y, [x], grad_y=gy)
    (gv,) = evaluate([g], {x: X2, gy: X3})
    np.testing.assert_array_equal(gv, 2 * X2 * X3)


def test_gradient_of_an_interior_node():
    x = gc.placeholder("x", (2, 3))
    m = x * 2 + 1
    y = m * m + x
    gm, gx = gc.gradients(y, [m, x])
    gmv, gxv = evaluate([gm, gx], {x: X2})
    M = X2 * 2 + 1
    np.testing.assert_array_equal(gmv, 2 * M)
    np.testing.assert_array_equal(gxv, 4 * M + 1)


def test_broadcast_gradients_are_summed_back():
    x, b = gc.placeholder("x", (2, 3)), gc.placeholder("b", (3,))
    s = gc.placeholder("s", ())
    y = x * b + s
    gx, gb, gs = gc.gradients(y, [x, b, s])
    assert (gx.shape, gb.shape, gs.shape) == ((2, 3), (3,), ())
    B = np.array([1.0, -2.0, 0.5])
    gxv, gbv, gsv = evaluate([gx, gb, gs], {x: X2, b: B, s: np.array(3.0)})
    np.testing.assert_array_equal(gxv, np.broadcast_to(B, (2, 3)))
    np.testing.assert_array_equal(gbv, X2.sum(axis=0))
    np.testing.assert_array_equal(gsv, 6.0)


def test_gradients_of_a_scalar_loss_of_a_small_mlp():
    """The MLP of the design doc: every parameter's gradient against finite differences."""
    x, y = gc.placeholder("x", (4, 3)), gc.placeholder("y", (4,), dtype="int32")
    W1 = gc.variable("W1", (3, 5), init=gc.init.normal(0.5, seed=1))
    b1 = gc.variable("b1", (5,), init=gc.init.normal(0.5, seed=2))
    W2 = gc.variable("W2", (5, 2), init=gc.init.normal(0.5, seed=3))
    b2 = gc.variable("b2", (2,), init=gc.init.normal(0.5, seed=4))
    loss = gc.softmax_cross_entropy(gc.tanh(x @ W1 + b1) @ W2 + b2, y)
    params = [W1, b1, W2, b2]
    ex = gc.NumpyExecutor([loss, *gc.gradients(loss, params)], dtype="float64")
    feed = {x: uniform((4, 3), seed=5), y: np.array([0, 1, 1, 0])}
    analytic = ex.run(feed)[1:]
    h = 1e-6
    for p, g in zip(params, analytic):
        start = ex.get_variable(p.name)
        numeric = np.zeros_like(start)
        for idx in np.ndindex(*start.shape):
            values = []
            for step in (h, -h):
                moved = start.copy()
                moved[idx] += step
                ex.set_variable(p.name, moved)
                values.append(ex.run(feed)[0])
            numeric[idx] = (values[0] - values[1]) / (2 * h)
        ex.set_variable(p.name, start)
        np.testing.assert_allclose(g, numeric, rtol=1e-6, atol=1e-9, err_msg=p.name)


def test_cannot_differentiate_an_integer_output():
    i = gc.placeholder("i", (3,), dtype="int32")
    with pytest.raises(gc.GCompileError, match=r"cannot differentiate mul_\d+ \(3,\) int32"):
        gc.gradients(i * 2, [i])


def test_grad_y_must_have_the_output_shape_and_dtype():
    x, gy = gc.placeholder("x", (2, 3)), gc.placeholder("gy", (3,))
    with pytest.raises(gc.GCompileError, match=r"grad_y gy \(3,\) float32 must have y's shape and dtype, "
                                               r"\(2, 3\) float32"):
        gc.gradients(x * 2, [x], grad_y=gy)
    gy64 = gc.placeholder("gy64", (2, 3), dtype="float64")   # the message named an inner gradient node
    with pytest.raises(gc.GCompileError, match=r"grad_y gy64 \(2, 3\) float64 must have y's shape and dtype"):
        gc.gradients(x * 2, [x], grad_y=gy64)


def test_the_gradient_of_x_to_the_0_is_0_at_0():
    x = gc.placeholder("x", (3,), dtype="float64")
    (g,) = gc.gradients(gc.reduce_sum(gc.pow(x, 0)), [x])   # 0 * x ** -1 gave NaN at x = 0
    got = gc.NumpyExecutor([g], dtype="float64").run({x: np.array([0.0, 1.0, -2.0])})[0]
    assert np.array_equal(got, np.zeros(3))


def test_gradient_nodes_are_ordinary_graph_nodes():
    x = gc.placeholder("x", (2, 3))
    (g,) = gc.gradients(gc.exp(x), [x])
    assert g.shape == (2, 3) and g.dtype == "float32"
    assert x in gc.topological_order([g])
    np.testing.assert_allclose(run64([g], {x: X2})[0], np.exp(X2), rtol=1e-15)


def test_nodes_carry_their_phase_into_the_kernel_comments():
    """design.md: each kernel's comment names its nodes "with shapes, fwd/bwd". Nodes made by gradients() are
    "bwd", the optimizer's and the guard's "update", the rest "fwd"; a pass that rewrites a node (simplify's
    folds, fuse's expansions, modes' specialization) keeps its phase, so the generated comments say it."""
    import re
    from graphs import mlp_program
    from gcompile.pipeline import compile_program
    program = mlp_program(16, dims=(20, 8, 4))
    assert program.loss.phase == "fwd" and {g.phase for g in program.grads} == {"bwd"}
    assert {u.phase for u in program.updates} == {"update"}
    source = compile_program(program, "cpu").source
    phase = {}
    for line in source.splitlines():
        m = re.fullmatch(r"//   (\w+) = (\w+)\(.*\) -> \[.*\] \w+   (fwd|bwd|update)", line)
        if m:
            phase[m.group(1), m.group(2)] = m.group(3)
    assert set(phase.values()) == {"fwd", "bwd", "update"}
    assert all(p == "fwd" for (name, op), p in phase.items() if op == "relu")
    assert all(p == "bwd" for (name, op), p in phase.items() if op == "relu_grad")
    assert all(p == "update" for (name, op), p in phase.items() if op == "assign")
