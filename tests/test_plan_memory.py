"""plan_memory and check_plan: the printed plan, aliasing of views and assigns, the MNIST MLP against its
lower bound, running schedules inside the planned arena against the reference executor, and a checker
that does catch broken plans."""
import dataclasses
from textwrap import dedent

import numpy as np
import pytest
from hypothesis import given, settings

import gcompile as gc
from gcompile.ops import get_op
from gcompile.passes import check_plan, plan_memory, schedule, simplify
from gcompile.passes.plan_memory import is_literal, storage_root
from graphs import mlp_feed, mlp_program, random_graphs


def run_in_arena(plan, name: str, feed: dict, variables: dict) -> np.ndarray:
    """Run schedule `name` with every value at its planned offset of one byte array (temporaries start as
    NaN garbage); return the arena. `variables`: name -> value before the step."""
    arena = np.full(plan.arena_bytes, 0xFF, dtype=np.uint8)
    for b in plan.buffers:
        if b.node.op == "placeholder":
            arena_value(plan, arena, b.node, name)[...] = feed[b.node]
        elif b.node.op == "variable":
            arena_value(plan, arena, b.node, name)[...] = variables[b.node.name]
        elif b.node.op == "constant":
            arena_value(plan, arena, b.node, name)[...] = b.node.attrs["value"]
    for node in plan.schedules[name]:
        if node.op in ("placeholder", "variable", "constant", "reshape"):
            continue
        args = [arena_value(plan, arena, i, name) for i in node.inputs]
        target = node.inputs[0] if node.op == "assign" else node
        arena_value(plan, arena, target, name)[...] = get_op(node.op).compute(node, *args)
    return arena


def arena_value(plan, arena: np.ndarray, node, name: str) -> np.ndarray:
    if is_literal(storage_root(node)):
        return storage_root(node).attrs["value"].reshape(node.shape)
    offset = plan.offset_of(node, name)
    return arena[offset:offset + node.nbytes].view(node.dtype).reshape(node.shape)


def close(got, want):
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def mlp_plan(batch, dims=(784, 256, 100, 10)):
    prog = mlp_program(batch, dims)
    outputs = simplify(prog.train_outputs + [prog.outputs["logits"]])
    train, logits = outputs[:-1], outputs[-1]
    plan = plan_memory({"train": schedule(train), "eval": schedule([logits])}, persistent=[train[0], logits])
    return prog, train, logits, plan


def test_printed_plan():
    x = gc.placeholder("x", (4, 8))
    W = gc.variable("W", (8, 8))
    h = gc.relu(x @ W)
    flat = gc.reshape(gc.reshape(h, (8, 4)), (32,))            # a chain of views of h
    loss = gc.reduce_sum(gc.tanh(flat) * 0.5)                  # 0.5: a literal, no buffer
    update = gc.assign(W, W - gc.matmul(x, h, trans_a=True) * 0.1)
    order = schedule([loss, update])
    assert gc.format_graph([loss, update], order=order) == dedent("""\
        %0 = placeholder {name=x} : float32[4,8]
        %1 = variable {init=constant(0.0), name=W} : float32[8,8]
        %2 = constant {value=0.1} : float32[]
        %3 = constant {value=0.5} : float32[]
        %4 = matmul(%0, %1) {trans_a=False, trans_b=False} : float32[4,8]
        %5 = relu(%4) : float32[4,8]
        %6 = reshape(%5) : float32[8,4]
        %7 = reshape(%6) : float32[32]
        %8 = tanh(%7) : float32[32]
        %9 = mul(%8, %3) : float32[32]
        %10 = reduce_sum(%9) {axes=(0,), keepdims=False} : float32[]
        %11 = matmul(%0, %5) {trans_a=True, trans_b=False} : float32[8,8]
        %12 = mul(%11, %2) : float32[8,8]
        %13 = sub(%1, %12) : float32[8,8]
        %14 = assign(%1, %13) : float32[8,8]
        return %10, %14""")
    for step, n in enumerate(order):                           # names that do not depend on node ids
        if n.op not in ("placeholder", "variable"):
            n.name = f"t{step}"
    plan = plan_memory({"step": order}, persistent=[loss])
    check_plan(plan)
    assert plan.format() == dedent("""\
        name  region      offset  size  lifetime
        x     persistent       0   256  always
        W     persistent     256   256  always
        t10   persistent     512   256  always
        t4    temp:step      768   256  4..5
        t8    temp:step      768   256  8..9
        t11   temp:step      768   256  11..12
        t13   temp:step      768   256  13..14
        t5    temp:step     1024   256  5..11
        t12   temp:step     1024   256  12..13
        t9    temp:step     1280   256  9..10
        aliases in step: t6->t5, t7->t5, t14->W
        arena 1536 bytes = persistent 768 + temporary 768; lower bound 1536 (arena is 1.000x); naive 2560""")


def test_views_and_assigns_alias_their_source():
    x = gc.placeholder("x", (6,))
    v = gc.variable("v", (2, 3))
    h = gc.exp(x)
    view = gc.reshape(gc.reshape(h, (3, 2)), (2, 3))           # read last: keeps h alive
    late = gc.tanh(gc.tanh(gc.tanh(x)))
    out = gc.reshape(late, (2, 3)) + view
    update = gc.assign(v, gc.reshape(x, (2, 3)) * 2.0)
    table = gc.constant(np.arange(6.0).reshape(2, 3))
    outputs = [out * table, update]
    order = schedule(outputs)
    plan = plan_memory({"step": order}, persistent=outputs)
    check_plan(plan)
    assert plan.offset_of(view) == plan.offset_of(h)
    assert plan.offset_of(update) == plan.offset_of(v)
    h_buffer = plan.buffer_of(h)
    assert (h_buffer.first, h_buffer.last) == (order.index(h), order.index(out))
    assert plan.buffer_of(table).region == "persistent"
    assert all(not is_literal(b.node) for b in plan.buffers)
    two = update.inputs[1].inputs[1]                           # the scalar 2.0: written into the code, no buffer
    with pytest.raises(gc.GCompileError, match="literal"):
        plan.buffer_of(two)
    at = plan.offset_of(two)                                   # ... but a pointer to it gets a workspace
    assert plan.workspaces[f"literal {two.name} #0"][0] == at == plan.literals[two] >= max(b.end for b in plan.buffers)


def test_a_persistent_view_keeps_its_source_persistent():
    x = gc.placeholder("x", (6,))
    out = gc.reshape(gc.exp(x), (2, 3))
    plan = plan_memory({"step": schedule([out])}, persistent=[out])
    check_plan(plan)
    assert plan.buffer_of(out).region == "persistent" and plan.buffer_of(out).node is out.inputs[0]


def test_schedules_share_the_temporary_region():
    prog, train, logits, plan = mlp_plan(32, dims=(64, 48, 10))
    check_plan(plan)
    temps = {name: [b for b in plan.buffers if b.schedule == name] for name in plan.schedules}
    assert min(b.offset for b in temps["eval"]) == min(b.offset for b in temps["train"]) == plan.persistent_bytes
    assert plan.arena_bytes == max(b.end for b in plan.buffers)
    relu = next(n for n in plan.schedules["eval"] if n.op == "relu")
    assert plan.buffer_of(relu, "eval") != plan.buffer_of(relu, "train")
    with pytest.raises(gc.GCompileError, match="name the schedule"):
        plan.offset_of(relu)


@pytest.mark.parametrize("batch", [128, 1000])
def test_mlp_arena_is_within_ten_percent_of_the_lower_bound(batch):
    prog, train, logits, plan = mlp_plan(batch)
    check_plan(plan)
    print(f"\nMLP 784-256-100-10, batch {batch}:\n{plan.format()}")
    persistent = [b for b in plan.buffers if b.region == "persistent"]
    guard = ["guard.halted_at", "guard.skip", "step", "guard.nonfinite_steps"]  # every Program's (test_guard.py)
    expected = ["x", "y", "W1", "b1", "W2", "b2", "W3", "b3", "lr", *guard, train[0].name, logits.name]
    assert [b.name for b in persistent] == expected
    assert plan.persistent_bytes == sum(-(-b.node.nbytes // 256) * 256 for b in persistent)
    temporary, peak = plan.arena_bytes - plan.persistent_bytes, plan.lower_bound - plan.persistent_bytes
    assert 0 < peak <= temporary <= 1.10 * peak
    assert plan.lower_bound <= plan.arena_bytes <= 1.10 * plan.lower_bound
    assert plan.arena_bytes < plan.naive_bytes


def test_mlp_steps_run_inside_the_arena():
    prog, train, logits, plan = mlp_plan(16)
    check_plan(plan)
    feed = mlp_feed(prog)
    reference = gc.NumpyExecutor(train + [logits])
    before = {k: v.copy() for k, v in reference.variables.items()}
    loss, *_, want_logits = reference.run(feed)
    arena = run_in_arena(plan, "train", feed, before)
    close(arena_value(plan, arena, train[0], "train"), loss)
    close(arena_value(plan, arena, logits, "train"), want_logits)
    for p in prog.params:
        close(arena_value(plan, arena, p, "train"), reference.get_variable(p.name))
    arena = run_in_arena(plan, "eval", feed, reference.variables)
    close(arena_value(plan, arena, logits, "eval"), forward(logits, feed, reference.variables))


def forward(node, feed, variables):
    ex = gc.NumpyExecutor([node])
    for name, value in variables.items():
        if name in ex.variables:
            ex.set_variable(name, value)
    return ex.run({k: v for k, v in feed.items() if k in ex.placeholders})[0]


@settings(max_examples=1000, deadline=None)
@given(random_graphs())
def test_random_plans_check_and_compute_the_reference_numbers(graph):
    outputs, feed = graph
    schedules = {"step": schedule(outputs), "first": schedule(outputs[:1])}
    plan = plan_memory(schedules, persistent=outputs)
    check_plan(plan)
    assert plan.lower_bound <= plan.arena_bytes <= plan.naive_bytes
    reference = gc.NumpyExecutor(outputs)
    before = {k: v.copy() for k, v in reference.variables.items()}
    with np.errstate(all="ignore"):
        want = reference.run(feed)
        arena = run_in_arena(plan, "step", feed, before)
    for node, value in zip(outputs, want):
        close(arena_value(plan, arena, node, "step"), value)
    for name, value in reference.variables.items():
        close(arena_value(plan, arena, reference.variable_nodes[name], "step"), value)


def broken(plan, name, **changes):
    """The plan with buffer `name`'s fields changed."""
    buffers = [dataclasses.replace(b, **changes) if b.name == name else b for b in plan.buffers]
    return dataclasses.replace(plan, buffers=buffers)


def small_plan():
    x = gc.placeholder("x", (64,))
    a = gc.exp(x)
    b = gc.tanh(a)
    c = gc.relu(b) + a                                         # a is live while b is computed
    plan = plan_memory({"step": schedule([c])}, persistent=[c])
    check_plan(plan)
    return plan, x, a, b, c


def test_checker_catches_overlapping_live_buffers():
    plan, x, a, b, c = small_plan()
    bad = broken(plan, b.name, offset=plan.offset_of(a))
    with pytest.raises(gc.PlanError, match=f"{a.name}.*{b.name}|{b.name}.*{a.name}"):
        check_plan(bad)


FAULTS = {   # name: (how to break small_plan's plan, what check_plan must say)
    "persistent overlap": (lambda plan, x, a, b, c: broken(plan, c.name, offset=plan.offset_of(x)), "overlap"),
    # relu(b) written over b at the step that last reads b (the lifetimes touch at one step: still an overlap)
    "written over an operand": (lambda plan, x, a, b, c: broken(plan, next(i.name for i in c.inputs if i.op == "relu"),
                                                                offset=plan.offset_of(b)), "overlap"),
    "misaligned": (lambda plan, x, a, b, c: broken(plan, a.name, offset=plan.offset_of(a) + 128), "misaligned"),
    "outside the arena": (lambda plan, x, a, b, c: broken(plan, a.name, offset=plan.arena_bytes), "outside"),
    "dies too early": (lambda plan, x, a, b, c: broken(plan, a.name, last=plan.buffer_of(a).first),
                       "outside its lifetime"),
    "placeholder as a temporary": (lambda plan, x, a, b, c: broken(plan, x.name, region="temp", schedule="step",
                                                                   first=0, last=4), "must have a persistent"),
    "missing buffer": (lambda plan, x, a, b, c: dataclasses.replace(
        plan, buffers=[buf for buf in plan.buffers if buf.node is not b]), "has no buffer"),
}


@pytest.mark.parametrize("fault", FAULTS)
def test_checker_catches_other_faults(fault):
    corrupt, message = FAULTS[fault]
    with pytest.raises(gc.PlanError, match=message):
        check_plan(corrupt(*small_plan()))


def test_image_input_read_in_place_only_where_every_reader_is_a_gemms_a_operand():
    """The MLP's x is read only as the A operand of x @ W1 (train and eval) and x^T @ dh1: those three GEMMs
    read the steps' batch input. Its slot holds two batches (the step's, and the next step's that the trainer
    writes while the step runs): of row indices into the dataset (a uint32 a row), or, where two batches of
    x's values take at most GATHERED_MAX bytes, of the gathered values. A program that also reads x
    elsewhere, or whose rows are no multiple of 4 elements, keeps x's values in the arena."""
    from gcompile.pipeline import compile_program
    from gcompile.passes.plan_memory import GATHERED_MAX
    src = compile_program(mlp_program(1000), target="cpu")
    x = src.module.trainer["x"]
    assert 2 * x.nbytes > GATHERED_MAX
    assert src.plan.buffer_of(x).rows and src.plan.buffer_of(x).needed == 2 * 4 * 1000 < x.nbytes
    assert "x: no buffer of its values" in src.stages["plan_memory"]
    assert "#define GC_X_ROWS 1" in src.source and "#define GC_X_GATHERED 0" in src.source
    assert src.source.count("*gc_batch_input(),") == 3
    src = compile_program(mlp_program(128), target="cpu")
    x = src.module.trainer["x"]
    assert 2 * x.nbytes <= GATHERED_MAX
    assert src.plan.buffer_of(x).rows and src.plan.buffer_of(x).needed == 2 * x.nbytes
    assert "two batches of its values" in src.stages["plan_memory"]
    assert "#define GC_X_ROWS 1" in src.source and "#define GC_X_GATHERED 1" in src.source
    assert src.source.count("*gc_batch_input(),") == 3

    def logreg(row, scaled):
        x = gc.placeholder("x", (8, row))
        y = gc.placeholder("y", (8,), dtype="int32")
        W = gc.variable("W", (row, 3), init=gc.init.normal(0.1, seed=1))
        logits = (x * 2.0 if scaled else x) @ W
        return gc.Program(gc.softmax_cross_entropy(logits, y), [W], optimizer=gc.SGD(lr=0.1),
                          outputs={"logits": logits})
    assert compile_program(logreg(12, False), target="cpu").plan.buffers[0].rows
    for row, scaled in ((12, True), (10, False)):
        src = compile_program(logreg(row, scaled), target="cpu")
        assert not any(b.rows for b in src.plan.buffers)
        assert "x: gathered into its buffer each step" in src.stages["plan_memory"]
        assert "#define GC_X_ROWS 0" in src.source and "gc_batch_input()," not in src.source


def test_outputs_and_a_loss_that_fold_into_literals_are_read_back(tmp_path):
    """A constant output or loss (simplify folds it into a literal, which the code writes where it is read
    and no buffer holds) is kept in a one-element constant: compile failed with 'has no buffer'."""
    x = gc.placeholder("x", (4, 3))
    W = gc.variable("W", (3, 2), init=gc.init.uniform(-1, 1, seed=1))
    program = gc.Program(gc.reduce_mean(x @ W), [W], gc.SGD(0.1), outputs={
        "y": x @ W, "scale": gc.constant(2.0) * 3.0, "count": gc.constant(7, dtype="int32"),
        "viewed": gc.reshape(gc.constant(2.0) * 3.0, (1, 1))}, name="folded")   # a view of one: it read 0
    with gc.load(gc.compile(program, target="cpu", out_dir=tmp_path / "outputs")) as m:
        got = m.forward(np.ones((4, 3), np.float32))
        assert (got["scale"].shape, float(got["scale"]), int(got["count"])) == ((), 6.0, 7)
        assert got["viewed"].tolist() == [[6.0]]
    constant_loss = gc.Program(gc.constant(1.5) * 2.0, [], name="constant_loss")
    with gc.load(gc.compile(constant_loss, target="cpu", out_dir=tmp_path / "loss")) as m:
        assert m.train_step() == 3.0
    assert float(gc.Executor([gc.constant(2.0) * 3.0], "cpu").run({})[0]) == 6.0


@pytest.mark.parametrize("view", ["x", "x * 1.0", "reshape"])
def test_an_output_that_is_the_image_input_keeps_its_values(view, tmp_path):
    """An output that is x (or simplifies to it) is read back from x's buffer: x keeps its values there. Read
    through batch rows, its buffer held none and forward() returned zeros."""
    x, y = gc.placeholder("x", (8, 12)), gc.placeholder("y", (8,), dtype="int32")
    W = gc.variable("W", (12, 3), init=gc.init.uniform(-1, 1, seed=1))
    logits = x @ W
    out = {"x": x, "x * 1.0": x * 1.0, "reshape": gc.reshape(x, (8, 12))}[view]
    program = gc.Program(gc.softmax_cross_entropy(logits, y), [W], gc.SGD(0.1),
                         outputs={"logits": logits, "x_out": out}, name="xout")
    artifact = gc.compile(program, target="cpu", out_dir=tmp_path)
    images = np.random.RandomState(0).rand(8, 12).astype(np.float32)
    with gc.load(artifact) as m:
        got = m.forward(images)
        assert np.array_equal(got["x_out"], images)
        np.testing.assert_allclose(got["logits"], images @ m.params["W"], rtol=1e-5, atol=1e-6)
    from gcompile.pipeline import compile_program
    assert "x: gathered into its buffer each step (an output is its values)" in \
        compile_program(program, target="cpu").stages["plan_memory"]
