"""Every op, forward against an independent numpy expression and gradient against finite differences."""
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis.extra.numpy import array_shapes, mutually_broadcastable_shapes

import gcompile as gc
from gcompile.ops import get_op
from opcheck import away_from_zero, check_op, distinct, rng, uniform


def softmax_ref(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def log_softmax_ref(x, axis):
    m = x.max(axis=axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))


# --- the helper itself must be able to fail -----------------------------------------------------------
def test_check_op_rejects_a_wrong_forward():
    with pytest.raises(AssertionError):
        check_op(gc.tanh, [uniform((2, 3))], lambda x: np.tanh(x) + 1e-3)


def test_check_op_rejects_a_wrong_gradient(monkeypatch):
    monkeypatch.setattr(type(get_op("tanh")), "grad", lambda self, node, g: [g * (1.0 - node)])
    with pytest.raises(AssertionError, match="relative error"):
        check_op(gc.tanh, [uniform((2, 3))], np.tanh)


# --- binary elementwise ops with broadcasting ---------------------------------------------------------
BINARY = {
    "add": (gc.add, np.add),
    "sub": (gc.sub, np.subtract),
    "mul": (gc.mul, np.multiply),
    "div": (gc.div, np.divide),
    "maximum": (gc.maximum, np.maximum),
    "minimum": (gc.minimum, np.minimum),
}
BROADCAST_SHAPES = [((3, 4), (3, 4)), ((3, 4), (4,)), ((4,), (3, 4)), ((3, 1), (1, 5)), ((2, 3, 4), (3, 1)),
                    ((), (2, 3)), ((2, 1, 4), (3, 1))]


@pytest.mark.parametrize("shapes", BROADCAST_SHAPES, ids=str)
@pytest.mark.parametrize("op", sorted(BINARY))
def test_binary(op, shapes):
    build, reference = BINARY[op]
    a = uniform(shapes[0], seed=1)
    b = away_from_zero(shapes[1], 0.5, 2.0, seed=2) if op == "div" else uniform(shapes[1], seed=2)
    if op in ("maximum", "minimum"):
        assert np.abs(a - b).min() > 1e-3  # no ties: the gradient is defined everywhere we probe
    check_op(build, [a, b], reference)


@settings(max_examples=40, deadline=None)
@given(mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, max_side=3))
def test_broadcasting_matches_numpy(shapes):
    a, b = uniform(shapes.input_shapes[0], seed=1), uniform(shapes.input_shapes[1], seed=2)
    out = check_op(lambda x, y: x * y - y, [a, b], lambda x, y: x * y - y)
    assert out.shape == shapes.result_shape


@settings(max_examples=60, deadline=None)
@given(array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=4),
       array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=4))
def test_broadcast_errors_exactly_when_numpy_refuses(shape_a, shape_b):
    a, b = gc.placeholder("a", shape_a), gc.placeholder("b", shape_b)
    try:
        expected = np.broadcast_shapes(shape_a, shape_b)
    except ValueError:
        with pytest.raises(gc.ShapeError, match="add: shapes do not broadcast"):
            a + b
    else:
        assert (a + b).shape == expected


def test_binary_operators_match_functions():
    a, b = uniform((3, 4), seed=1), away_from_zero((4,), seed=2)
    check_op(lambda x, y: x + y, [a, b], np.add)
    check_op(lambda x, y: x - y, [a, b], np.subtract)
    check_op(lambda x, y: x * y, [a, b], np.multiply)
    check_op(lambda x, y: x / y, [a, b], np.divide)
    check_op(lambda x: -x, [a], np.negative)
    check_op(lambda x: +x, [a], lambda x: x)


SCALAR_CASES = {
    "x + 2": (lambda x: x + 2, lambda x: x + 2),
    "2 + x": (lambda x: 2 + x, lambda x: 2 + x),
    "x - 2.5": (lambda x: x - 2.5, lambda x: x - 2.5),
    "2 - x": (lambda x: 2 - x, lambda x: 2 - x),
    "x * 3": (lambda x: x * 3, lambda x: x * 3),
    "3 * x": (lambda x: 3 * x, lambda x: 3 * x),
    "x / 4": (lambda x: x / 4, lambda x: x / 4),
    "1 / x": (lambda x: 1 / x, lambda x: 1 / x),
    "np.float32(2) * x": (lambda x: np.float32(2.0) * x, lambda x: 2 * x),
    "maximum(x, 0.5)": (lambda x: gc.maximum(x, 0.5), lambda x: np.maximum(x, 0.5)),
    "maximum(0.5, x)": (lambda x: gc.maximum(0.5, x), lambda x: np.maximum(x, 0.5)),
    "minimum(x, -0.5)": (lambda x: gc.minimum(x, -0.5), lambda x: np.minimum(x, -0.5)),
    "minimum(-0.5, x)": (lambda x: gc.minimum(-0.5, x), lambda x: np.minimum(x, -0.5)),
}


@pytest.mark.parametrize("case", sorted(SCALAR_CASES))
def test_python_scalar_operands(case):
    build, reference = SCALAR_CASES[case]
    x = away_from_zero((3, 4), 0.6, 2.0, seed=3)  # keeps 1/x finite and x away from the +-0.5 kinks
    out = check_op(build, [x], reference)
    assert out.dtype == "float32"


def test_python_scalar_adopts_the_tensor_dtype():
    x = gc.placeholder("x", (3,), dtype="float64")
    assert (x * 2).dtype == "float64" and (2 - x).inputs[0].dtype == "float64"
    i = gc.placeholder("i", (3,), dtype="int32")
    assert (i + 1).dtype == "int32"


def test_array_operands():
    a = uniform((2, 3), seed=4)
    m = uniform((3, 4), seed=5)
    check_op(lambda x: m + x, [uniform((2, 3, 4), seed=6)], lambda x: m + x)
    check_op(lambda x: a @ x, [m], lambda x: a @ x)
    check_op(lambda x: x @ m, [a], lambda x: x @ m)


def test_integer_ops():
    a = np.array([[7, -7, 6], [-6, 5, 0]], dtype=np.int32)
    b = np.array([2, 2, 4], dtype=np.int32)
    check_op(gc.add, [a, b], np.add)
    check_op(gc.mul, [a, b], np.multiply)
    check_op(gc.maximum, [a, b], np.maximum)
    check_op(lambda x: -x, [a], np.negative)


def test_integer_division_truncates_toward_zero_like_c():
    # The op's c_expr is C's `/`, which truncates; the reference executor must agree with compiled code.
    a = np.array([7, -7, 7, -7, 6, -6, 0], dtype=np.int32)
    b = np.array([2, 2, -2, -2, 4, 4, 3], dtype=np.int32)
    check_op(gc.div, [a, b], lambda a, b: np.array([3, -3, -3, 3, 1, -1, 0], dtype=np.int32))
    check_op(lambda x: x / 3, [np.array([7, 255, 0], np.uint8)], lambda x: np.array([2, 85, 0], np.uint8))


# --- unary elementwise ops ----------------------------------------------------------------------------
def sigmoid_ref(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))


UNARY = {
    "neg": (gc.neg, np.negative, uniform),
    "exp": (gc.exp, np.exp, uniform),
    "log": (gc.log, np.log, lambda shape, seed: uniform(shape, 0.5, 3.0, seed)),
    "sqrt": (gc.sqrt, np.sqrt, lambda shape, seed: uniform(shape, 0.5, 3.0, seed)),
    "tanh": (gc.tanh, np.tanh, uniform),
    "sigmoid": (gc.sigmoid, sigmoid_ref, lambda shape, seed: uniform(shape, -4.0, 4.0, seed)),
    "relu": (gc.relu, lambda x: x * (x > 0), away_from_zero),
    "sin": (gc.sin, np.sin, lambda shape, seed: uniform(shape, -3.0, 3.0, seed)),
    "cos": (gc.cos, np.cos, lambda shape, seed: uniform(shape, -3.0, 3.0, seed)),
}


@pytest.mark.parametrize("shape", [(5,), (3, 4), (2, 3, 4)], ids=str)
@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary(op, shape):
    build, reference, sample = UNARY[op]
    check_op(build, [sample(shape, seed=7)], reference)


def test_sigmoid_is_stable_for_large_inputs():
    x = np.array([-1000.0, -100.0, -20.0, 0.0, 20.0, 100.0, 1000.0])
    def reference(v):
        with np.errstate(over="ignore"):
            return 1.0 / (1.0 + np.exp(-v))  # exp(1000) = inf gives exactly 0

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the op itself must not overflow
        out = check_op(gc.sigmoid, [x], reference, atol=1e-44)  # float32 denormals are coarse
        (got,) = gc.NumpyExecutor([out]).run({out.inputs[0]: x})
    assert got[0] == 0.0 and got[-1] == 1.0 and got[3] == 0.5
    assert 0 < got[1] < 1e-43  # exp(-100) survives as a float32 denormal


POW_EXPONENTS = [2, 3, 1, 0, 0.5, -1, -2.5, 1.5]


@pytest.mark.parametrize("exponent", POW_EXPONENTS)
def test_pow(exponent):
    x = uniform((3, 4), 0.5, 2.0, seed=8)
    check_op(lambda v: gc.pow(v, exponent), [x], lambda v: v ** float(exponent))
    check_op(lambda v: v ** exponent, [x], lambda v: v ** float(exponent))


def test_pow_of_negative_base_with_integer_exponent():
    x = away_from_zero((3, 4), 0.5, 2.0, seed=9)
    check_op(lambda v: v ** 2, [x], np.square)
    check_op(lambda v: v ** 3, [x], lambda v: v * v * v)
    check_op(lambda v: v ** -1, [x], np.reciprocal)


def test_relu_grad_and_masks():
    x, g = away_from_zero((3, 4), seed=10), uniform((3, 4), seed=11)
    check_op(gc.relu_grad, [x, g], lambda x, g: np.where(x > 0, g, 0.0))
    a, b = distinct((3, 4), seed=12), distinct((4,), seed=13)
    check_op(gc.greater_equal, [a, b], lambda a, b: (a >= b).astype(np.float64))
    check_op(gc.equal, [a, a[0]], lambda a, b: (a == b).astype(np.float64))
    check_op(gc.equal, [np.array([1, 2, 3], np.int32), np.array([1, 0, 3], np.int32)],
             lambda a, b: np.array([1, 0, 1], np.int32))


# --- matmul -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
def test_matmul(trans_a, trans_b):
    m, k, n = 3, 4, 5
    a = uniform((k, m) if trans_a else (m, k), seed=14)
    b = uniform((n, k) if trans_b else (k, n), seed=15)
    check_op(lambda x, y: gc.matmul(x, y, trans_a=trans_a, trans_b=trans_b), [a, b],
             lambda x, y: (x.T if trans_a else x) @ (y.T if trans_b else y))


def test_matmul_operator_and_chain():
    a, b, c = uniform((2, 3), seed=16), uniform((3, 4), seed=17), uniform((5, 4), seed=18)
    check_op(lambda x, y, z: (x @ y) @ z.T, [a, b, c], lambda x, y, z: x @ y @ z.T)


# --- shape ops ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("perm", [(1, 0, 2), (2, 0, 1), (0, 2, 1), (0, 1, 2), None], ids=str)
def test_transpose_3d(perm):
    check_op(lambda x: gc.transpose(x, perm), [uniform((2, 3, 4), seed=19)], lambda x: np.transpose(x, perm))


def test_transpose_property_t():
    check_op(lambda x: x.T, [uniform((3, 5), seed=20)], lambda x: x.T)


@pytest.mark.parametrize("src,dst", [((2, 3, 4), (6, 4)), ((2, 3, 4), (4, -1)), ((2, 3, 4), (-1,)),
                                     ((6, 4), (2, -1, 3)), ((3, 4), (1, 12)), ((12,), (3, 4))], ids=str)
def test_reshape(src, dst):
    out = check_op(lambda x: gc.reshape(x, dst), [uniform(src, seed=21)], lambda x: x.reshape(dst))
    assert -1 not in out.shape


@pytest.mark.parametrize("src,dst", [((3, 1), (2, 3, 5)), ((4,), (3, 4)), ((), (2, 3)), ((1, 4), (3, 4)),
                                     ((2, 1, 4), (2, 3, 4)), ((3, 4), (3, 4))], ids=str)
def test_broadcast_to(src, dst):
    check_op(lambda x: gc.broadcast_to(x, dst), [uniform(src, seed=22)], lambda x: np.broadcast_to(x, dst))


# --- reductions ---------------------------------------------------------------------------------------
REDUCTIONS = {"reduce_sum": (gc.reduce_sum, np.sum), "reduce_mean": (gc.reduce_mean, np.mean),
              "reduce_max": (gc.reduce_max, np.max)}
AXES = [0, 1, 2, -1, -3, (0, 2), (1, -1), (0, 1, 2), None]


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("axis", AXES, ids=str)
@pytest.mark.parametrize("op", sorted(REDUCTIONS))
def test_reduce(op, axis, keepdims):
    build, reference = REDUCTIONS[op]
    x = distinct((2, 3, 4), seed=23)  # distinct values: reduce_max has no ties
    check_op(lambda v: build(v, axis=axis, keepdims=keepdims), [x],
             lambda v: reference(v, axis=axis, keepdims=keepdims))


def test_reduce_max_shares_the_gradient_between_ties():
    x = gc.placeholder("x", (2, 3))
    (g,) = gc.gradients(gc.reduce_sum(gc.reduce_max(x, axis=1) * np.array([1.0, 4.0])), [x])
    (gv,) = gc.NumpyExecutor([g], dtype="float64").run({x: np.array([[1.0, 3.0, 3.0], [5.0, 5.0, 5.0]])})
    np.testing.assert_array_equal(gv, [[0.0, 0.5, 0.5], [4 / 3, 4 / 3, 4 / 3]])


def test_reduce_of_a_scalar_and_integers():
    check_op(gc.reduce_sum, [np.array(1.5)], lambda v: v)
    check_op(lambda v: gc.reduce_sum(v, axis=0), [np.array([[1, 2], [3, 4]], np.int32)],
             lambda v: np.array([4, 6], np.int32))


def test_an_integer_mean_truncates_its_exact_sum_toward_zero():
    """As the compiled kernels do (an int64 sum): np.mean's float64 sum rounded 2^23 values near 2^31 (QA)."""
    check_op(lambda v: gc.reduce_mean(v, axis=1), [np.array([[-1, -1, 1], [5, 5, 6], [-7, 0, 0]], np.int32)],
             lambda v: np.array([0, 5, -2], np.int32))
    big = np.full(2 ** 23, 2 ** 31 - 1, np.int32)
    big[0] -= 1
    check_op(gc.reduce_mean, [big], lambda v: np.int32(2 ** 31 - 2))


# --- softmax family -----------------------------------------------------------------------------------
@pytest.mark.parametrize("shape,axis", [((3, 5), -1), ((3, 5), 0), ((3, 5), 1), ((2, 3, 4), 1), ((4,), 0)],
                         ids=str)
def test_softmax(shape, axis):
    check_op(lambda v: gc.softmax(v, axis=axis), [uniform(shape, -3, 3, seed=24)], lambda v: softmax_ref(v, axis))


@pytest.mark.parametrize("shape,axis", [((3, 5), -1), ((3, 5), 0), ((2, 3, 4), 1), ((2, 3, 4), -3)], ids=str)
def test_log_softmax(shape, axis):
    check_op(lambda v: gc.log_softmax(v, axis=axis), [uniform(shape, -3, 3, seed=25)],
             lambda v: log_softmax_ref(v, axis))


LARGE_LOGITS = np.array([[1000.0, 1001.0, 1002.0], [-1000.0, 0.0, 1000.0], [-1000.0, -1000.5, -999.0]])


def test_softmax_family_is_stable_for_large_logits():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        base = np.log(1 + np.exp(-1.0) + np.exp(-2.0))
        expected = np.array([[-2 - base, -1 - base, -base], [-2000.0, -1000.0, 0.0],
                             log_softmax_ref(LARGE_LOGITS[2:], -1)[0]])
        check_op(gc.log_softmax, [LARGE_LOGITS], lambda v: expected, rtol=1e-6, atol=1e-4)
        check_op(gc.softmax, [LARGE_LOGITS], lambda v: np.exp(expected), rtol=1e-5, atol=1e-6)


def cross_entropy_ref(logits, labels):
    return -np.mean(log_softmax_ref(logits, 1)[np.arange(len(labels)), labels])


@pytest.mark.parametrize("label_dtype", [np.int32, np.uint8])
def test_softmax_cross_entropy_integer_labels(label_dtype):
    logits = uniform((5, 4), -3, 3, seed=26)
    labels = np.array([0, 3, 1, 3, 2], dtype=label_dtype)
    out = check_op(gc.softmax_cross_entropy, [logits, labels], cross_entropy_ref)
    assert out.shape == () and out.dtype == "float32"


def test_softmax_cross_entropy_large_logits():
    labels = np.array([0, 1, 2], np.int32)
    expected = (2 + np.log(1 + np.exp(-1.0) + np.exp(-2.0))  # row 0, label 0: 2 below the max
                + 1000.0                                      # row 1, label 1: 1000 below the max
                + np.log(1 + np.exp(-1.0) + np.exp(-1.5)))    # row 2, label 2: the max
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_op(gc.softmax_cross_entropy, [LARGE_LOGITS, labels], lambda *_: expected / 3, atol=0)


def test_softmax_cross_entropy_rejects_out_of_range_labels():
    logits, labels = gc.placeholder("logits", (2, 3)), gc.placeholder("labels", (2,), dtype="int32")
    ex = gc.NumpyExecutor([gc.softmax_cross_entropy(logits, labels)])
    with pytest.raises(gc.GCompileError, match=r"label 3 at index 1 is outside \[0, 3\)"):
        ex.run({logits: np.zeros((2, 3)), labels: np.array([0, 3])})


def test_softmax_cross_entropy_one_hot_labels():
    logits = uniform((5, 4), -3, 3, seed=27)
    classes = np.array([2, 0, 1, 3, 3])
    one_hot = np.eye(4)[classes]
    check_op(gc.softmax_cross_entropy, [logits, one_hot], lambda z, y: cross_entropy_ref(z, classes))


def test_softmax_cross_entropy_soft_labels():
    logits = uniform((3, 4), -3, 3, seed=28)
    probs = softmax_ref(uniform((3, 4), seed=29), 1)
    check_op(gc.softmax_cross_entropy, [logits, probs],
             lambda z, p: -np.sum(p * log_softmax_ref(z, 1)) / 3)


def test_one_hot():
    labels = np.array([[0, 3, 1], [2, 2, 4]], dtype=np.int32)  # 4 is outside [0, 4): a row of zeros
    expected = np.zeros((2, 3, 4))
    for idx in np.ndindex(2, 3):
        if labels[idx] < 4:
            expected[idx + (labels[idx],)] = 1
    out = check_op(lambda v: gc.one_hot(v, 4), [labels], lambda v: expected)
    assert out.dtype == "float32"
    out = check_op(lambda v: gc.one_hot(v, 4, dtype="int32"), [labels.astype(np.uint8)],
                   lambda v: expected.astype(np.int32))
    assert out.dtype == "int32"


# --- fills and casts ----------------------------------------------------------------------------------
def test_zeros_like_and_ones_like():
    x = uniform((3, 4), seed=30)
    check_op(gc.zeros_like, [x], np.zeros_like)
    check_op(gc.ones_like, [x], np.ones_like)
    check_op(lambda v: v * gc.ones_like(v), [x], lambda v: v)  # no gradient flows through the fill
    out = check_op(gc.ones_like, [np.array([1, 2], np.int32)], lambda v: np.array([1, 1], np.int32))
    assert out.dtype == "int32"


def test_cast():
    x = np.array([[-1.7, -0.2, 0.0], [0.4, 2.9, 3.5]])
    out = check_op(lambda v: gc.cast(v, "int32"), [x], lambda v: np.array([[-1, 0, 0], [0, 2, 3]], np.int32))
    assert out.dtype == "int32"
    out = check_op(lambda v: gc.cast(v, "float64") * 2.0, [x], lambda v: 2 * v)
    assert out.dtype == "float64"
    check_op(lambda v: gc.cast(gc.cast(v, "float64"), "float32") ** 2, [x], np.square)
    check_op(lambda v: gc.cast(v, "float32"), [np.array([1, 255], np.uint8)], lambda v: v.astype(float))


def test_integer_path_blocks_the_gradient():
    check_op(lambda v: v * gc.cast(gc.cast(v, "int32"), "float32"), [np.array([[1.5, -2.5, 3.25]])],
             lambda v: v * np.trunc(v))
