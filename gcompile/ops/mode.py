"""mode_select(train_value, eval_value): one value with a train-time and an eval-time behaviour (batch norm's
batch vs running statistics, dropout vs identity). Graphs are specialized before they run
(gcompile/modes.py::specialize): the train graph keeps train_value and gains the node's `train_updates`
(assign nodes, e.g. running statistics), the eval graph keeps eval_value. Nothing ever computes a
mode_select node itself."""
from __future__ import annotations

from ..errors import GCompileError, ShapeError
from .base import Op, register


@register
class ModeSelect(Op):
    name = "mode_select"

    def infer(self, node):
        train, evaluated = node.inputs
        if train.shape != evaluated.shape or train.dtype != evaluated.dtype:
            raise ShapeError(f"mode_select: the train value {train.describe()} and the eval value "
                             f"{evaluated.describe()} must have one shape and dtype")
        for a in node.attrs["train_updates"]:
            if a.op != "assign":
                raise ShapeError(f"mode_select: train_updates must be assign nodes, got {a.describe()}")
        return train.shape, train.dtype

    def compute(self, node, train, evaluated):
        raise GCompileError(f"mode_select {node.name}: specialize the graph to train or eval mode first "
                            f"(gcompile.modes.specialize; NumpyExecutor and Program do it)")

    def grad(self, node, g):
        return [g, None]  # gradients are taken of the training computation
