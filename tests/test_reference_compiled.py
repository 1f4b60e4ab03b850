"""The reference experiment compiled: the standalone binary trains examples/mnist_logreg.py and
examples/mnist_mlp.py for 10 epochs (no shuffling) and must land in docs/reference.md's band — the cpu
target here, the cuda target on a GPU machine. Also: the Python loader reproduces the binary's losses, and
device allocations do not grow with the number of epochs (cuda only)."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import gcompile as gc
from conftest import REFERENCE, load_example

TARGETS = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def train_binary(artifact, data, tmp_path, *args):
    log = tmp_path / "metrics.jsonl"
    proc = subprocess.run([artifact.binary, "train", "--data", str(data), "--log", str(log), *args],
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    return [json.loads(line) for line in log.read_text().splitlines()], proc


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_reference_experiment(mnist_dir, name, target, tmp_path):
    want_losses, want_accuracy = REFERENCE[name]
    artifact = gc.compile(load_example(name).program(), target=target, out_dir=tmp_path / "build")
    epochs, proc = train_binary(artifact, mnist_dir, tmp_path, "--epochs", "10", "--no-shuffle")
    print(proc.stdout)
    assert [e["epoch"] for e in epochs] == list(range(1, 11))
    assert epochs[-1]["val_acc"] == pytest.approx(want_accuracy, abs=0.003)
    assert [e["loss"] for e in epochs] == pytest.approx(want_losses, abs=0.03)


@pytest.mark.parametrize("target", TARGETS)
def test_python_loader_matches_the_binary(mnist_dir, target, tmp_path):
    """One epoch in order from Python through gc.load gives the binary's last-batch loss."""
    artifact = gc.compile(load_example("mnist_logreg").program(), target=target, out_dir=tmp_path / "build")
    epochs, _ = train_binary(artifact, mnist_dir, tmp_path, "--epochs", "1", "--no-shuffle")
    images = np.load(mnist_dir / "train_images.npy").reshape(-1, 784)
    labels = np.load(mnist_dir / "train_labels.npy").astype(np.int32)
    model = gc.load(artifact)
    for step in range(len(images) // 1000):
        batch = slice(step * 1000, (step + 1) * 1000)
        loss = model.train_step(images[batch].astype(np.float32) / np.float32(256), labels[batch])
    assert loss == pytest.approx(epochs[0]["loss"], rel=1e-5)


@pytest.mark.gpu
def test_device_allocations_do_not_grow_with_epochs(mnist_dir, tmp_path):
    """Count cudaMalloc with an LD_PRELOAD shim (the binary links the CUDA runtime shared): one arena and
    one dataset allocation, for 1 epoch as for 5."""
    shim = tmp_path / "count_cuda_malloc.so"
    source = Path(__file__).parent / "native" / "count_cuda_malloc.c"
    subprocess.run([shutil.which("cc") or "gcc", "-shared", "-fPIC", "-o", str(shim), str(source), "-ldl"],
                   check=True)
    artifact = gc.compile(load_example("mnist_mlp").program(), target="cuda", out_dir=tmp_path / "build",
                          cudart="shared")
    counts = {}
    for epochs in (1, 5):
        proc = subprocess.run([artifact.binary, "train", "--data", str(mnist_dir), "--epochs", str(epochs)],
                              capture_output=True, text=True, timeout=600, env={"LD_PRELOAD": str(shim),
                                                                               "PATH": "/usr/bin:/bin"})
        assert proc.returncode == 0, proc.stderr
        line = [ln for ln in proc.stderr.splitlines() if ln.startswith("[count_cuda_malloc]")][-1]
        counts[epochs] = int(line.split("calls=")[1].split()[0])
        print(f"epochs={epochs}: {line}")
    assert counts[1] == counts[5] == 2
