"""gc.Program: what a model file hands the compiler — loss, parameters, optimizer, named outputs."""
from __future__ import annotations

from typing import Mapping, Sequence

from . import graph as G
from .autodiff import gradients
from .errors import GCompileError
from .executor import leaves_of
from .graph import Node
from .modes import specialize
from .optim import guarded


class Program:
    """A training program. `train_outputs` are the loss and the update nodes of one step;
    `eval_outputs` the named outputs (for `predict`/`forward`). The batch size is the leading dimension
    every input shares.

    With an optimizer, the step also increments the int32 variable `step` (G.step_counter(); it counts
    every step run, skipped ones too) and every update, batch norm's running statistics included, is guarded
    by the numerical guard (gcompile/optim.py). The train step and the outputs are specialized to train and
    eval mode (gcompile/modes.py): batch norm and dropout behave as in training in `train_outputs` (whose
    updates include batch norm's running statistics) and as in evaluation in `outputs`."""

    def __init__(self, loss: Node, params: Sequence[Node], optimizer=None,
                 outputs: Mapping[str, Node] | None = None, name: str = "model"):
        if loss.shape != () or loss.dtype not in G.FLOAT_DTYPES:
            raise GCompileError(f"Program: the loss must be a float scalar, got {loss.describe()}")
        for p in params:
            if p.op != "variable":
                raise GCompileError(f"Program: parameter {p.describe()} is a {p.op}, not a variable")
            if not p.attrs.get("trainable", True):   # (it was trained, and --load then left it out of the model)
                raise GCompileError(f"Program: parameter {p.describe()} was made with trainable=False; a "
                                    "parameter is what the optimizer trains")
        self.name = name
        self.params = list(params)
        self.optimizer = optimizer
        self.grads = gradients(loss, self.params)
        unused = [p.name for p, g in zip(self.params, self.grads) if g.op == "zeros_like"]
        if unused:
            raise GCompileError(f"Program: the loss does not depend on parameter(s) {unused}")
        other = [p for p in self.params if p.dtype != loss.dtype]
        if optimizer and other:   # its learning rate, schedule and moments are scalars of the loss's type
            raise GCompileError(f"Program: parameter {other[0].describe()} and the loss {loss.describe()} have "
                                f"different dtypes; the optimizer updates parameters of the loss's dtype (cast the "
                                f"loss: gc.cast(loss, {other[0].dtype!r}))")
        with G.phase("update"):
            updates = optimizer.updates(self.params, self.grads, loss.dtype) if optimizer else []
        train, state_updates = specialize([loss] + updates, "train")
        self.loss, self.updates = train[0], train[1:] + state_updates
        if optimizer:
            self.step = G.step_counter()
            with G.phase("update"):
                self.updates = guarded(self.updates, self.loss, self.step) + [G.assign(self.step, self.step + 1)]
        names = list(outputs or {})
        self.outputs = dict(zip(names, specialize([outputs[n] for n in names], "eval")[0]))
        order = G.topological_order(self.train_outputs + list(self.outputs.values()))
        self.inputs = leaves_of(order, "placeholder")
        batches = {p.shape[0] for p in self.inputs if p.shape}
        if len(batches) > 1:
            raise GCompileError("Program: inputs disagree on the batch size: "
                                + ", ".join(p.describe() for p in self.inputs))
        self.batch_size = batches.pop() if batches else 1

    @property
    def train_outputs(self) -> list[Node]:
        return [self.loss] + self.updates
