"""The user-facing entry points of the compiler: gc.compile (Program -> Artifact) and gc.Executor (the
dlsys-style executor: a node list compiled behind the scenes on first use)."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Mapping

from .build import Artifact, build, compile_flags
from .errors import GCompileError
from .executor import NumpyExecutor
from .graph import Node, format_graph
from .pipeline import compile_program

TARGETS = ("cuda", "cpu")


def compile(program, target: str = "cuda", out_dir=None, name: str | None = None, arch: str | None = None,
            source: str = "<python>") -> Artifact:  # noqa: A001 - the public name in the design
    """Compile a gc.Program (or a list of nodes) into out_dir: the .cu/.cpp source, a standalone binary,
    a shared library, the initial parameters and a JSON manifest."""
    if target not in TARGETS:
        raise GCompileError(f"compile: unknown target {target!r}; expected one of {TARGETS}")
    name = name or getattr(program, "name", None) or "model"
    if not name.isidentifier():
        raise GCompileError(f"compile: program name {name!r} must be a C identifier")
    compiler, flags, _ = compile_flags(target, arch)
    compiled = compile_program(program, target, name, source, build_command=" ".join([compiler, *flags]))
    return build(compiled, out_dir or Path("build") / name, arch)


def cache_dir() -> Path:
    root = os.environ.get("GCOMPILE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "gcompile")
    return Path(root) / "executors"


class Executor:
    """`Executor(nodes, target).run(feed_dict) -> [ndarray, ...]`: evaluates nodes (a forward graph) with the
    numpy reference ("numpy") or a compiled program ("cpu", "cuda"), compiled once and cached by graph."""

    def __init__(self, nodes, target: str = "numpy"):
        self.nodes = list(nodes)
        self.target = target
        if target == "numpy":
            self.reference = NumpyExecutor(self.nodes)
        elif target in TARGETS:
            self.model = None
        else:
            raise GCompileError(f"Executor: unknown target {target!r}; expected numpy, cpu or cuda")

    def _compiled(self):
        if self.model is None:
            from .loader import load
            key = hashlib.sha256(f"{self.target}\n{format_graph(self.nodes)}".encode()).hexdigest()[:16]
            artifact = compile(self.nodes, self.target, cache_dir() / f"{self.target}-{key}", name="executor")
            self.model = load(artifact)
        return self.model

    def run(self, feed_dict: Mapping | None = None) -> list:
        if self.target == "numpy":
            return self.reference.run(feed_dict)
        model = self._compiled()
        feeds = {(k.name if isinstance(k, Node) else k): v for k, v in (feed_dict or {}).items()}
        specs = model.manifest["eval_inputs"]
        missing = [s["name"] for s in specs if s["name"] not in feeds]
        unknown = sorted(set(feeds) - {s["name"] for s in specs})
        if missing or unknown:
            raise GCompileError(f"Executor.run: missing feeds {missing}, unknown feeds {unknown}")
        outputs = model.forward(*(feeds[s["name"]] for s in specs))
        return list(outputs.values())
