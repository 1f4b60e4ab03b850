"""Neural-network ops with numerically stable definitions: softmax, log_softmax, one_hot and
softmax_cross_entropy on integer labels (the one-hot form is composed from log_softmax in graph.py)."""
from __future__ import annotations

import numpy as np

from .. import graph as G
from ..errors import GCompileError, ShapeError
from .base import Op, register, require_float


def _stable_log_softmax(x, axis):
    shifted = x - np.max(x, axis=axis, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))


@register
class Softmax(Op):
    name = "softmax"

    def infer(self, node):
        require_float(self.name, node.inputs[0])
        return node.inputs[0].shape, node.inputs[0].dtype

    def compute(self, node, x):
        e = np.exp(x - np.max(x, axis=node.attrs["axis"], keepdims=True))
        return e / np.sum(e, axis=node.attrs["axis"], keepdims=True)

    def grad(self, node, g):
        axis = node.attrs["axis"]
        inner = G.reduce_sum(g * node, axis, keepdims=True)
        return [node * (g - inner)]


@register
class LogSoftmax(Op):
    name = "log_softmax"

    def infer(self, node):
        require_float(self.name, node.inputs[0])
        return node.inputs[0].shape, node.inputs[0].dtype

    def compute(self, node, x):
        return _stable_log_softmax(x, node.attrs["axis"])

    def grad(self, node, g):
        axis = node.attrs["axis"]
        return [g - G.exp(node) * G.reduce_sum(g, axis, keepdims=True)]


@register
class OneHot(Op):
    """one_hot(labels, depth): rows of zeros with a 1 at each label (a label outside [0, depth) gives zeros)."""

    name, differentiable = "one_hot", False

    def infer(self, node):
        labels = node.inputs[0]
        if labels.dtype not in ("int32", "uint8"):
            raise ShapeError(f"one_hot: labels must be integers, got {labels.describe()}")
        return labels.shape + (node.attrs["depth"],), node.attrs["dtype"]

    def compute(self, node, labels):
        return (labels[..., None] == np.arange(node.attrs["depth"])).astype(node.attrs["dtype"])

    def grad(self, node, g):
        return [None]


@register
class SoftmaxCrossEntropy(Op):
    """mean_b( logsumexp(logits[b]) - logits[b, labels[b]] ) for logits (B, C), integer labels (B,)."""

    name = "softmax_cross_entropy"

    def infer(self, node):
        logits, labels = node.inputs
        require_float(self.name, logits)
        if logits.ndim != 2:
            raise ShapeError(f"softmax_cross_entropy: logits must be (batch, classes), got {logits.describe()}")
        if labels.dtype not in ("int32", "uint8"):
            raise ShapeError(f"softmax_cross_entropy: labels must be integer class indices or one-hot rows of "
                             f"the logits' dtype, got {labels.describe()}")
        if labels.shape != logits.shape[:1]:
            raise ShapeError(f"softmax_cross_entropy: labels {labels.describe()} do not match logits "
                             f"{logits.describe()}: expected labels of shape ({logits.shape[0]},)")
        return (), logits.dtype

    def compute(self, node, logits, labels):
        classes = logits.shape[1]
        bad = (labels < 0) | (labels >= classes)
        if np.any(bad):
            i = int(np.argmax(bad))
            raise GCompileError(f"softmax_cross_entropy {node.name}: label {int(labels[i])} at index {i} is "
                                f"outside [0, {classes})")
        logp = _stable_log_softmax(logits, 1)
        return -np.mean(logp[np.arange(len(labels)), labels])

    def grad(self, node, g):
        logits, labels = node.inputs
        batch, classes = logits.shape
        target = G.one_hot(labels, classes, logits.dtype)
        return [(G.softmax(logits, axis=1) - target) * (g * (1.0 / batch)), None]
