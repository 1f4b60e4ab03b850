"""Where the files gcompile ships live, and a digest of them (part of every build's cache key); the folders
it writes into."""
from __future__ import annotations

import functools
import hashlib
from importlib import resources
from pathlib import Path

from .errors import GCompileError


def make_folder(path, what: str, error=GCompileError) -> Path:
    """The folder at path, made with its parents where missing; a path that cannot be one (a file there or
    above it, no permission) raises `error` naming it and `what` it was for."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        reason = "something other than a folder is there" if isinstance(e, FileExistsError) else e.strerror
        raise error(f"{path}: cannot make the {what} folder: {reason}") from None
    return path


def package_dir(name: str) -> Path:
    """codegen_templates/ and runtime/ ship inside the wheel as gcompile.<name>; in a source checkout they
    sit at the top level."""
    try:
        found = Path(str(resources.files(f"gcompile.{name}")))
        if found.is_dir():
            return found
    except ModuleNotFoundError:
        pass
    return Path(__file__).resolve().parents[1] / name


@functools.lru_cache(maxsize=None)
def code_digest() -> str:
    """sha256 of gcompile's own code, templates, runtime and data files (the GEMM tile calibration, which
    `bench/gemm_bench.py --calibrate` rewrites): a build made by other code or data is never reused."""
    h = hashlib.sha256()
    for path in digested_files():
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def digested_files() -> list[Path]:
    roots = [Path(__file__).resolve().parent, package_dir("codegen_templates"), package_dir("runtime")]
    return [path for root in roots
            for path in sorted(p for p in root.rglob("*") if p.suffix in (".py", ".j2", ".h", ".cuh", ".cpp", ".json"))]
