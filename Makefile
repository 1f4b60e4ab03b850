# Everyday commands. They use a virtual environment in .venv (made, with gcompile installed in editable
# mode, on first use), or any Python you name: `make test PYTHON=/path/to/python`.
VENV   ?= .venv
PYTHON ?= $(VENV)/bin/python
# Depend on the venv only when PYTHON lives in it.
NEEDS_VENV := $(filter $(VENV)/%,$(PYTHON))

.PHONY: install data demo reference test gpu-test convnets clean
MNIST = $$($(PYTHON) -c 'from gcompile.data import default_data_dir; print(default_data_dir("mnist"))')

$(VENV)/bin/python:
	python3 -m venv $(VENV)
	$@ -m pip install --disable-pip-version-check -e '.[test]'

install: $(NEEDS_VENV)
	$(PYTHON) -m pip install --disable-pip-version-check -e '.[test]'

data: $(NEEDS_VENV)
	$(PYTHON) -m gcompile data mnist

# Compile the MNIST MLP (cuda when a GPU is present, else the cpu target) and train it with the demo's
# settings: batch 128, shuffled, lr 0.1, 10 epochs.
demo: data
	$(PYTHON) -m gcompile run examples/mnist_mlp.py --batch-size 128 -o build/demo -- \
		train --data $(MNIST) --epochs 10 --lr 0.1

# The reference experiment of reference_mnist.md, compiled: batch 1000, in order, lr 1.0 (0.9717 expected).
reference: data
	$(PYTHON) -m gcompile run examples/mnist_mlp.py -o build/reference -- \
		train --data $(MNIST) --epochs 10 --no-shuffle

test: $(NEEDS_VENV)
	$(PYTHON) -m pytest -q

# The tests marked gpu: the cuda target against numpy, the reference experiment and the allocation count.
gpu-test: $(NEEDS_VENV)
	$(PYTHON) -m pytest -q -m gpu

# LeNet on MNIST (validation >= 0.990) and ResNet-14 on Fashion-MNIST (test >= 0.920) with the compiled trainer,
# reporting epochs and wall time (examples/train_convnets.py). Offline: make convnets MNIST_FROM=mnist.pkl.gz
# FASHION_FROM=<folder of the IDX .gz files>.
convnets: $(NEEDS_VENV)
	$(PYTHON) examples/train_convnets.py $(if $(MNIST_FROM),--mnist-from $(MNIST_FROM)) \
		$(if $(FASHION_FROM),--fashion-from $(FASHION_FROM))

clean:
	rm -rf build dist *.egg-info .pytest_cache .hypothesis
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
