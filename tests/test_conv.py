"""Ops of convolutional networks against independent numpy loops, their gradients against finite differences
(random shapes, strides and padding), batch norm and dropout in both modes, Philox against its published
test vectors, and the optimizers and schedules against numpy formulas."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gcompile as gc
from gcompile.ops.random import philox4x32_10
from opcheck import check_op, distinct, uniform

F32 = 1e-6  # scalars written in a graph (momentum, eps, pi) are float32 constants, also in float64 runs


# --- references: direct loops over output positions ------------------------------------------------------
def conv_ref(x, w, b, stride, padding):
    n, c, h, wd = x.shape
    cout, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    oh, ow = (h + 2 * padding - kh) // stride + 1, (wd + 2 * padding - kw) // stride + 1
    out = np.zeros((n, cout, oh, ow))
    for i in range(oh):
        for j in range(ow):
            patch = xp[:, :, i * stride:i * stride + kh, j * stride:j * stride + kw]
            out[:, :, i, j] = np.einsum("nckl,ockl->no", patch, w)
    return out if b is None else out + b[None, :, None, None]


def pool_ref(x, k, stride, padding, mode):
    n, c, h, w = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)),
                constant_values=-np.inf if mode == "max" else 0)
    oh, ow = (h + 2 * padding - k) // stride + 1, (w + 2 * padding - k) // stride + 1
    out = np.zeros((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            window = xp[:, :, i * stride:i * stride + k, j * stride:j * stride + k]
            out[:, :, i, j] = window.max(axis=(2, 3)) if mode == "max" else window.sum(axis=(2, 3)) / (k * k)
    return out


def windows_fit(size, k, padding):
    return size + 2 * padding >= k


# --- conv2d ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("stride,padding,bias", [(1, 0, True), (2, 1, True), (1, 2, False), (3, 1, True)])
def test_conv2d(stride, padding, bias):
    x, w, b = uniform((2, 3, 6, 5), seed=1), uniform((4, 3, 3, 2), seed=2), uniform((4,), seed=3)
    if bias:
        check_op(lambda X, W, B: gc.conv2d(X, W, B, stride, padding), [x, w, b],
                 lambda X, W, B: conv_ref(X, W, B, stride, padding))
    else:
        check_op(lambda X, W: gc.conv2d(X, W, None, stride, padding), [x, w],
                 lambda X, W: conv_ref(X, W, None, stride, padding))


def test_conv2d_1x1_reads_the_image_without_patches():
    x, w = uniform((2, 3, 4, 4), seed=1), uniform((5, 3, 1, 1), seed=2)
    out = check_op(lambda X, W: gc.conv2d(X, W), [x, w], lambda X, W: conv_ref(X, W, None, 1, 0))
    assert "im2col" not in gc.format_graph([out])


@settings(max_examples=12, deadline=None)
@given(n=st.integers(1, 2), c=st.integers(1, 3), h=st.integers(1, 6), w=st.integers(1, 6), cout=st.integers(1, 3),
       k=st.integers(1, 3), stride=st.integers(1, 3), padding=st.integers(0, 2), seed=st.integers(0, 99))
def test_conv2d_random_shapes(n, c, h, w, cout, k, stride, padding, seed):
    if not (windows_fit(h, k, padding) and windows_fit(w, k, padding)):
        with pytest.raises(gc.ShapeError, match="larger than the padded input"):
            gc.conv2d(gc.placeholder("x", (n, c, h, w)), gc.placeholder("w", (cout, c, k, k)), None, stride, padding)
        return
    x, wt = uniform((n, c, h, w), seed=seed), uniform((cout, c, k, k), seed=seed + 1)
    b = uniform((cout,), seed=seed + 2)
    check_op(lambda X, W, B: gc.conv2d(X, W, B, stride, padding), [x, wt, b],
             lambda X, W, B: conv_ref(X, W, B, stride, padding))


def test_im2col_and_col2im_are_adjoint():
    x = uniform((2, 3, 5, 4), seed=1)
    X = gc.placeholder("x", x.shape)
    cols = gc.im2col(X, 3, 2, 1)
    c = uniform(cols.shape, seed=2)
    C = gc.placeholder("c", c.shape)
    patches, image = gc.NumpyExecutor([cols, gc.col2im(C, (5, 4), 3, 2, 1)], dtype="float64").run({X: x, C: c})
    assert np.sum(patches * c) == pytest.approx(np.sum(x * image), rel=1e-12)
    check_op(lambda P: gc.col2im(P, (5, 4), 3, 2, 1), [c], lambda P: image)


def test_conv_shape_errors_name_the_op_and_shapes():
    x = gc.placeholder("x", (2, 3, 8, 8))
    with pytest.raises(gc.ShapeError, match=r"conv2d: expected x \(N, C, H, W\).*same C"):
        gc.conv2d(x, gc.placeholder("w", (4, 2, 3, 3)))
    with pytest.raises(gc.ShapeError, match=r"bias .* must have shape \(4,\)"):
        gc.conv2d(x, gc.placeholder("w", (4, 3, 3, 3)), gc.placeholder("b", (3,)))
    with pytest.raises(gc.ShapeError, match="conv2d: kernel 9 is larger than the padded input"):
        gc.conv2d(x, gc.placeholder("w", (4, 3, 9, 9)))
    with pytest.raises(gc.ShapeError, match="stride >= 1"):
        gc.conv2d(x, gc.placeholder("w", (4, 3, 3, 3)), stride=0)
    with pytest.raises(gc.ShapeError, match="max_pool2d: padding 2 is more than half the kernel"):
        gc.max_pool2d(x, 3, 1, 2)
    with pytest.raises(gc.ShapeError, match="avg_pool2d: expected an NCHW image"):
        gc.avg_pool2d(gc.placeholder("v", (2, 8)), 2)


# --- pooling --------------------------------------------------------------------------------------
@settings(max_examples=12, deadline=None)
@given(n=st.integers(1, 2), c=st.integers(1, 3), h=st.integers(1, 7), w=st.integers(1, 7), k=st.integers(1, 3),
       stride=st.integers(1, 3), padding=st.integers(0, 1), mode=st.sampled_from(["max", "avg"]),
       seed=st.integers(0, 99))
def test_pool_random_shapes(n, c, h, w, k, stride, padding, mode, seed):
    build = gc.max_pool2d if mode == "max" else gc.avg_pool2d
    if 2 * padding > k or not (windows_fit(h, k, padding) and windows_fit(w, k, padding)):
        with pytest.raises(gc.ShapeError):
            build(gc.placeholder("x", (n, c, h, w)), k, stride, padding)
        return
    x = distinct((n, c, h, w), seed=seed)  # no ties: the max-pool gradient is defined where we probe
    check_op(lambda X: build(X, k, stride, padding), [x], lambda X: pool_ref(X, k, stride, padding, mode))


def max_pool_grad_ref(x, g, k, stride, padding):
    """Each window's g added at the window's maximum of x (no ties: distinct inputs)."""
    n, c, h, w = x.shape
    out = np.zeros(x.shape)
    for b in range(n):
        for ch in range(c):
            for i in range(g.shape[2]):
                for j in range(g.shape[3]):
                    rows = range(max(i * stride - padding, 0), min(i * stride - padding + k, h))
                    cols = range(max(j * stride - padding, 0), min(j * stride - padding + k, w))
                    r, q = max(((r, q) for r in rows for q in cols), key=lambda rq: x[b, ch, rq[0], rq[1]])
                    out[b, ch, r, q] += g[b, ch, i, j]
    return out


@pytest.mark.parametrize("k,stride,padding", [(2, 2, 0), (3, 2, 1), (3, 1, 1), (2, 3, 1)])
def test_max_pool_gradient_has_a_gradient(k, stride, padding):
    """Second derivatives through max pooling: max_pool2d_grad(x, g), an op of x and g, checked as any op (in
    g its gradient is max_pool2d_select; in x it is zero away from ties), and max_pool2d_select, reached as
    the gradient in g of sum(max_pool2d_grad(x, g) * h), against h's pixel at each window's maximum."""
    x = distinct((2, 3, 7, 6), seed=4)
    pooled = pool_ref(x, k, stride, padding, "max").shape
    g = uniform(pooled, seed=5)

    def grad_of_pool(X, G):
        (dx,) = gc.gradients(gc.reduce_sum(gc.max_pool2d(X, k, stride, padding) * G), [X])
        return dx

    def select(X, H, G):   # (G's value does not matter; the loss's seed reads the graph that holds it)
        (dg,) = gc.gradients(gc.reduce_sum(grad_of_pool(X, G) * H), [G])
        return dg

    def select_ref(X, H, G):   # the adjoint of max_pool_grad_ref in g: <max_pool_grad_ref(X, e_ij), H> a window
        out = np.zeros(pooled)
        for at in np.ndindex(*pooled):
            e = np.zeros(pooled)
            e[at] = 1.0
            out[at] = np.sum(max_pool_grad_ref(X, e, k, stride, padding) * H)
        return out
    check_op(grad_of_pool, [x, g], lambda X, G: max_pool_grad_ref(X, G, k, stride, padding))
    check_op(select, [x, uniform(x.shape, seed=6), g], select_ref)


@pytest.mark.parametrize("k,stride,padding", [(2, 2, 0), (3, 2, 1), (3, 1, 1)])
def test_avg_pool_gradient_and_im2col_checked_as_ops(k, stride, padding):
    """avg_pool2d_grad (an op of g: each window's g over k*k, padding counted, spread over its pixels; x only
    sets the shape) and im2col, each with its gradient, against loops written here."""
    x = uniform((2, 3, 7, 6), seed=7)
    pooled = pool_ref(x, k, stride, padding, "avg").shape

    def avg_grad_ref(X, G):
        out = np.zeros(X.shape)
        for i, j in np.ndindex(*pooled[2:]):
            for r in range(max(i * stride - padding, 0), min(i * stride - padding + k, X.shape[2])):
                for q in range(max(j * stride - padding, 0), min(j * stride - padding + k, X.shape[3])):
                    out[:, :, r, q] += G[:, :, i, j] / (k * k)
        return out

    def grad_of_avg_pool(X, G):
        (dx,) = gc.gradients(gc.reduce_sum(gc.avg_pool2d(X, k, stride, padding) * G), [X])
        return dx
    check_op(grad_of_avg_pool, [x, uniform(pooled, seed=8)], avg_grad_ref)

    def im2col_ref(X):
        n, c, h, w = X.shape
        xp = np.pad(X, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
        oh, ow = (h + 2 * padding - k) // stride + 1, (w + 2 * padding - k) // stride + 1
        cols = np.zeros((n, c, k, k, oh, ow))
        for a, b in np.ndindex(k, k):
            cols[:, :, a, b] = xp[:, :, a:a + stride * (oh - 1) + 1:stride, b:b + stride * (ow - 1) + 1:stride]
        return cols.reshape(n, c * k * k, oh * ow)
    check_op(lambda X: gc.im2col(X, (k, k), stride, padding), [x], im2col_ref)


def test_max_pool_ties_send_the_gradient_to_the_first_maximum():
    x = np.array([[[[1.0, 3.0, 3.0, 0.0], [3.0, 2.0, 0.0, 3.0]]]])   # two windows of 2x2 holding ties
    X = gc.placeholder("x", x.shape)
    (g,) = gc.NumpyExecutor(gc.gradients(gc.reduce_sum(gc.max_pool2d(X, 2)), [X])).run({X: x})
    np.testing.assert_array_equal(g, [[[[0, 1, 1, 0], [0, 0, 0, 0]]]])


def test_global_avg_pool_and_flatten():
    x = uniform((2, 3, 4, 5), seed=1)
    check_op(gc.global_avg_pool, [x], lambda X: X.mean(axis=(2, 3)))
    out = check_op(lambda X: gc.flatten(X) * 2.0, [x], lambda X: X.reshape(2, -1) * 2)
    assert out.shape == (2, 60)


# --- batched matmul (what conv2d lowers to) ---------------------------------------------------------
@pytest.mark.parametrize("shapes,ta,tb", [(((3, 4), (5, 4, 2)), False, False), (((5, 3, 4), (4, 2)), False, False),
                                          (((5, 4, 3), (5, 2, 4)), True, True), (((1, 3, 4), (5, 2, 4)), False, True)])
def test_batched_matmul(shapes, ta, tb):
    a, b = uniform(shapes[0], seed=1), uniform(shapes[1], seed=2)

    def ref(A, B):
        return np.matmul(A.swapaxes(-1, -2) if ta else A, B.swapaxes(-1, -2) if tb else B)
    check_op(lambda A, B: gc.matmul(A, B, ta, tb), [a, b], ref)


def test_batched_matmul_rejects_stacks_of_different_sizes():
    with pytest.raises(gc.ShapeError, match="stacks of different sizes"):
        gc.matmul(gc.placeholder("a", (3, 2, 4)), gc.placeholder("b", (5, 4, 2)))


# --- batch norm -------------------------------------------------------------------------------------
def bn_ref(x, gamma, beta, eps=1e-5):
    axes = tuple(a for a in range(x.ndim) if a != 1)
    shape = [1] * x.ndim
    shape[1] = -1
    mean, var = x.mean(axis=axes, keepdims=True), x.var(axis=axes, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma.reshape(shape) + beta.reshape(shape)


def running_stats(c):
    return (gc.variable("rm", (c,), init=gc.init.zeros(), trainable=False),
            gc.variable("rv", (c,), init=gc.init.ones(), trainable=False))


@pytest.mark.parametrize("shape", [(4, 3, 2, 3), (6, 4)])
def test_batch_norm_training(shape):
    rm, rv = running_stats(shape[1])
    x = uniform(shape, seed=1) * 3 + 1
    g, b = uniform(shape[1:2], seed=2), uniform(shape[1:2], seed=3)
    check_op(lambda X, G, B: gc.batch_norm(X, G, B, rm, rv), [x, g, b], bn_ref)


def test_batch_norm_updates_running_statistics_and_evaluates_with_them():
    rm, rv = running_stats(3)
    X = gc.placeholder("x", (4, 3, 2, 2))
    gamma, beta = gc.variable("g", init=np.float32([1, 2, 3])), gc.variable("b", init=np.float32([0, 1, -1]))
    y = gc.batch_norm(X, gamma, beta, rm, rv, momentum=0.25)
    train = gc.NumpyExecutor([y], dtype="float64")
    batches = [uniform((4, 3, 2, 2), seed=s) * 2 + s for s in range(3)]
    mean, var = np.zeros(3), np.ones(3)
    for xb in batches:
        train.run({X: xb})
        mean = 0.75 * mean + 0.25 * xb.mean(axis=(0, 2, 3))
        var = 0.75 * var + 0.25 * xb.var(axis=(0, 2, 3), ddof=1)
    np.testing.assert_allclose(train.get_variable("rm"), mean, rtol=1e-12)
    np.testing.assert_allclose(train.get_variable("rv"), var, rtol=F32)
    evaluate = gc.NumpyExecutor([y], dtype="float64", mode="eval")
    for name in ("rm", "rv"):
        evaluate.set_variable(name, train.get_variable(name))
    xb = uniform((4, 3, 2, 2), seed=9)
    want = (xb - mean[:, None, None]) / np.sqrt(var[:, None, None] + 1e-5) * np.array([1, 2, 3])[:, None, None] \
        + np.array([0, 1, -1])[:, None, None]
    np.testing.assert_allclose(evaluate.run({X: xb})[0], want, rtol=F32)
    np.testing.assert_allclose(evaluate.get_variable("rm"), mean, rtol=1e-12)  # evaluation leaves them


def test_batch_norm_rejects_mismatched_parameters():
    rm, rv = running_stats(3)
    with pytest.raises(gc.ShapeError, match=r"batch_norm: .* must have shape \(4,\)"):
        gc.batch_norm(gc.placeholder("x", (2, 4, 3, 3)), rm, rm, rm, rv)


# --- dropout and its generator -----------------------------------------------------------------------
def test_philox_matches_the_published_test_vectors():
    """Known-answer tests of Random123 (kat_vectors) for philox4x32_10."""
    cases = [((0, 0, 0, 0), (0, 0), (0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8)),
             ((0xffffffff,) * 4, (0xffffffff,) * 2, (0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd)),
             ((0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344), (0xa4093822, 0x299f31d0),
              (0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1))]
    for counter, key, want in cases:
        got = philox4x32_10([[c] for c in counter], key)
        assert [int(v[0]) for v in got] == list(want)


def test_a_wrapped_step_counter_gives_the_compiled_mask():
    """The step counter is an int32: after 2^31 - 1 steps it wraps to a negative value, whose 32 bits the compiled
    mask hashes ((uint32_t)step); numpy's mask raised OverflowError there."""
    from gcompile.ops.random import dropout_mask
    for step, bits in ((-1, 2**32 - 1), (-2**31, 2**31)):
        np.testing.assert_array_equal(dropout_mask(100, step, 11, 0.3, "float32"),
                                      dropout_mask(100, bits, 11, 0.3, "float32"))


def test_dropout_masks_are_fresh_each_step_and_reproducible():
    X = gc.placeholder("x", (64, 50))
    y = gc.dropout(X, 0.3, seed=11)
    step = gc.step_counter()
    train = gc.NumpyExecutor([y, gc.assign(step, step + 1)])
    ones = np.ones((64, 50), np.float32)
    masks = [train.run({X: ones})[0] for _ in range(3)]
    assert train.get_variable("step") == 3
    for m in masks:
        assert set(np.unique(m)) == {0.0, np.float32(1 / 0.7)}
        assert abs((m == 0).mean() - 0.3) < 0.03
    assert not np.array_equal(masks[0], masks[1])
    again = gc.NumpyExecutor([y, gc.assign(step, step + 1)])
    np.testing.assert_array_equal(again.run({X: ones})[0], masks[0])
    other_seed = gc.NumpyExecutor([gc.dropout(X, 0.3, seed=12)]).run({X: ones})[0]
    assert not np.array_equal(other_seed, masks[0])
    np.testing.assert_array_equal(gc.NumpyExecutor([y], mode="eval").run({X: ones})[0], ones)


def test_dropout_gradient_uses_the_same_mask():
    x = uniform((4, 6), seed=1)
    X = gc.placeholder("x", x.shape)
    y = gc.dropout(X, 0.5, seed=3)
    mask, (g,) = gc.NumpyExecutor([y]).run({X: np.ones_like(x)})[0], \
        gc.NumpyExecutor(gc.gradients(gc.reduce_sum(y * 3.0), [X])).run({X: x})
    np.testing.assert_array_equal(g, 3 * mask)


def test_specialize_keeps_graphs_without_modes_and_chains_updates():
    X = gc.placeholder("x", (4, 3))
    plain = gc.relu(X)
    assert gc.specialize([plain], "train") == ([plain], [])
    rm, rv = running_stats(3)
    y = gc.batch_norm(gc.dropout(X, 0.5, seed=1), gc.variable("g", init=np.ones(3, np.float32)),
                      gc.variable("b", init=np.zeros(3, np.float32)), rm, rv)
    (train,), updates = gc.specialize([y], "train")
    (evaluated,), none = gc.specialize([y], "eval")
    ops = lambda nodes: {n.op for n in gc.topological_order(nodes)}  # noqa: E731
    assert none == [] and "mode_select" not in ops([evaluated]) | ops([train] + updates)
    assert [u.inputs[0].name for u in updates] == ["rm", "rv"]
    assert "dropout_mask" in ops(updates) and "dropout_mask" not in ops([evaluated])
    with pytest.raises(gc.GCompileError, match="mode must be one of"):
        gc.specialize([y], "test")


# --- optimizers and schedules ---------------------------------------------------------------------------
def regression(optimizer):
    x = gc.placeholder("x", (8, 3))
    t = gc.placeholder("t", (8, 2))
    W = gc.variable("W", init=uniform((3, 2), seed=5).astype(np.float32))
    loss = gc.reduce_mean((x @ W - t) ** 2)
    return x, t, W, gc.Program(loss, [W], optimizer)


@pytest.mark.parametrize("decoupled", [False, True])
def test_adam_and_adamw_follow_the_formulas(decoupled):
    lr, b1, b2, eps, wd = 0.01, 0.8, 0.95, 1e-6, 0.1
    cls = gc.AdamW if decoupled else gc.Adam
    x, t, W, prog = regression(cls(lr, b1, b2, eps, weight_decay=wd))
    ex = gc.NumpyExecutor(prog.train_outputs, dtype="float64")
    w = ex.get_variable("W")
    m, v = np.zeros_like(w), np.zeros_like(w)
    for step in range(1, 5):
        xv, tv = uniform((8, 3), seed=step), uniform((8, 2), seed=10 + step)
        ex.run({x: xv, t: tv})
        g = 2 / 16 * xv.T @ (xv @ w - tv) + (0 if decoupled else wd * w)
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        update = m / (1 - b1 ** step) / (np.sqrt(v / (1 - b2 ** step)) + eps) + (wd * w if decoupled else 0)
        w = w - lr * update
        np.testing.assert_allclose(ex.get_variable("W"), w, rtol=F32)
    np.testing.assert_allclose(ex.get_variable("W.adam_m"), m, rtol=F32)
    assert ex.get_variable("step") == 4


@pytest.mark.parametrize("kwargs", [{"lr": 0}, {"beta1": 1.0}, {"beta2": -0.1}, {"eps": 0}, {"weight_decay": -1}])
def test_adam_rejects_bad_hyperparameters(kwargs):
    with pytest.raises(gc.GCompileError, match="Adam"):
        gc.Adam(**kwargs)


@pytest.mark.parametrize("beta2", [0.999, 0.9999, 0.99999])
def test_adam_bias_correction_is_exact_in_float32(beta2, tmp_path):
    """1 - beta2^t in float32 cancelled (beta2 = 0.99999, t = 1: 1.0014e-5): the first step of a gradient of 1
    was 1.0007 lr, not lr / (1 + eps). Both targets."""
    w = gc.variable("w", init=np.zeros(1, np.float32))
    prog = gc.Program(gc.reduce_sum(w), [w], gc.Adam(lr=1.0, beta2=beta2))
    ex = gc.NumpyExecutor(prog.train_outputs)
    ex.run({})
    with gc.load(gc.compile(prog, target="cpu", out_dir=tmp_path)) as m:
        m.train_step()
        assert -m.params["w"][0] == -ex.get_variable("w")[0] == np.float32(1 / (1 + 1e-8))


def test_an_optimizer_needs_parameters_of_the_losss_dtype():
    """A float64 loss over float32 parameters failed inside the optimizer's nodes ('mul: operands have
    different dtypes: lr () float64, ...', telling the user to insert a cast they cannot)."""
    x, y = gc.placeholder("x", (4, 3)), gc.placeholder("y", (4,), dtype="int32")
    W = gc.variable("W", init=np.ones((3, 2), np.float32))
    loss = gc.softmax_cross_entropy(gc.cast(x @ W, "float64"), y)
    with pytest.raises(gc.GCompileError, match=r"Program: parameter W \(3, 2\) float32 and the loss .* float64 have "
                                               r"different dtypes.*gc.cast\(loss, 'float32'\)"):
        gc.Program(loss, [W], gc.SGD(lr=0.1))
    gc.Program(gc.cast(loss, "float32"), [W], gc.Adam())


def test_a_variable_made_untrainable_is_not_a_parameter():
    W = gc.variable("W", init=np.ones((3, 2), np.float32), trainable=False)
    loss = gc.reduce_sum(gc.placeholder("x", (4, 3)) @ W)
    with pytest.raises(gc.GCompileError, match=r"parameter W \(3, 2\) float32 was made with trainable=False"):
        gc.Program(loss, [W], gc.SGD(lr=0.1))


def lr_trajectory(schedule, steps):
    """The learning rate of each step, read off SGD updates of a linear loss (gradient 1)."""
    x = gc.placeholder("x", (1,))
    p = gc.variable("p", init=np.zeros(1))
    prog = gc.Program(gc.reduce_sum(p * x), [p], gc.SGD(lr=0.5, schedule=schedule))
    ex = gc.NumpyExecutor(prog.train_outputs, dtype="float64")
    rates = []
    for _ in range(steps):
        before = ex.get_variable("p")[0]
        ex.run({x: np.ones(1)})
        rates.append(before - ex.get_variable("p")[0])
    return np.array(rates), ex


def test_cosine_schedule():
    rates, ex = lr_trajectory(gc.CosineSchedule(total_steps=8), 10)
    want = [0.5 * 0.5 * (1 + math.cos(math.pi * min(s / 8, 1))) for s in range(10)]
    np.testing.assert_allclose(rates, want, rtol=F32, atol=1e-12)
    ex.set_variable("total_steps", 4)   # what the binary does with --epochs
    ex.set_variable("step", 1)
    before = ex.get_variable("p")[0]
    ex.run({"x": np.ones(1)})
    assert before - ex.get_variable("p")[0] == pytest.approx(0.25 * (1 + math.cos(math.pi / 4)), rel=F32)


def test_step_schedule():
    rates, _ = lr_trajectory(gc.StepSchedule((0.5, 0.75), gamma=0.1, total_steps=8), 9)
    np.testing.assert_allclose(rates, [0.5] * 4 + [0.05] * 2 + [0.005] * 3, rtol=F32)
    with pytest.raises(gc.GCompileError, match="milestones"):
        gc.StepSchedule((0.75, 0.5))


@pytest.mark.parametrize("total,milestone,at", [(100, 0.3, 30), (50, 0.6, 30), (50, 0.75, 38), (7, 0.5, 4),
                                                (5, 0.5, 3), (150, 0.25, 38)])
def test_step_schedule_milestones_at_their_whole_step_in_float32(total, milestone, at):
    """A milestone passes at step floor(m * total_steps + 0.5), halves up: in float32, 0.3 x 100 is 30.000002,
    which step 30 did not reach (the rate fell a step late)."""
    p = gc.variable("p", init=np.zeros(1, np.float32))
    prog = gc.Program(gc.reduce_sum(p), [p], gc.SGD(lr=1.0, schedule=gc.StepSchedule((milestone,), 0.5, total)))
    ex = gc.NumpyExecutor(prog.train_outputs)
    rates = []
    for _ in range(total):
        before = ex.get_variable("p")[0]
        ex.run({})
        rates.append(before - ex.get_variable("p")[0])
    assert rates == [1.0] * at + [0.5] * (total - at)


def test_schedule_names():
    assert isinstance(gc.SGD(0.1, schedule="cosine").schedule, gc.CosineSchedule)
    assert gc.SGD(0.1, schedule="constant").schedule is None
    with pytest.raises(gc.GCompileError, match="unknown learning-rate schedule 'linear'"):
        gc.SGD(0.1, schedule="linear")
    with pytest.raises(gc.GCompileError, match="unknown optimizer 'rmsprop'"):
        gc.optim.make_optimizer("rmsprop", 0.1)


def test_optimizer_hyperparameters_are_finite_numbers():
    """NaN passed every range check (nan <= 0 is False); text failed with a TypeError. A 0-d array is a number."""
    for make, bad in ((lambda v: gc.SGD(lr=v), "SGD: lr"), (lambda v: gc.SGD(0.1, momentum=v), "SGD: momentum"),
                      (lambda v: gc.Adam(eps=v), "Adam: eps"), (lambda v: gc.AdamW(beta1=v), "AdamW: beta1")):
        for value in (float("nan"), float("inf"), "0.1", None, True):
            with pytest.raises(gc.GCompileError, match=f"{bad} must be a finite number, got {value!r}"):
                make(value)
    assert gc.SGD(lr=np.array(0.25)).lr == 0.25 and gc.Adam(lr=np.float32(0.5)).lr == 0.5


@pytest.mark.parametrize("name,shape,std", [("he_normal", (64, 32, 3, 3), math.sqrt(2 / 288)),
                                            ("he_uniform", (400, 300), math.sqrt(2 / 400)),
                                            ("xavier_normal", (400, 300), math.sqrt(2 / 700)),
                                            ("xavier_uniform", (64, 32, 3, 3), math.sqrt(2 / (288 + 576)))])
def test_initializers_have_their_variance_and_are_seeded(name, shape, std):
    make = getattr(gc.init, name)
    value = make(seed=3)(shape)
    assert value.dtype == np.float32 and value.shape == shape
    assert value.std() == pytest.approx(std, rel=0.05) and abs(value.mean()) < 0.1 * std
    np.testing.assert_array_equal(make(seed=3)(shape), value)
    assert not np.array_equal(make(seed=4)(shape), value)
