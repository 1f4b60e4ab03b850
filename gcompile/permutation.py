"""The training order of an epoch: a keyed bijection of [0, n), a pure function of (seed, epoch).

The generated trainer evaluates this function on the device, inside the batch gather kernel
(runtime/gc_runtime.h, `gc_perm_make` / `gc_perm_apply`): position p of epoch e reads example
permute(seed, e, n, p). There is no index array and no host work per epoch, and a resumed run at
(epoch, step) sees exactly the order an uninterrupted one saw. This module is the same function in numpy,
for tests and for numpy reference runs; the C and numpy versions must agree bit for bit.

The function: a 4-round balanced Feistel network over [0, 4^h), with 4^h the smallest power of four
>= n, made a bijection of [0, n) by cycle walking (apply the network again while the value is >= n; the
walk ends because the value's cycle through [0, 4^h) contains the start, which is < n; since 4^h < 4n it
takes fewer than 4 rounds on average). Each round maps (L, R) to (R, L ^ (hash32(R ^ key_r) & mask)),
with hash32 the `lowbias32` integer hash and mask = 2^h - 1. The four 32-bit round keys come from
splitmix64: s = mix64(seed + G), key_r = low 32 bits of mix64(s + G * (4 * epoch + r + 1)), G the 64-bit
golden ratio. Epochs are numbered from 0 (the first epoch of a run started from initial parameters).
n is at most 2^32 - 1, so every value fits 32 bits (h <= 16).
"""
from __future__ import annotations

import numpy as np

GOLDEN = 0x9E3779B97F4A7C15
MASK64 = (1 << 64) - 1
ROUNDS = 4


def mix64(z: int) -> int:
    """splitmix64's output function (Python ints, wrapped to 64 bits)."""
    z &= MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def epoch_keys(seed: int, epoch: int) -> np.ndarray:
    """The four round keys (uint32) of the permutation of `epoch` under `seed`."""
    s = mix64(seed + GOLDEN)
    return np.array([mix64(s + GOLDEN * (ROUNDS * epoch + r + 1)) & 0xFFFFFFFF for r in range(ROUNDS)],
                    dtype=np.uint32)


def half_bits(n: int) -> int:
    """h >= 1 with 4^h the smallest power of four >= n: the Feistel halves have h bits each."""
    if not 1 <= n <= 0xFFFFFFFF:
        raise ValueError(f"permutation size {n} is outside [1, 2^32 - 1]")
    h = 1
    while 4 ** h < n:
        h += 1
    return h


def hash32(x: np.ndarray) -> np.ndarray:
    """lowbias32 on uint32 arrays (numpy wraps uint32 products modulo 2^32, as C does)."""
    x = x ^ (x >> np.uint32(16))
    x = x * np.uint32(0x7FEB352D)
    x = x ^ (x >> np.uint32(15))
    x = x * np.uint32(0x846CA68B)
    return x ^ (x >> np.uint32(16))


def feistel(x: np.ndarray, keys: np.ndarray, h: int) -> np.ndarray:
    mask = np.uint32((1 << h) - 1)
    left, right = x >> np.uint32(h), x & mask
    for key in keys:
        left, right = right, left ^ (hash32(right ^ key) & mask)
    return (left << np.uint32(h)) | right


def permute(seed: int, epoch: int, n: int, positions) -> np.ndarray:
    """The examples (int64) read at `positions` (each in [0, n)) in epoch `epoch` under `seed`."""
    h = half_bits(n)
    pos = np.asarray(positions, dtype=np.int64)
    if pos.size and (pos.min() < 0 or pos.max() >= n):
        raise ValueError(f"positions must lie in [0, {n})")
    keys = epoch_keys(seed, epoch)
    x = feistel(pos.astype(np.uint32), keys, h)
    outside = x >= n
    while outside.any():                      # cycle walking back into [0, n)
        x[outside] = feistel(x[outside], keys, h)
        outside = x >= n
    return x.astype(np.int64)


def epoch_order(seed: int, epoch: int, n: int) -> np.ndarray:
    """The whole order of an epoch: example epoch_order(...)[p] is read at position p."""
    return permute(seed, epoch, n, np.arange(n))
