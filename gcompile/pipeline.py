"""The whole compiler in one function: every pass, in order, by name.

    trace -> simplify -> schedule -> plan_memory -> lower -> emit        (then build, in build.py)

Autodiff and the optimizer's update nodes are appended when the gc.Program is built (gc.gradients and
optimizer.updates), so `trace` starts from the full training graph. GCOMPILE_DEBUG=1 prints the IR after
each pass to stderr.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from .graph import format_graph
from .passes.emit import emit
from .passes.lower import Kernel, lower
from .passes.plan_memory import MemoryPlan, check_plan, plan_memory
from .passes.schedule import schedule
from .passes.simplify import simplify
from .passes.trace import Module, trace

PASSES = ("trace", "simplify", "schedule", "plan_memory", "lower", "emit")


@dataclass
class CompiledSource:
    module: Module
    schedules: dict
    plan: MemoryPlan
    kernels: dict[str, list[Kernel]]
    source: str
    target: str


def dump(stage: str, text: str, stop_after: str | None = None) -> None:
    if os.environ.get("GCOMPILE_DEBUG") == "1":
        print(f"==== after {stage} ====\n{text}\n", file=sys.stderr)


def compile_program(program, target: str = "cuda", name: str = "model", source: str = "<python>",
                    build_command: str = "") -> CompiledSource:
    module = trace(program, name, source)
    dump("trace", format_graph(module.train + list(module.outputs.values())))

    graphs = module.graphs
    simplified = {g: simplify(outputs) for g, outputs in graphs.items()}
    if "train" in simplified:
        module.train = simplified["train"]
        module.loss = module.train[0]
    if "eval" in simplified:
        module.outputs = dict(zip(module.outputs, simplified["eval"]))
    module.refresh()
    dump("simplify", "\n".join(f"-- {g}\n{format_graph(o)}" for g, o in simplified.items()))

    schedules = {g: schedule(outputs) for g, outputs in module.graphs.items()}
    dump("schedule", "\n".join(f"-- {g}: " + ", ".join(n.name for n in order) for g, order in schedules.items()))

    persistent = list(module.outputs.values()) + ([module.loss] if module.loss is not None else [])
    plan = plan_memory(schedules, persistent)
    check_plan(plan)
    dump("plan_memory", plan.format())

    kernels = lower(schedules, plan)
    dump("lower", "\n".join(f"{k.name}: {k.kind} {k.comment}" for ks in kernels.values() for k in ks))

    text = emit(module, schedules, plan, kernels, target, build_command)
    return CompiledSource(module, schedules, plan, kernels, text, target)
