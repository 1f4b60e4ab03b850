"""The user-facing entry points of the compiler: gc.compile (Program -> Artifact) and gc.Executor (the
dlsys-style executor: a node list compiled behind the scenes on first use)."""
from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path
from typing import Mapping

from .build import (Artifact, build, build_settings, cached_artifact, check_folder, compile_flags, folder_lock,
                    header_commands)
from .errors import GCompileError
from .executor import NumpyExecutor
from .gemm_tiles import check_precision
from .graph import Node, format_graph, topological_order
from .resources import code_digest
from .tune import read_record

TARGETS = ("cuda", "cpu")


def compile(program, target: str = "cuda", out_dir=None, name: str | None = None, arch: str | None = None,
            source: str | None = None, cudart: str = "static",
            precision: str = "fp32", sanitize: bool = False, tuning=None) -> Artifact:  # noqa: A001 - the design's name
    """Compile a gc.Program (or a list of nodes: their values are the outputs out0, out1, ..., followed by
    update0, ... for the train updates they carry, applied at every run as NumpyExecutor's train mode applies
    them) into out_dir: the .cu/.cpp source, a standalone binary,
    a shared library, the initial parameters and a JSON manifest. precision="tf32" lets float32 GEMMs use
    tf32 tensor cores (cuda; the cpu target computes them in fp32 with double sums either way). `arch`
    (cuda): e.g. "sm_90" or "sm_80,sm_90,compute_90" (see build.gencode_flags). sanitize=True (cpu): an
    AddressSanitizer/UBSan build. tuning (cuda): a tuning record, or its JSON file's path, from gc.tune / `gcompile
    tune`: the training step's GEMM tiles it measured fastest on its GPU (gcompile/tune.py). source: the model
    file the generated header names (default: the file of the code that called gcompile, else "<python>")."""
    source = source or calling_file()
    if target not in TARGETS:
        raise GCompileError(f"compile: unknown target {target!r}; expected one of {TARGETS}")
    check_precision(precision)
    name = name or getattr(program, "name", None) or "model"
    if not name.isidentifier():
        raise GCompileError(f"compile: program name {name!r} must be a C identifier")
    record = None if tuning is None else read_record(tuning)
    compiler, flags, link_flags = compile_flags(target, arch, cudart, sanitize)
    out_dir = out_dir or Path("build") / name
    key = fingerprint(program, [*build_settings(target, compiler, flags, link_flags), name, source,
                                f"precision={precision}",
                                *([f"tuning={record['program']}:{record['kernels']}"] if record else [])])
    # builds of one name into one folder take turns (processes, threads)
    with folder_lock(check_folder(target, out_dir), name):
        artifact = cached_artifact(out_dir, name, key)
        if artifact is not None:
            return artifact
        from .pipeline import compile_program  # the passes load networkx and jinja2: only when compiling
        compiled = compile_program(program, target, name, source, precision=precision, tuning=record,
                                   build_command=header_commands(target, compiler, flags))
        return build(compiled, out_dir, arch, cudart, program_key=key, sanitize=sanitize)


def calling_file() -> str:
    """The file of the innermost caller outside the gcompile package (the user's model script), or "<python>"
    (an interactive session, `python -c`)."""
    package = os.path.dirname(os.path.abspath(__file__)) + os.sep
    frame = sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame = frame.f_back
    name = frame.f_code.co_filename if frame is not None else ""
    return name if os.path.isfile(name) else "<python>"


def fingerprint(program, settings) -> str:
    """Identifies what a build would produce before running the pipeline: the graph's text, every initial
    value and array constant, the compiler settings, and gcompile's own code."""
    if isinstance(program, Node) or not hasattr(program, "train_outputs"):
        outputs = list(program)
    else:
        outputs = program.train_outputs + list(program.outputs.values())
        settings = [*settings, *program.outputs]
    h = hashlib.sha256(code_digest().encode())
    h.update("\0".join(map(str, settings)).encode())
    h.update(format_graph(outputs).encode())
    for node in topological_order(outputs):
        if node.op == "variable":   # its initial value, and whether it is trainable (the manifest says)
            h.update(node.attrs["init"](node.shape, node.dtype).tobytes())
            h.update(b"T" if node.attrs.get("trainable", True) else b"F")
        elif node.op == "constant":
            h.update(node.attrs["value"].tobytes())
    return h.hexdigest()


def cache_dir() -> Path:
    root = os.environ.get("GCOMPILE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "gcompile")
    return Path(root) / "executors"


class Executor:
    """`Executor(nodes, target).run(feed_dict) -> [ndarray, ...]`: evaluates nodes (a forward graph) with the
    numpy reference ("numpy") or a compiled program ("cpu", "cuda"), compiled once and cached by graph and
    precision (see gc.compile)."""

    def __init__(self, nodes, target: str = "numpy", precision: str = "fp32"):
        self.nodes = list(nodes)
        # every placeholder of the graph may be fed, one that simplify left unread too (zeros_like(s)): the
        # feeds NumpyExecutor needs serve every target
        self.placeholders = {n.name for n in topological_order(self.nodes) if n.op == "placeholder"}
        self.target = target
        self.precision = check_precision(precision)
        if target == "numpy":
            self.reference = NumpyExecutor(self.nodes)
        elif target in TARGETS:
            self.model = None
        else:
            raise GCompileError(f"Executor: unknown target {target!r}; expected numpy, cpu or cuda")

    def _compiled(self):
        if self.model is None:
            from .loader import load
            text = f"{self.target}\n{self.precision}\n{format_graph(self.nodes)}"
            key = hashlib.sha256(text.encode()).hexdigest()[:16]
            # (one source for every caller: the cache folder is the graph's, whoever runs it)
            artifact = compile(self.nodes, self.target, cache_dir() / f"{self.target}-{key}", name="executor",
                               source="<gc.Executor>", precision=self.precision)
            self.model = load(artifact)
        return self.model

    def run(self, feed_dict: Mapping | None = None) -> list:
        if self.target == "numpy":
            return self.reference.run(feed_dict)
        model = self._compiled()
        feeds = {(k.name if isinstance(k, Node) else k): v for k, v in (feed_dict or {}).items()}
        specs = model.manifest["eval_inputs"]
        missing = [s["name"] for s in specs if s["name"] not in feeds]
        unknown = sorted(set(feeds) - self.placeholders)
        if missing or unknown:
            raise GCompileError(f"Executor.run: missing feeds {missing}, unknown feeds {unknown}")
        outputs = model.forward(*(feeds[s["name"]] for s in specs))
        return list(outputs.values())[:len(self.nodes)]   # (then the train updates': trace)
