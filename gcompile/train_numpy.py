"""Train a gc.Program with the numpy reference executor: the oracle of the generated training loop.

The loop is the reference experiment's (docs/reference.md): batches taken in order from the start of the
training set, no shuffling, a final incomplete batch dropped (shapes are static); after training, the
argmax of the program's "logits" output over the whole validation set, computed in chunks of the
program's batch size with the trained parameter values.

A model file names its inputs "x" (images, float) and "y" (labels, int32); images are fed as
`uint8 * scale` in float32, with the scale from the dataset's manifest.

`example_main(program)` is the command line of examples/*.py:
    python examples/mnist_mlp.py --executor numpy --epochs 10 [--data DIR] [--set NAME=VALUE ...]
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .commands.model_file import at_least_one, call_program, parse_settings
from .data import default_data_dir, load_dataset, read_manifest
from .errors import GCompileError
from .executor import NumpyExecutor
from .program import Program


@dataclass
class TrainResult:
    losses: list       # the last batch's loss of each epoch
    accuracy: float    # on the validation set, after the last epoch


def program_inputs(program: Program):
    inputs = {p.name: p for p in program.inputs}
    if set(inputs) != {"x", "y"}:
        raise GCompileError(f"{program.name}: the training loop feeds placeholders 'x' (images) and 'y' "
                            f"(labels); the program has {sorted(inputs)}")
    return inputs["x"], inputs["y"]


def as_float(images: np.ndarray, scale: float, dtype) -> np.ndarray:
    return images.astype(dtype) * dtype.type(scale)


def evaluate(program: Program, trained: NumpyExecutor, images, labels, scale: float) -> float:
    """Accuracy of argmax(logits) over all of `images`, in chunks of the batch size (the last one padded)."""
    x, _ = program_inputs(program)
    if "logits" not in program.outputs:
        raise GCompileError(f"{program.name}: evaluation needs an output named 'logits'; the program has "
                            f"{sorted(program.outputs)}")
    forward = NumpyExecutor([program.outputs["logits"]])
    for name in forward.variables:
        forward.set_variable(name, trained.get_variable(name))
    batch, dtype = program.batch_size, np.dtype(x.dtype)
    correct = 0
    for start in range(0, len(labels), batch):
        chunk = images[start:start + batch]
        padded = np.zeros((batch,) + chunk.shape[1:], chunk.dtype)
        padded[:len(chunk)] = chunk
        (logits,) = forward.run({x: as_float(padded, scale, dtype)})
        correct += int(np.sum(np.argmax(logits[:len(chunk)], axis=1) == labels[start:start + batch]))
    return correct / len(labels)


def train(program: Program, dataset: dict, scale: float, epochs: int, log=print) -> TrainResult:
    """Train on dataset["train"] for `epochs` epochs, then evaluate on dataset["valid"]."""
    x, y = program_inputs(program)
    images, labels = dataset["train"]
    batch, dtype = program.batch_size, np.dtype(x.dtype)
    steps = len(labels) // batch
    if steps == 0:
        raise GCompileError(f"{len(labels)} training examples, fewer than one batch of {batch}")
    step = NumpyExecutor(program.train_outputs)
    if "total_steps" in step.variables:   # a learning-rate schedule spans the run, as in the compiled trainer
        step.set_variable("total_steps", np.int32(max(1, min(epochs * steps, 2**31 - 1))))
    losses = []
    for epoch in range(1, epochs + 1):
        start_time = time.perf_counter()
        for i in range(steps):
            rows = slice(i * batch, (i + 1) * batch)
            loss = step.run({x: as_float(images[rows], scale, dtype), y: labels[rows]})[0]
        seconds = time.perf_counter() - start_time
        losses.append(float(loss))
        log(f"epoch {epoch:3d}/{epochs}  last-batch loss {float(loss):.4f}  "
            f"{steps * batch / seconds:8.0f} examples/s  {seconds:.2f} s")
    accuracy = evaluate(program, step, *dataset["valid"], scale)
    log(f"validation accuracy {accuracy:.4f} ({round(accuracy * len(dataset['valid'][1]))}/"
        f"{len(dataset['valid'][1])})")
    return TrainResult(losses, accuracy)


def example_main(make_program, argv=None, dataset="mnist") -> int:
    """The command line of an example model file: train `make_program()` and report loss and accuracy."""
    parser = argparse.ArgumentParser(description=(make_program.__doc__ or "").strip().splitlines()[0])
    parser.add_argument("--executor", choices=["numpy"], default="numpy",
                        help="what runs the graph: numpy, the reference executor")
    parser.add_argument("--epochs", type=at_least_one("--epochs"), default=10)
    parser.add_argument("--data", metavar="DIR", default=None,
                        help=f"dataset folder written by `gcompile data {dataset}` "
                             f"(default {default_data_dir(dataset)})")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="passed to program(NAME=VALUE), as `gcompile build --set` does")
    args = parser.parse_args(argv)
    data_dir = args.data or default_data_dir(dataset)
    try:
        manifest = read_manifest(data_dir)
        program = call_program(Path(make_program.__code__.co_filename), make_program, None, parse_settings(args.set))
        train(program, load_dataset(data_dir), manifest["scale"], args.epochs)
    except GCompileError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0
