"""Golden tests: compiled programs (cpu target here, cuda on a GPU machine) against the numpy reference.

The rule (design.md): outputs and parameters after several training steps equal NumpyExecutor's within
rtol 1e-4, atol 1e-5 in float32. Every op is compiled alone AND through its gradient graph, all ops of a
target in one program so the whole suite costs one compiler run per target.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

import gcompile as gc

from golden import TARGETS, assert_compiled_matches_numpy, assert_training_matches_numpy, graph_of_cases


def op_cases():
    """(name, build(placeholders) -> node, input arrays) for every op of the library."""
    r = np.random.RandomState(0)
    a, b = r.uniform(-1, 1, (5, 7)), r.uniform(-1, 1, (5, 7))
    pos = r.uniform(0.5, 2.0, (5, 7))
    row, col = r.uniform(-1, 1, (7,)), r.uniform(-1, 1, (5, 1))
    cube = r.uniform(-1, 1, (3, 4, 5))
    labels = r.randint(0, 7, size=(5,)).astype(np.int32)
    away = r.uniform(0.2, 1.0, (5, 7)) * r.choice([-1, 1], (5, 7))
    distinct = (r.permutation(35) * 0.1 - 1.7).reshape(5, 7)
    return [
        ("add", lambda x, y: x + y, [a, row]),
        ("sub", lambda x, y: x - y, [a, col]),
        ("mul", lambda x, y: x * y, [a, b]),
        ("div", lambda x, y: x / y, [a, pos]),
        ("rsub_scalar", lambda x: 2.0 - x, [a]),
        ("neg", lambda x: -x, [a]),
        ("pow", lambda x: x ** 3, [a]),
        ("pow_half", lambda x: x ** 0.5, [pos]),
        ("exp", gc.exp, [a]),
        ("log", gc.log, [pos]),
        ("sqrt", gc.sqrt, [pos]),
        ("tanh", gc.tanh, [a]),
        ("sigmoid", gc.sigmoid, [a * 8]),
        ("relu", gc.relu, [away]),
        ("maximum", gc.maximum, [distinct, distinct.T.reshape(5, 7) + 0.05]),
        ("minimum", gc.minimum, [distinct, distinct.T.reshape(5, 7) + 0.05]),
        ("matmul", lambda x, y: x @ y, [a, r.uniform(-1, 1, (7, 3))]),
        ("matmul_ta", lambda x, y: gc.matmul(x, y, trans_a=True), [a, r.uniform(-1, 1, (5, 3))]),
        ("matmul_tb", lambda x, y: gc.matmul(x, y, trans_b=True), [a, r.uniform(-1, 1, (3, 7))]),
        ("matmul_tab", lambda x, y: gc.matmul(x, y, True, True), [a, r.uniform(-1, 1, (3, 5))]),
        ("matmul_big", lambda x, y: x @ y, [r.uniform(-1, 1, (70, 130)), r.uniform(-1, 1, (130, 90))]),
        ("transpose", lambda x: gc.transpose(x, (2, 0, 1)), [cube]),
        ("reshape", lambda x: gc.reshape(x, (4, -1)) * 2.0, [cube]),
        ("broadcast_to", lambda x: gc.broadcast_to(x, (4, 5, 1)), [col]),
        ("reduce_sum_0", lambda x: gc.reduce_sum(x, 0), [cube]),
        ("reduce_sum_02", lambda x: gc.reduce_sum(x, (0, 2), keepdims=True), [cube]),
        ("reduce_sum_all", gc.reduce_sum, [r.uniform(-1, 1, (40, 30))]),
        ("reduce_mean_1", lambda x: gc.reduce_mean(x, 1), [cube]),
        ("reduce_max_2", lambda x: gc.reduce_max(x, -1), [distinct.reshape(5, 7)]),
        ("softmax", gc.softmax, [a * 5]),
        ("softmax_axis0", lambda x: gc.softmax(x, axis=0), [cube]),
        ("log_softmax", gc.log_softmax, [a * 5]),
        ("softmax_cross_entropy", gc.softmax_cross_entropy, [a * 3, labels]),
        ("softmax_cross_entropy_onehot", lambda x, y: gc.softmax_cross_entropy(x, gc.one_hot(y, 7)),
         [a * 3, labels]),
        ("ones_like", lambda x: gc.ones_like(x) + x, [a]),
        ("zeros_like", lambda x: gc.zeros_like(x) - x, [a]),
        ("cast", lambda x: gc.cast(gc.cast(x * 10.0, "int32"), "float32"), [a]),
        # integers: x / 0 is 0 and INT32_MIN / -1 wraps (C's division traps on both); means sum exactly
        ("int_div", lambda x, y: x / y, [np.array([[7, -7, 6, -2**31, 5, -9, 0]]),
                                         np.array([[2, 2, 0, -1, -1, 4, 0]])]),
        ("int_mean", lambda x: gc.reduce_mean(x, 1), [np.array([[2 * 10**9] * 3, [1, 2, 4], [-1, -2, -4]])]),
        ("uint8_mean", lambda x: gc.cast(gc.reduce_mean(gc.cast(x, "uint8"), 1), "int32"),
         [np.array([[200, 200, 200, 200], [10, 20, 30, 41]])]),
        # int32 +, -, * and negation wrap as numpy's do (C++'s signed overflow is undefined: the compiler
        # folded `x + 1 >= x` to 1 at INT32_MAX); a maximum's accumulator keeps its type
        ("int_wrap", lambda x: gc.greater_equal(x + 1, x) + gc.greater_equal(x, x - 1) * 2 +
         gc.greater_equal(x * 2, x) * 4 + gc.greater_equal(-x, 0) * 8,
         [np.array([[2**31 - 1, -2**31, 5, 2**30, -3, 0]])]),
        ("int_max", lambda x: gc.reduce_max(x * 3, 1), [np.array([[2**30, 7, -2**31], [-5, -9, -2]])]),
        # a sum (wrapping in its type) and a mean (in int64) of one input: two accumulators, not one
        # (negative rows: a shared uint32 accumulator would give the mean of a wrapped sum)
        ("int_sum_and_mean", lambda x: gc.reduce_sum(x, 1) + gc.reduce_mean(x, 1),
         [np.array([[2**30] * 3, [-1, -2, -4], [-7, 5, -3]])]),
        ("uint8_sum_and_mean", lambda x: gc.cast(gc.reduce_sum(gc.cast(x, "uint8"), 1) +
                                                 gc.reduce_mean(gc.cast(x, "uint8"), 1), "int32"),
         [np.array([[200, 100, 50], [255, 255, 255]])]),
        # a slice reduction of a global one, in a domain of size-1 axes (it read the global before its loop)
        ("sums_of_1x1", lambda x: gc.reduce_sum(gc.reduce_sum(gc.reduce_sum(x, 1, keepdims=True), (0, 1),
                                                              keepdims=True), 1), [np.array([[0.5]])]),
    ]


def build_all():
    """One graph holding every op and the gradient of each w.r.t. its float inputs."""
    return graph_of_cases(op_cases(), no_gradient={"cast"})


@pytest.mark.parametrize("target", TARGETS)
def test_every_op_and_its_gradient_matches_numpy(target, tmp_path, monkeypatch):
    monkeypatch.setenv("GCOMPILE_CACHE", str(tmp_path))
    assert_compiled_matches_numpy(*build_all(), target)


@pytest.mark.parametrize("target", TARGETS)
def test_gradients_of_one_element_outputs(target, tmp_path, monkeypatch):
    """The gradient of a one-element output seeds its op's backward with a scalar constant viewed as (1, 1):
    a GEMM or a window op reads its operands through a pointer, and compiling failed ('a literal ... has no
    buffer'); the constant now also lies in the arena (plan_memory.literal_offset)."""
    monkeypatch.setenv("GCOMPILE_CACHE", str(tmp_path))
    r = np.random.RandomState(4)
    image, a, b = (gc.placeholder(n, s) for n, s in (("image", (1, 1, 2, 2)), ("a", (1, 3)), ("b", (3, 1))))
    w = gc.placeholder("w", (1, 1, 2, 2))
    outputs = (gc.gradients(gc.reduce_sum(gc.max_pool2d(image, 2)), [image]) +
               gc.gradients(gc.reduce_sum(gc.avg_pool2d(image, 2)), [image]) +
               gc.gradients(gc.reduce_sum(a @ b), [a, b]) +
               gc.gradients(gc.reduce_sum(gc.conv2d(image, w)), [image, w]))
    for value in (2.0, 5.0):   # two constants of one name: a slot each (they shared one)
        outputs.append(gc.reshape(gc.constant(value, name="c"), (1, 1)) @ gc.transpose(b))
    feeds = {p: r.uniform(-1, 1, p.shape).astype(np.float32) for p in (image, a, b, w)}
    assert_compiled_matches_numpy(outputs, feeds, target)


@pytest.mark.parametrize("target", TARGETS)
def test_max_pool_gradients_of_nan_and_minus_inf(target, tmp_path, monkeypatch):
    """A window's gradient goes to its first maximum, a NaN above all (the C kernel skipped a NaN that did
    not come first); a window whose pixels are all -inf gives it to the first of them, never to padding (the
    numpy executor gave it to a pad, dropping it)."""
    monkeypatch.setenv("GCOMPILE_CACHE", str(tmp_path))
    a = np.array([[[[1.0, np.nan, 5.0, 6.0], [2.0, 0.0, 7.0, 8.0]]]], np.float32)
    b = np.full((1, 1, 2, 2), -np.inf, np.float32)
    pa, pb = gc.placeholder("a", a.shape), gc.placeholder("b", b.shape)
    outputs = (gc.gradients(gc.reduce_sum(gc.max_pool2d(pa, 2, 2, 0)), [pa]) +
               gc.gradients(gc.reduce_sum(gc.max_pool2d(pb, 2, 2, 1)), [pb]))
    want = [np.array([0, 1, 0, 0, 0, 0, 0, 1], np.float32), np.ones(4, np.float32)]
    for got, expected in zip(gc.NumpyExecutor(outputs).run({pa: a, pb: b}), want):
        assert np.array_equal(got.reshape(-1), expected)
    assert_compiled_matches_numpy(outputs, {pa: a, pb: b}, target)


def mlp(batch, hidden, classes=10, features=20, momentum=0.0):
    r = np.random.RandomState(7)
    x = gc.placeholder("x", (batch, features))
    y = gc.placeholder("y", (batch,), dtype="int32")
    params, h = [], x
    sizes = [features, *hidden, classes]
    for i, (n_in, n_out) in enumerate(zip(sizes, sizes[1:])):
        W = gc.variable(f"W{i}", init=r.normal(0, 0.3, (n_in, n_out)).astype(np.float32))
        b = gc.variable(f"b{i}", init=r.normal(0, 0.1, (n_out,)).astype(np.float32))
        params += [W, b]
        h = h @ W + b
        if i < len(hidden):
            h = gc.relu(h)
    loss = gc.softmax_cross_entropy(h, y)
    return gc.Program(loss, params, gc.SGD(lr=0.5, momentum=momentum), outputs={"logits": h}, name="mlp")


@pytest.mark.parametrize("target", TARGETS)
def test_pow_at_special_values_matches_numpy(target):
    """np.power takes sqrt for the exponent 0.5: NaN at -inf and -0 at -0, where C's pow gives inf and +0 (QA)."""
    values = np.array([-np.inf, -0.0, 0.0, np.nan, 2.0, -2.0, np.inf, 1e-30], np.float64)
    outputs, feeds = [], {}
    for dtype in ("float32", "float64"):
        x = gc.placeholder(f"x_{dtype}", values.shape, dtype=dtype)
        feeds[x] = values.astype(dtype)
        outputs += [gc.pow(x, e) for e in (0.5, -0.5, 2.0, 3.0, 1.5, -1.0)]
    with np.errstate(all="ignore"):
        want = gc.NumpyExecutor(outputs).run(feeds)
    special = ~np.isfinite(values) | (values == 0)          # the same bits there; elsewhere a few ulps (libm)
    for node, w, g in zip(outputs, want, gc.Executor(outputs, target=target).run(feeds)):
        same = ((w == g) & (np.signbit(w) == np.signbit(g))) | (np.isnan(w) & np.isnan(g))
        assert same[special].all(), f"{node.describe()}: {g} against numpy's {w}"
        np.testing.assert_allclose(g[~special], w[~special], rtol=8 * np.finfo(w.dtype).eps, err_msg=node.describe())


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("hidden,momentum", [((), 0.0), ((32, 16), 0.0), ((24,), 0.9), ((100, 48), 0.0)],
                         ids=["logreg", "mlp", "mlp_momentum", "mlp_wide"])   # wide: post GEMMs of N > 32
def test_training_steps_match_numpy(target, hidden, momentum, tmp_path):
    program = mlp(batch=64, hidden=hidden, momentum=momentum)
    model = gc.load(gc.compile(program, target=target, out_dir=tmp_path))
    reference = gc.NumpyExecutor(program.train_outputs)
    r = np.random.RandomState(3)
    batches = [(r.uniform(0, 1, (64, 20)).astype(np.float32), r.randint(0, 10, 64).astype(np.int32))
               for _ in range(5)]
    assert_training_matches_numpy(program, model, reference, batches)


def wide_head():
    """A 1000-class head after a 16-unit layer at batch 1000: the chain's GEMM stages on tensor cores
    (gc_row_mma) with N = 1000, whose column check went past nvcc's constexpr budget (the build failed)."""
    return mlp(batch=1000, hidden=(256, 16), classes=1000, features=784)


@pytest.mark.gpu
def test_a_wide_head_in_the_tensor_core_chain_matches_numpy(tmp_path):
    program = wide_head()
    artifact = gc.compile(program, target="cuda", out_dir=tmp_path)
    assert "gc_row_mma_shape<false, 1000, 16, 8>" in open(artifact.source).read()
    model = gc.load(artifact)
    r = np.random.RandomState(5)
    # images scaled to keep the logits near 1 (at [0, 1) they reach ~100, where float32's own rounding of the
    # 1000-class head differs from numpy's by more than the golden tolerance)
    batches = [(r.uniform(0, 0.03, (1000, 784)).astype(np.float32), r.randint(0, 1000, 1000).astype(np.int32))
               for _ in range(3)]
    assert_training_matches_numpy(program, model, gc.NumpyExecutor(program.train_outputs), batches)


def test_shapes_at_the_kernels_shared_memory_limits_compile_with_nvcc(tmp_path):
    """Shapes whose kernels went past a block's shared memory (a QA sweep of ~200 cuda builds): a chain stage on
    tensor cores with K = 7200 (gc_row_mma's rows of A in static shared memory: ptxas refused 227 KB; at K
    4000 beside the staged weights the first launch would have failed) now keeps the fp32 stages; dW1 reading
    the image rows in place at batch 3585 (tf32, a 2048-unit layer) on a tile whose row indices fit beside its
    buffers (the static_assert stopped the build)."""
    import shutil
    if not shutil.which("nvcc"):
        pytest.skip("nvcc is not installed")
    from gcompile.passes.lower import row_mma_fits
    cases = [(mlp(batch=513, hidden=(7200, 4), classes=2), "fp32"),
             (mlp(batch=1000, hidden=(4000, 8), features=784), "fp32"),
             (mlp(batch=3585, hidden=(2048,), features=784), "tf32")]
    for i, (program, precision) in enumerate(cases):
        artifact = gc.compile(program, target="cuda", precision=precision, out_dir=tmp_path / str(i))
        assert not re.search(r"gc_row_mma_shape<(true|false), \d+", open(artifact.source).read())
    x, w = gc.placeholder("x", (8, 1240)), gc.placeholder("w", (1240, 4))
    assert row_mma_fits(x @ w) and not row_mma_fits(gc.placeholder("x2", (8, 1241)) @ gc.placeholder("w2", (1241, 4)))


def test_cuda_target_compiles_with_nvcc(tmp_path):
    """Compile-only check of the cuda target (CI has nvcc but no GPU)."""
    import shutil
    if not shutil.which("nvcc"):
        pytest.skip("nvcc is not installed")
    outputs, _ = build_all()
    artifact = gc.compile(outputs, target="cuda", out_dir=tmp_path / "ops", name="ops")
    artifact2 = gc.compile(mlp(batch=64, hidden=(32,)), target="cuda", out_dir=tmp_path / "mlp")
    artifact3 = gc.compile(wide_head(), target="cuda", out_dir=tmp_path / "wide")
    for a in (artifact, artifact2, artifact3):
        text = open(a.source).read()
        assert text.startswith("// @generated by gcompile")
        assert "cudaMalloc" in text and "__global__" in text
        for path in (a.binary, a.library):
            assert open(path, "rb").read(4) == b"\x7fELF"
