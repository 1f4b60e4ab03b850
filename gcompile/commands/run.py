"""gcompile run MODEL.py [build options] -- ARGS: build if needed, then run the binary with ARGS."""
from __future__ import annotations

import os
import sys

from .model_file import add_model_arguments, compile_model


def add_arguments(parser) -> None:
    add_model_arguments(parser)
    parser.add_argument("-o", "--out", default=None, help="build directory (default: build/<program name>)")
    parser.epilog = "Arguments after `--` go to the binary, e.g. `-- train --data DIR --epochs 10`."


def run(args) -> int:
    artifact = compile_model(args, args.out)
    print(f"{artifact.name}: {'cached' if artifact.cached else 'built'} in {artifact.seconds:.2f} s "
          f"({artifact.target}) -> {artifact.binary}", file=sys.stderr, flush=True)
    os.execv(artifact.binary, [artifact.binary, *args.passthrough])
