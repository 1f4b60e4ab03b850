"""Layer helpers for model files: each call creates its layer's variables — named `<layer>.<role>`, with a
seeded initializer of their own (He for weights feeding ReLUs) — and returns the layer's output;
`params` lists the trainable variables in creation order, ready for gc.Program. `dtype` is the variables'
(float32 unless given: `Layers(dtype="float64")` for a float64 model).

    L = gc.layers.Layers(seed=0)
    h = gc.relu(L.batch_norm("bn1", L.conv2d("conv1", x, 16, 3, padding=1, bias=False)))
    logits = L.dense("fc", gc.global_avg_pool(h), 10)
    program = gc.Program(loss, L.params, ...)
"""
from __future__ import annotations

from . import graph as G
from . import init


class Layers:
    def __init__(self, seed: int = 0, dtype: str = "float32"):
        self.params: list = []
        self.seed = int(seed)  # the next variable's seed: every variable draws its own stream
        self.dtype = G.canonical_dtype(dtype)
        if self.dtype not in G.FLOAT_DTYPES:
            raise G.ShapeError(f"Layers: dtype {self.dtype} — a layer's parameters are float32 or float64")

    def variable(self, name: str, shape, initializer, trainable: bool = True):
        v = G.variable(name, shape, init=initializer, dtype=self.dtype, trainable=trainable)
        if trainable:
            self.params.append(v)
        return v

    def next_seed(self) -> int:
        self.seed += 1
        return self.seed

    def conv2d(self, name: str, x, channels: int, kernel: int, stride: int = 1, padding: int = 0,
               bias: bool = True, weight_init=None):
        w = self.variable(f"{name}.w", (channels, x.shape[1], kernel, kernel),
                          weight_init or init.he_normal(self.next_seed()))
        b = self.variable(f"{name}.b", (channels,), init.zeros()) if bias else None
        return G.conv2d(x, w, b, stride, padding)

    def dense(self, name: str, x, units: int, bias: bool = True, weight_init=None):
        w = self.variable(f"{name}.w", (x.shape[1], units), weight_init or init.he_normal(self.next_seed()))
        out = x @ w
        return out + self.variable(f"{name}.b", (units,), init.zeros()) if bias else out

    def batch_norm(self, name: str, x, momentum: float = 0.1, eps: float = 1e-5):
        c = x.shape[1]
        gamma = self.variable(f"{name}.gamma", (c,), init.ones())
        beta = self.variable(f"{name}.beta", (c,), init.zeros())
        mean = self.variable(f"{name}.running_mean", (c,), init.zeros(), trainable=False)
        var = self.variable(f"{name}.running_var", (c,), init.ones(), trainable=False)
        return G.batch_norm(x, gamma, beta, mean, var, momentum, eps)
