"""Initializers: seeded, reproducible callables `init(shape, dtype) -> ndarray`.

Each initializer owns its seed (a fresh `numpy.random.RandomState(seed)` per call), so the same model file
always gives the same initial values, whichever executor or target runs it. Give different variables
different seeds. For a sequence of draws from one generator (as the reference MNIST experiment does), draw
the arrays yourself and pass them to `gc.variable(init=array)`.
"""
from __future__ import annotations

import numpy as np


def fans(shape) -> tuple[int, int]:
    """(fan_in, fan_out): dense weights are (in, out); conv weights (out, in, kh, kw)."""
    if len(shape) == 2:
        return shape[0], shape[1]
    if len(shape) >= 3:
        receptive = int(np.prod(shape[2:]))
        return shape[1] * receptive, shape[0] * receptive
    n = shape[0] if shape else 1
    return n, n


class Initializer:
    def __call__(self, shape, dtype="float32") -> np.ndarray:
        from .graph import converted   # (a value the dtype cannot hold is refused: 3e9 or 0.5 for int32)
        return converted(self.draw(tuple(shape)), dtype, f"initializer {self.describe()}").reshape(shape)

    def describe(self) -> str:
        args = ",".join(f"{k}={v}" for k, v in vars(self).items())
        return f"{type(self).__name__.lower()}({args})"


class Constant(Initializer):
    def __init__(self, value):
        self.value = np.asarray(value)

    def draw(self, shape):
        return np.broadcast_to(self.value, shape).copy()

    def describe(self) -> str:
        if self.value.ndim == 0:
            return f"constant({self.value.item()!r})"
        return f"array{self.value.shape}"


class Normal(Initializer):
    def __init__(self, std=1.0, seed=0, mean=0.0):
        self.mean, self.std, self.seed = float(mean), float(std), int(seed)

    def draw(self, shape):
        return np.random.RandomState(self.seed).normal(self.mean, self.std, size=shape)


class Uniform(Initializer):
    def __init__(self, low=-1.0, high=1.0, seed=0):
        self.low, self.high, self.seed = float(low), float(high), int(seed)

    def draw(self, shape):
        return np.random.RandomState(self.seed).uniform(self.low, self.high, size=shape)


class HeNormal(Initializer):
    """N(0, 2 / fan_in): keeps activations' variance through ReLU layers (He et al. 2015)."""

    def __init__(self, seed=0):
        self.seed = int(seed)

    def draw(self, shape):
        std = np.sqrt(2.0 / fans(shape)[0])
        return np.random.RandomState(self.seed).normal(0.0, std, size=shape)


class HeUniform(Initializer):
    """U(±sqrt(6 / fan_in)): the uniform form of He initialization (variance 2 / fan_in)."""

    def __init__(self, seed=0):
        self.seed = int(seed)

    def draw(self, shape):
        limit = np.sqrt(6.0 / fans(shape)[0])
        return np.random.RandomState(self.seed).uniform(-limit, limit, size=shape)


class XavierNormal(Initializer):
    """N(0, 2 / (fan_in + fan_out)) (Glorot & Bengio 2010)."""

    def __init__(self, seed=0):
        self.seed = int(seed)

    def draw(self, shape):
        fan_in, fan_out = fans(shape)
        return np.random.RandomState(self.seed).normal(0.0, np.sqrt(2.0 / (fan_in + fan_out)), size=shape)


class XavierUniform(Initializer):
    """U(±sqrt(6 / (fan_in + fan_out))) (Glorot & Bengio 2010)."""

    def __init__(self, seed=0):
        self.seed = int(seed)

    def draw(self, shape):
        fan_in, fan_out = fans(shape)
        limit = np.sqrt(6.0 / (fan_in + fan_out))
        return np.random.RandomState(self.seed).uniform(-limit, limit, size=shape)


def zeros(): return Constant(0.0)
def ones(): return Constant(1.0)
def normal(std=1.0, seed=0, mean=0.0): return Normal(std, seed, mean)
def uniform(low=-1.0, high=1.0, seed=0): return Uniform(low, high, seed)
def he_normal(seed=0): return HeNormal(seed)
def he_uniform(seed=0): return HeUniform(seed)
def xavier_uniform(seed=0): return XavierUniform(seed)
def xavier_normal(seed=0): return XavierNormal(seed)
