"""A model file is a Python file that defines `program(batch_size=...) -> gc.Program` (see examples/).
The subcommands import it by path and call `program`, passing --batch-size when given and every
`--set NAME=VALUE` as the keyword argument NAME (VALUE read as a Python literal — 0.1, True, (20, 50) or
20,50 — else as text: --set optimizer=adam)."""
from __future__ import annotations

import argparse
import ast
import importlib.machinery
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


def parse_settings(items) -> dict:
    """["NAME=VALUE", ...] -> {NAME: value}: a Python literal where VALUE is one, else the text."""
    settings = {}
    for item in items or ():
        name, sep, text = item.partition("=")
        if not sep or not name.isidentifier():
            raise GCompileError(f"--set {item!r}: expected NAME=VALUE, e.g. --set optimizer=adam")
        try:
            settings[name] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            settings[name] = text
    return settings


def load_program(path, batch_size: int | None = None, settings: dict | None = None) -> Program:
    path = Path(path)
    if not path.is_file():
        raise GCompileError(f"{path}: no such model file")
    # as Python source whatever its name ends with (a name without .py had no loader: a traceback)
    loader = importlib.machinery.SourceFileLoader(f"gcompile_model_{path.stem}", str(path))
    spec = importlib.util.spec_from_file_location(loader.name, path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent.resolve()))
    try:
        run_model_code(path, spec.loader.exec_module, module)
    finally:
        sys.path.pop(0)
    make = getattr(module, "program", None)
    if not callable(make):
        raise GCompileError(f"{path}: a model file must define program(batch_size=...) returning a gc.Program")
    return call_program(path, make, batch_size, settings)


def call_program(path: Path, make, batch_size: int | None = None, settings: dict | None = None) -> Program:
    """make(batch_size=..., **settings), the model file's program(): names it does not take, and whatever its
    code raises, are errors naming the model file."""
    kwargs = dict(settings or {})
    if batch_size is not None:
        if "batch_size" in kwargs:
            raise GCompileError(f"--batch-size {batch_size} and --set batch_size={kwargs['batch_size']!r}: give one")
        kwargs["batch_size"] = batch_size
    accepted = inspect.signature(make).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values())   # program(**settings)
    unknown = [name for name in kwargs if name not in accepted and not takes_any]
    if unknown:
        flags = ", ".join("--batch-size" if n == "batch_size" else f"--set {n}=..." for n in unknown)
        raise GCompileError(f"{path}: program() takes no {', '.join(unknown)}, so {flags} cannot be used "
                            f"(it takes {', '.join(accepted) or 'nothing'})")
    texts = [f"--set {name}={value}" for name, value in (settings or {}).items() if isinstance(value, str)]
    program = run_model_code(path, make, note=f" ({', '.join(texts)}: passed as text, not a Python literal)"
                             if texts else "", **kwargs)
    if not isinstance(program, Program):
        raise GCompileError(f"{path}: program() returned {type(program).__name__}, not a gc.Program")
    return program


def run_model_code(path: Path, function, *args, note: str = "", **kwargs):
    """Call model-file code; an exception it raises (other than gcompile's own errors, which say what they
    mean) becomes a GCompileError naming the model file's line (and `note`), instead of a traceback; so does
    an exit (sys.exit), which would otherwise end gcompile with nothing built and no message."""
    try:
        return function(*args, **kwargs)
    except GCompileError:
        raise
    except (Exception, SystemExit) as e:  # noqa: BLE001 - any error of user code is reported, with its place
        frames = [f for f in traceback.extract_tb(e.__traceback__) if Path(f.filename).resolve() == path.resolve()]
        line = getattr(e, "lineno", None) if isinstance(e, SyntaxError) else (frames[-1].lineno if frames else None)
        where = f"{path}:{line}" if line else str(path)
        if isinstance(e, SystemExit):
            raise GCompileError(f"{where}: the model file called sys.exit({e.code!r}); it should define program() "
                                "and leave running to gcompile") from e
        raise GCompileError(f"{where}: the model file raised {type(e).__name__}: {e}{note}") from e


def default_target() -> str:
    """cuda where a GPU answers and nvcc is installed, else cpu (with a note when only nvcc is missing)."""
    if not detect_arch():
        return "cpu"
    if shutil.which("nvcc") is None:
        print("gcompile: a GPU is present but nvcc is not on PATH: building for the cpu target", file=sys.stderr)
        return "cpu"
    return "cuda"


def at_least_one(what: str):
    """An argparse type: a whole number >= 1, `what` naming it in the error."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"{text!r}: {what} must be at least 1")
        return value
    return parse


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="model file defining program(batch_size=...)")
    parser.add_argument("--target", choices=("cuda", "cpu"), default=None,
                        help="cuda or cpu (default: cuda when a GPU is present, else cpu)")
    parser.add_argument("--arch", default=None, help="CUDA architectures: sm_XY (machine code) and compute_XY "
                        "(PTX), comma-separated, e.g. sm_90 or sm_80,sm_90,compute_90 (default: the GPU's, or "
                        "sm_90,compute_90 when there is no GPU)")
    parser.add_argument("--batch-size", type=at_least_one("the batch size"), default=None,
                        help="passed to program(batch_size=...)")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="passed to program(NAME=VALUE), VALUE a Python literal or text; repeatable, "
                             "e.g. --set optimizer=adam --set batch_norm=False")
    parser.add_argument("--precision", choices=("fp32", "tf32"), default="fp32",
                        help="float32 GEMMs in fp32 (default) or on tf32 tensor cores (cuda target)")
    parser.add_argument("--sanitize", action="store_true", help="cpu target: build under AddressSanitizer and "
                        "UndefinedBehaviorSanitizer (every report fatal), for testing")
    parser.add_argument("--tuning", default=None, metavar="RECORD.json",
                        help="cuda: build with the GEMM tiles of this tuning record (written by gcompile tune)")


def compile_model(args, out_dir=None):
    from ..compiler import compile as compile_program

    program = load_program(args.model, args.batch_size, parse_settings(args.set))
    return compile_program(program, target=args.target or default_target(), out_dir=out_dir,
                           arch=args.arch, source=os.path.relpath(args.model), precision=args.precision,
                           sanitize=args.sanitize, tuning=args.tuning)
