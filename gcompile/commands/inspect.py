"""gcompile inspect MODEL.py [--after PASS]: the IR after a pass, the schedule, the memory plan."""
from __future__ import annotations

from ..build import compile_flags, header_commands
from ..errors import GCompileError
from .model_file import add_model_arguments, default_target, load_program, parse_settings


def add_arguments(parser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--after", metavar="PASS", default=None,
                        help="print the IR after this pass only: trace, simplify, fuse, schedule, plan_memory, "
                             "lower or emit (default: the fused IR with its groups, the schedule and the memory "
                             "plan)")


def run(args) -> int:
    import os

    from ..pipeline import PASSES, compile_program  # loads the passes: only when inspecting
    from ..tune import read_record

    if args.after is not None and args.after not in PASSES:
        raise GCompileError(f"--after: unknown pass {args.after!r}; the passes are {', '.join(PASSES)}")
    target = args.target or default_target()
    compiler, flags, _ = compile_flags(target, args.arch, sanitize=args.sanitize)
    program = load_program(args.model, args.batch_size, parse_settings(args.set))
    compiled = compile_program(program, target, program.name, os.path.relpath(args.model),
                               build_command=header_commands(target, compiler, flags),
                               precision=args.precision,
                               tuning=None if args.tuning is None else read_record(args.tuning))
    stages = [args.after] if args.after else ["fuse", "schedule", "plan_memory"]
    for stage in stages:
        print(f"==== after {stage} ====")
        print(compiled.stages[stage])
        if stage == "plan_memory":   # the kernels' workspaces, which lower adds to the plan
            print(compiled.plan.format_workspaces())
        print()
    return 0
