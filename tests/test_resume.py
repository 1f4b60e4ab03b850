"""--save-every and --resume: a run killed with SIGKILL at random steps and resumed ends bit-identical to the
uninterrupted run (the kill test), resuming at epoch boundaries and mid-epoch, and the resume errors."""
import json
import os
import random
import shutil
import signal
import subprocess
import time

import numpy as np
import pytest

import gcompile as gc
from conftest import load_example
from gcompile import checkpoint as ck
from reliability import run_binary, small_program, synthetic_dataset, write_split

KILL_EPOCHS, KILL_BATCH, KILL_TRAIN, KILL_VALID, KILL_SAVE_EVERY = 3, 100, 1000, 200, 3


def saved_step(path) -> int:
    """The step count in a checkpoint's header (the file is renamed into place whole, so it is complete)."""
    with open(path, "rb") as f:
        return ck.HEADER.unpack(f.read(ck.HEADER.size))[4]


def assert_same_tensors(got: ck.Checkpoint, want: ck.Checkpoint):
    assert sorted(got.tensors) == sorted(want.tensors)
    for name, value in want.tensors.items():
        assert got.tensors[name].tobytes() == value.tobytes(), f"{name} differs"


def epoch_lines(log) -> dict:
    """The log's last line for each epoch (a resumed run may repeat the epoch it was killed in), without the
    timings."""
    lines = {}
    for line in log.read_text().splitlines():
        entry = json.loads(line)
        lines[entry["epoch"]] = {k: entry[k] for k in ("loss", "mean_loss", "val_acc", "skipped")}
    return lines


@pytest.fixture(scope="module")
def mlp(mnist_dir, tmp_path_factory):
    """examples/mnist_mlp.py at batch 100 (cpu) and the first 1000 / 200 MNIST examples: 10 steps per epoch."""
    root = tmp_path_factory.mktemp("kill")
    for split, n in (("train", KILL_TRAIN), ("valid", KILL_VALID)):
        write_split(root / "data", split, np.load(mnist_dir / f"{split}_images.npy")[:n],
                    np.load(mnist_dir / f"{split}_labels.npy")[:n])
    program = load_example("mnist_mlp").program(batch_size=KILL_BATCH, lr=0.1)
    return gc.compile(program, target="cpu", out_dir=root / "build"), root / "data"


def train_args(data, ckpt, log):
    return ["train", "--data", data, "--epochs", KILL_EPOCHS, "--save", ckpt, "--save-every", KILL_SAVE_EVERY,
            "--log", log]


def test_kill_and_resume_is_bit_identical(mlp, tmp_path):
    """The acceptance test: SIGKILL at 5 random steps, resume each, compare with the uninterrupted run."""
    artifact, data = mlp
    started = time.perf_counter()
    run_binary(artifact, *train_args(data, tmp_path / "ref.ckpt", tmp_path / "ref.jsonl"), "--seed", 7, check=0)
    reference = gc.read_checkpoint(tmp_path / "ref.ckpt")
    total = reference.step
    assert total == KILL_EPOCHS * KILL_TRAIN // KILL_BATCH
    step_seconds = (time.perf_counter() - started) / total

    seed = int(os.environ.get("GC_KILL_SEED", random.randrange(2**32)))
    rng = random.Random(seed)
    points = sorted(rng.sample(range(2, total - 2 * KILL_SAVE_EVERY), 5))
    print(f"kill points (GC_KILL_SEED={seed}): after step {points}")
    for point in points:
        ckpt, log = tmp_path / f"run{point}.ckpt", tmp_path / f"run{point}.jsonl"
        proc = subprocess.Popen([artifact.binary, *map(str, train_args(data, ckpt, log)), "--seed", "7"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        while proc.poll() is None and not (ckpt.exists() and saved_step(ckpt) >= point):
            time.sleep(0.001)
        time.sleep(rng.uniform(0, KILL_SAVE_EVERY * step_seconds))   # anywhere among the next steps, or a save
        proc.send_signal(signal.SIGKILL)
        assert proc.wait() == -signal.SIGKILL, proc.stderr.read().decode()
        killed_at = gc.read_checkpoint(ckpt)          # intact: atomic writes
        assert point <= killed_at.step < total

        resumed = run_binary(artifact, "train", "--resume", ckpt, "--data", data, "--epochs", KILL_EPOCHS,
                             "--save-every", KILL_SAVE_EVERY, "--log", log, check=0)
        assert f"resuming {ckpt} at epoch {killed_at.epoch + 1}, step {killed_at.epoch_step + 1}" in resumed.stdout
        final = gc.read_checkpoint(ckpt)
        assert (final.step, final.epoch, final.epoch_step) == (total, KILL_EPOCHS, 0)
        assert_same_tensors(final, reference)
        assert epoch_lines(log) == epoch_lines(tmp_path / "ref.jsonl")


# --- resuming without kills, on a small program ----------------------------------------------------------
@pytest.fixture(scope="module")
def small(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    artifact = gc.compile(small_program(), target="cpu", out_dir=root / "build")
    return artifact, synthetic_dataset(root / "data", n_train=40, n_valid=12)   # 10 steps per epoch


@pytest.mark.parametrize("shuffle", [True, False], ids=["shuffled", "in-order"])
def test_resume_at_epoch_ends(small, tmp_path, shuffle):
    """A run stopped after 1 or 2 of 3 epochs and resumed ends as the uninterrupted run (mid-epoch resumes:
    the kill test)."""
    artifact, data = small
    order = [] if shuffle else ["--no-shuffle"]
    run_binary(artifact, "train", "--data", data, "--epochs", 3, *order, "--save-every", "1e", "--save",
               tmp_path / "ref.ckpt", "--log", tmp_path / "ref.jsonl", check=0)
    reference = gc.read_checkpoint(tmp_path / "ref.ckpt")
    for done in (1, 2):
        ckpt, log = tmp_path / f"after{done}.ckpt", tmp_path / f"after{done}.jsonl"
        run_binary(artifact, "train", "--data", data, "--epochs", done, *order, "--save", ckpt, "--log", log,
                   check=0)
        saved = gc.read_checkpoint(ckpt)
        assert (saved.epoch, saved.epoch_step, saved.step, saved.shuffle) == (done, 0, 10 * done, shuffle)
        run_binary(artifact, "train", "--resume", ckpt, "--data", data, "--epochs", 3, "--log", log, check=0)
        assert_same_tensors(gc.read_checkpoint(ckpt), reference)
        assert epoch_lines(log) == epoch_lines(tmp_path / "ref.jsonl")


# --- resume errors -----------------------------------------------------------------------------------------
def test_resume_errors(small, tmp_path):
    artifact, data = small
    ckpt = tmp_path / "a.ckpt"
    run_binary(artifact, "train", "--data", data, "--epochs", 1, "--seed", 3, "--save", ckpt, "--save-every", 4,
               check=0)
    proc = run_binary(artifact, "train", "--resume", ckpt, "--data", data, "--seed", 4, check=2)
    assert f"error: --seed 4: {ckpt} continues a run with seed 3 (leave --seed out)" in proc.stderr
    proc = run_binary(artifact, "train", "--resume", ckpt, "--data", data, "--no-shuffle", check=2)
    assert f"error: --no-shuffle: {ckpt} continues a shuffled run" in proc.stderr
    proc = run_binary(artifact, "train", "--resume", ckpt, "--load", ckpt, "--data", data, check=2)
    assert "error: --resume and --load: give one" in proc.stderr
    proc = run_binary(artifact, "train", "--resume", ckpt, "--data", data, "--epochs", 1, check=0)
    assert f"{ckpt}: already trained 1 epochs (--epochs 1): nothing to do" in proc.stdout

    mid = tmp_path / "mid.ckpt"   # saved 8 steps into an epoch of 10 ...
    saved = gc.read_checkpoint(ckpt)
    saved.epoch, saved.epoch_step, saved.step = 0, 8, 8
    gc.write_checkpoint(mid, saved)
    fewer = synthetic_dataset(tmp_path / "fewer", n_train=20, n_valid=4)   # ... resumed on 5 steps per epoch
    proc = run_binary(artifact, "train", "--resume", mid, "--data", fewer, check=1)
    assert f"error: {mid}: saved at step 8 of epoch 1, but {fewer} gives 5 steps per epoch (another dataset?)" \
        in proc.stderr

    other = gc.compile(small_program(momentum=0.0), target="cpu", out_dir=tmp_path / "other")
    proc = run_binary(other, "train", "--resume", ckpt, "--data", data, check=1)
    assert f"error: {ckpt}: written by a different program" in proc.stderr

    # the same parameters, another batch: its epochs are other steps (the layout hash cannot tell)
    assert gc.read_checkpoint(ckpt).batch == 4
    halves = gc.compile(small_program(batch=2), target="cpu", out_dir=tmp_path / "halves")
    proc = run_binary(halves, "train", "--resume", ckpt, "--data", data, "--epochs", 2, check=2)
    assert f"error: {ckpt}: saved by a build of batch 4, this one's batch is 2: a run resumes with the batch it " \
           "began with (--load starts a new run from its parameters)" in proc.stderr
    run_binary(halves, "train", "--load", ckpt, "--data", data, "--epochs", 1, "--save", tmp_path / "b2.ckpt", check=0)
    assert gc.read_checkpoint(tmp_path / "b2.ckpt").batch == 2
    with gc.load(halves) as m:   # the library keeps the batch its position counts in: no relabelling by a save
        m.load(ckpt)
        m.save(tmp_path / "relabelled.ckpt")
    assert gc.read_checkpoint(tmp_path / "relabelled.ckpt").batch == 4


def test_load_starts_a_new_run_from_the_files_model(small, tmp_path):
    """--load takes what evaluation reads (the parameters); the optimizer state (momentum), the step counter
    (Adam's bias correction counts from it) and the rest start as compiled."""
    artifact, data = small
    trained, loaded = tmp_path / "trained.ckpt", tmp_path / "loaded.ckpt"
    run_binary(artifact, "train", "--data", data, "--epochs", 1, "--save", trained, check=0)
    run_binary(artifact, "train", "--data", data, "--epochs", 0, "--load", trained, "--save", loaded, check=0)
    a, b, init = gc.read_checkpoint(trained), gc.read_checkpoint(loaded), gc.read_checkpoint(artifact.init)
    assert a.step == 10 and (b.step, b.epoch, int(b.tensors["step"])) == (0, 0, 0)
    for name, value in a.tensors.items():
        want = value if name in ("W1", "b1", "W2", "b2") else init.tensors[name]
        assert b.tensors[name].tobytes() == want.tobytes(), name
    assert np.abs(a.tensors["W1.velocity"]).max() > 0


def test_a_binary_shipped_without_its_initial_values(small, tmp_path):
    """eval --load FILE reads FILE alone: the binary copied away from its init file evaluates a checkpoint as
    it does beside it. Training needs the initial values (train --load takes only the model from FILE); it
    says which file is missing."""
    artifact, data = small
    trained = tmp_path / "trained.ckpt"
    run_binary(artifact, "train", "--data", data, "--epochs", 1, "--save", trained, check=0)
    want = run_binary(artifact, "eval", "--data", data, "--load", trained, check=0).stdout
    alone = tmp_path / "alone" / os.path.basename(artifact.binary)
    alone.parent.mkdir()
    shutil.copy2(artifact.binary, alone)
    run = lambda *args: subprocess.run([alone, *map(str, args)], capture_output=True, text=True, timeout=120)
    got = run("eval", "--data", data, "--load", trained)
    assert (got.returncode, got.stdout) == (0, want), got.stderr
    for args in (["--load", trained], []):
        got = run("train", "--data", data, "--epochs", 1, *args)
        init = alone.parent / os.path.basename(artifact.init)
        assert got.returncode != 0 and f"{init}: not found: the initial values" in got.stderr, got.stderr
        assert ("train --load takes the checkpoint's model" in got.stderr) == bool(args)


def test_the_init_file_is_found_next_to_the_binary_however_it_is_run(small, tmp_path):
    """Through a symbolic link elsewhere, and by a bare name found on PATH, the binary reads the init file
    next to itself (it looked beside argv[0]: in the link's folder, or the current one)."""
    artifact, data = small
    want = run_binary(artifact, "eval", "--data", data, check=0).stdout
    link = tmp_path / "bin" / "linked"
    link.parent.mkdir()
    link.symlink_to(artifact.binary)
    elsewhere = tmp_path / "work"
    elsewhere.mkdir()
    path = f"{os.path.dirname(artifact.binary)}{os.pathsep}{os.environ.get('PATH', '')}"
    for command, env in (([str(link)], None), ([os.path.basename(artifact.binary)], {**os.environ, "PATH": path})):
        got = subprocess.run([*command, "eval", "--data", str(data)], capture_output=True, text=True, cwd=elsewhere,
                             env=env, timeout=120)
        assert (got.returncode, got.stdout) == (0, want), got.stderr


def test_load_takes_the_model_from_a_build_with_other_optimizer_state(small, tmp_path):
    """--load matches the model by name, dtype and shape, not by the whole layout: a checkpoint of the model
    trained with momentum starts (and is evaluated by) a plain SGD build, its velocities passed over.
    --resume still needs this program's layout; a file whose model lacks a variable, or holds one of
    another shape, is refused naming it."""
    artifact, data = small   # momentum 0.9
    trained, loaded = tmp_path / "momentum.ckpt", tmp_path / "plain.ckpt"
    run_binary(artifact, "train", "--data", data, "--epochs", 1, "--save", trained, check=0)
    plain = gc.compile(small_program(momentum=0.0), target="cpu", out_dir=tmp_path / "plain")
    run_binary(plain, "train", "--data", data, "--epochs", 0, "--load", trained, "--save", loaded, check=0)
    a, b = gc.read_checkpoint(trained), gc.read_checkpoint(loaded)
    assert "W1.velocity" in a.tensors and "W1.velocity" not in b.tensors
    for name in ("W1", "b1", "W2"):
        assert b.tensors[name].tobytes() == a.tensors[name].tobytes(), name
    evaluate = lambda art, ckpt: run_binary(art, "eval", "--data", data, "--load", ckpt, check=0).stdout
    assert evaluate(plain, trained) == evaluate(artifact, trained)
    assert "written by a different program" in run_binary(plain, "train", "--data", data, "--epochs", 2,
                                                           "--resume", trained, check=1).stderr
    for edit, message in ((lambda t: t.pop("W2"), "variable 'W2' is missing"),
                          (lambda t: t.update(b1=np.zeros(4, np.float32)),
                           "tensor 'b1' is float32 (4,) in the file, float32 (5,) in this program")):
        bad = gc.read_checkpoint(trained)
        edit(bad.tensors)
        gc.write_checkpoint(tmp_path / "bad.ckpt", bad)
        for command in (["train", "--epochs", 1], ["eval"]):
            proc = run_binary(plain, *command, "--data", data, "--load", tmp_path / "bad.ckpt", check=1)
            assert message in proc.stderr, proc.stderr


def test_load_takes_trained_parameters_the_outputs_do_not_read(tmp_path):
    """A head only the loss uses (A) is part of the model --load takes, with the parameters the logits read."""
    x, y = gc.placeholder("x", (4, 6)), gc.placeholder("y", (4,), dtype="int32")
    r = np.random.RandomState(1)
    W = gc.variable("W", init=r.normal(0, 0.3, (6, 3)).astype(np.float32))
    A = gc.variable("A", init=r.normal(0, 0.3, (6, 1)).astype(np.float32))
    logits = x @ W
    loss = gc.softmax_cross_entropy(logits, y) + 0.1 * gc.reduce_mean((x @ A) * (x @ A))
    artifact = gc.compile(gc.Program(loss, [W, A], gc.SGD(lr=0.5), outputs={"logits": logits}, name="aux"),
                          target="cpu", out_dir=tmp_path / "build")
    data = synthetic_dataset(tmp_path / "data", n_train=40, n_valid=12)
    trained, loaded = tmp_path / "trained.ckpt", tmp_path / "loaded.ckpt"
    run_binary(artifact, "train", "--data", data, "--epochs", 1, "--save", trained, check=0)
    run_binary(artifact, "train", "--data", data, "--epochs", 0, "--load", trained, "--save", loaded, check=0)
    a, b = gc.read_checkpoint(trained), gc.read_checkpoint(loaded)
    assert not np.array_equal(a.tensors["A"], gc.read_checkpoint(artifact.init).tensors["A"])
    for name in ("W", "A"):
        assert b.tensors[name].tobytes() == a.tensors[name].tobytes(), name


def test_load_starts_a_new_run_whose_schedule_spans_it(tmp_path):
    """--load: a step counter from 0, so that a learning-rate schedule spans this run's --epochs (it went on
    from the file's count: a cosine run had finished already)."""
    x, y = gc.placeholder("x", (4, 6)), gc.placeholder("y", (4,), dtype="int32")
    W = gc.variable("W", init=np.random.RandomState(0).normal(0, 0.3, (6, 3)).astype(np.float32))
    logits = x @ W
    program = gc.Program(gc.softmax_cross_entropy(logits, y), [W], gc.SGD(lr=0.5, schedule="cosine"),
                         outputs={"logits": logits}, name="cosine")
    artifact = gc.compile(program, target="cpu", out_dir=tmp_path / "build")
    data = synthetic_dataset(tmp_path / "data", n_train=40, n_valid=12)   # 10 steps per epoch
    first, second = tmp_path / "first.ckpt", tmp_path / "second.ckpt"
    run_binary(artifact, "train", "--data", data, "--epochs", 1, "--save", first, check=0)
    proc = run_binary(artifact, "train", "--data", data, "--epochs", 1, "--load", first, "--save", second, check=0)
    a, b = gc.read_checkpoint(first), gc.read_checkpoint(second)
    assert (a.step, b.step, int(b.tensors["step"]), b.epoch) == (10, 10, 10, 1)
    assert np.abs(a.tensors["W"] - b.tensors["W"]).max() > 1e-3   # the schedule's first steps: not lr x 0
    assert "resuming" not in proc.stdout
