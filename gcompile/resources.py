"""Where the files gcompile ships live, and a digest of them (part of every build's cache key); the folders
it writes into, their locks, and file digests."""
from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import hashlib
import json
import os
import secrets
import stat
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


def new_temporary(folder, prefix: str, suffix: str = ".tmp") -> tuple[int, str]:
    """(fd, path) of a new file in folder named prefix + 16 random hex digits + suffix, open for writing: a
    name of its own (threads and processes writing beside one another never share one), made as mkstemp
    makes its files but with mode 0666, which the kernel reduces by the umask — the mode any other new file
    gets. (mkstemp's 0600 would hide a shared file from other users, and the umask can only be read by setting
    it, for the whole process: a thread doing the same then reads the value set for a moment, and keeps it.)
    OSError if it cannot be made."""
    for _ in range(100):
        path = os.path.join(os.fsdecode(folder), f"{prefix}{secrets.token_hex(8)}{suffix}")
        try:
            return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666), path
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary name", os.fsdecode(folder))


def read_regular_file(path) -> bytes:
    """The bytes of the regular file at `path`; OSError where it cannot be read, with strerror "not a regular file"
    for a folder, fifo, device or socket. Opened without blocking: opening a fifo to read waits for a writer (a fifo
    in a checkpoint's or a manifest's place hung the reader), and a regular file's reads ignore O_NONBLOCK."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        f = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with f:
        return f.read()


def read_json(path, what: str, kind: str, hint: str = "", error=GCompileError):
    """A JSON file's value; `error` (a GCompileError) naming `path` where it cannot be read ("cannot read the
    `what`"), is not text or not JSON ("not a `kind`: ..."; `hint` after the first: what to pass instead)."""
    try:
        return json.loads(read_regular_file(path).decode())
    except OSError as e:
        raise error(f"{path}: cannot read the {what} ({e.strerror})") from None
    except UnicodeDecodeError as e:   # (a binary file given for it)
        raise error(f"{path}: not a {kind}: not UTF-8 text (byte {e.start}){hint}") from None
    except json.JSONDecodeError as e:
        raise error(f"{path}: not a {kind}: invalid JSON at line {e.lineno} column {e.colno} ({e.msg})") from None


def write_temporary(path, write, prefix: str | None = None, error=None) -> Path:
    """Call `write(file)` on a new temporary file beside `path` (new_temporary, named `prefix` + random +
    `.tmp`; by default `.<name>.`), flushed to the disk, and return its path; it is removed if writing fails.
    With `error` (an exception class), an OSError (no room, no permission) becomes that error naming `path`."""
    path = Path(path)
    try:
        fd, tmp = new_temporary(path.parent, f".{path.name}." if prefix is None else prefix)
    except OSError as e:
        if error is None:
            raise
        raise error(f"{path}: cannot write: {e.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError) and error is not None:
            raise error(f"{path}: cannot write: {e.strerror or e}") from None
        raise
    return Path(tmp)


def write_atomically(path, write, prefix: str | None = None, error=None) -> None:
    """write_temporary, then the temporary file renamed to `path` (removed if the rename fails): `path` holds
    the old file or the whole new one, never part of it."""
    tmp = write_temporary(path, write, prefix, error)
    try:
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) and error is not None:
            raise error(f"{path}: cannot write: {e.strerror or e}") from None
        raise


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
