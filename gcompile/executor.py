"""The numpy reference executor: the oracle every compiled result is compared with.

It evaluates the graph op by op in `topological_order`, holds variable values between runs, and applies
`assign` nodes after the whole step has been evaluated, so every read in a step sees the step's starting
values — the semantics the generated programs implement too.
"""
from __future__ import annotations

from typing import Iterable, Mapping

import numpy as np

from . import graph as G
from .errors import GCompileError
from .graph import Node
from .modes import specialize
from .ops import get_op


def leaves_of(order: Iterable[Node], op: str) -> list[Node]:
    """The leaves of one kind, with unique names (names identify feeds, parameters and checkpoint entries)."""
    found: dict[str, Node] = {}
    for n in order:
        if n.op == op:
            if n.name in found and found[n.name] is not n:
                raise GCompileError(f"two different {op}s are named {n.name!r}: {found[n.name].describe()} and "
                                    f"{n.describe()}")
            found[n.name] = n
    return list(found.values())


def check_feed(name: str, shape: tuple, dtype: str, value, as_dtype: str | None = None,
               what: str = "feed for placeholder") -> np.ndarray:
    """A value fed to placeholder `name` as a C-contiguous array of its shape and dtype (`as_dtype` may widen
    float32 to float64). Floats accept any real array; integer placeholders accept integers in range."""
    arr = np.asarray(value)
    if arr.shape != tuple(shape):
        raise GCompileError(f"{what} {name!r}: expected shape {tuple(shape)}, got {arr.shape}")
    if dtype in G.FLOAT_DTYPES:
        if arr.dtype.kind not in "fiu":
            raise GCompileError(f"{what} {name!r}: expected {dtype}, got {arr.dtype}")
    else:
        if arr.dtype.kind not in "iu":
            raise GCompileError(f"{what} {name!r}: expected integers ({dtype}), got {arr.dtype}")
        info = np.iinfo(dtype)
        if arr.size and (arr.min() < info.min or arr.max() > info.max):
            raise GCompileError(f"{what} {name!r}: values outside the range of {dtype}")
    return np.asarray(arr, dtype=as_dtype or dtype, order="C")


class NumpyExecutor:
    """`NumpyExecutor(outputs, dtype=None, mode="train").run(feed_dict) -> [ndarray, ...]`.

    dtype="float64" computes every float value in float64 (for gradient checks); variables are held in
    that precision too. `mode` picks the train or eval behaviour of batch norm and dropout
    (gcompile/modes.py); in train mode a run also applies their state updates (running statistics).
    Variables are initialized from their initializers on construction; read or set them by name with
    `get_variable` / `set_variable` or the `variables` dict."""

    def __init__(self, outputs: Iterable[Node], dtype: str | None = None, mode: str = "train"):
        if dtype is not None:
            dtype = G.canonical_dtype(dtype)    # (np.float64, 'f8', 'double' name float64)
        if dtype is not None and dtype not in G.FLOAT_DTYPES:
            raise GCompileError(f"NumpyExecutor: dtype must be float32 or float64, got {dtype!r}")
        self.float_dtype = dtype
        self.outputs, updates = specialize(list(outputs), mode)
        self.order = G.topological_order(self.outputs + updates)
        self.placeholders = leaves_of(self.order, "placeholder")
        self.variables = {v.name: v.attrs["init"](v.shape, self.dtype_of(v)) for v in
                          leaves_of(self.order, "variable")}
        self.variable_nodes = {v.name: v for v in leaves_of(self.order, "variable")}

    def dtype_of(self, node: Node) -> str:
        if self.float_dtype and node.dtype in G.FLOAT_DTYPES:
            return self.float_dtype
        return node.dtype

    def get_variable(self, name: str) -> np.ndarray:
        if name not in self.variables:
            raise GCompileError(f"no variable named {name!r}; known: {sorted(self.variables)}")
        return self.variables[name].copy()

    def set_variable(self, name: str, value) -> None:
        node = self.variable_nodes.get(name)
        if node is None:
            raise GCompileError(f"no variable named {name!r}; known: {sorted(self.variables)}")
        self.variables[name] = check_feed(name, node.shape, node.dtype, value, as_dtype=self.dtype_of(node),
                                          what="set_variable")

    def run(self, feed_dict: Mapping | None = None) -> list[np.ndarray]:
        feeds = {}
        for key, value in (feed_dict or {}).items():
            name = key.name if isinstance(key, Node) else key
            feeds[name] = value
        unknown = set(feeds) - {p.name for p in self.placeholders}
        if unknown:
            raise GCompileError(f"feed names unknown placeholder(s) {sorted(unknown)}; the graph's placeholders "
                                f"are {[p.name for p in self.placeholders]}")
        values: dict[Node, np.ndarray] = {}
        writes = []
        for node in self.order:
            if node.op == "placeholder":
                if node.name not in feeds:
                    raise GCompileError(f"placeholder {node.describe()} was not fed")
                values[node] = check_feed(node.name, node.shape, node.dtype, feeds[node.name], self.dtype_of(node))
            elif node.op == "variable":
                values[node] = self.variables[node.name]
            else:
                out = get_op(node.op).compute(node, *(values[i] for i in node.inputs))
                values[node] = np.asarray(out, dtype=self.dtype_of(node))
                if values[node].shape != node.shape:
                    raise GCompileError(f"{node.op}: computed shape {values[node].shape} differs from the inferred "
                                        f"shape of {node.describe()} (a bug in the op's infer or compute)")
                if node.op == "assign":
                    writes.append((node.inputs[0].name, values[node]))
        for name, value in writes:
            self.variables[name] = value.copy()
        return [values[o].copy() for o in self.outputs]  # views (reshape of a variable) must not leak state
