# Everyday commands. They use a virtual environment in .venv (made, with gcompile installed in editable
# mode, on first use), or any Python you name: `make test PYTHON=/path/to/python`.
VENV   ?= .venv
PYTHON ?= $(VENV)/bin/python
# Depend on the venv only when PYTHON lives in it.
NEEDS_VENV := $(filter $(VENV)/%,$(PYTHON))

.PHONY: install data demo reference test gpu-test convnets bench tune clean
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

# The reference experiment of docs/reference.md, compiled: batch 1000, in order, lr 1.0 (0.9717 expected).
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

# gcompile against PyTorch and JAX on the GPU machine: one table, bench/results/<gpu>-<commit>.json and a PNG
# (bench/README.md). It uses that machine's python3, which has torch, jax and matplotlib; cffi comes from
# the carried wheels, installed first with `pip install --target /tmp/site .whl/*.whl` and PYTHONPATH
# (kept: the checkout is put in front of it). MNIST is prepared from .device/mnist.pkl.gz when that file is
# there, Fashion-MNIST from the IDX files in .device/fashion-mnist/ when that folder is there. The results are
# named after COMMIT; without it, after git's HEAD, '-dirty' added where the tracked files differ from it. A
# copy of the tree (the GPU machine's) may carry a .git of another commit: name the commit there, e.g.
#   make bench COMMIT=$(git rev-parse --short=12 HEAD) BENCH_ARGS="--results-dir $OUT"
# BENCH_ARGS: --quick, --only mnist,conv,eltwise,gemm, --impls, --fashion DIR (python3 -m bench.run --help).
BENCH_PYTHON ?= python3
COMMIT ?=
BENCH_ENV = PYTHONPATH=$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} GCOMPILE_COMMIT=$(COMMIT)
bench:
	-$(BENCH_ENV) $(BENCH_PYTHON) -m gcompile data mnist $(if $(wildcard .device/mnist.pkl.gz),--from .device/mnist.pkl.gz)
	$(if $(wildcard .device/fashion-mnist),-$(BENCH_ENV) $(BENCH_PYTHON) -m gcompile data fashion-mnist --from .device/fashion-mnist)
	$(BENCH_ENV) PYTHONUNBUFFERED=1 $(BENCH_PYTHON) -m bench.run $(BENCH_ARGS)

# The tuning records make bench builds with (bench/tuned/<gpu>/, gcompile/tune.py), measured on the GPU machine:
#   make tune TUNE_ARGS="--out $OUT"   (writes $OUT/<gpu>/*.json: copy that folder into bench/tuned/;
#   --only mnist_mlp:128:fp32,...)
tune:
	-$(BENCH_ENV) $(BENCH_PYTHON) -m gcompile data mnist $(if $(wildcard .device/mnist.pkl.gz),--from .device/mnist.pkl.gz)
	$(BENCH_ENV) PYTHONUNBUFFERED=1 $(BENCH_PYTHON) -m bench.tune $(TUNE_ARGS)

clean:
	rm -rf build dist *.egg-info .pytest_cache .hypothesis
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
