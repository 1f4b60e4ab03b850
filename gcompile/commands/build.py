"""gcompile build MODEL.py -o OUT: compile a model file into OUT (source, binary, library, manifest)."""
from __future__ import annotations

import json
from pathlib import Path

from .model_file import add_model_arguments, compile_model


def add_arguments(parser) -> None:
    add_model_arguments(parser)
    parser.add_argument("-o", "--out", default=None, help="output directory (default: build/<program name>)")


def run(args) -> int:
    artifact = compile_model(args, args.out)
    state = "up to date (cached)" if artifact.cached else "built"
    print(f"{artifact.name}: {state} in {artifact.seconds:.2f} s ({artifact.target})")
    for label, path in (("source", artifact.source), ("binary", artifact.binary), ("library", artifact.library),
                        ("manifest", artifact.manifest), ("initial parameters", artifact.init)):
        print(f"  {label:<19} {path}")
    reason = json.loads(Path(artifact.manifest).read_text()).get("no_trainer")
    if reason:
        print(f"  note: no training loop in the binary ({reason}): use the library (gc.load); the binary runs "
              "`check` only")
    return 0
