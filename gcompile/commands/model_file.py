"""A model file is a Python file that defines `program(batch_size=...) -> gc.Program` (see examples/).
The subcommands import it by path and call `program`, passing --batch-size when given."""
from __future__ import annotations

import argparse
import importlib.util
import inspect
import os
import shutil
import sys
import traceback
from pathlib import Path

from ..build import detect_arch
from ..errors import GCompileError
from ..program import Program


def load_program(path, batch_size: int | None = None) -> Program:
    path = Path(path)
    if not path.is_file():
        raise GCompileError(f"{path}: no such model file")
    spec = importlib.util.spec_from_file_location(f"gcompile_model_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent.resolve()))
    try:
        run_model_code(path, spec.loader.exec_module, module)
    finally:
        sys.path.pop(0)
    make = getattr(module, "program", None)
    if not callable(make):
        raise GCompileError(f"{path}: a model file must define program(batch_size=...) returning a gc.Program")
    kwargs = {}
    if batch_size is not None:
        if "batch_size" not in inspect.signature(make).parameters:
            raise GCompileError(f"{path}: program() takes no batch_size, so --batch-size cannot be used")
        kwargs["batch_size"] = batch_size
    program = run_model_code(path, make, **kwargs)
    if not isinstance(program, Program):
        raise GCompileError(f"{path}: program() returned {type(program).__name__}, not a gc.Program")
    return program


def run_model_code(path: Path, function, *args, **kwargs):
    """Call model-file code; an exception it raises (other than gcompile's own errors, which say what they
    mean) becomes a GCompileError naming the model file's line, instead of a traceback."""
    try:
        return function(*args, **kwargs)
    except GCompileError:
        raise
    except Exception as e:  # noqa: BLE001 - any error of user code is reported, with its place
        frames = [f for f in traceback.extract_tb(e.__traceback__) if Path(f.filename).resolve() == path.resolve()]
        line = getattr(e, "lineno", None) if isinstance(e, SyntaxError) else (frames[-1].lineno if frames else None)
        where = f"{path}:{line}" if line else str(path)
        raise GCompileError(f"{where}: the model file raised {type(e).__name__}: {e}") from e


def default_target() -> str:
    """cuda where a GPU answers and nvcc is installed, else cpu (with a note when only nvcc is missing)."""
    if not detect_arch():
        return "cpu"
    if shutil.which("nvcc") is None:
        print("gcompile: a GPU is present but nvcc is not on PATH: building for the cpu target", file=sys.stderr)
        return "cpu"
    return "cuda"


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: the batch size must be at least 1")
    return value


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="model file defining program(batch_size=...)")
    parser.add_argument("--target", choices=("cuda", "cpu"), default=None,
                        help="cuda or cpu (default: cuda when a GPU is present, else cpu)")
    parser.add_argument("--arch", default=None, help="CUDA architectures: sm_XY (machine code) and compute_XY "
                        "(PTX), comma-separated, e.g. sm_90 or sm_80,sm_90,compute_90 (default: the GPU's, or "
                        "sm_90,compute_90 when there is no GPU)")
    parser.add_argument("--batch-size", type=positive_int, default=None, help="passed to program(batch_size=...)")
    parser.add_argument("--sanitize", action="store_true", help="cpu target: build under AddressSanitizer and "
                        "UndefinedBehaviorSanitizer (every report fatal), for testing")


def compile_model(args, out_dir=None):
    from ..compiler import compile as compile_program

    program = load_program(args.model, args.batch_size)
    return compile_program(program, target=args.target or default_target(), out_dir=out_dir,
                           arch=args.arch, source=os.path.relpath(args.model), sanitize=args.sanitize)
