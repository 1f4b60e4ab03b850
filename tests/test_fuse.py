"""fuse: grouping decisions on small graphs (the printed groups), the MNIST models' kernel counts, fused
schedules planned and run in a numpy arena (random graphs), and compiled fused kernels against the numpy
reference — cpu here, cuda behind the gpu marker — on hand-written and random graphs."""
from __future__ import annotations

import re
import shutil
from textwrap import dedent

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gcompile as gc
from gcompile.ops import get_op
from gcompile.passes import check_plan, plan_memory, schedule, simplify
from gcompile.passes.fuse import describe_groups, expand, fuse, split_matmul
from gcompile.passes.plan_memory import storage_root
from gcompile.pipeline import compile_program
from graphs import broadcastable, mlp_program, random_graphs
from test_plan_memory import arena_value

RTOL, ATOL = 1e-4, 1e-5
TARGETS = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def fused(outputs):
    """(outer graph outputs, groups) for an eval graph, as the pipeline makes them."""
    graphs, groups = fuse({"eval": simplify(list(outputs))})
    return graphs["eval"], groups


def groups_text(outputs) -> str:
    return describe_groups(fused(outputs)[1])


def kernels(program_or_nodes) -> dict:
    return {g: len(ks) for g, ks in compile_program(program_or_nodes, "cpu").kernels.items()}


def batch_norm(a, axis):
    mean = gc.reduce_mean(a, axis, keepdims=True)
    centered = a - mean
    var = gc.reduce_mean(centered * centered, axis, keepdims=True)
    return centered / gc.sqrt(var + 1e-5)


def value_scale(outputs, feeds) -> float:
    """The largest finite magnitude any float value of the graph takes (at least 1). float32 rounding errors
    scale with it, not with an output's own size: where terms of ~250 cancel to ~0.1, the result keeps
    their absolute error (a random graph did: 3e-5 off, 3.5e-4 relative)."""
    nodes = [n for n in gc.topological_order(outputs) if n.dtype in ("float32", "float64")]
    finite = [np.abs(v[np.isfinite(v)]) for v in gc.NumpyExecutor(nodes).run(feeds)]
    return max([1.0] + [float(f.max()) for f in finite if f.size])


def check_compiled(outputs, feeds, target):
    want = gc.NumpyExecutor(outputs).run(feeds)
    got = gc.Executor(outputs, target=target).run(feeds)
    atol = ATOL * value_scale(outputs, feeds)
    for node, w, g in zip(outputs, want, got):
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=atol, err_msg=node.describe())


# --- grouping decisions ----------------------------------------------------------------------------
def test_batch_norm_is_one_row_kernel_with_two_phases():
    x = gc.placeholder("x", (6, 5))
    out = batch_norm(x, 0)
    out.name = "normalized"
    assert groups_text([out]) == dedent(f"""\
        g0 rows: 5 slices of 6 (reduced axes [0] of [6, 5]), 2 reduction phase(s)
            members: {", ".join(m.name for m in fused([out])[1][0].members)}
            writes:  normalized""")


def test_identical_reductions_share_one_accumulator():
    x = gc.placeholder("x", (4, 9))
    out = gc.reduce_sum(x, 1, keepdims=True) * x + gc.reshape(gc.reduce_mean(x, 1), (4, 1))
    (kernel,) = compile_program([out], "cpu").kernels["eval"]
    (segment,) = kernel.values["segments"]
    assert [len(p["accs"]) for p in segment["phases"]] == [1]   # the mean reuses the sum
    assert kernel.kind == "fused" and segment["slices"] == 4 and segment["length"] == 9


def test_mlp_groups_and_kernel_counts():
    prog = mlp_program(64, dims=(20, 16, 12, 10))
    text = compile_program(prog, "cpu").stages["fuse"].split("-- groups\n")[1]
    heads = [line for line in text.splitlines() if not line.startswith(" ")]
    assert heads == [
        "g0 gemm: GEMM 64x16 with an epilogue of 2 node(s)",          # bias + relu
        "g1 gemm: GEMM 64x12 with an epilogue of 2 node(s)",
        "g2 gemm: GEMM 64x10 with an epilogue of 1 node(s)",          # bias: the logits
        "g3 rows: 64 slices of 10 (reduced axes [1] of [64, 10]), 2 reduction phase(s), then a global reduction",
        "g4 gemm: GEMM 64x12 with an epilogue of 1 node(s)",          # relu mask of the backward
        "g5 gemm: GEMM 64x16 with an epilogue of 1 node(s)",
        "g6 gemm: GEMM 20x16 with an epilogue of 4 node(s)",          # dW1 and the (guarded) SGD update of W1
        # bias gradients and updates, the numerical guard's count and halted_at, step + 1
        "g7 multi: one kernel over 6 segments g7.0, g7.1, g7.2, g7.3, g7.4, g7.5",
        "g8 gemm: GEMM 16x12 with an epilogue of 4 node(s)",
        "g9 gemm: GEMM 12x10 with an epilogue of 4 node(s)",
    ]
    assert "writes:  softmax_cross_entropy" in text.splitlines()[text.splitlines().index(heads[3]) + 3]
    # layers of <= 32 columns: lower makes g0 .. g5 (forward, softmax, the backward's row-local GEMMs) one chain,
    # and the weight gradients with their updates and g7 one kernel of post stages after it
    assert kernels(prog) == {"train": 2, "eval": 1}


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_mnist_models_kernel_counts(momentum):
    x = gc.placeholder("x", (128, 784))
    y = gc.placeholder("y", (128,), dtype="int32")
    W, b = gc.variable("W", (784, 10)), gc.variable("b", (10,))
    logits = x @ W + b
    logreg = gc.Program(gc.softmax_cross_entropy(logits, y), [W, b], gc.SGD(0.1, momentum=momentum),
                        {"logits": logits})
    # logits GEMM + softmax: one chain; dW, the bias gradient and the updates: its post kernel
    assert kernels(logreg) == {"train": 2, "eval": 1}
    mlp = mlp_program(128)
    # h2 .. dh1: one chain (x @ W1: B too large); dW3, dW2 and the bias gradients: its post kernel; dW1
    assert kernels(mlp) == {"train": 4, "eval": 2}


def test_matmul_read_elsewhere_keeps_its_own_kernel():
    x, W, b = gc.placeholder("x", (8, 4)), gc.placeholder("W", (4, 3)), gc.placeholder("b", (3,))
    h = x @ W
    assert groups_text([gc.relu(h + b), h]).splitlines()[0].startswith("g0 rows: map")   # h is an output
    summed = gc.reduce_sum(h, 0)
    assert groups_text([summed]).splitlines()[0].startswith("g0 rows: 3 slices of 8")     # not an epilogue
    assert groups_text([gc.relu(h + b), h + b]).splitlines()[0] == "g0 gemm: GEMM 8x3 with an epilogue of 2 node(s)"


def test_a_group_stays_convex():
    x, W = gc.placeholder("x", (4, 4)), gc.placeholder("W", (4, 4))
    a = gc.exp(x)
    out = a + a @ W          # joining exp's group would put the matmul both after and before the group
    text = groups_text([out])
    assert text.splitlines()[0].startswith("g0 rows: map") and "g1 gemm: GEMM 4x4 with an epilogue" in text


def test_assign_that_reads_other_elements_is_written_by_a_kernel_of_its_own():
    v = gc.variable("v", (3, 3), init=np.arange(9, dtype=np.float32).reshape(3, 3))
    update = gc.assign(v, gc.transpose(v) + 1.0)
    text = groups_text([update])
    assert text.count(" rows: map") == 2 and "writes:  v (assigned)" in text.splitlines()[-1]
    want = np.arange(9, dtype=np.float32).reshape(3, 3).T + 1
    np.testing.assert_array_equal(gc.Executor([update], target="cpu").run()[0], want)


def test_independent_updates_share_a_kernel_dependent_ones_do_not():
    vs = [gc.variable(f"v{k}", (5,), init=np.arange(5, dtype=np.float32) + k) for k in range(3)]
    bump = gc.assign(vs[0], vs[0] + 1.0)
    scale = gc.assign(vs[1], vs[1] * vs[0])     # reads v0's old value: it must run before bump
    drop = gc.assign(vs[2], vs[2] - 1.0)        # independent of both
    outputs = [bump, scale, drop]
    text = groups_text(outputs)
    assert text.splitlines()[0] == "g0 multi: one kernel over 2 segments g0.0, g0.1"
    assert kernels(outputs) == {"eval": 2}
    check_compiled(outputs, {}, "cpu")


def test_gemm_does_not_take_an_epilogue_that_overwrites_its_operand():
    W = gc.variable("W", (3, 3), init=np.eye(3, dtype=np.float32) * 2)
    M = gc.placeholder("M", (3, 3))
    update = gc.assign(W, W @ M)
    text = groups_text([update])
    assert "gemm" not in text and "writes:  W (assigned)" in text
    m = np.arange(9, dtype=np.float32).reshape(3, 3)
    np.testing.assert_allclose(gc.Executor([update], target="cpu").run({M: m})[0], 2 * m)


class GuardedSGD:
    """SGD whose updates keep the old value when the loss is not below a bound: assign(p, ok * new + (1 - ok) *
    p), the shape of a numerical guard (an elementwise select on a scalar computed from the loss)."""

    def __init__(self, lr, bound):
        self.lr, self.bound = lr, bound

    def updates(self, params, grads, dtype="float32"):
        self.ok = gc.greater_equal(self.bound, self.loss)
        return [gc.assign(p, self.ok * (p - self.lr * g) + (1.0 - self.ok) * p) for p, g in zip(params, grads)]


@pytest.mark.parametrize("bound", [100.0, 0.0], ids=["updates", "guard holds"])
def test_guarded_updates_fuse_like_plain_ones(bound, tmp_path):
    x = gc.placeholder("x", (32, 20))
    y = gc.placeholder("y", (32,), dtype="int32")
    r = np.random.RandomState(2)
    W1 = gc.variable("W1", init=r.normal(0, 0.3, (20, 16)).astype(np.float32))
    b1 = gc.variable("b1", init=r.normal(0, 0.1, (16,)).astype(np.float32))
    W2 = gc.variable("W2", init=r.normal(0, 0.3, (16, 10)).astype(np.float32))
    logits = gc.relu(x @ W1 + b1) @ W2
    loss = gc.softmax_cross_entropy(logits, y)
    optimizer = GuardedSGD(0.5, bound)
    optimizer.loss = loss
    program = gc.Program(loss, [W1, b1, W2], optimizer, {"logits": logits}, name="guarded")
    # the guard adds no kernel (the layers: one chain, the gradients over the batch its post kernel)
    assert kernels(program) == {"train": 2, "eval": 1}
    model = gc.load(gc.compile(program, target="cpu", out_dir=tmp_path))
    reference = gc.NumpyExecutor(program.train_outputs)
    for step in range(3):
        xb, yb = r.uniform(0, 1, (32, 20)).astype(np.float32), r.randint(0, 10, 32).astype(np.int32)
        np.testing.assert_allclose(model.train_step(xb, yb), reference.run({"x": xb, "y": yb})[0], rtol=RTOL)
    for name, value in model.params.items():
        np.testing.assert_allclose(value, reference.variables[name], rtol=RTOL, atol=ATOL, err_msg=name)
    assert (bound == 0.0) == np.array_equal(model.params["W1"], W1.attrs["init"](W1.shape, "float32"))


# --- compiled fused kernels against numpy ------------------------------------------------------------
@pytest.mark.parametrize("target", TARGETS)
def test_fused_kernels_match_numpy(target):
    """Row and column batch norms with their gradients, softmax + cross-entropy on one-hot labels, a GEMM
    with a two-output epilogue, a long row (one block per slice) and a wide column reduction."""
    r = np.random.RandomState(5)
    x = gc.placeholder("x", (37, 300))
    hot = gc.placeholder("hot", (37, 300))
    W, b = gc.placeholder("W", (300, 20)), gc.placeholder("b", (20,))
    rows, cols = batch_norm(x, 1), batch_norm(x, 0)
    weights = gc.constant(r.uniform(-1, 1, (37, 300)), dtype="float32")
    grads = gc.gradients(gc.reduce_sum((rows + cols) * weights), [x])
    pre = x @ W + b
    outputs = [rows, cols, *grads, gc.softmax_cross_entropy(x * 3.0, hot), gc.relu(pre), pre,
               gc.reduce_max(x, 0), gc.log_softmax(x, 0)]
    labels = np.eye(300, dtype=np.float32)[r.randint(0, 300, 37)]
    feeds = {x: r.uniform(-1, 1, (37, 300)).astype(np.float32), hot: labels,
             W: r.uniform(-1, 1, (300, 20)).astype(np.float32), b: r.uniform(-1, 1, 20).astype(np.float32)}
    check_compiled(outputs, feeds, target)


def test_cuda_fused_kinds_compile_with_nvcc(tmp_path):
    """Compile-only: every fused kind (map, rows with phases and a global reduction, multi, GEMM epilogues
    with side outputs and assigns) through nvcc."""
    if not shutil.which("nvcc"):
        pytest.skip("nvcc is not installed")
    x, hot = gc.placeholder("x", (37, 300)), gc.placeholder("hot", (37, 300))
    W, b = gc.placeholder("W", (300, 20)), gc.placeholder("b", (20,))
    v = [gc.variable(f"v{k}", (20,)) for k in range(2)]
    pre = x @ W + b
    outputs = [batch_norm(x, 0), gc.softmax_cross_entropy(x, hot), gc.relu(pre), pre,
               gc.assign(v[0], v[0] + gc.reduce_sum(pre, 0)), gc.assign(v[1], v[1] * 0.5)]
    artifact = gc.compile(outputs, target="cuda", out_dir=tmp_path, name="fused_kinds")
    text = open(artifact.source).read()
    assert "gc_reduce_columns" in text and "_ep{A}" in text and open(artifact.library, "rb").read(4) == b"\x7fELF"


@pytest.mark.gpu
def test_cuda_reductions_are_bitwise_reproducible():
    """Fixed-order trees, no float atomics: the same inputs give the same bits, run after run."""
    r = np.random.RandomState(9)
    x = gc.placeholder("x", (1000, 513))
    labels = gc.placeholder("labels", (1000,), dtype="int32")
    outputs = [gc.reduce_sum(x, 0), gc.reduce_sum(x, 1), gc.softmax_cross_entropy(x, labels), gc.reduce_mean(x)]
    feeds = {x: r.standard_normal((1000, 513)).astype(np.float32), labels: r.randint(0, 513, 1000).astype(np.int32)}
    executor = gc.Executor(outputs, target="cuda")
    first, second = executor.run(feeds), executor.run(feeds)
    for a, b in zip(first, second):
        assert a.tobytes() == b.tobytes()


# --- random graphs ---------------------------------------------------------------------------------
UNARY = (gc.neg, gc.relu, gc.tanh, gc.sigmoid, lambda v: v * v)
BINARY = (gc.add, gc.sub, gc.mul, gc.maximum)
KINDS = ("unary", "binary", "reduce", "softmax", "reshape", "scale")


@st.composite
def row_graphs(draw):
    """(outputs, feeds): random chains of maps, broadcasts and reductions over a matrix, a row vector and a
    column vector — what fuse groups — sometimes with the gradient of the result."""
    rows, cols = draw(st.sampled_from([(1, 1), (3, 4), (5, 1), (2, 7), (40, 33), (300, 3)]))
    leaves = [gc.placeholder("m", (rows, cols)), gc.placeholder("row", (cols,)), gc.placeholder("col", (rows, 1))]
    pool = list(leaves)
    steps = draw(st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, 3), st.integers(0, 3),
                                    st.integers(0, 15)), min_size=3, max_size=12))
    for kind, i, j, p in steps:
        a, b = pool[-1 - i % len(pool)], pool[-1 - j % len(pool)]
        node = None
        if kind == "binary" and broadcastable(a, b):
            node = BINARY[p % 4](a, b)
        elif kind == "reduce" and a.ndim == 2:
            node = (gc.reduce_sum, gc.reduce_mean, gc.reduce_max)[p % 3](a, axis=p % 2, keepdims=p // 2 % 2 == 0)
        elif kind == "softmax" and a.ndim == 2:
            node = (gc.softmax, gc.log_softmax)[p % 2](a, axis=p // 2 % 2)
        elif kind == "reshape" and a.ndim == 1:
            node = gc.reshape(a, (1, -1) if p % 2 else (-1, 1))
        elif kind == "scale":
            node = a * (0.5, 2.0, -1.0, 0.25)[p % 4]
        pool.append(node if node is not None else UNARY[p % 5](a))
    outputs = [n for n in dict.fromkeys([pool[-1], pool[draw(st.integers(0, len(pool) - 1))]]) if n.inputs]
    outputs = outputs or [gc.neg(pool[-1])]
    if draw(st.booleans()) and pool[-1].inputs:
        used = gc.topological_order([pool[-1]])
        wrt = [leaf for leaf in leaves if leaf in used]
        outputs += [g for g in gc.gradients(gc.reduce_sum(pool[-1] * pool[-1]), wrt) if g.op != "zeros_like"]
    rng = np.random.RandomState(draw(st.integers(0, 2**16)))
    feeds = {leaf: rng.uniform(-1, 1, leaf.shape).astype(np.float32) for leaf in leaves
             if leaf in gc.topological_order(outputs)}
    return outputs, feeds


@pytest.mark.parametrize("target", TARGETS)
@settings(max_examples=12, deadline=None)
@given(row_graphs())
def test_random_fused_graphs_compile_to_the_reference_numbers(target, graph):
    outputs, feeds = graph
    check_compiled(outputs, feeds, target)


def run_fused_in_arena(plan, name: str, feed: dict, variables: dict) -> np.ndarray:
    """Run a fused schedule in one byte array at the planned offsets: a fused node evaluates its members with
    numpy (outside values read from the arena), then stores what leaves the group."""
    arena = np.full(plan.arena_bytes, 0xFF, dtype=np.uint8)
    for b in plan.buffers:
        if b.node.op in ("placeholder", "variable", "constant"):
            value = {"placeholder": lambda n: feed[n], "variable": lambda n: variables[n.name],
                     "constant": lambda n: n.attrs["value"]}[b.node.op](b.node)
            arena_value(plan, arena, b.node, name)[...] = value
    for node in plan.schedules[name]:
        if node.op == "fused":
            group = node.attrs["group"]
            values = {}
            for m in group.members:
                args = [values[i] if i in values else arena_value(plan, arena, group.external[i], name)
                        for i in m.inputs]
                values[m] = np.array(get_op(m.op).compute(m, *args))
            for m in group.outputs:
                arena_value(plan, arena, group.result_of(m), name)[...] = values[m]
            for a in group.assigns:
                arena_value(plan, arena, group.external[a.inputs[0]], name)[...] = values[a]
        elif node.op == "matmul":
            args = [arena_value(plan, arena, i, name) for i in node.inputs]
            arena_value(plan, arena, node, name)[...] = get_op("matmul").compute(node, *args)
    return arena


@settings(max_examples=60, deadline=None)
@given(random_graphs())
def test_random_fused_plans_check_and_compute_the_reference_numbers(graph):
    """Every node lands in a group or stays outside, the plan of the fused schedule checks, and running it
    gives the reference executor's numbers."""
    outputs, feed = graph
    graphs, groups = fuse({"eval": simplify(outputs)})
    order = schedule(graphs["eval"])
    plan = plan_memory({"eval": order}, graphs["eval"])
    check_plan(plan)
    reference = gc.NumpyExecutor(outputs)
    variables = {k: v.copy() for k, v in reference.variables.items()}
    with np.errstate(all="ignore"):
        want = reference.run(feed)
        arena = run_fused_in_arena(plan, "eval", feed, variables)
    assigned = {a.inputs[0] for a in gc.topological_order(outputs) if a.op == "assign"}
    for node, out, w in zip(outputs, graphs["eval"], want):
        if node.op != "assign" and storage_root(out) in assigned:
            continue    # simplify made it the variable itself (x + 0 -> x): after the step, its new value
        np.testing.assert_allclose(arena_value(plan, arena, out, "eval"), w, rtol=1e-5, atol=1e-6,
                                   err_msg=node.describe())
    for name, value in reference.variables.items():
        np.testing.assert_allclose(arena_value(plan, arena, reference.variable_nodes[name], "eval"), value,
                                   rtol=1e-5, atol=1e-6, err_msg=name)
    internal = {m for g in groups for m in g.members} - {m for g in groups for m in g.outputs}
    assert not internal & {b.node for b in plan.buffers}, "a value internal to a group got a buffer"


def test_inspect_after_fuse_shows_groups_and_their_kernels(capsys):
    from gcompile.cli import main
    from conftest import EXAMPLES
    assert main(["inspect", str(EXAMPLES / "mnist_logreg.py"), "--target", "cpu", "--after", "fuse"]) == 0
    groups = capsys.readouterr().out.split("-- groups\n")[1].strip().splitlines()
    assert groups[0] == "g0 gemm: GEMM 1000x10 with an epilogue of 1 node(s)"
    # the logits GEMM and the softmax (g1) are one chain kernel in train, named after its last stage
    assert re.fullmatch(r"    kernel:  k0_fused_where_\d+ \(train\), k3_fused_add_\d+ \(eval\)", groups[1])
    assert re.fullmatch(r"    kernel:  k0_fused_where_\d+ \(train\)", groups[5])
    assert re.fullmatch(r"    members: matmul_\d+, add_\d+", groups[2])
    # the last group: the bias update, the numerical guard's two counters and the step counter's increment,
    # one kernel of four segments
    assert groups[-1] == "      writes:  step (assigned)" and "      writes:  b1 (assigned)" in groups
    assert len(groups) == 4 * 4 + 4 * 3 - 2


def test_inspect_lists_the_workspaces_lower_adds_after_the_plan(capsys):
    """The plan's arena line is written before lower adds the kernels' workspaces: inspect lists them after
    it, with the arena the program allocates (the manifest's arena_bytes)."""
    from gcompile.cli import main
    from gcompile.pipeline import compile_program
    from conftest import EXAMPLES, load_example
    assert main(["inspect", str(EXAMPLES / "mnist_mlp.py"), "--target", "cpu", "--batch-size", "128",
                 "--after", "plan_memory"]) == 0
    out = capsys.readouterr().out
    arena = compile_program(load_example("mnist_mlp").program(batch_size=128), target="cpu").plan.arena_bytes
    assert re.search(r"^workspace k\d+_fused_\w+: offset \d+, 1280 bytes \(a reduction's ticket", out, re.M)
    assert f"arena with the workspaces: {arena} bytes" in out


# --- long reductions split ----------------------------------------------------------------------------
def test_a_reduction_over_one_long_slice_runs_on_many_slices_and_a_global_one():
    """An MSE over a whole (512, 512) output was one slice of 262144: one block on cuda, one thread on cpu."""
    x, t = gc.placeholder("x", (512, 512)), gc.placeholder("t", (512, 512))
    loss = gc.reduce_mean((x - t) * (x - t))
    (group,) = fused([loss])[1]
    assert describe_groups([group]).startswith(
        "g0 rows: 512 slices of 512 (reduced axes [1] of [512, 512]), 1 reduction phase(s), then a global reduction")


SPLITS = [  # shape, axis, keepdims, op, dtype, split (into what inner reduction's input shape and axes)
    ((512, 512), None, False, gc.reduce_mean, "float32", ((512, 512), (1,))),
    ((512, 512), None, True, gc.reduce_sum, "float32", ((512, 512), (1,))),
    ((4, 256, 1024), (1, 2), False, gc.reduce_max, "float32", ((4, 256, 1024), (2,))),
    ((2, 128, 3, 2048), (1, 3), True, gc.reduce_mean, "float32", ((2, 128, 3, 2048), (3,))),
    ((262144,), None, False, gc.reduce_sum, "float32", ((512, 512), (1,))),
    ((100000, 3), 0, True, gc.reduce_mean, "float32", ((400, 250, 3), (1,))),
    ((3, 300000), 1, False, gc.reduce_max, "int32", ((3, 600, 500), (2,))),
    ((512, 512), None, False, gc.reduce_sum, "int32", ((512, 512), (1,))),
    ((262144, 1), None, False, gc.reduce_mean, "float32", ((512, 512, 1), (1, 2))),   # not over the 1 alone
    ((4, 40000, 8), (1, 2), True, gc.reduce_sum, "float32", ((4, 625, 64, 8), (2, 3))),
    ((65536, 64), 0, False, gc.reduce_sum, "float32", ((256, 256, 64), (1,))),  # 64 strided slices: 8 blocks
    ((127, 300000), 1, False, gc.reduce_sum, "float32", ((127, 600, 500), (2,))),
    ((512, 512), None, False, gc.reduce_mean, "int32", None),      # an integer mean truncates: not split
    ((128, 300000), 1, False, gc.reduce_sum, "float32", None),     # a block a slice: blocks enough
    ((40000, 1024), 0, False, gc.reduce_sum, "float32", None),     # 8 slices a block: blocks enough
    ((4, 40000), 1, False, gc.reduce_max, "float32", None),        # 40000 a block: less than the split costs
    ((262147,), None, False, gc.reduce_sum, "float32", None),      # a prime length: no cut
    ((100, 300), None, False, gc.reduce_sum, "float32", None),     # short
]


@pytest.mark.parametrize("shape, axis, keepdims, reduce, dtype, split", SPLITS)
def test_long_reductions_split_into_two_that_give_the_same_values(shape, axis, keepdims, reduce, dtype, split):
    r = np.random.RandomState(3)
    x = gc.placeholder("x", shape, dtype=dtype)
    out = reduce(x, axis, keepdims=keepdims)
    (expanded,) = expand([out])
    inner = [n for n in gc.topological_order([expanded]) if n.op == out.op and n.inputs[0].shape == split[0]] \
        if split else []
    if split is None:
        assert expanded is out      # (the same node: numpy's own values)
        return
    else:
        assert [tuple(n.attrs["axes"]) for n in inner] == [split[1]]
    assert expanded.shape == out.shape and expanded.dtype == out.dtype and expanded.name == out.name
    value = (r.uniform(-2, 2, shape) if dtype == "float32" else r.randint(-1000, 1000, shape)).astype(dtype)
    got = gc.NumpyExecutor([expanded]).run({x: value})[0]
    if dtype == "int32":          # sums wrap, maxima are exact: the same values
        np.testing.assert_array_equal(got, gc.NumpyExecutor([out]).run({x: value})[0])
    else:                         # against float64 (numpy's own float32 sum along a strided axis is serial)
        exact = {"reduce_sum": np.sum, "reduce_mean": np.mean, "reduce_max": np.max}[out.op](
            value.astype(np.float64), axis=axis, keepdims=keepdims)
        scale = np.sum(np.abs(value), axis=axis, keepdims=keepdims, dtype=np.float64)   # what sums cancel
        np.testing.assert_array_less(np.abs(got - exact), 1e-5 * np.abs(exact) + 1e-7 * scale + 1e-6)


@pytest.mark.parametrize("target", TARGETS)
def test_split_reductions_compile_to_the_reference_numbers(target):
    """The split forms fused with what they read, with their gradients: an MSE, a long column sum, a 1-D
    sum whose axis is cut in two and a softmax over long rows (an expansion's reductions)."""
    r = np.random.RandomState(7)
    x, t = gc.placeholder("x", (512, 512)), gc.placeholder("t", (512, 512))
    v, c = gc.placeholder("v", (262144,)), gc.placeholder("c", (100000, 3))
    mse = gc.reduce_mean((x - t) * (x - t))
    outputs = [mse, *gc.gradients(mse, [x]), gc.reduce_sum(gc.tanh(v)), gc.reduce_max(c * 2.0, 0, keepdims=True),
               gc.reduce_sum(c, 0) + 1.0, gc.softmax(gc.reshape(c, (1, 300000)) * 4.0, 1)]
    assert sum(m.op == "reduce_max" for g in fused(outputs[-1:])[1] for m in g.members) == 2   # split
    feeds = {x: r.uniform(-1, 1, (512, 512)), t: r.uniform(-1, 1, (512, 512)), v: r.uniform(-1, 1, 262144),
             c: r.uniform(-1, 1, (100000, 3))}
    check_compiled(outputs, {k: a.astype(np.float32) for k, a in feeds.items()}, target)


@pytest.mark.parametrize("k, m, n, trans_b, placeholder, stacks", [
    (65536, 16, 64, False, False, 256),   # a weight gradient at batch 65536: 2 tiles at split 8 were 16 blocks
    (20000, 100, 10, False, False, 50),   # K / S at least 256: S up to 78, the divisor nearest 128 is 50
    (65536, 16, 64, False, True, 256),    # A the image input, 4 MB: the trainer gathers it into a buffer
    (20000, 784, 10, False, True, None),  # 63 MB: the trainer reads it in place as a plain GEMM's A
    (16384, 784, 256, False, False, None),   # tiles enough
    (8192, 16, 64, False, False, None),   # K short
    (65536, 16, 64, True, False, None),   # A^T B^T: not a reshape of its K axis
    (16411, 16, 16, False, False, None),  # a prime K
])
def test_a_long_k_weight_gradient_becomes_a_stack_of_gemms_and_their_sum(k, m, n, trans_b, placeholder, stacks):
    x = gc.placeholder("x", (k, m))
    a = x if placeholder else gc.tanh(x)
    b = gc.placeholder("b", (n, k) if trans_b else (k, n))
    c = gc.matmul(a, b, trans_a=True, trans_b=trans_b)
    (expanded,) = expand([c])
    if stacks is None:
        assert expanded.op == "matmul" and expanded.inputs[1] is b and split_matmul(c, a, b) is None
        return
    (part,) = [x for x in gc.topological_order([expanded]) if x.op == "matmul"]
    assert expanded.op == "reduce_sum" and part.shape == (stacks, m, n) and expanded.name == c.name
    r = np.random.RandomState(1)
    xv, bv = r.uniform(-1, 1, x.shape).astype(np.float32), r.uniform(-1, 1, b.shape).astype(np.float32)
    np.testing.assert_allclose(gc.NumpyExecutor([expanded]).run({x: xv, b: bv})[0],
                               (xv if placeholder else np.tanh(xv.astype(np.float64))).T @ bv, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("target", TARGETS)
def test_a_large_batch_regressions_loss_and_gradients_match_the_reference(target):
    """Its weight gradients split (split_matmul), its bias gradients and loss split (split_reduction)."""
    r = np.random.RandomState(2)
    x, t = gc.placeholder("x", (32768, 8)), gc.placeholder("t", (32768, 1))
    W1 = gc.variable("W1", init=(r.standard_normal((8, 16)) * 0.3).astype(np.float32))
    b1 = gc.variable("b1", (16,))
    W2 = gc.variable("W2", init=(r.standard_normal((16, 1)) * 0.3).astype(np.float32))
    d = gc.relu(x @ W1 + b1) @ W2 - t
    loss = gc.reduce_mean(d * d)
    grads = gc.gradients(loss, [W1, b1, W2])
    ops = [n.op for n in gc.topological_order(expand(grads))]
    assert ops.count("matmul") >= 3 and any(n.ndim == 3 for n in gc.topological_order(expand(grads))
                                            if n.op == "matmul")
    feeds = {x: r.uniform(-1, 1, (32768, 8)).astype(np.float32), t: r.uniform(-1, 1, (32768, 1)).astype(np.float32)}
    check_compiled([loss, *grads], feeds, target)


def test_a_global_reduction_runs_on_at_most_global_blocks():
    """Every block takes the ticket and leaves a partial: beyond what the GPU holds at once, more blocks only
    queue on the ticket (lower.GLOBAL_BLOCKS; 65536 slices would be 8192 blocks)."""
    from gcompile.passes.lower import GLOBAL_BLOCKS
    x = gc.placeholder("x", (65536, 1024))
    (kernel,) = compile_program([gc.reduce_sum(x * x)], "cuda").kernels["eval"]
    (segment,) = kernel.values["segments"]
    assert segment["slices"] == 65536 and segment["blocks"] == GLOBAL_BLOCKS == 2048


def test_an_outer_reduction_still_long_on_few_blocks_is_split_again():
    """(2^20, 32, 4) over (0, 1): the inner over the 32, then 4 columns of 2^20 (one block) split again."""
    x = gc.placeholder("x", (1 << 20, 32, 4))
    (expanded,) = expand([gc.reduce_sum(x, (0, 1))])
    sums = [n for n in gc.topological_order([expanded]) if n.op == "reduce_sum"]
    assert [(n.inputs[0].shape, n.attrs["axes"]) for n in sums] == [
        ((1 << 20, 32, 4), (1,)), ((1024, 1024, 4), (1,)), ((1024, 4), (0,))]
    assert expanded.name == "reduce_sum_" + expanded.name.split("_")[-1] or expanded.shape == (4,)


def test_a_splits_view_is_no_second_copy_and_its_names_are_the_reductions():
    """The view a split puts before a long axis stays a view of its input's buffer (as a group member it was
    written beside it: a softmax over (4, 2^20) held two copies of x * 2 and of its exp), and the nodes the
    splits make are named after what they split, so one process's two builds give one source (QA)."""
    def program():
        x = gc.placeholder("x", (4, 1 << 20))
        scaled = x * 2.0
        scaled.name = "scaled"          # (a node the user makes is numbered by the process unless named)
        out = gc.softmax(scaled, 1)
        out.name = "probabilities"
        return [out]
    graphs, groups = fuse({"eval": simplify(program())})
    written = [w for g in groups for w in g.outputs]
    assert not [w for w in written if w.op == "reshape" and w.attrs.get("view")]
    views = [n for n in gc.topological_order(graphs["eval"]) if n.op == "reshape" and n.attrs.get("view")]
    assert views and all(n.name.endswith("_view") for n in views)
    strip = lambda src: re.sub(r"\n\s*\n", "\n", re.sub(r"//.*", "", src))   # noqa: E731
    assert strip(compile_program(program(), "cuda").source) == strip(compile_program(program(), "cuda").source)
