"""What is benchmarked: the example programs, their data, their initial values and the training recipe.

Every implementation starts from the gcompile program's own initial values (the peers copy them), trains
on the same data resident on the device as float32 (uint8 * 1/256), with the same recipe for time to
accuracy (RECIPES, plain SGD: the examples' optimizer): at batch 128 lr 0.1, shuffled every epoch; at batch
1000 the reference experiment's (docs/reference.md: lr 1.0, the file's order).
"""
from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import gcompile as gc
from gcompile.data import load_dataset, read_manifest
from gcompile.graph import topological_order

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
LR = 0.1   # the programs' learning rate: the tuning records' programs (bench/tuned/) are built with it
TARGETS = {"mnist_logreg": 0.92, "mnist_mlp": 0.97}   # validation accuracy for time to accuracy
RECIPE_BATCH = 128   # the convolutional nets' batch


@dataclass(frozen=True)
class Recipe:
    """How every implementation trains for time to accuracy at one batch size. The learning rate is a run-time
    setting (the binary's --lr, the peers' optimizers): the programs keep LR, so their tuning records hold."""
    lr: float
    shuffle: bool   # a new permutation every epoch, else the dataset's file order
    label: str


RECIPES = {128: Recipe(0.1, True, "batch 128, lr 0.1, shuffled every epoch"),
           1000: Recipe(1.0, False, "the reference experiment: batch 1000, lr 1.0, file order")}


def load_example(name: str):
    """examples/<name>.py as a module, or None when the file is not there (yet)."""
    path = EXAMPLES / f"{name}.py"
    if not path.is_file():
        return None
    spec = importlib.util.spec_from_file_location(f"bench_example_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_program(example, batch: int, lr: float | None = None) -> gc.Program:
    """The example's program at this batch size (and learning rate, when given): its defaults otherwise."""
    return example.program(batch_size=batch) if lr is None else example.program(batch_size=batch, lr=lr)


def initial_values(program: gc.Program) -> dict:
    """{name: ndarray} of the trainable parameters, as the compiled program starts from them."""
    return {p.name: np.asarray(p.attrs["init"](p.shape, p.dtype)) for p in program.params}


def placeholders(program: gc.Program):
    inputs = {p.name: p for p in program.inputs}
    return inputs["x"], inputs["y"]


def ops_of(program: gc.Program) -> set:
    return {n.op for n in topological_order(program.train_outputs + list(program.outputs.values()))}


@dataclass
class Dataset:
    """A dataset as float32 images (N, 784) and int32 labels, host side; the peers put it on the device."""
    name: str
    image_shape: tuple
    train_x: np.ndarray
    train_y: np.ndarray
    valid_x: np.ndarray
    valid_y: np.ndarray
    path: str

    @staticmethod
    def load(path) -> "Dataset":
        manifest = read_manifest(path)
        splits = load_dataset(path)
        scale = np.float32(manifest["scale"])
        x = {s: splits[s][0].reshape(len(splits[s][0]), -1).astype(np.float32) * scale for s in ("train", "valid")}
        y = {s: splits[s][1].astype(np.int32) for s in ("train", "valid")}
        return Dataset(manifest["name"], tuple(manifest["image_shape"]), x["train"], y["train"], x["valid"],
                       y["valid"], str(path))


@dataclass
class Task:
    """One model at one batch size: its gcompile program and what the peers need to mirror it."""
    model: str                    # example name: mnist_logreg, mnist_mlp, mnist_lenet, resnet14
    batch: int
    program: gc.Program
    data: Dataset
    section: str = "mnist"
    target: float | None = None   # validation accuracy for time to accuracy (None: not measured)
    recipe: Recipe | None = None   # how time to accuracy trains (None: not measured)

    @property
    def lr(self) -> float:
        """The learning rate every implementation trains with: the recipe's, else the program's optimizer's."""
        return self.recipe.lr if self.recipe is not None else float(getattr(self.program.optimizer, "lr", LR))

    @functools.cached_property
    def init(self) -> dict:
        return initial_values(self.program)

    @property
    def input_shape(self) -> tuple:
        return tuple(placeholders(self.program)[0].shape[1:])

    def batch0(self):
        """The first `batch` training examples, in order, shaped for the program: the correctness probe."""
        x = self.data.train_x[:self.batch].reshape((self.batch,) + self.input_shape)
        return np.ascontiguousarray(x), self.data.train_y[:self.batch].copy()

    @functools.cached_property
    def reference_loss(self) -> float | None:
        """The loss of the first step on batch0, from the numpy reference executor (dense models only:
        the numpy convolution is too slow to sit in the benchmark)."""
        if self.section != "mnist":
            return None
        x, y = placeholders(self.program)
        xb, yb = self.batch0()
        return float(gc.NumpyExecutor([self.program.loss]).run({x: xb, y: yb})[0])


def check_loss(loss: float, reference: float | None, precision: str) -> str | None:
    """A note when the first-step loss disagrees with the numpy reference (None when it agrees)."""
    if not np.isfinite(loss):
        return f"first-step loss is {loss}"
    if reference is None:
        return None
    tolerance = 2e-2 if precision == "tf32" else 1e-3
    if abs(loss - reference) > tolerance * max(1.0, abs(reference)):
        return f"CHECK FAILED: first-step loss {loss:.6f}, numpy reference {reference:.6f}"
    return None
