"""Optimizers as graph rewrites: `updates(params, grads)` returns `assign` nodes that write each parameter
(and its optimizer state) in place. Hyperparameters that a user may change between runs (the learning
rate) are scalar variables, so compiled programs can set them without recompiling."""
from __future__ import annotations

from . import graph as G
from .errors import GCompileError
from .init import Constant


class SGD:
    """p <- p - lr * v,  v <- momentum * v + (g + weight_decay * p)  (v = the gradient when momentum = 0)."""

    def __init__(self, lr: float = 0.01, momentum: float = 0.0, weight_decay: float = 0.0):
        if lr <= 0 or momentum < 0 or weight_decay < 0:
            raise GCompileError(f"SGD: lr must be > 0 and momentum, weight_decay >= 0 (got lr={lr}, "
                                f"momentum={momentum}, weight_decay={weight_decay})")
        self.lr, self.momentum, self.weight_decay = float(lr), float(momentum), float(weight_decay)

    def updates(self, params, grads, dtype="float32"):
        lr = G.variable("lr", (), init=Constant(self.lr), dtype=dtype, trainable=False)
        out = []
        for p, g in zip(params, grads):
            step = g + self.weight_decay * p if self.weight_decay else g
            if self.momentum:
                v = G.variable(f"{p.name}.velocity", p.shape, init=Constant(0.0), dtype=p.dtype, trainable=False)
                step = self.momentum * v + step
                out.append(G.assign(v, step))
            out.append(G.assign(p, p - lr * step))
        return out
