"""What the reliability tests share: a small trainable program, synthetic datasets in the trainer's format,
and running the standalone binary."""
from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np

import gcompile as gc

FEATURES, CLASSES, BATCH = 6, 3, 4


def small_program(batch=BATCH, momentum=0.9, lr=0.1, positive=False) -> gc.Program:
    """A 6-5-3 ReLU MLP with momentum (so optimizer state exists); inputs x (batch, 6) and y (batch,).
    positive=True: W1 in [0.2, 1], so an image of 3e38s overflows the first layer however it is summed."""
    r = np.random.RandomState(5)
    x = gc.placeholder("x", (batch, FEATURES))
    y = gc.placeholder("y", (batch,), dtype="int32")
    w1 = r.uniform(0.2, 1.0, (FEATURES, 5)) if positive else r.normal(0, 0.5, (FEATURES, 5))
    W1 = gc.variable("W1", init=w1.astype(np.float32))
    b1 = gc.variable("b1", init=np.zeros(5, np.float32))
    W2 = gc.variable("W2", init=r.normal(0, 0.5, (5, CLASSES)).astype(np.float32))
    logits = gc.relu(x @ W1 + b1) @ W2
    loss = gc.softmax_cross_entropy(logits, y)
    return gc.Program(loss, [W1, b1, W2], gc.SGD(lr=lr, momentum=momentum), outputs={"logits": logits},
                      name="small")


def write_split(folder: Path, split: str, images: np.ndarray, labels: np.ndarray) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / f"{split}_images.npy", images)
    np.save(folder / f"{split}_labels.npy", labels)


def synthetic_dataset(folder: Path, n_train=40, n_valid=12, seed=0, features=FEATURES, classes=CLASSES,
                      dtype=np.uint8) -> Path:
    """train and valid splits as `gcompile data` writes them: uint8 (or float32) images (N, features),
    uint8 labels."""
    r = np.random.RandomState(seed)
    for split, n in (("train", n_train), ("valid", n_valid)):
        images = r.randint(0, 256, (n, features))
        write_split(folder, split, images.astype(dtype), r.randint(0, classes, n).astype(np.uint8))
    return folder


def run_binary(artifact, *args, timeout=300, check=None) -> subprocess.CompletedProcess:
    """Run the artifact's binary; `check` = the exit status it must return (stderr shown if not)."""
    proc = subprocess.run([artifact.binary, *map(str, args)], capture_output=True, text=True, timeout=timeout)
    if check is not None:
        assert proc.returncode == check, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc
