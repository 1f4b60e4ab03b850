"""`gcompile` on the command line: one subcommand per row of COMMANDS.

Each row names the module that implements the subcommand; that module defines `add_arguments(parser)` and
`run(args) -> exit code`. To add a subcommand (build, inspect, run, ...), add a row. A GCompileError ends
the command with its message on stderr and exit code 1, without a traceback (Ctrl-C: exit code 130).
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from . import __version__
from .errors import GCompileError

COMMANDS = {  # name: (module, one-line help)
    "data": ("gcompile.data", "fetch a dataset (mnist, fashion-mnist) and convert it to .npy files"),
    "build": ("gcompile.commands.build", "compile a model file: one .cu/.cpp, a training binary, a library"),
    "inspect": ("gcompile.commands.inspect", "print the IR after a pass, the schedule and the memory plan"),
    "run": ("gcompile.commands.run", "build a model file if needed, then run its binary (args after --)"),
    "tune": ("gcompile.commands.tune", "time the training step's GEMM tiles on the GPU; write a tuning record"),
}


def build_parser(commands=COMMANDS) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gcompile", description="Ahead-of-time compiler for neural-network training.")
    parser.add_argument("--version", action="version", version=f"gcompile {__version__}")
    subcommands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, help_text) in commands.items():
        sub = subcommands.add_parser(name, help=help_text, description=help_text)
        importlib.import_module(module).add_arguments(sub)
        sub.set_defaults(module=module)
    return parser


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    passthrough = []
    if "--" in argv:  # what follows `--` belongs to the program `gcompile run` starts
        split = argv.index("--")
        argv, passthrough = argv[:split], argv[split + 1:]
    parser = build_parser()
    args = parser.parse_args(argv)
    if passthrough and args.command != "run":   # silently dropped, they hid a `build` meant as `run`
        parser.error(f"{args.command} takes no arguments after --; {' '.join(passthrough)!r} would go to the "
                     "binary that `gcompile run` starts")
    args.passthrough = passthrough
    try:
        return importlib.import_module(args.module).run(args)
    except GCompileError as e:
        print(f"gcompile {args.command}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:   # Ctrl-C: what was being written is cleaned up on the way out; no traceback
        print(f"gcompile {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:   # output piped into a reader that stopped (| head): no traceback, nor another at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
