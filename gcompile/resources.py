"""Where the files gcompile ships live, and a digest of them (part of every build's cache key); the folders
it writes into, their locks, and file digests."""
from __future__ import annotations

import contextlib
import fcntl
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


@contextlib.contextmanager
def file_lock(path: Path, error=None):
    """An exclusive flock on the file at path (made if missing) while inside: other processes and threads
    taking it wait; the system releases it when its holder dies. Where the file cannot be opened (a
    read-only folder), `error` (an exception class) is raised naming the folder, or without one the body runs
    unlocked; on a file system without locks it runs unlocked."""
    try:
        lock = open(path, "a")
    except OSError as e:
        if error is None:
            yield
            return
        raise error(f"{path.parent}: cannot write: {e.strerror or e}") from None
    with lock:   # closing it releases the lock
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
        except OSError:   # ENOLCK, EOPNOTSUPP
            pass
        yield


def sha256_of(path) -> str:
    """The SHA-256 of a file's bytes (hex), read a megabyte at a time; OSError if it cannot be read."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


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
    suffixes = (".py", ".j2", ".h", ".cuh", ".cpp", ".json")
    return [path for root in roots for path in sorted(p for p in root.rglob("*") if p.suffix in suffixes)]
