# Everyday commands. They use a virtual environment in .venv (made, with gcompile installed in editable
# mode, on first use), or any Python you name: `make test PYTHON=/path/to/python`.
VENV   ?= .venv
PYTHON ?= $(VENV)/bin/python
# Depend on the venv only when PYTHON lives in it.
NEEDS_VENV := $(filter $(VENV)/%,$(PYTHON))

.PHONY: install data demo test gpu-test clean

$(VENV)/bin/python:
	python3 -m venv $(VENV)
	$@ -m pip install --disable-pip-version-check -e '.[test]'

install: $(NEEDS_VENV)
	$(PYTHON) -m pip install --disable-pip-version-check -e '.[test]'

data: $(NEEDS_VENV)
	$(PYTHON) -m gcompile data mnist

# For now: the reference MLP (reference_mnist.md) with the numpy reference executor.
demo: data
	$(PYTHON) examples/mnist_mlp.py --executor numpy --epochs 10

test: $(NEEDS_VENV)
	$(PYTHON) -m pytest -q

# The tests marked gpu (they need an NVIDIA GPU). pytest exits 5 when it selects none, as it does until the
# cuda target has tests; that is not a failure.
gpu-test: $(NEEDS_VENV)
	$(PYTHON) -m pytest -q -m gpu || [ $$? -eq 5 ]

clean:
	rm -rf build dist *.egg-info .pytest_cache .hypothesis
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
