"""The numerical guard: the ops it is made of (where, isfinite), the step counter, its semantics in the
numpy executor, compiled == numpy with bad steps in both modes, and the trainer stopping (or skipping)."""
import json

import numpy as np
import pytest

import gcompile as gc
from gcompile.optim import GUARD_HALTED_AT, GUARD_NONFINITE, GUARD_SKIP
from golden import TARGETS
from opcheck import check_op, uniform
from reliability import (BATCH, CLASSES, FEATURES, poisoned_dataset, run_binary, small_program, synthetic_dataset,
                         write_split)

# the reference executor meets the infinities these tests feed it
pytestmark = pytest.mark.filterwarnings("ignore:(invalid value|overflow):RuntimeWarning")


# --- the ops ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shapes", [((3, 4), (3, 4), (3, 4)), ((4,), (3, 4), (3, 1)), ((), (2, 3), (3,))],
                         ids=str)
def test_where(shapes):
    cond = (uniform(shapes[0], seed=1) > 0).astype(np.float64)
    check_op(gc.where, [cond, uniform(shapes[1], seed=2), uniform(shapes[2], seed=3)],
             lambda c, a, b: np.where(c != 0, a, b))


def test_where_with_an_integer_condition_and_a_scalar():
    cond = np.array([0, 3, -1, 0], np.int32)
    out = check_op(lambda c, a: gc.where(c, a, 2.5), [cond, uniform((4,), seed=4)],
                   lambda c, a: np.where(c != 0, a, 2.5))
    assert out.dtype == "float32" and out.inputs[2].op == "constant"


def test_where_rejects_mismatched_values():
    c = gc.placeholder("c", (3,))
    with pytest.raises(gc.ShapeError, match=r"where: operands have different dtypes: a \(3,\) float32, "
                                            r"b \(3,\) int32"):
        gc.where(c, gc.placeholder("a", (3,)), gc.placeholder("b", (3,), dtype="int32"))
    with pytest.raises(gc.ShapeError, match=r"where: shapes do not broadcast"):
        gc.where(c, gc.placeholder("a", (4,)), 0.0)
    with pytest.raises(gc.ShapeError, match="where: the condition must be a graph node"):
        gc.where(True, c, c)


def test_isfinite():
    x = np.array([[0.0, -1.5, np.inf], [np.nan, -np.inf, 3e38]])
    out = check_op(gc.isfinite, [x], lambda v: np.isfinite(v).astype(np.float32))
    assert out.dtype == "float32"
    (grad,) = gc.gradients(gc.reduce_sum(out), [out.inputs[0]])
    assert grad.op == "zeros_like"  # a mask: no gradient flows through it
    with pytest.raises(gc.ShapeError, match="isfinite: needs a float input"):
        gc.isfinite(gc.placeholder("i", (2,), dtype="int32"))


def test_nan_propagates_in_compiled_code_as_in_numpy(tmp_path):
    """relu, maximum, minimum and reduce_max keep a NaN (C's comparisons alone would drop it): a NaN that
    reaches the loss in numpy reaches it in the compiled program, and the guard sees it."""
    x, y = gc.placeholder("x", (2, 3)), gc.placeholder("y", (2, 3))
    outputs = [gc.relu(x), gc.maximum(x, y), gc.minimum(x, y), gc.maximum(y, x), gc.reduce_max(x, axis=1)]
    feed = {x: np.array([[np.nan, 1.0, -2.0], [0.5, np.nan, 3.0]], np.float32),
            y: np.array([[0.0, np.nan, 1.0], [2.0, -1.0, np.nan]], np.float32)}
    want = gc.NumpyExecutor(outputs).run(feed)
    with gc.load(gc.compile(outputs, target="cpu", out_dir=tmp_path, name="nan")) as model:
        got = list(model.forward(feed[x], feed[y]).values())
    for node, g, w in zip(outputs, got, want):
        np.testing.assert_array_equal(g, w, err_msg=node.describe())
    assert np.isnan(want[0][0, 0]) and np.isnan(want[4]).all()


# --- the step counter and the guard in the numpy executor --------------------------------------------------
def batch(seed, bad=False):
    r = np.random.RandomState(seed)
    x = r.uniform(0, 1, (BATCH, FEATURES)).astype(np.float32)
    if bad:   # with positive first-layer weights every hidden unit is inf, the logits NaN: so is the loss
        x[1] = np.inf
    return {"x": x, "y": r.randint(0, CLASSES, BATCH).astype(np.int32)}


def test_every_program_with_an_optimizer_counts_its_steps():
    program = small_program(positive=True)
    ex = gc.NumpyExecutor(program.train_outputs)
    assert program.step.name == "step" and program.step.dtype == "int32" and program.step.shape == ()
    assert ex.get_variable("step") == 0
    for seed in range(3):
        ex.run(batch(seed))
    assert ex.get_variable("step") == 3
    assert not hasattr(gc.Program(program.loss, program.params), "step")  # no optimizer, no steps


def snapshot(ex):
    return {name: value.copy() for name, value in ex.variables.items()}


@pytest.mark.parametrize("skip", [0, 1], ids=["stop", "skip"])
def test_a_bad_step_changes_no_parameter(skip):
    ex = gc.NumpyExecutor(small_program(positive=True).train_outputs)
    ex.set_variable(GUARD_SKIP, skip)
    ex.run(batch(0))
    before = snapshot(ex)
    ex.run(batch(1, bad=True))
    after = snapshot(ex)
    for name in ("W1", "b1", "W2", "W1.velocity", "b1.velocity", "W2.velocity"):
        np.testing.assert_array_equal(after[name], before[name], err_msg=name)
    assert after["step"] == 2 and after[GUARD_NONFINITE] == 1
    assert after[GUARD_HALTED_AT] == (-1 if skip else 1)

    ex.run(batch(2))    # stop: held (no update at all); skip: trains on
    later = snapshot(ex)
    assert (later["W1"] == after["W1"]).all() == (not skip)
    assert later["step"] == 3 and later[GUARD_NONFINITE] == 1


# --- compiled == numpy ----------------------------------------------------------------------------------
@pytest.fixture(scope="module", params=TARGETS)
def positive_artifact(request, tmp_path_factory):
    """The small program compiled for each target (cuda: its loss's sum and guard in the chain's collector
    block, gc_collect_partials)."""
    return gc.compile(small_program(positive=True), target=request.param,
                      out_dir=tmp_path_factory.mktemp(f"positive-{request.param}"))

@pytest.mark.parametrize("skip", [0, 1], ids=["stop", "skip"])
def test_compiled_guard_matches_numpy(positive_artifact, skip):
    model = gc.load(positive_artifact)
    reference = gc.NumpyExecutor(small_program(positive=True).train_outputs)
    model.set(GUARD_SKIP, skip)
    reference.set_variable(GUARD_SKIP, skip)
    for seed in range(6):
        feed = batch(seed, bad=seed in (2, 4))
        reference.run(feed)
        if skip or seed < 2:
            model.train_step(feed["x"], feed["y"])
        else:   # stop: the ABI reports the bad step, then that updates are held
            expected = "step 2: non-finite loss" if seed == 2 else "updates are stopped since step 2"
            with pytest.raises(gc.RuntimeFailure, match=expected):
                model.train_step(feed["x"], feed["y"])
    for name, value in model.params.items():
        np.testing.assert_allclose(value, reference.variables[name], rtol=1e-5, atol=1e-6, err_msg=name)
    assert model.params[GUARD_NONFINITE] == 2 and model.params["step"] == 6


def test_train_step_names_the_bad_step_and_how_to_go_on(positive_artifact):
    model = gc.load(positive_artifact)
    feed = batch(0, bad=True)
    with pytest.raises(gc.RuntimeFailure, match=r"gc_train_step: step 0: non-finite loss \(-?nan\): its update was "
                                                r"not applied.*guard.halted_at is set back to -1"):
        model.train_step(feed["x"], feed["y"])
    model.set(GUARD_HALTED_AT, -1)
    good = batch(1)
    assert np.isfinite(model.train_step(good["x"], good["y"]))
    assert model.params["step"] == 2 and model.params[GUARD_NONFINITE] == 1
    # with the counter set by the host, the bad step is still this one (it was told apart by the library's own
    # count of its steps, and reported as "stopped since step 0")
    model.set(GUARD_HALTED_AT, -1)
    model.set("step", 0)
    with pytest.raises(gc.RuntimeFailure, match=r"gc_train_step: step 0: non-finite loss"):
        model.train_step(feed["x"], feed["y"])
    model.set(GUARD_HALTED_AT, -1)
    model.set("step", 100)
    with pytest.raises(gc.RuntimeFailure, match=r"gc_train_step: step 100: non-finite loss"):
        model.train_step(feed["x"], feed["y"])
    with pytest.raises(gc.RuntimeFailure, match=r"updates are stopped since step 100"):
        model.train_step(good["x"], good["y"])


# --- the trainer ------------------------------------------------------------------------------------------
def test_trainer_stops_at_a_bad_step_and_keeps_the_last_checkpoint(positive_artifact, tmp_path):
    data = poisoned_dataset(tmp_path / "data", bad_example=4 * 3 + 1)      # step 4 of epoch 1 (no shuffle)
    ckpt = tmp_path / "run.ckpt"
    proc = run_binary(positive_artifact, "train", "--data", data, "--epochs", "2", "--no-shuffle", "--save", ckpt,
                      "--save-every", "2", check=3)
    assert ("error: non-finite loss at step 4 of the run (epoch 1, step 4 of 6): training stopped with the "
            f"parameters of the step before; the last checkpoint, {ckpt} (step 2), is kept") in proc.stderr
    saved = gc.read_checkpoint(ckpt)
    assert saved.step == 2 and saved.epoch_step == 2 and saved.tensors[GUARD_HALTED_AT] == -1
    assert all(np.isfinite(v).all() for v in saved.tensors.values())

    before = ckpt.read_bytes()   # a second failing run leaves the existing file alone
    proc = run_binary(positive_artifact, "train", "--data", data, "--epochs", "2", "--no-shuffle", "--save", ckpt,
                      check=3)
    assert "this run wrote no checkpoint" in proc.stderr and ckpt.read_bytes() == before


def test_trainer_skips_bad_steps_as_the_numpy_executor_does(positive_artifact, tmp_path):
    data = poisoned_dataset(tmp_path / "data", bad_example=9)   # step 2 of each epoch
    ckpt, log = tmp_path / "run.ckpt", tmp_path / "log.jsonl"
    run_binary(positive_artifact, "train", "--data", data, "--epochs", "1", "--no-shuffle", "--save", ckpt,
               "--on-nonfinite", "skip", "--log", log, check=0)
    run_binary(positive_artifact, "train", "--resume", ckpt, "--data", data, "--epochs", "2", "--on-nonfinite",
               "skip", "--log", log, check=0)     # the guard's count goes on, each epoch reports its own skips
    epochs = [json.loads(line) for line in log.read_text().splitlines()]
    assert [e["skipped"] for e in epochs] == [1, 1] and all(np.isfinite(e["mean_loss"]) for e in epochs)

    reference = gc.NumpyExecutor(small_program(positive=True).train_outputs)
    reference.set_variable(GUARD_SKIP, 1)
    images = np.load(data / "train_images.npy")
    labels = np.load(data / "train_labels.npy").astype(np.int32)
    for _ in range(2):
        for step in range(len(labels) // BATCH):
            rows = slice(step * BATCH, (step + 1) * BATCH)
            reference.run({"x": images[rows], "y": labels[rows]})
    saved = gc.read_checkpoint(ckpt)
    assert saved.tensors[GUARD_NONFINITE] == 2 and saved.tensors["step"] == 12
    for name, value in saved.tensors.items():
        np.testing.assert_allclose(value, reference.variables[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_an_epoch_of_skipped_steps_has_no_mean_loss(positive_artifact, tmp_path):
    """Every step skipped: the mean over no steps is nan in the line and null in the log (it said 0, a loss
    no step had). Options also take the --name=value form."""
    data = synthetic_dataset(tmp_path / "data", n_train=24, n_valid=8, dtype=np.float32)
    images = np.load(data / "train_images.npy")
    write_split(data, "train", np.full_like(images, 3e38), np.load(data / "train_labels.npy"))
    log = tmp_path / "log.jsonl"
    proc = run_binary(positive_artifact, "train", "--data", data, "--epochs=1", "--on-nonfinite=skip", f"--log={log}",
                      check=0)
    assert "(mean nan)" in proc.stdout and "(skipped 6 steps: non-finite loss)" in proc.stdout
    entry = json.loads(log.read_text())
    assert (entry["mean_loss"], entry["skipped"]) == (None, 6)


def test_an_overflowing_update_is_never_saved(positive_artifact, tmp_path):
    """A finite loss whose update overflows passes the guard; the checkpoint writer refuses the result."""
    good = tmp_path / "good.ckpt"
    with gc.load(positive_artifact) as model:
        model.save(good)
        before = good.read_bytes()
        model.set("lr", 1e30)
        feed = batch(0)
        feed["x"][:] = 1e19                     # a loss around 1e19, finite; gradients around 1e19
        assert np.isfinite(model.train_step(feed["x"], feed["y"]))
        with pytest.raises(gc.RuntimeFailure, match=rf"gc_save: {good}: not saved: variable 'W1' holds the "
                                                    r"non-finite value -?inf at element \d+"):
            model.save(good)
    assert good.read_bytes() == before

    data = tmp_path / "data"
    synthetic_dataset(data, n_train=24, n_valid=8, dtype=np.float32)
    write_split(data, "train", np.full((24, FEATURES), 1e19, np.float32), np.load(data / "train_labels.npy"))
    proc = run_binary(positive_artifact, "train", "--data", data, "--lr", "1e30", "--save", good, "--save-every", 1,
                      check=3)
    assert (f"error: after step 1: {good}: not saved: variable 'W1' holds the non-finite value" in proc.stderr
            and "(an update overflowed, though every loss was finite); this run wrote no checkpoint" in proc.stderr)
    assert good.read_bytes() == before
