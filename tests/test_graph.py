"""The graph as a whole: printed IR, topological order, the numpy reference executor, SGD, initializers and
gc.Program."""
import numpy as np
import pytest

import gcompile as gc
from opcheck import uniform


def mlp(batch=4):
    x = gc.placeholder("x", (batch, 3))
    y = gc.placeholder("y", (batch,), dtype="int32")
    W1 = gc.variable("W1", (3, 5), init=gc.init.normal(0.1, seed=123))
    b1 = gc.variable("b1", (5,), init=gc.init.zeros())
    W2 = gc.variable("W2", (5, 2), init=gc.init.he_normal(seed=1))
    b2 = gc.variable("b2", (2,))
    logits = gc.relu(x @ W1 + b1) @ W2 + b2
    return gc.softmax_cross_entropy(logits, y), logits, [W1, b1, W2, b2]


MLP_TEXT = """\
%0 = placeholder {name=x} : float32[4,3]
%1 = variable {init=normal(mean=0.0,std=0.1,seed=123), name=W1} : float32[3,5]
%2 = matmul(%0, %1) {trans_a=False, trans_b=False} : float32[4,5]
%3 = variable {init=constant(0.0), name=b1} : float32[5]
%4 = add(%2, %3) : float32[4,5]
%5 = relu(%4) : float32[4,5]
%6 = variable {init=henormal(seed=1), name=W2} : float32[5,2]
%7 = matmul(%5, %6) {trans_a=False, trans_b=False} : float32[4,2]
%8 = variable {init=constant(0.0), name=b2} : float32[2]
%9 = add(%7, %8) : float32[4,2]
%10 = placeholder {name=y} : int32[4]
%11 = softmax_cross_entropy(%9, %10) : float32[]
return %11, %9"""


# --- printed IR ---------------------------------------------------------------------------------------
def test_format_graph_of_an_mlp():
    loss, logits, _ = mlp()
    assert gc.format_graph([loss, logits]) == MLP_TEXT


def test_format_graph_is_stable_across_builds():
    first, second = mlp(), mlp()
    assert first[0] is not second[0]
    assert gc.format_graph(first[:2]) == gc.format_graph(second[:2])
    grads_text = [gc.format_graph(gc.gradients(loss, params)) for loss, _, params in (first, second)]
    assert grads_text[0] == grads_text[1]


def test_a_plain_function_initializer_prints_its_name_not_its_address():
    """The build key hashes this text (compiler.fingerprint): a function's repr holds its address, which differs
    in every process, so such a model never hit the build cache."""
    def ones(shape, dtype):
        return np.ones(shape, dtype)

    text = gc.format_graph([gc.variable("w", (4, 3), init=ones)])
    assert "init=<test_graph.test_a_plain_function_initializer_prints_its_name_not_its_address.<locals>.ones>" in text
    assert "0x" not in text


def test_format_graph_attributes_and_constants():
    x = gc.placeholder("x", (8, 4))
    z = gc.reduce_mean(gc.transpose(gc.reshape(x, (2, -1, 4)), (2, 0, 1)) * 0.5, axis=(0, -1), keepdims=True)
    s = gc.softmax(gc.cast(x, "float64"), axis=0)
    c = gc.variable("c", (3,), init=gc.init.uniform(-0.5, 0.5, seed=7))
    labels = gc.one_hot(gc.placeholder("y", (8,), dtype="uint8"), 10)
    outputs = [z, s, c, gc.constant([1.0, 2.0]), gc.constant(np.zeros((3, 3))), labels, x * 0.1, gc.constant(3)]
    assert gc.format_graph(outputs) == """\
%0 = placeholder {name=x} : float32[8,4]
%1 = reshape(%0) : float32[2,4,4]
%2 = transpose(%1) {perm=(2,0,1)} : float32[4,2,4]
%3 = constant {value=0.5} : float32[]
%4 = mul(%2, %3) : float32[4,2,4]
%5 = reduce_mean(%4) {axes=(0,2), keepdims=True} : float32[1,2,1]
%6 = cast(%0) : float64[8,4]
%7 = softmax(%6) {axis=0} : float64[8,4]
%8 = variable {init=uniform(low=-0.5,high=0.5,seed=7), name=c} : float32[3]
%9 = constant {value=[1.,2.]} : float32[2]
%10 = constant {value=<array (3, 3)>} : float32[3,3]
%11 = placeholder {name=y} : uint8[8]
%12 = one_hot(%11) {depth=10} : float32[8,10]
%13 = constant {value=0.1} : float32[]
%14 = mul(%0, %13) : float32[8,4]
%15 = constant {value=3} : int32[]
return %5, %7, %8, %9, %10, %12, %14, %15"""


def test_format_graph_shares_numbering_across_calls():
    loss, logits, params = mlp()
    numbering = {}
    forward = gc.format_graph([loss], numbering)
    backward = gc.format_graph(gc.gradients(loss, params), numbering)
    assert forward == MLP_TEXT.replace("return %11, %9", "return %11")
    forward_lines = forward.splitlines()[:-1]
    backward_lines = backward.splitlines()[:-1]
    assert set(forward_lines) <= set(backward_lines)  # the forward nodes keep their numbers
    numbers = sorted(int(line.split(" = ")[0][1:]) for line in backward_lines)
    assert numbers[-1] == len(numbering) - 1 and len(set(numbers)) == len(numbers)


# --- topological order --------------------------------------------------------------------------------
def test_topological_order_properties():
    loss, logits, params = mlp()
    grads = gc.gradients(loss, params)
    outputs = [loss, *grads]
    order = gc.topological_order(outputs)
    position = {node: i for i, node in enumerate(order)}
    assert len(position) == len(order), "each node appears once"
    for node in order:
        for i in node.inputs:
            assert position[i] < position[node], f"{i} must come before its user {node}"
    assert all(o in position for o in outputs)
    reachable, stack = set(), list(outputs)
    while stack:
        node = stack.pop()
        if node not in reachable:
            reachable.add(node)
            stack.extend(node.inputs)
    assert reachable == set(order), "exactly the nodes reachable from the outputs"
    assert gc.topological_order(outputs) == order, "deterministic"


def test_topological_order_is_depth_first_with_inputs_in_order():
    a, b = gc.placeholder("a", (2,)), gc.placeholder("b", (2,))
    s = a + b
    p = b * s
    unused = gc.exp(a)
    order = gc.topological_order([p, s, a])
    assert order == [b, a, s, p]
    assert unused not in order
    assert gc.topological_order([s, p]) == [a, b, s, p]


def test_topological_order_of_a_deep_chain_does_not_recurse():
    x = gc.placeholder("x", (2,))
    y = x
    for _ in range(3000):
        y = y + 1.0
    order = gc.topological_order([y])
    assert len(order) == 1 + 2 * 3000 and order[0] is x and order[-1] is y


# --- executor: feeds ----------------------------------------------------------------------------------
def feed_graph():
    x = gc.placeholder("x", (4, 3))
    y = gc.placeholder("y", (4,), dtype="int32")
    return x, y, gc.NumpyExecutor([gc.reduce_sum(x, axis=1) * gc.cast(y, "float32")])


def test_feed_by_node_or_by_name():
    x, y, ex = feed_graph()
    xv, yv = uniform((4, 3), seed=1), np.array([1, -2, 3, 0])
    expected = xv.sum(axis=1) * yv
    np.testing.assert_allclose(ex.run({x: xv, y: yv})[0], expected, rtol=1e-6)
    np.testing.assert_allclose(ex.run({"x": xv, "y": yv})[0], expected, rtol=1e-6)


def test_missing_feed():
    x, y, ex = feed_graph()
    with pytest.raises(gc.GCompileError, match=r"placeholder y \(4,\) int32 was not fed"):
        ex.run({x: np.zeros((4, 3))})


def test_feed_of_the_wrong_shape():
    x, y, ex = feed_graph()
    with pytest.raises(gc.GCompileError, match=r"placeholder 'x': expected shape \(4, 3\), got \(3, 4\)"):
        ex.run({x: np.zeros((3, 4)), y: np.zeros(4, np.int32)})


def test_float_fed_to_an_integer_placeholder():
    x, y, ex = feed_graph()
    with pytest.raises(gc.GCompileError, match=r"placeholder 'y': expected integers \(int32\), got float64"):
        ex.run({x: np.zeros((4, 3)), y: np.zeros(4)})


def test_integer_feed_out_of_range():
    u = gc.placeholder("u", (2,), dtype="uint8")
    ex = gc.NumpyExecutor([u])
    with pytest.raises(gc.GCompileError, match=r"placeholder 'u': values outside the range of uint8"):
        ex.run({u: np.array([1, 256])})
    np.testing.assert_array_equal(ex.run({u: np.array([0, 255])})[0], np.array([0, 255], np.uint8))


def test_unknown_feed_name():
    x, y, ex = feed_graph()
    with pytest.raises(gc.GCompileError, match=r"unknown placeholder\(s\) \['z'\].*\['x', 'y'\]"):
        ex.run({x: np.zeros((4, 3)), y: np.zeros(4, np.int32), "z": np.zeros(1)})


def test_two_leaves_with_one_name_are_rejected():
    a, b = gc.placeholder("x", (2,)), gc.placeholder("x", (2,))
    with pytest.raises(gc.GCompileError, match=r"two different placeholders are named 'x'"):
        gc.NumpyExecutor([a + b])


def test_executor_rejects_an_integer_compute_dtype():
    with pytest.raises(gc.GCompileError, match="float32 or float64"):
        gc.NumpyExecutor([gc.placeholder("x", (2,))], dtype="int32")


def test_executor_takes_numpys_spellings_of_its_compute_dtype():
    x = gc.placeholder("x", (2,))
    for spelling in (np.float64, "f8", "double"):
        assert gc.NumpyExecutor([x * 1.5], dtype=spelling).run({x: [1.0, 2.0]})[0].dtype == np.float64


# --- numbers beside nodes, dtypes (QA: values the node's dtype cannot hold were converted silently) ------
def test_numbers_and_arrays_take_the_other_operands_dtype():
    f64, u8 = gc.placeholder("f64", (3,), dtype="float64"), gc.placeholder("u8", (3,), dtype="uint8")
    x, i = gc.placeholder("x", (3,)), gc.placeholder("i", (3,), dtype="int32")
    outs = [f64 + np.array([1.0, 2.0, 3.0]), f64 * np.array(2.0), u8 + np.array([1, 2, 3], np.uint8), x + [1, 2, 3],
            2.0 * i, i + np.array([True, False, True]), gc.exp(2.0) * x, gc.neg(np.ones(3)) + x]
    assert [o.dtype for o in outs] == ["float64", "float64", "uint8", "float32", "int32", "int32", "float32",
                                       "float32"]
    got = gc.NumpyExecutor(outs).run({f64: [1.0, 2.0, 4.0], u8: [1, 2, 3], x: [0.5, 0.25, 0.0], i: [1, -2, 3]})
    np.testing.assert_allclose(got[0], [2, 4, 7]) and np.testing.assert_array_equal(got[4], [2, -4, 6])
    np.testing.assert_allclose(got[6], np.exp(np.float32(2.0)) * np.float32([0.5, 0.25, 0.0]), rtol=1e-6)
    np.testing.assert_array_equal(got[7], [-0.5, -0.75, -1.0])


@pytest.mark.parametrize("build, message", [
    (lambda i, u, x: 2.5 * i, r"mul: an operand beside i \(3,\) int32: 2.5 is not a whole number"),
    (lambda i, u, x: i + 0.5, "not a whole number"),
    (lambda i, u, x: i + float("nan"), "not a whole number"),
    (lambda i, u, x: gc.maximum(i, 0.5), "maximum: .* not a whole number"),
    (lambda i, u, x: i + 2 ** 31, r"2147483648 is out of the range of int32 \[-2147483648, 2147483647\]"),
    (lambda i, u, x: i * 1e10, "out of the range of int32"),
    (lambda i, u, x: i + np.array([2 ** 40]), "out of the range of int32"),
    (lambda i, u, x: i + 2 ** 70, "out of the range of int32"),
    (lambda i, u, x: u + 300, "out of the range of uint8"),
    (lambda i, u, x: u / -1, "out of the range of uint8"),
    (lambda i, u, x: x + 1e300, "out of the range of float32"),
    (lambda i, u, x: x + None, "None is not a real number"),
    (lambda i, u, x: x + "a", "'a' is not a real number"),
    (lambda i, u, x: gc.constant(1 + 2j), r"\(1\+2j\) is not a real number"),
    (lambda i, u, x: gc.constant(3e9, dtype="int32"), "out of the range of int32"),
    (lambda i, u, x: gc.constant(2 ** 40), "out of the range of int32"),
    (lambda i, u, x: gc.NumpyExecutor([gc.variable("v", (2,), dtype="int32", init=gc.init.Constant(3e9))]),
     r"initializer constant\(3000000000.0\): .* out of the range of int32"),
    (lambda i, u, x: gc.NumpyExecutor([gc.variable("w", (2,), dtype="int32", init=gc.init.normal(1.0))]),
     "not a whole number"),
])
def test_values_a_dtype_cannot_hold_are_refused(build, message):
    i, u = gc.placeholder("i", (3,), dtype="int32"), gc.placeholder("u", (3,), dtype="uint8")
    with pytest.raises(gc.ShapeError, match=message):
        build(i, u, gc.placeholder("x", (3,)))


@pytest.mark.parametrize("dtype, message", [
    ("fp32", "unknown dtype 'fp32'; gcompile supports float32, float64, int32, uint8"),
    ("float32 ", "unknown dtype 'float32 '"), ("", "unknown dtype ''"),
    (None, "dtype None: give one"), ("int", r"unsupported dtype 'int' \(int64\)"),
    (np.int16, r"unsupported dtype <class 'numpy.int16'> \(int16\)"), ("complex64", "unsupported dtype 'complex64'"),
])
def test_dtype_names_are_checked_with_the_name_given(dtype, message):
    with pytest.raises(gc.ShapeError, match=message):
        gc.placeholder("x", (2,), dtype=dtype)


def test_set_variable_checks_the_values_as_a_feed_is():
    v = gc.variable("v", (2,), dtype="int32")
    ex = gc.NumpyExecutor([v])
    for bad in ([2 ** 40, 0], [1.7, 0], [np.nan, 0]):
        with pytest.raises(gc.GCompileError, match="set_variable 'v'"):
            ex.set_variable("v", bad)
    ex.set_variable("v", np.array([3, -4], np.int64))
    np.testing.assert_array_equal(ex.run()[0], [3, -4])


# --- executor: variables and assign -------------------------------------------------------------------
def test_variables_get_and_set_by_name():
    W = gc.variable("W", (2, 3), init=gc.init.normal(1.0, seed=5))
    x = gc.placeholder("x", (4, 2))
    ex = gc.NumpyExecutor([x @ W])
    initial = gc.init.normal(1.0, seed=5)((2, 3))
    np.testing.assert_array_equal(ex.get_variable("W"), initial)
    assert ex.get_variable("W").dtype == np.float32

    new = np.arange(6.0).reshape(2, 3)
    ex.set_variable("W", new)
    xv = uniform((4, 2), seed=2)
    np.testing.assert_allclose(ex.run({x: xv})[0], xv @ new, rtol=1e-6)
    assert ex.get_variable("W").dtype == np.float32

    ex.get_variable("W")[:] = 0  # a copy: the executor's state is untouched
    np.testing.assert_array_equal(ex.get_variable("W"), new)
    with pytest.raises(gc.GCompileError, match=r"set_variable 'W': expected shape \(2, 3\), got \(3, 2\)"):
        ex.set_variable("W", new.T)
    with pytest.raises(gc.GCompileError, match=r"no variable named 'V'; known: \['W'\]"):
        ex.get_variable("V")
    with pytest.raises(gc.GCompileError, match=r"no variable named 'V'"):
        ex.set_variable("V", new)


def test_outputs_do_not_alias_variables():
    W = gc.variable("W", init=np.arange(6.0).reshape(2, 3))
    ex = gc.NumpyExecutor([W, gc.reshape(W, (6,)), W + 0.0])
    for out in ex.run():
        out[...] = -1
    np.testing.assert_array_equal(ex.get_variable("W"), np.arange(6.0).reshape(2, 3))


def test_assign_reads_see_old_values_and_writes_land_after_the_step():
    a = gc.variable("a", init=np.array([1.0, 2.0]))
    b = gc.variable("b", init=np.array([10.0, 20.0]))
    n = gc.variable("n", init=np.array(0.0))
    swap = [gc.assign(a, b), gc.assign(b, a)]  # both read the values the step started with
    count = gc.assign(n, n + 1.0)
    seen = n * 1.0
    ex = gc.NumpyExecutor([seen, *swap, count])
    for step in range(3):
        seen_v, new_a, new_b, new_n = ex.run()
        assert seen_v == step and new_n == step + 1
        np.testing.assert_array_equal(new_a, [10.0, 20.0] if step % 2 == 0 else [1.0, 2.0])
        np.testing.assert_array_equal(ex.get_variable("a"), new_a)
        np.testing.assert_array_equal(ex.get_variable("b"), new_b)
    assert ex.get_variable("n") == 3.0


def test_variable_read_in_the_step_of_its_assign_is_the_old_value():
    v = gc.variable("v", init=np.array([1.0, 2.0]))
    update = gc.assign(v, v * 3.0)
    ex = gc.NumpyExecutor([v, update, v + 0.0])
    old, new, old_plus_zero = ex.run()
    np.testing.assert_array_equal(old, [1.0, 2.0])
    np.testing.assert_array_equal(old_plus_zero, [1.0, 2.0])
    np.testing.assert_array_equal(new, [3.0, 6.0])
    np.testing.assert_array_equal(ex.get_variable("v"), [3.0, 6.0])


# --- executor: float64 mode ---------------------------------------------------------------------------
def test_float64_mode():
    x, y = gc.placeholder("x", (3, 4)), gc.placeholder("y", (4,))
    i = gc.placeholder("i", (3,), dtype="int32")
    W = gc.variable("W", (4, 2), init=gc.init.normal(1.0, seed=3))
    out = gc.tanh(x * y) @ W + gc.reshape(gc.cast(i, "float32"), (3, 1))
    xv, yv, iv = uniform((3, 4), seed=4), uniform((4,), seed=5), np.array([1, 2, 3])
    wv = gc.init.normal(1.0, seed=3)((4, 2), "float64")
    expected = np.tanh(xv * yv) @ wv + iv[:, None]

    ex64 = gc.NumpyExecutor([out, i * 2], dtype="float64")
    got, doubled = ex64.run({x: xv, y: yv, i: iv})
    assert got.dtype == np.float64 and ex64.get_variable("W").dtype == np.float64
    assert doubled.dtype == np.int32
    np.testing.assert_allclose(got, expected, rtol=1e-14)

    (got32,) = gc.NumpyExecutor([out]).run({x: xv, y: yv, i: iv})
    assert got32.dtype == np.float32
    np.testing.assert_allclose(got32, expected, rtol=1e-5)
    assert np.abs(got32 - expected).max() > 1e-12, "float32 mode really rounds"


# --- SGD ----------------------------------------------------------------------------------------------
def regression(optimizer):
    x, t = gc.placeholder("x", (4, 3)), gc.placeholder("t", (4, 2))
    W = gc.variable("W", (3, 2), init=gc.init.normal(0.5, seed=11))
    b = gc.variable("b", (2,), init=gc.init.normal(0.5, seed=12))
    loss = gc.reduce_mean((x @ W + b - t) ** 2)
    return x, t, gc.Program(loss, params=[W, b], optimizer=optimizer)


def test_sgd_with_momentum_and_weight_decay_matches_numpy():
    lr, mu, wd = 0.1, 0.9, 0.01
    x, t, prog = regression(gc.SGD(lr=lr, momentum=mu, weight_decay=wd))
    ex = gc.NumpyExecutor(prog.train_outputs)
    W = gc.init.normal(0.5, seed=11)((3, 2), "float64")
    b = gc.init.normal(0.5, seed=12)((2,), "float64")
    vW, vb = np.zeros_like(W), np.zeros_like(b)
    for step in range(3):
        xv, tv = uniform((4, 3), seed=20 + step), uniform((4, 2), seed=30 + step)
        loss = ex.run({x: xv, t: tv})[0]

        r = xv @ W + b - tv
        np.testing.assert_allclose(loss, np.mean(r ** 2), rtol=1e-5)
        gW, gb = 2 / r.size * xv.T @ r, 2 / r.size * r.sum(axis=0)
        vW, vb = mu * vW + gW + wd * W, mu * vb + gb + wd * b
        W, b = W - lr * vW, b - lr * vb
        np.testing.assert_allclose(ex.get_variable("W"), W, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(ex.get_variable("b"), b, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(ex.get_variable("W.velocity"), vW, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(ex.get_variable("b.velocity"), vb, rtol=1e-5, atol=1e-6)


def test_plain_sgd_has_no_state_and_a_settable_learning_rate():
    x, t, prog = regression(gc.SGD(lr=0.5))
    ex = gc.NumpyExecutor(prog.train_outputs)
    guard = ["guard.halted_at", "guard.nonfinite_steps", "guard.skip"]  # every Program's (test_guard.py)
    assert sorted(ex.variables) == ["W", "b", *guard, "lr", "step"]
    assert ex.get_variable("lr") == np.float32(0.5)
    ex.set_variable("lr", 0.25)
    W = ex.get_variable("W").astype(np.float64)
    b = ex.get_variable("b").astype(np.float64)
    xv, tv = uniform((4, 3), seed=1), uniform((4, 2), seed=2)
    ex.run({x: xv, t: tv})
    r = xv @ W + b - tv
    np.testing.assert_allclose(ex.get_variable("W"), W - 0.25 * (2 / r.size) * xv.T @ r, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kwargs", [{"lr": 0.0}, {"lr": -1.0}, {"momentum": -0.1}, {"weight_decay": -1e-4}])
def test_sgd_rejects_bad_hyperparameters(kwargs):
    with pytest.raises(gc.GCompileError, match="SGD"):
        gc.SGD(**kwargs)


# --- initializers -------------------------------------------------------------------------------------
INITIALIZERS = [gc.init.normal(0.1, seed=3), gc.init.uniform(-1, 2, seed=3), gc.init.he_normal(seed=3),
                gc.init.xavier_uniform(seed=3)]


@pytest.mark.parametrize("init", INITIALIZERS, ids=lambda i: i.describe())
def test_initializers_are_reproducible(init):
    first = init((30, 20))
    assert first.dtype == np.float32 and first.shape == (30, 20)
    np.testing.assert_array_equal(first, init((30, 20)))
    np.testing.assert_array_equal(first, type(init)(**vars(init))((30, 20)))
    other = dict(vars(init), seed=4)
    assert not np.array_equal(first, type(init)(**other)((30, 20)))
    np.testing.assert_array_equal(gc.NumpyExecutor([gc.variable("v", (30, 20), init=init)]).run()[0], first)


def test_he_normal_std():
    w = gc.init.he_normal(seed=0)((2000, 500))
    assert abs(w.std() / np.sqrt(2 / 2000) - 1) < 0.01
    assert abs(w.mean()) < 1e-3
    conv = gc.init.he_normal(seed=0)((64, 32, 3, 3))  # (out, in, kh, kw): fan_in = 32 * 9
    assert abs(conv.std() / np.sqrt(2 / 288) - 1) < 0.02


def test_xavier_uniform_bounds():
    w = gc.init.xavier_uniform(seed=0)((300, 200)).astype(np.float64)
    limit = np.sqrt(6 / 500)
    assert np.abs(w).max() <= limit * (1 + 1e-7)
    assert w.max() > 0.99 * limit and w.min() < -0.99 * limit
    assert abs(w.std() / (limit / np.sqrt(3)) - 1) < 0.01


def test_normal_uniform_and_constant_initializers():
    w = gc.init.normal(0.5, seed=1, mean=2.0)((400, 250))
    assert abs(w.mean() - 2.0) < 0.01 and abs(w.std() - 0.5) < 0.01
    u = gc.init.uniform(-1.0, 3.0, seed=1)((400, 250))
    assert u.min() >= -1.0 and u.max() < 3.0 and abs(u.mean() - 1.0) < 0.01
    np.testing.assert_array_equal(gc.init.zeros()((2, 3)), np.zeros((2, 3)))
    np.testing.assert_array_equal(gc.init.ones()((2,), "float64"), np.ones(2))
    assert gc.init.ones()((2,), "float64").dtype == np.float64


def test_variable_from_an_array():
    value = np.arange(6.0).reshape(3, 2)
    v = gc.variable("v", init=value)
    assert v.shape == (3, 2) and v.dtype == "float32"
    np.testing.assert_array_equal(gc.NumpyExecutor([v]).run()[0], value)


# --- gc.Program ---------------------------------------------------------------------------------------
def test_program_collects_gradients_updates_and_inputs():
    loss, logits, params = mlp(batch=6)
    prog = gc.Program(loss, params, optimizer=gc.SGD(lr=0.1), outputs={"logits": logits})
    assert [g.shape for g in prog.grads] == [p.shape for p in params]
    assert all(u.op == "assign" for u in prog.updates)
    targets = [u.inputs[0].name for u in prog.updates]  # the parameters, then the guard's and the step counter
    assert targets == [p.name for p in params] + ["guard.nonfinite_steps", "guard.halted_at", "step"]
    assert prog.updates[-1].inputs[0] is gc.step_counter()  # the step counter's increment
    assert prog.train_outputs[0] is loss
    assert [p.name for p in prog.inputs] == ["x", "y"]
    assert prog.batch_size == 6


def test_program_rejects_a_non_scalar_loss():
    _, logits, params = mlp()
    with pytest.raises(gc.GCompileError, match=r"loss must be a float scalar, got add_\d+ \(4, 2\) float32"):
        gc.Program(logits, params)


def test_program_rejects_an_integer_loss():
    labels = gc.placeholder("labels", (4,), dtype="int32")
    with pytest.raises(gc.GCompileError, match=r"loss must be a float scalar.*int32"):
        gc.Program(gc.reduce_sum(labels), [])


def test_program_rejects_an_unused_parameter():
    loss, _, params = mlp()
    extra = gc.variable("unused", (3,))
    with pytest.raises(gc.GCompileError, match=r"does not depend on parameter\(s\) \['unused'\]"):
        gc.Program(loss, params + [extra])


def test_program_rejects_a_parameter_that_is_not_a_variable():
    loss, logits, params = mlp()
    with pytest.raises(gc.GCompileError, match=r"parameter add_\d+ \(4, 2\) float32 is a add, not a variable"):
        gc.Program(loss, params + [logits])


def test_program_rejects_inputs_with_different_batch_sizes():
    a, b = gc.placeholder("a", (4, 3)), gc.placeholder("b", (5, 3))
    w = gc.variable("w", (3,), init=gc.init.ones())
    loss = gc.reduce_sum(a * w) + gc.reduce_sum(b * w)
    with pytest.raises(gc.GCompileError, match=r"batch size: a \(4, 3\) float32, b \(5, 3\) float32"):
        gc.Program(loss, [w])
