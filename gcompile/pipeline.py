"""The whole compiler in one function: every pass, in order, by name.

    trace -> simplify -> fuse -> schedule -> plan_memory -> lower -> emit        (then build, in build.py)

Autodiff and the optimizer's update nodes are appended when the gc.Program is built (gc.gradients and
optimizer.updates), so `trace` starts from the full training graph. GCOMPILE_DEBUG=1 prints the IR after
each pass to stderr.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from .errors import GCompileError
from .gemm_tiles import check_precision
from .graph import format_graph, topological_order
from .passes.emit import emit
from .passes.fuse import describe_groups, fuse
from .passes.lower import Kernel, lower
from .passes.plan_memory import MemoryPlan, check_plan, in_a_buffer, plan_memory, read_at_start
from .passes.chain import find_chains
from .passes.schedule import schedule
from .passes.simplify import simplify
from .passes.trace import Module, trace
from .tune import check_applied, record_tiles

PASSES = ("trace", "simplify", "fuse", "schedule", "plan_memory", "lower", "emit")


@dataclass
class CompiledSource:
    module: Module
    schedules: dict
    plan: MemoryPlan
    kernels: dict[str, list[Kernel]]
    source: str
    target: str
    stages: dict[str, str]           # the printed IR after each pass (what `gcompile inspect` shows)
    kernel_parts: int = 1            # the cuda build's kernels parts (emit.assign_parts, build.part_commands)


def graphs_text(graphs: dict) -> str:
    return "\n".join(f"-- {g}\n{format_graph(outputs)}" for g, outputs in graphs.items())


def compile_program(program, target: str = "cuda", name: str = "model", source: str = "<python>",
                    build_command="", precision: str = "fp32", tiles: dict | None = None,
                    tuning: dict | None = None) -> CompiledSource:
    """build_command: what the source's header shows as its compile commands, or a function of the number of
    kernels parts (emit.assign_parts) that gives it. tiles: {GEMM kernel name: (tile name, split)} instead of
    choose_tile's; tuning: a tuning record (gcompile/tune.py, read_record) whose tiles are used, after checking
    it was made for this program."""
    stages = {}
    module = trace(program, name, source)
    module.precision = check_precision(precision)
    stages["trace"] = graphs_text(module.graphs)

    # one call for both graphs, so the nodes they share stay one node
    simplified = simplify(module.train + list(module.outputs.values()))
    module.train, evaluated = simplified[:len(module.train)], simplified[len(module.train):]
    if module.train:   # a constant loss or output (folded into a literal) still has a buffer to read back
        module.train[0] = in_a_buffer(module.train[0])
    module.loss = module.train[0] if module.train else None
    assigned = {n.inputs[0] for n in topological_order(evaluated) if n.op == "assign"}
    module.outputs = dict(zip(module.outputs, (read_at_start(in_a_buffer(o), assigned) for o in evaluated)))
    module.refresh()
    stages["simplify"] = graphs_text(module.graphs)

    fused, groups = fuse(module.graphs)
    module.train = fused.get("train", [])
    module.loss = module.train[0] if module.train else None
    module.outputs = dict(zip(module.outputs, fused.get("eval", [])))
    module.refresh()
    fused_text = graphs_text(module.graphs) + "\n-- groups\n"
    stages["fuse"] = fused_text + describe_groups(groups)

    schedules, chains = {}, {}
    for g, outputs in module.graphs.items():
        schedules[g], chains[g] = find_chains(schedule(outputs), precision)
    stages["schedule"] = "\n".join(f"-- {g}\n{format_graph(outputs, order=schedules[g])}"
                                   for g, outputs in module.graphs.items())

    persistent = list(module.outputs.values()) + ([module.loss] if module.loss is not None else [])
    plan = plan_memory(schedules, persistent, module.trainer["x"] if module.trainer else None, chains)
    check_plan(plan)
    stages["plan_memory"] = plan.format()

    if tuning is not None:
        if target != "cuda":
            raise GCompileError(f"a tuning record chooses GEMM tiles of the cuda target, not {target!r}")
        tiles = {**record_tiles(tuning, stages["simplify"], precision), **(tiles or {})}
    kernels = lower(schedules, plan, precision, tiles, target)
    if tuning is not None:
        check_applied(tuning, kernels)
    module.kernels = {g: len(ks) for g, ks in kernels.items()}   # one launch per lowered kernel
    stages["lower"] = "\n".join(f"{k.name:<28} {k.kind:<6} {k.comment}" for ks in kernels.values() for k in ks)
    made = {}                           # the fuse stage names the kernel each group became
    for g, ks in kernels.items():
        for k in ks:
            for group in [k.group] + k.fused:
                made.setdefault(group, []).append(f"{k.name} ({g})")
    stages["fuse"] = fused_text + describe_groups(groups, made)

    text, kernel_parts = emit(module, plan, kernels, target, build_command)
    stages["emit"] = text
    if os.environ.get("GCOMPILE_DEBUG") == "1":
        for stage, printed in stages.items():
            print(f"==== after {stage} ====\n{printed}\n", file=sys.stderr)
    return CompiledSource(module, schedules, plan, kernels, text, target, stages, kernel_parts)
