"""Counter-based random numbers: Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
SC 2011), the generator behind dropout. A random word is a pure function of (counter, key), so every
element of every step draws its own number in any order, on any target, and numpy reproduces the device's
stream exactly (runtime/gc_kernels_conv.h has the same function in C).

dropout_mask(step): element i of step `step` keeps its value (mask = 1 / (1 - rate)) when the first word of
philox(counter = (i mod 2^32, i >> 32, step, 0), key = (seed mod 2^32, seed >> 32)), shifted right by 8,
is at least round(rate * 2^24); otherwise the mask is 0. A fresh mask each step, the same on every run.
"""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from .base import Op, register

PHILOX_M = (0xD2511F53, 0xCD9E8D57)
PHILOX_W = (0x9E3779B9, 0xBB67AE85)
MASK32 = np.uint64(0xFFFFFFFF)


def philox4x32_10(counter, key):
    """Philox4x32-10 of counters (4 arrays of uint32 values) and key (2 ints): the 4 output words."""
    c = [np.asarray(v, dtype=np.uint64) & MASK32 for v in counter]
    k0, k1 = np.uint64(key[0] & 0xFFFFFFFF), np.uint64(key[1] & 0xFFFFFFFF)
    for r in range(10):
        if r:
            k0, k1 = (k0 + np.uint64(PHILOX_W[0])) & MASK32, (k1 + np.uint64(PHILOX_W[1])) & MASK32
        p0, p1 = np.uint64(PHILOX_M[0]) * c[0], np.uint64(PHILOX_M[1]) * c[2]
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ k0, p1 & MASK32, (p0 >> np.uint64(32)) ^ c[3] ^ k1, p0 & MASK32]
    return [v.astype(np.uint32) for v in c]


def dropout_threshold(rate: float) -> int:
    return int(round(rate * (1 << 24)))


def dropout_mask(size: int, step: int, seed: int, rate: float, dtype) -> np.ndarray:
    i = np.arange(size, dtype=np.uint64)
    step_word = np.full(size, step & 0xFFFFFFFF, np.uint64)   # the int32 counter's bits (a wrapped one is negative)
    word = philox4x32_10((i & MASK32, i >> np.uint64(32), step_word, np.zeros(size, np.uint64)),
                         (seed & 0xFFFFFFFF, seed >> 32))[0]
    keep = (word >> np.uint32(8)) >= dropout_threshold(rate)
    dtype = np.dtype(dtype)
    return np.where(keep, dtype.type(1.0 / (1.0 - rate)), dtype.type(0))


@register
class DropoutMask(Op):
    """dropout_mask(step) {shape, rate, seed, dtype}: 0 or 1 / (1 - rate) per element (see the module)."""

    name, differentiable = "dropout_mask", False

    def infer(self, node):
        step = node.inputs[0]
        if step.shape != () or step.dtype != "int32":
            raise ShapeError(f"dropout_mask: the step counter must be an int32 scalar, got {step.describe()}")
        rate, seed = node.attrs["rate"], node.attrs["seed"]
        if not 0.0 < rate < 1.0 or not 0 <= seed < 2 ** 64:
            raise ShapeError(f"dropout: rate must be in (0, 1) and seed in [0, 2^64), got rate {rate}, seed {seed}")
        return node.attrs["shape"], node.attrs["dtype"]

    def compute(self, node, step):
        size = int(np.prod(node.attrs["shape"], dtype=np.int64))
        mask = dropout_mask(size, int(step), node.attrs["seed"], node.attrs["rate"], node.attrs["dtype"])
        return mask.reshape(node.attrs["shape"])

    def grad(self, node, g):
        return [None]
