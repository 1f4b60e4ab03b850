"""gc.load: a compiled shared library in Python, through cffi. numpy in, numpy out.

Every argument is checked here (shapes, dtypes, names, a closed model) before it reaches C, and every C
error code becomes a Python exception carrying gc_last_error(): a bad call raises, it never crashes the
process.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import threading
import weakref
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

import cffi
import numpy as np

from .build import Artifact
from .checkpoint import checked_path
from .errors import DataError, GCompileError, RuntimeFailure
from .resources import read_json, sha256_of
from .executor import check_feed

CDEF = """
typedef struct gc_model gc_model;
const char* gc_last_error(void);
const char* gc_manifest(void);
int gc_create(gc_model** out);
void gc_destroy(gc_model* m);
int gc_train_step(gc_model* m, const void* const* inputs, int n, double* loss);
int gc_forward(gc_model* m, const void* const* inputs, int n, void* const* outputs, int n_out);
int gc_get_variable(gc_model* m, const char* name, void* dst, size_t nbytes);
int gc_set_variable(gc_model* m, const char* name, const void* src, size_t nbytes);
int gc_save(gc_model* m, const char* path);
int gc_load(gc_model* m, const char* path);
int gc_time_steps(gc_model* m, int which, int steps, double* seconds);
int gc_check_file(const char* kind, const char* path);
int gc_main(int argc, char** argv);
"""
ffi = cffi.FFI()
ffi.cdef(CDEF)
_libraries: dict[str, object] = {}


def open_library(path: str, sha256: str | None = None):
    """dlopen a library by content: a rebuilt library at the same path must not return the old handle. With
    the digest its build recorded, a library changed since (truncated: dlopen would kill the process) is
    refused."""
    try:
        full = sha256_of(path)
    except OSError as e:
        raise GCompileError(f"{path}: cannot read the compiled library ({e.strerror}); was the build directory "
                            "moved or deleted? Compile the program again") from None
    if sha256 is not None and full != sha256:
        raise GCompileError(f"{path}: the compiled library is not the one its build wrote (SHA-256 {full[:16]}..., "
                            f"the manifest records {sha256[:16]}...): truncated or replaced; compile the program "
                            "again")
    digest = full[:16]
    if digest not in _libraries:   # opened from a copy named by its content, removed once it is mapped
        with tempfile.TemporaryDirectory(prefix="gcompile-lib-") as folder:
            copy = os.path.join(folder, f"{digest}.so")
            shutil.copyfile(path, copy)
            _libraries[digest] = ffi.dlopen(copy)
    return _libraries[digest]


MANIFEST_KEYS = ("name", "artifact", "variables", "has_train_step", "train_inputs", "eval_inputs", "outputs")


def resolve(artifact) -> dict:
    """An Artifact, an output directory or a manifest path -> the manifest dict."""
    if isinstance(artifact, Artifact):
        path = Path(artifact.manifest)
    else:
        path = Path(artifact)
        if path.is_dir():
            found = sorted(path.glob("*.json"))
            if len(found) != 1:
                raise GCompileError(f"{path}: expected one manifest (*.json) in the directory, found {len(found)}")
            path = found[0]
    # (the binary, the library or a checkpoint given for the manifest: not text)
    manifest = read_json(path, "manifest", "gcompile manifest", hint="; pass the build's .json manifest or its folder")
    if not isinstance(manifest, dict):
        raise GCompileError(f"{path}: not a gcompile manifest (a JSON {type(manifest).__name__}, not an object)")
    missing = [key for key in MANIFEST_KEYS if key not in manifest]
    if not missing and not (isinstance(manifest["artifact"], dict) and
                            {"library", "init"} <= set(manifest["artifact"])):
        missing = ["artifact.library", "artifact.init"]
    if missing:
        raise GCompileError(f"{path}: not a gcompile manifest (no {', '.join(missing)})")
    return manifest


_models = weakref.WeakSet()   # every Model of this process, for the fork handler below
_cuda = {"used": False, "forked": False}   # a cuda model was made here; this process is a fork of one that had


def _after_fork_in_child():
    """A forked child has only the forking thread: a model another thread was inside a call to would keep its
    lock held forever (the child hung at its next call), and its arena may hold part of that call. Each model
    gets a new lock; one that was in use is marked, and its calls say so. CUDA does not survive a fork: after
    one, cuda models (inherited or new) refuse with a message that says so (CUDA's own was 'initialization
    error', which gc_create explains as a crashed kernel's)."""
    _cuda["forked"] = _cuda["forked"] or _cuda["used"]
    for model in list(_models):
        if model._lock.acquire(blocking=False):
            model._lock.release()
        else:
            model._forked_mid_call = True
        model._lock = threading.RLock()


os.register_at_fork(after_in_child=_after_fork_in_child)


class Model:
    """A loaded program. `params` (all variables by name), `train_step(*inputs) -> loss`, `forward(*inputs)
    -> dict`, `predict(x) -> first output`, `time_steps(steps, which) -> seconds`, `save(path)`, `load(path)`,
    `close()`. One model may be shared by threads: its calls into the library take turns (the arena holds one
    batch), and close() waits for the call in progress. In a child forked while another thread was inside a
    call, the model's calls raise (load it again there); close() still frees it. CUDA does not survive a fork:
    in a forked child cuda models refuse every call, and close() there only forgets the model."""

    _forked_mid_call = False

    def __init__(self, artifact, initial: bool = True):
        self._lock = threading.RLock()
        _models.add(self)
        self.manifest = resolve(artifact)
        self._check_cuda_fork()
        _cuda["used"] = _cuda["used"] or self.manifest.get("target") == "cuda"
        if self.manifest.get("sanitize") and not sanitizer_runtime_loaded():
            raise GCompileError(f"{self.manifest['artifact']['library']}: built with sanitize=True; loading it into "
                                "a process without AddressSanitizer would abort it. Run its binary, or start Python "
                                "with LD_PRELOAD=$(c++ -print-file-name=libasan.so)")
        self.lib = open_library(self.manifest["artifact"]["library"], self.manifest.get("library_sha256"))
        self.variables = {v["name"]: v for v in self.manifest["variables"]}
        handle = ffi.new("gc_model**")
        self._check(self.lib.gc_create(handle), "gc_create")
        self.handle = handle[0]
        if initial:
            self.load(self.manifest["artifact"]["init"])

    def _check(self, rc: int, fn: str) -> None:
        if rc != 0:
            message = ffi.string(self.lib.gc_last_error()).decode(errors="replace")
            raise RuntimeFailure(message if message.startswith(f"{fn}:") else f"{fn}: {message}")

    def _check_cuda_fork(self):
        if _cuda["forked"] and self.manifest.get("target") == "cuda":
            raise GCompileError(f"model {self.manifest['name']!r}: this process was forked from one that used CUDA, "
                                f"which does not survive fork(): use cuda models in a process started another way "
                                f"(multiprocessing's 'spawn' or 'forkserver' start method)")

    def _live(self):
        if getattr(self, "handle", None) is None:
            raise GCompileError(f"model {self.manifest['name']!r} is closed")
        self._check_cuda_fork()
        if self._forked_mid_call:
            raise GCompileError(f"model {self.manifest['name']!r}: this process was forked while another thread "
                                f"was inside a call to it, so this copy of its memory may hold part of that call; "
                                f"load the model again in this process")
        return self.handle

    def _call(self, fn: str, *args) -> None:
        """lib.fn(handle, *args), raising on its error code, under the model's lock: one call into the
        library at a time (two threads' batches would share the arena), none after close()."""
        with self._lock:
            self._check(getattr(self.lib, fn)(self._live(), *args), fn)

    def _inputs(self, specs, values, fn):
        if len(values) != len(specs):
            names = [s["name"] for s in specs]
            raise GCompileError(f"{fn}: expected {len(specs)} inputs {names}, got {len(values)}")
        arrays = [check_feed(s["name"], s["shape"], s["dtype"], v) for s, v in zip(specs, values)]
        return arrays, ffi.new("void*[]", [ffi.from_buffer(a) for a in arrays] or [ffi.NULL])

    def train_step(self, *inputs) -> float:
        """One optimizer step on a batch; inputs in the order of manifest['train_inputs']. Returns the loss."""
        self._live()
        if not self.manifest["has_train_step"]:
            raise GCompileError(f"model {self.manifest['name']!r} has no training step")
        keep, ptrs = self._inputs(self.manifest["train_inputs"], inputs, "train_step")
        loss = ffi.new("double*")
        self._call("gc_train_step", ptrs, len(keep), loss)
        return float(loss[0])

    def forward(self, *inputs) -> dict[str, np.ndarray]:
        self._live()
        keep, ptrs = self._inputs(self.manifest["eval_inputs"], inputs, "forward")
        outs = [np.empty(o["shape"], dtype=o["dtype"]) for o in self.manifest["outputs"]]
        out_ptrs = ffi.new("void*[]", [ffi.from_buffer(o) for o in outs] or [ffi.NULL])
        self._call("gc_forward", ptrs, len(keep), out_ptrs, len(outs))
        return {o["name"]: arr for o, arr in zip(self.manifest["outputs"], outs)}

    def time_steps(self, steps: int, which: str = "train") -> float:
        """Seconds of device time for `steps` train (or eval) steps on the inputs already in the model — those
        of the last train_step / forward call (zeros before any) — replayed as the trainer replays them, after
        a warm-up. Train steps, the warm-up's included, update the parameters."""
        self._live()
        if which not in ("train", "eval"):
            raise GCompileError(f"time_steps: which must be 'train' or 'eval', not {which!r}")
        if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or not 1 <= steps <= 2**31 - 1:
            raise GCompileError(f"time_steps: steps must be a whole number in [1, 2^31 - 1], not {steps!r}")
        if which == "train" and not self.manifest["has_train_step"]:
            raise GCompileError(f"model {self.manifest['name']!r} has no training step")
        seconds = ffi.new("double*")
        self._call("gc_time_steps", 0 if which == "train" else 1, int(steps), seconds)
        return float(seconds[0])

    def predict(self, *inputs) -> np.ndarray:
        """The first output of forward(*inputs)."""
        if not self.manifest["outputs"]:
            raise GCompileError(f"predict: model {self.manifest['name']!r} has no outputs (give the Program "
                                "outputs={...})")
        return next(iter(self.forward(*inputs).values()))

    def get(self, name: str) -> np.ndarray:
        self._live()
        if name not in self.variables:
            raise GCompileError(f"no variable named {name!r}; known: {sorted(self.variables)}")
        v = self.variables[name]
        out = np.empty(v["shape"], dtype=v["dtype"])
        self._call("gc_get_variable", name.encode(), ffi.from_buffer(out), out.nbytes)
        return out

    def set(self, name: str, value) -> None:
        self._live()
        if name not in self.variables:
            raise GCompileError(f"no variable named {name!r}; known: {sorted(self.variables)}")
        v = self.variables[name]
        arr = check_feed(name, v["shape"], v["dtype"], value, what="value for variable")
        self._call("gc_set_variable", name.encode(), ffi.from_buffer(arr), arr.nbytes)

    @property
    def params(self) -> Mapping[str, np.ndarray]:
        """Every variable's value now, by name: a read-only snapshot (writing into it raises rather than
        changing nothing); `set(name, value)` changes a variable."""
        snapshot = {}
        with self._lock:   # one step's values, not some from before another thread's step and some after
            for name in self.variables:
                snapshot[name] = self.get(name)
                snapshot[name].flags.writeable = False
        return MappingProxyType(snapshot)

    def save(self, path) -> None:
        """Write every variable and the trainer's position to a checkpoint, atomically."""
        self._call("gc_save", c_path(path))

    def load(self, path) -> None:
        """Load a checkpoint of this program; a bad file raises and leaves the model unchanged."""
        self._call("gc_load", c_path(path))

    def check_file(self, kind: str, path) -> None:
        """Check a file as the trainer would read it, without loading it: kind "checkpoint" (a checkpoint of
        this program) or "train" / "valid" / "test" (that split of the dataset in folder `path`, against the
        program's input shape and classes). Raises DataError with the reader's message."""
        if kind not in ("checkpoint", "train", "valid", "test"):
            raise GCompileError(f"check_file: unknown kind {kind!r}; expected checkpoint, train, valid or test")
        if self.lib.gc_check_file(kind.encode(), c_path(path)) != 0:
            raise DataError(ffi.string(self.lib.gc_last_error()).decode(errors="replace"))

    def close(self) -> None:
        """Free the model (after the call another thread has in progress, if any); calls after it raise."""
        if getattr(self, "_lock", None) is None:   # __init__ failed before anything was made
            return
        with self._lock:
            if getattr(self, "handle", None) is not None:
                if not (_cuda["forked"] and self.manifest.get("target") == "cuda"):   # (no CUDA call after a fork)
                    self.lib.gc_destroy(self.handle)
                self.handle = None

    __del__ = close

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def c_path(path) -> bytes:
    try:
        raw = os.fsencode(checked_path(path))
    except UnicodeEncodeError as e:
        raise GCompileError(f"path {path!r} cannot be encoded for the file system: {e.reason}") from None
    if b"\0" in raw:
        raise GCompileError(f"path {path!r} contains a NUL byte")
    return raw


def sanitizer_runtime_loaded() -> bool:
    """Whether AddressSanitizer's runtime is in this process (LD_PRELOAD), which a sanitize=True library needs."""
    try:
        return "libasan" in Path("/proc/self/maps").read_text()
    except OSError:
        return False


def load(artifact, initial: bool = True) -> Model:
    return Model(artifact, initial)
