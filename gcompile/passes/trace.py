"""trace: gather what a compiled program is made of — its train graph (loss and update nodes), its eval
graph (named outputs), inputs, variables — into a Module. Autodiff and the optimizer's update nodes were
appended when the Program was built (gc.Program calls gradients and the optimizer); this pass only
collects and checks. A plain list of nodes (gc.Executor) becomes a module with an eval graph only, in
train mode (gcompile/modes.py), as NumpyExecutor computes it by default.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..checkpoint import layout_hash
from ..errors import GCompileError
from ..executor import leaves_of
from ..graph import FLOAT_DTYPES, Node, topological_order
from ..modes import specialize
from ..program import Program


@dataclass
class Module:
    name: str
    source: str                              # the model file (or "<python>")
    train: list[Node]                        # loss + assign nodes ([] without training)
    outputs: dict[str, Node]                 # the eval graph's named outputs
    loss: Node | None
    batch_size: int
    variables: list[Node] = field(default_factory=list)
    train_inputs: list[Node] = field(default_factory=list)
    eval_inputs: list[Node] = field(default_factory=list)
    kernels: dict[str, int] = field(default_factory=dict)   # kernel launches per step of each graph (lower)
    precision: str = "fp32"                  # the GEMMs' arithmetic: "fp32" or "tf32" (gemm_tiles.py)
    labels: dict[str, int] = field(default_factory=dict)   # label inputs: placeholder name -> classes

    @property
    def graphs(self) -> dict[str, list[Node]]:
        graphs = {}
        if self.train:
            graphs["train"] = self.train
        if self.outputs:
            graphs["eval"] = list(self.outputs.values())
        return graphs

    def refresh(self):
        """Recompute the leaf lists after a pass replaced nodes."""
        self.train_inputs = leaves_of(topological_order(self.train), "placeholder")
        self.eval_inputs = leaves_of(topological_order(self.outputs.values()), "placeholder")
        everything = topological_order(self.train + list(self.outputs.values()))
        self.variables = sorted(leaves_of(everything, "variable"), key=lambda v: v.name)
        leaves_of(everything, "placeholder")  # raises if two different placeholders share a name
        return self

    @property
    def eval_variables(self) -> set[str]:
        """The names of the variables the evaluation step reads: the model (parameters, batch-norm
        statistics), not the optimizer's state, the step counter or the guard."""
        return {v.name for v in leaves_of(topological_order(self.outputs.values()), "variable")}

    @property
    def layout_hash(self) -> int:
        return layout_hash(self.variables)

    @property
    def init_file(self) -> str:
        return f"{self.name}.init.ckpt"

    @property
    def trainer(self) -> dict | None:
        """What the standalone trainer needs, or None when the program does not fit it (no_trainer says why):
        a float32 loss, one float32 image input (batch, ...), one int32 label input (batch,), a 'logits'
        output (batch, C) of float32."""
        return None if self.no_trainer else self.trainer_nodes()

    def trainer_nodes(self) -> dict:
        x = next((p for p in self.train_inputs if p.dtype == "float32"), None)
        y = next((p for p in self.train_inputs if p.dtype == "int32" and p.shape == (self.batch_size,)), None)
        return {"x": x, "y": y, "logits": self.outputs.get("logits")}

    @property
    def no_trainer(self) -> str:
        """Why the standalone trainer cannot run this program ("" when it can): the binary's message."""
        if self.loss is None:
            return "it has no loss"
        if self.loss.dtype != "float32":
            return f"its loss is {self.loss.dtype}; the trainer's is float32"
        nodes, b = self.trainer_nodes(), self.batch_size
        logits = nodes["logits"]
        if logits is None:
            return "it has no output named 'logits', which the trainer's evaluation reads"
        if logits.ndim != 2 or logits.dtype != "float32" or logits.shape[0] != b:
            return f"its 'logits' output is {logits.describe()}; the trainer's is float32 (batch {b}, classes)"
        if len(self.train_inputs) != 2 or nodes["x"] is None or nodes["y"] is None or nodes["x"].shape[:1] != (b,):
            found = ", ".join(p.describe() for p in self.train_inputs) or "none"
            return (f"its train step's inputs are {found}; the trainer feeds two: a float32 batch of images (batch "
                    f"{b}, ...) and its int32 labels (batch {b},)")
        return ""

    @property
    def manifest(self) -> dict:
        def row(n, name=None):
            return {"name": name or n.name, "shape": list(n.shape), "dtype": n.dtype}
        return {
            "name": self.name, "source": self.source, "batch_size": self.batch_size,
            "has_train_step": self.loss is not None, "has_trainer": self.trainer is not None,
            "no_trainer": self.no_trainer,
            "train_inputs": [row(x) for x in self.train_inputs],
            "eval_inputs": [row(x) for x in self.eval_inputs],
            "outputs": [row(o, name) for name, o in self.outputs.items()],
            "variables": [dict(row(v), trainable=bool(v.attrs.get("trainable", True))) for v in self.variables],
            "layout_hash": f"{self.layout_hash:016x}", "init_file": self.init_file,
            "kernels": {"train": self.kernels.get("train", 0), "eval": self.kernels.get("eval", 0)},
            "precision": self.precision,
        }


def trace(program, name: str = "model", source: str = "<python>") -> Module:
    if isinstance(program, Program):
        train = program.train_outputs if program.optimizer is not None else [program.loss]
        module = Module(name, source, list(train), dict(program.outputs), program.loss, program.batch_size)
    else:
        nodes = list(program)
        if not nodes or not all(isinstance(n, Node) for n in nodes):
            raise GCompileError("compile: expected a gc.Program or a non-empty list of graph nodes")
        # as NumpyExecutor's default mode computes them, with the train updates the nodes carry (batch norm's
        # running statistics), which it applies at every run: outputs update0, ... after the nodes' own
        nodes, updates = specialize(nodes, "train")
        batch = nodes[0].shape[0] if nodes[0].shape else 1
        outputs = {**{f"out{i}": n for i, n in enumerate(nodes)}, **{f"update{i}": a for i, a in enumerate(updates)}}
        module = Module(name, source, [], outputs, None, batch)
    for node in list(module.outputs.values()) + ([module.loss] if module.loss is not None else []):
        if node.dtype not in FLOAT_DTYPES + ("int32",):
            raise GCompileError(f"compile: output {node.describe()} has dtype {node.dtype}; outputs must be "
                                "float32, float64 or int32")
    module.labels = label_inputs(module.train + list(module.outputs.values()))
    return module.refresh()


def label_inputs(outputs: list[Node]) -> dict[str, int]:
    """{placeholder name: classes} for the placeholders fed as softmax_cross_entropy's integer labels — directly,
    reshaped, or cast to a type that holds every value of theirs (the labels are then the placeholder's values):
    the compiled program checks their values against [0, classes) before it runs a step on them, as the numpy
    executor does (its kernels would give a NaN loss, which the guard turns into halted updates). Labels computed
    otherwise (arithmetic, a cast from floats or one that wraps) are not checked before the step."""
    labels = {}
    for node in topological_order(outputs):
        if node.op != "softmax_cross_entropy" or node.inputs[1].dtype in FLOAT_DTYPES:
            continue
        source = node.inputs[1]
        while source.op == "reshape" or (source.op == "cast" and np.can_cast(source.inputs[0].dtype, source.dtype,
                                                                              "safe")):
            source = source.inputs[0]
        if source.op == "placeholder":
            name, classes = source.name, node.inputs[0].shape[1]
            labels[name] = min(classes, labels.get(name, classes))
    return labels
