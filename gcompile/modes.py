"""Train and eval behaviour of one graph.

A model is written once; batch norm and dropout build `mode_select(train_value, eval_value)` nodes.
`specialize(outputs, mode)` resolves them: it returns the outputs rebuilt with every mode_select replaced by
its train (or eval) value — nodes that depend on no mode_select are returned as they are — and, in train
mode, the assign nodes the selected nodes carry (`train_updates`, e.g. batch norm's running statistics),
rebuilt the same way. gc.Program specializes its train step and its eval outputs; NumpyExecutor takes a
`mode`. A graph without mode_select nodes comes back unchanged.
"""
from __future__ import annotations

from .errors import GCompileError
from .graph import Node, rebuilt, topological_order

MODES = ("train", "eval")


def specialize(outputs, mode: str) -> tuple[list[Node], list[Node]]:
    """(outputs in `mode`, the train updates of the selected nodes — [] in eval mode)."""
    if mode not in MODES:
        raise GCompileError(f"mode must be one of {MODES}, got {mode!r}")
    picked = 0 if mode == "train" else 1
    memo: dict[Node, Node] = {}
    updates: list[Node] = []
    roots = list(outputs)
    while roots:
        pending = []  # assigns that selected mode_select nodes carry
        for node in selected_order(roots, picked, memo):
            if node.op == "mode_select":
                memo[node] = memo[node.inputs[picked]]
                if mode == "train":
                    pending += node.attrs["train_updates"]
                continue
            inputs = tuple(memo[i] for i in node.inputs)
            memo[node] = rebuilt(node, inputs)
        # an update's value may itself hold mode_select nodes (batch norm after dropout): another round
        roots = [a for a in dict.fromkeys(pending) if a not in memo]
        updates += roots
    return [memo[o] for o in outputs], [memo[a] for a in updates]


def selected_order(roots, picked: int, done) -> list[Node]:
    """Nodes reachable from roots and not in `done`, inputs first, through the picked input of each
    mode_select only (a value of the other mode is never built, and its updates never join)."""
    return topological_order(roots, lambda node: inputs_of(node, picked), done)


def inputs_of(node: Node, picked: int):
    return (node.inputs[picked],) if node.op == "mode_select" else node.inputs
