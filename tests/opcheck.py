"""The one helper that checks an op: forward against numpy, gradient against central differences.

`check_op(build, inputs, reference)`:
  1. makes a placeholder per input (float arrays become float32 placeholders, integer arrays keep their
     dtype), calls `build(*placeholders)` and runs the result with `gc.NumpyExecutor` in float32; the output
     must have the node's static shape and dtype and match `reference(*inputs)`, an independent numpy
     expression written by the test (evaluated on the float64 inputs);
  2. for a float output, differentiates `sum(out * w)` (w random, fed as a placeholder) w.r.t. every float
     input with `gc.gradients` and compares with central finite differences, all in float64
     (`NumpyExecutor(..., dtype="float64")`).

Inputs must keep away from kinks (relu at 0, ties of max/min, log/sqrt near 0): the test chooses them.
"""
from __future__ import annotations

import numpy as np

import gcompile as gc

FD_STEP = 1e-6
GRAD_RTOL = 1e-6
GRAD_FLOOR = 1e-3  # below this gradient norm the check is absolute (|error| < GRAD_RTOL * GRAD_FLOOR)


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def uniform(shape, low=-1.0, high=1.0, seed=0) -> np.ndarray:
    return rng(seed).uniform(low, high, size=shape)


def away_from_zero(shape, low=0.2, high=2.0, seed=0) -> np.ndarray:
    """Values with low <= |x| <= high and random signs (relu, division, negative powers)."""
    r = rng(seed)
    return r.uniform(low, high, size=shape) * r.choice([-1.0, 1.0], size=shape)


def distinct(shape, seed=0, gap=0.1) -> np.ndarray:
    """Values whose pairwise differences are all at least about `gap` (no ties for max/min)."""
    r = rng(seed)
    n = int(np.prod(shape, dtype=np.int64))
    return (r.permutation(n) * gap + r.uniform(0, gap / 10, size=n) - n * gap / 2).reshape(shape)


def placeholder_for(i: int, value: np.ndarray) -> gc.Node:
    dtype = "float32" if value.dtype.kind == "f" else value.dtype.name
    return gc.placeholder(f"in{i}", value.shape, dtype=dtype)


def check_op(build, inputs, reference, *, rtol=1e-5, atol=1e-6, check_grad=True, seed=0):
    """Check `build` (placeholders -> node) against `reference` (arrays -> array); return the output node."""
    inputs = [np.asarray(v) for v in inputs]
    places = [placeholder_for(i, v) for i, v in enumerate(inputs)]
    out = build(*places)
    expected = np.asarray(reference(*inputs))

    assert out.shape == expected.shape, f"static shape {out.shape} != reference shape {expected.shape}"
    (got,) = gc.NumpyExecutor([out]).run(dict(zip(places, inputs)))
    assert got.shape == out.shape and got.dtype == np.dtype(out.dtype), (got.shape, got.dtype, out.describe())
    if out.dtype in ("float32", "float64"):
        np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol)
    else:
        np.testing.assert_array_equal(got, expected)

    if check_grad and out.dtype in ("float32", "float64"):
        check_gradients(out, places, inputs, seed)
    return out


def check_gradients(out: gc.Node, places, inputs, seed=0) -> None:
    weights = gc.placeholder("weights", out.shape, dtype=out.dtype)
    loss = gc.reduce_sum(out * weights)
    wrt = [(p, v) for p, v in zip(places, inputs) if p.dtype in ("float32", "float64")]
    grads = gc.gradients(loss, [p for p, _ in wrt])
    feed = dict(zip(places, inputs))
    feed[weights] = rng(seed + 1).normal(size=out.shape)

    analytic = run64(grads, feed)
    loss_at = gc.NumpyExecutor([loss], dtype="float64")
    for (place, value), grad in zip(wrt, analytic):
        assert grad.shape == place.shape, f"gradient of {place.name}: shape {grad.shape} != {place.shape}"
        numeric = np.zeros(value.shape)
        x = value.astype(np.float64)  # a copy: perturbed in place below
        for idx in np.ndindex(*value.shape):
            saved = x[idx]
            x[idx] = saved + FD_STEP
            plus = loss_at.run(fed(loss_at, {**feed, place: x}))[0]
            x[idx] = saved - FD_STEP
            minus = loss_at.run(fed(loss_at, {**feed, place: x}))[0]
            x[idx] = saved
            numeric[idx] = (plus - minus) / (2 * FD_STEP)
        scale = max(np.linalg.norm(grad), np.linalg.norm(numeric), GRAD_FLOOR)
        error = np.linalg.norm(grad - numeric) / scale
        assert error < GRAD_RTOL, (f"gradient w.r.t. {place.name} {place.shape}: relative error {error:.2e}\n"
                                   f"analytic:\n{grad}\nnumeric:\n{numeric}")


def fed(executor: gc.NumpyExecutor, feed: dict) -> dict:
    """The part of `feed` that the executor's graph reads (it rejects feeds for placeholders it lacks)."""
    return {p: feed[p] for p in executor.placeholders}


def run64(outputs, feed: dict) -> list:
    executor = gc.NumpyExecutor(outputs, dtype="float64")
    return executor.run(fed(executor, feed))
