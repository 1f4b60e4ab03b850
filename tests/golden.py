"""What the golden tests share: compiled programs (cpu in CI, cuda on the GPU machine) against the numpy
executor — one graph of many op cases with their gradients, and a few training steps of a program."""
from __future__ import annotations

import numpy as np
import pytest

import gcompile as gc

RTOL, ATOL = 1e-4, 1e-5
TARGETS = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def graph_of_cases(cases, no_gradient=()):
    """One graph holding every case `(name, build, inputs)` and, for a float output, the gradient of
    sum(out * w) (w fixed, random) w.r.t. the case's float inputs — unless the case is named in `no_gradient`.
    Returns the outputs and the feeds (float inputs as float32, integer ones as int32)."""
    outputs, feeds = [], {}
    for name, build, inputs in cases:
        places = []
        for i, value in enumerate(inputs):
            dtype = "int32" if value.dtype.kind in "iu" else "float32"
            p = gc.placeholder(f"{name}_in{i}", value.shape, dtype=dtype)
            places.append(p)
            feeds[p] = value.astype(dtype)
        out = build(*places)
        outputs.append(out)
        floats = [p for p in places if p.dtype == "float32"]
        if out.dtype == "float32" and floats and name not in no_gradient:
            weights = gc.constant(np.random.RandomState(1).uniform(-1, 1, out.shape), dtype="float32")
            outputs += gc.gradients(gc.reduce_sum(out * weights), floats)
    return outputs, feeds


def assert_compiled_matches_numpy(outputs, feeds, target):
    expected = gc.NumpyExecutor(outputs).run(feeds)
    got = gc.Executor(outputs, target=target).run(feeds)
    assert len(got) == len(outputs)
    for node, e, g in zip(outputs, expected, got):
        np.testing.assert_allclose(g, e, rtol=RTOL, atol=ATOL, err_msg=node.describe())


def assert_training_matches_numpy(program, model, reference, batches):
    """Train `model` (compiled from `program`) and `reference` (its NumpyExecutor) on the same batches (x, y):
    every step's loss, then every parameter, then the evaluation logits of the last x agree."""
    for step, (x, y) in enumerate(batches):
        got = model.train_step(x, y)
        want = reference.run({"x": x, "y": y})[0]
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=f"loss at step {step}")
    for name, value in model.params.items():
        np.testing.assert_allclose(value, reference.variables[name], rtol=RTOL, atol=ATOL, err_msg=name)
    evaluate = gc.NumpyExecutor([program.outputs["logits"]], mode="eval")
    for name in evaluate.variables:
        evaluate.set_variable(name, reference.variables[name])
    np.testing.assert_allclose(model.predict(x), evaluate.run({"x": x})[0], rtol=RTOL, atol=ATOL)
