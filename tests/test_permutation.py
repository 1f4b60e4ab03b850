"""The training order (gcompile/permutation.py and its C twin in runtime/gc_runtime.h): a bijection of
[0, n) for every n, a pure function of (seed, epoch), and the same numbers in C and numpy."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from gcompile.permutation import epoch_order, half_bits, permute
from gcompile.resources import package_dir

SIZES = [*range(1, 70), 127, 128, 129, 255, 256, 257, 1000, 4095, 4096, 4097, 50000, 60000, 65535, 65536,
         65537, (1 << 20) + 3]


@pytest.mark.parametrize("seed,epoch", [(0, 0), (1, 0), (0, 1), (2**53, 12345)])
def test_every_order_is_a_bijection(seed, epoch):
    for n in SIZES:
        order = epoch_order(seed, epoch, n)
        assert order.dtype == np.int64 and order.shape == (n,)
        np.testing.assert_array_equal(np.sort(order), np.arange(n), err_msg=f"n={n}")


def test_order_is_a_pure_function_of_seed_and_epoch():
    n = 50000
    first = epoch_order(3, 5, n)
    np.testing.assert_array_equal(epoch_order(3, 5, n), first)
    np.testing.assert_array_equal(permute(3, 5, n, [7, 0, 49999]), first[[7, 0, 49999]])
    for other in (epoch_order(3, 6, n), epoch_order(4, 5, n)):
        assert np.mean(other == first) < 0.01   # a different order, not a shifted copy
    assert np.mean(first == np.arange(n)) < 0.01


def test_orders_are_close_to_uniform():
    """Over many epochs, every example comes first about equally often (a loose check of mixing)."""
    n, epochs = 10, 5000
    counts = np.bincount([epoch_order(11, e, n)[0] for e in range(epochs)], minlength=n)
    assert counts.min() > 0.7 * epochs / n and counts.max() < 1.3 * epochs / n, counts


def test_domain_and_argument_checks():
    assert [half_bits(n) for n in (1, 4, 5, 16, 17, 2**32 - 1)] == [1, 1, 2, 2, 3, 16]
    with pytest.raises(ValueError, match="outside"):
        half_bits(0)
    with pytest.raises(ValueError, match="outside"):
        half_bits(2**32)
    with pytest.raises(ValueError, match=r"\[0, 10\)"):
        permute(0, 0, 10, [10])


@pytest.fixture(scope="module")
def c_order(tmp_path_factory):
    """The runtime's gc_perm_make/gc_perm_apply compiled for the host (the cpu target's code)."""
    compiler = shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        pytest.skip("no C++ compiler")
    exe = tmp_path_factory.mktemp("perm") / "perm_order"
    source = Path(__file__).parent / "native" / "perm_order.cpp"
    subprocess.run([compiler, "-O2", "-std=c++17", f"-I{package_dir('runtime')}", str(source), "-o", str(exe)],
                   check=True)

    def run(seed, epoch, n):
        out = subprocess.run([str(exe), str(seed), str(epoch), str(n)], capture_output=True, check=True).stdout
        return np.frombuffer(out, dtype="<u4").astype(np.int64)
    return run


@pytest.mark.parametrize("n", [1, 2, 3, 17, 1000, 50000, 65537])
@pytest.mark.parametrize("seed,epoch", [(0, 0), (7, 3), (2**53, 999)])
def test_c_runtime_matches_numpy(c_order, seed, epoch, n):
    np.testing.assert_array_equal(c_order(seed, epoch, n), epoch_order(seed, epoch, n))
