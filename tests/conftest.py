"""Shared fixtures: MNIST (fetched once into the user's cache), the reference table, the example and bench
loaders."""
import importlib.util
import os
import sys
from pathlib import Path

import pytest

from gcompile import DataError
from gcompile.data import prepare_mnist

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"

REFERENCE = {  # model: (last-batch loss of epochs 1..10, validation accuracy after 10 epochs)
    "mnist_logreg": ([0.5275, 0.4561, 0.4258, 0.4082, 0.3964, 0.3879, 0.3812, 0.3759, 0.3715, 0.3677], 0.9223),
    "mnist_mlp": ([0.5648, 0.3034, 0.2223, 0.2029, 0.1848, 0.1765, 0.1307, 0.1043, 0.0887, 0.0742], 0.9717),
}


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture(scope="session")
def mnist_dir():
    try:
        return prepare_mnist(log=lambda _: None)
    except DataError as e:
        if in_ci():
            pytest.fail(f"CI must be able to obtain MNIST: {e}")
        pytest.skip(f"MNIST could not be obtained (run `gcompile data mnist --from FILE`): {e}")


def load_example(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_bench():
    """The bench package from the checkout (it is not part of the installed wheel), without putting the
    checkout on sys.path, which would shadow the installed gcompile. Its modules then import as bench.X."""
    if "bench" not in sys.modules:
        spec = importlib.util.spec_from_file_location("bench", ROOT / "bench" / "__init__.py",
                                                      submodule_search_locations=[str(ROOT / "bench")])
        module = importlib.util.module_from_spec(spec)
        sys.modules["bench"] = module
        spec.loader.exec_module(module)
    return sys.modules["bench"]
