"""How steps execute: the trainer's shuffled epochs (device-side order, chunks of replayed steps) against a
numpy run in the same order, --target-acc, the timing ABI (gc_time_steps / Model.time_steps), the
manifest's kernel counts, and — on a GPU — CUDA graph replay against plain launches, bit for bit."""
from __future__ import annotations

import json
import re
import subprocess

import numpy as np
import pytest

import gcompile as gc
from gcompile.checkpoint import read_checkpoint
from gcompile.permutation import epoch_order

RTOL, ATOL = 1e-4, 1e-5
TARGETS = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
BATCH, FEATURES, CLASSES = 4, 12, 3
N_TRAIN = 67 * BATCH + 2     # 67 steps per epoch: a prime above 64, so a graph of 64 steps and one of 3
SCALE = np.float32(1 / 256)


def program():
    r = np.random.RandomState(5)
    x = gc.placeholder("x", (BATCH, FEATURES))
    y = gc.placeholder("y", (BATCH,), dtype="int32")
    W1 = gc.variable("W1", init=r.normal(0, 0.3, (FEATURES, 8)).astype(np.float32))
    b1 = gc.variable("b1", init=np.zeros(8, np.float32))
    W2 = gc.variable("W2", init=r.normal(0, 0.3, (8, CLASSES)).astype(np.float32))
    logits = gc.relu(x @ W1 + b1) @ W2
    return gc.Program(gc.softmax_cross_entropy(logits, y), [W1, b1, W2], gc.SGD(lr=0.2),
                      outputs={"logits": logits}, name="steps")


def clusters(r, n, centers, noise=0.0):
    """uint8 images around one center per class; a fraction `noise` of the labels is wrong."""
    labels = r.randint(0, CLASSES, n)
    images = np.clip(centers[labels] + r.normal(0, 25, (n, FEATURES)), 0, 255).astype(np.uint8)
    flip = r.uniform(size=n) < noise
    labels[flip] = (labels[flip] + 1) % CLASSES
    return images, labels.astype(np.uint8)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("clusters")
    r = np.random.RandomState(1)
    centers = r.uniform(0, 255, (CLASSES, FEATURES))
    # 10% of the validation labels are wrong: accuracy tops out near 0.9
    for split, n, noise in (("train", N_TRAIN, 0.0), ("valid", 41, 0.1)):
        images, labels = clusters(r, n, centers, noise)
        np.save(root / f"{split}_images.npy", images)
        np.save(root / f"{split}_labels.npy", labels)
    return root


@pytest.fixture(scope="module", params=TARGETS)
def artifact(request, tmp_path_factory):
    return gc.compile(program(), target=request.param, out_dir=tmp_path_factory.mktemp(request.param))


def train(artifact, data, tmp_path, *args, tag="run"):
    log, save = tmp_path / f"{tag}.jsonl", tmp_path / f"{tag}.ckpt"
    proc = subprocess.run([artifact.binary, "train", "--data", str(data), "--log", str(log), "--save", str(save),
                           *args], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    return [json.loads(line) for line in log.read_text().splitlines()], read_checkpoint(save), proc.stdout


def numpy_run(data, epochs, seed, shuffle=True):
    """The trainer's loop in numpy: epoch e reads examples epoch_order(seed, e, n)[s*B:(s+1)*B] at step s."""
    images, labels = np.load(data / "train_images.npy"), np.load(data / "train_labels.npy").astype(np.int32)
    step = gc.NumpyExecutor(program().train_outputs)
    steps, losses = len(labels) // BATCH, []
    for epoch in range(epochs):
        order = epoch_order(seed, epoch, len(labels)) if shuffle else np.arange(len(labels))
        epoch_losses = []
        for s in range(steps):
            rows = order[s * BATCH:(s + 1) * BATCH]
            epoch_losses.append(step.run({"x": images[rows].astype(np.float32) * SCALE, "y": labels[rows]})[0])
        losses.append(epoch_losses)
    return step, np.array(losses, dtype=np.float64)


def test_shuffled_training_matches_numpy_in_the_same_order(artifact, dataset, tmp_path):
    epochs, ckpt, out = train(artifact, dataset, tmp_path, "--epochs", "3", "--seed", "9")
    reference, losses = numpy_run(dataset, 3, seed=9)
    assert [e["loss"] for e in epochs] == pytest.approx(losses[:, -1], rel=RTOL, abs=ATOL)
    assert [e["mean_loss"] for e in epochs] == pytest.approx(losses.mean(axis=1), rel=RTOL, abs=ATOL)
    for name, value in ckpt.tensors.items():
        if name != "lr":
            np.testing.assert_allclose(value, reference.variables[name], rtol=RTOL, atol=ATOL, err_msg=name)
    assert (ckpt.step, ckpt.epoch, ckpt.seed, ckpt.shuffle) == (3 * 67, 3, 9, True)
    if artifact.target == "cuda":
        assert "CUDA graphs of 64 steps" in out


def assert_same_runs(dataset, tmp_path, **artifacts):
    """Two builds' trainers, 2 epochs with one seed: the same losses, accuracies and checkpoint, bit for bit."""
    (first, a), (second, b) = artifacts.items()
    runs = [train(artifact, dataset, tmp_path, "--epochs", "2", "--seed", "3", tag=tag)
            for tag, artifact in ((first, a), (second, b))]
    assert [(e["loss"], e["mean_loss"], e["val_acc"]) for e in runs[0][0]] == \
        [(e["loss"], e["mean_loss"], e["val_acc"]) for e in runs[1][0]]
    for name, value in runs[0][1].tensors.items():
        np.testing.assert_array_equal(value, runs[1][1].tensors[name], err_msg=name)


@pytest.mark.parametrize("target", TARGETS)
def test_gathered_batches_and_row_indices_train_alike(target, dataset, tmp_path, monkeypatch):
    """x's slot holds two gathered batches of its values (small batches, plan_memory.gathered_rows) or two
    batches of row indices into the dataset: the GEMMs read the same values either way, bit for bit."""
    import importlib
    plan_memory = importlib.import_module("gcompile.passes.plan_memory")
    gathered = gc.compile(program(), target=target, out_dir=tmp_path / "gathered")
    monkeypatch.setattr(plan_memory, "GATHERED_MAX", 0)
    indexed = gc.compile(program(), target=target, out_dir=tmp_path / "indexed")
    assert "#define GC_X_GATHERED 1" in open(gathered.source).read()
    assert "#define GC_X_GATHERED 0" in open(indexed.source).read()
    assert_same_runs(dataset, tmp_path, gathered=gathered, indexed=indexed)


@pytest.mark.gpu
def test_images_widened_on_the_device_train_as_bytes(dataset, tmp_path, monkeypatch):
    """GC_X_FLOAT (emit.rows_as_floats): the cuda trainer uploads a uint8 dataset's bytes and widens them to floats
    in place on the device (gc_widen_pixels, ~log4(n) launches, each writing over bytes the one before read); the
    steps then read floats where they read bytes: the same values, so the same run bit for bit, the validation
    split (41 rows: an odd count of values) included."""
    import importlib
    plan_memory = importlib.import_module("gcompile.passes.plan_memory")
    emit = importlib.import_module("gcompile.passes.emit")
    monkeypatch.setattr(plan_memory, "GATHERED_MAX", 0)
    as_bytes = gc.compile(program(), target="cuda", out_dir=tmp_path / "bytes")
    monkeypatch.setattr(emit, "rows_as_floats", lambda kernels, target: target == "cuda")
    widened = gc.compile(program(), target="cuda", out_dir=tmp_path / "widened")
    assert "#define GC_X_FLOAT 0" in open(as_bytes.source).read()
    assert "#define GC_X_FLOAT 1" in open(widened.source).read()
    assert_same_runs(dataset, tmp_path, bytes=as_bytes, widened=widened)


def test_order_depends_on_the_seed_only(artifact, dataset, tmp_path):
    _, a, _ = train(artifact, dataset, tmp_path, "--epochs", "2", "--seed", "4", tag="a")
    _, b, _ = train(artifact, dataset, tmp_path, "--epochs", "2", "--seed", "4", tag="b")
    _, c, _ = train(artifact, dataset, tmp_path, "--epochs", "2", "--seed", "5", tag="c")
    for name in a.tensors:
        np.testing.assert_array_equal(a.tensors[name], b.tensors[name])
    assert not np.array_equal(a.tensors["W1"], c.tensors["W1"])


def test_target_accuracy_stops_training(artifact, dataset, tmp_path):
    epochs, _, out = train(artifact, dataset, tmp_path, "--epochs", "30", "--target-acc", "0.8", tag="hit")
    summary = epochs[-1]
    assert "target_acc" in summary and summary["epoch"] == len(epochs) - 1 < 30
    assert epochs[-2]["val_acc"] >= 0.8 and all(e["val_acc"] < 0.8 for e in epochs[:-2])
    assert 0 < summary["train_seconds"] <= summary["loop_seconds"] <= summary["since_start_seconds"]
    assert re.search(rf"target val_acc 0.8000 reached at epoch {summary['epoch']}: training loop [0-9.]+ s "
                     r"\(steps [0-9.]+ s\), since start [0-9.]+ s", out), out
    epochs, _, out = train(artifact, dataset, tmp_path, "--epochs", "2", "--target-acc", "0.99", tag="miss")
    assert len(epochs) == 2 and "target val_acc 0.9900 not reached in 2 epochs" in out


def test_the_trainer_reports_the_accuracy_it_starts_from(artifact, dataset, tmp_path):
    """Before its first step the trainer evaluates the parameters it starts from (outside the timed loop): the
    initial values' accuracy, as `eval` gives it and as numpy does (to an example); a resumed run's, that of
    the epoch it resumes after."""
    evaluated = subprocess.run([artifact.binary, "eval", "--data", str(dataset)], capture_output=True, text=True,
                               timeout=600)
    assert evaluated.returncode == 0, evaluated.stderr
    initial = re.search(r"valid accuracy ([0-9.]+) \(41 examples\)", evaluated.stdout).group(1)
    images = np.load(dataset / "valid_images.npy").astype(np.float32) * SCALE
    labels = np.load(dataset / "valid_labels.npy")
    padded = images[np.minimum(np.arange(-(-len(labels) // BATCH) * BATCH), len(labels) - 1)]
    forward = gc.NumpyExecutor([program().outputs["logits"]])
    logits = np.concatenate([forward.run({"x": padded[i:i + BATCH]})[0] for i in range(0, len(padded), BATCH)])
    assert float(initial) == pytest.approx(np.mean(logits[:len(labels)].argmax(axis=1) == labels), abs=1 / 41)
    epochs, _, out = train(artifact, dataset, tmp_path, "--epochs", "1", tag="first")
    lines = out.splitlines()
    at = lines.index(f"val_acc {initial} before this run's first step")
    assert lines[at + 1].startswith("epoch 1/1")
    _, _, out = train(artifact, dataset, tmp_path, "--epochs", "2", "--resume", str(tmp_path / "first.ckpt"),
                      tag="second")
    assert f"val_acc {epochs[-1]['val_acc']:.4f} before this run's first step" in out


def test_time_steps_runs_the_steps_it_times(artifact):
    r = np.random.RandomState(2)
    x = r.uniform(0, 1, (BATCH, FEATURES)).astype(np.float32)
    y = r.randint(0, CLASSES, BATCH).astype(np.int32)
    model = gc.load(artifact)
    reference = gc.NumpyExecutor(program().train_outputs)
    model.train_step(x, y)
    seconds = model.time_steps(5)       # a warm-up graph of 5 steps, then 5 timed steps
    assert 0 < seconds < 60
    for _ in range(11):
        reference.run({"x": x, "y": y})
    for name, value in model.params.items():
        np.testing.assert_allclose(value, reference.variables[name], rtol=RTOL, atol=ATOL, err_msg=name)
    before = model.params
    assert model.time_steps(70, which="eval") > 0    # graphs of 35 forward passes
    for name, value in model.params.items():
        np.testing.assert_array_equal(value, before[name])
    for bad, message in (((0,), "steps must be"), ((2.5,), "steps must be"), ((3, "both"), "which must be")):
        with pytest.raises(gc.GCompileError, match=message):
            model.time_steps(*bad)


def test_manifest_counts_the_kernels_of_each_step(artifact):
    manifest = json.loads(open(artifact.manifest).read())
    source = open(artifact.source).read()
    for graph in ("train", "eval"):
        body = re.search(rf"static int gc_run_{graph}_branches\(unsigned char\* A, const gc_step_hook\* hook\) \{{(.*?)\n}}", source,
                         re.S).group(1)
        assert manifest["kernels"][graph] == len(re.findall(r"GC_TRY\(k\d+_", body)) > 0
    assert manifest["kernels"]["train"] > manifest["kernels"]["eval"]


def test_cuda_build_launches_on_the_per_thread_stream(tmp_path):
    """Compile-only: graph capture needs every launch on the per-thread default stream."""
    import shutil
    if not shutil.which("nvcc"):
        pytest.skip("nvcc is not installed")
    built = gc.compile(program(), target="cuda", out_dir=tmp_path)
    manifest = json.loads(open(built.manifest).read())
    assert "--default-stream" in manifest["compiler"]
    assert manifest["compiler"][manifest["compiler"].index("--default-stream") + 1] == "per-thread"
    assert "cudaStreamBeginCapture" in open(built.source).read()


# ---- the CUDA graph path against plain launches (GPU) -----------------------------------------------------
@pytest.mark.gpu
def test_trainer_graphs_match_plain_launches(tmp_path, dataset):
    built = gc.compile(program(), target="cuda", out_dir=tmp_path / "build")
    graphs = train(built, dataset, tmp_path, "--epochs", "3", "--seed", "2", tag="graphs")
    plain = train(built, dataset, tmp_path, "--epochs", "3", "--seed", "2", "--no-graph", tag="plain")
    assert "CUDA graphs of 64 steps" in graphs[2] and "no CUDA graphs" in plain[2]
    strip = [{k: v for k, v in e.items() if k in ("epoch", "loss", "mean_loss", "val_acc")} for e in graphs[0]]
    assert strip == [{k: v for k, v in e.items() if k in ("epoch", "loss", "mean_loss", "val_acc")}
                     for e in plain[0]]
    for name, value in graphs[1].tensors.items():
        np.testing.assert_array_equal(value, plain[1].tensors[name], err_msg=name)


@pytest.mark.gpu
@pytest.mark.slow
def test_mnist_trainer_graphs_match_plain_launches(mnist_dir, tmp_path):
    """The MNIST MLP at batch 128, shuffled: 390 steps per epoch as graphs of 39 steps."""
    from conftest import load_example
    built = gc.compile(load_example("mnist_mlp").program(batch_size=128), target="cuda", out_dir=tmp_path / "b")
    args = ["--epochs", "2", "--lr", "0.1"]
    graphs = train(built, mnist_dir, tmp_path, *args, tag="graphs")
    plain = train(built, mnist_dir, tmp_path, *args, "--no-graph", tag="plain")
    print(graphs[2])
    assert "CUDA graphs of 39 steps" in graphs[2]
    assert [(e["loss"], e["mean_loss"], e["val_acc"]) for e in graphs[0]] == \
        [(e["loss"], e["mean_loss"], e["val_acc"]) for e in plain[0]]
    for name, value in graphs[1].tensors.items():
        np.testing.assert_array_equal(value, plain[1].tensors[name], err_msg=name)
    assert graphs[0][-1]["val_acc"] > 0.93     # 0.9449 on the cpu target in this order


@pytest.mark.gpu
def test_python_abi_graphs_match_plain_launches(tmp_path, monkeypatch):
    built = gc.compile(program(), target="cuda", out_dir=tmp_path)
    with_graphs = gc.load(built)
    monkeypatch.setenv("GC_NO_GRAPH", "1")
    plain = gc.load(built)          # GC_NO_GRAPH is read when the model is created
    r = np.random.RandomState(0)
    for _ in range(4):
        x = r.uniform(0, 1, (BATCH, FEATURES)).astype(np.float32)
        y = r.randint(0, CLASSES, BATCH).astype(np.int32)
        assert with_graphs.train_step(x, y) == plain.train_step(x, y)
        np.testing.assert_array_equal(with_graphs.predict(x), plain.predict(x))
    with_graphs.time_steps(100)
    plain.time_steps(100)
    for name, value in with_graphs.params.items():
        np.testing.assert_array_equal(value, plain.params[name], err_msg=name)


@pytest.mark.gpu
@pytest.mark.slow
def test_mnist_b1000_tf32_trainer_gives_one_checkpoint(mnist_dir, tmp_path, capsys):
    """The MLP at batch 1000 on tf32 tensor cores, built as make bench builds it (with this GPU's tuning record
    where bench/tuned has one — the H100's and H200's split dW1's K 4 ways over a cluster of blocks, beside other
    streams' kernels; else the default tiles): 40 runs of plain launches save
    one checkpoint (the race of docs/compiler.md's "A cross-stream nondeterminism" showed in 1-2 of 30-40), and
    CUDA graphs save the same tensors."""
    import importlib
    from conftest import ROOT, load_bench
    load_bench()
    det = importlib.import_module("bench.determinism")
    args = [str(ROOT / "examples/mnist_mlp.py"), "--batch-size", "1000", "--precision", "tf32",
            "--data", str(mnist_dir)]
    assert det.main(args + ["--runs", "40", "--keep", str(tmp_path / "plain")]) == 0, capsys.readouterr()
    assert det.main(args + ["--runs", "3", "--graphs", "--keep", str(tmp_path / "graphs")]) == 0, \
        capsys.readouterr()
    out = capsys.readouterr().out
    print(out)
    assert "40 runs, one checkpoint" in out and "3 runs, one checkpoint" in out
    plain, graphs = (read_checkpoint(tmp_path / mode / "run0.ckpt") for mode in ("plain", "graphs"))
    for name, value in graphs.tensors.items():
        np.testing.assert_array_equal(value, plain.tensors[name], err_msg=name)
