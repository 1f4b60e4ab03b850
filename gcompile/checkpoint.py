"""The checkpoint format, read and written from Python (runtime/gc_checkpoint.h is the C side).

    magic "GCKPT\\0\\0\\0" | u32 version | u32 tensor count | u64 layout hash
    u64 step | u64 epoch | u64 epoch step | u64 seed | u64 shuffle | u64 batch | f64 loss sum
                                               (the trainer's position; version 2, still read, has no batch)
    per tensor: u16 name length | name | u8 dtype | u8 ndim | u64 dims[ndim] | u64 byte count | bytes
    u32 CRC-32 (zlib's) of everything before it             (little endian)

A checkpoint holds every variable of its program (parameters, optimizer state, learning rate, the step
counter, the guard's state). `read_checkpoint` (public as `gc.read_checkpoint`) returns them as numpy
arrays without any compiled program, and checks the file as strictly as the C loader: a bad file raises
DataError naming the file, the byte and the problem. `write_checkpoint` writes atomically (temporary file
in the same directory, fsync, rename), so an existing checkpoint is never replaced by a partial one.
"""
from __future__ import annotations

import errno
import math
import os
import struct
import zlib
from dataclasses import dataclass, field

import numpy as np

from .errors import DataError, GCompileError
from .graph import MAX_NDIM
from .resources import read_regular_file, write_atomically

MAGIC = b"GCKPT\0\0\0"
VERSION = 3
HEADER = struct.Struct("<8sIIQQQQQQQd")  # magic .. loss sum: 80 bytes
HEADER_V2 = struct.Struct("<8sIIQQQQQQd")  # without the batch: 72 bytes
DTYPES = {0: "uint8", 1: "int32", 2: "float32", 3: "int64", 4: "float64"}
CODES = {v: k for k, v in DTYPES.items()}
FNV_SEED, FNV_PRIME = 0xCBF29CE484222325, 0x100000001B3


def fnv1a(data: bytes, h: int = FNV_SEED) -> int:
    """FNV-1a 64 of `data` (the layout hash the generated program embeds as GC_LAYOUT_HASH)."""
    for byte in data:
        h = ((h ^ byte) * FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return h


def layout_hash(variables) -> int:
    """Identifies a program's variable layout: names, dtypes and shapes, sorted by name."""
    ordered = sorted(variables, key=lambda v: v.name)
    text = "".join(f"{v.name}:{v.dtype}:{','.join(map(str, v.shape))};" for v in ordered)
    return fnv1a(text.encode())


@dataclass
class Checkpoint:
    """tensors: every variable by name. step: training steps run in all; epoch: epochs finished; epoch_step:
    steps into the next epoch; seed, shuffle: the data order; loss_sum: the epoch's losses so far; batch: the
    batch size of the program that wrote it (0: not recorded), which a resumed run must have."""
    tensors: dict[str, np.ndarray]
    layout_hash: int
    step: int = 0
    epoch: int = 0
    epoch_step: int = 0
    seed: int = 0
    shuffle: bool = True
    loss_sum: float = 0.0
    batch: int = 0
    path: str = field(default="")


def encode(ckpt: Checkpoint) -> bytes:
    parts = [HEADER.pack(MAGIC, VERSION, len(ckpt.tensors), ckpt.layout_hash, ckpt.step, ckpt.epoch,
                         ckpt.epoch_step, ckpt.seed, int(ckpt.shuffle), ckpt.batch, ckpt.loss_sum)]
    for name, arr in ckpt.tensors.items():
        arr = np.asarray(arr, order="C")
        if arr.dtype.name not in CODES:
            raise DataError(f"checkpoint: cannot store {arr.dtype.name} (tensor {name!r}); checkpoints hold "
                            f"{', '.join(CODES)}")
        raw = name.encode()
        parts += [struct.pack("<H", len(raw)), raw, struct.pack("<BB", CODES[arr.dtype.name], arr.ndim),
                  struct.pack(f"<{arr.ndim}Q", *arr.shape), struct.pack("<Q", arr.nbytes), arr.tobytes()]
    body = b"".join(parts)
    return body + struct.pack("<I", zlib.crc32(body))


def write_checkpoint(path, ckpt: Checkpoint) -> None:
    """Write ckpt to path atomically. Through symbolic links it replaces the file they end at, not a link (as
    the C runtime's saves do); it refuses a loop of links and anything but a regular file there (a folder; a
    device or fifo, which the rename would replace)."""
    data = encode(ckpt)
    path = os.fsdecode(checked_path(path))
    try:
        os.path.realpath(path, strict=True)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise DataError(f"{path}: a loop of symbolic links (or too many of them)") from None
    target = os.path.realpath(path)   # a chain of links that ends nowhere yet: the file it names
    if os.path.exists(target) and not os.path.isfile(target):
        raise DataError(f"{path}: {'a folder' if os.path.isdir(target) else 'a device, fifo or socket'}, not a "
                        "regular file: a checkpoint is not written there")
    write_atomically(target, lambda f: f.write(data), prefix=os.path.basename(target) + ".")


def checked_path(path):
    """path, if it is a str, bytes or os.PathLike (a file's name), else a GCompileError naming its type."""
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise GCompileError(f"a path must be a str, bytes or os.PathLike, not {type(path).__name__}")
    return path


def read_checkpoint(path) -> Checkpoint:
    """Every tensor of a checkpoint file as numpy arrays, with the trainer's position; no compiled program
    needed. Raises DataError for anything but a complete, uncorrupted checkpoint of this format version."""
    path = checked_path(path)   # open() would take an int as a file descriptor, and close it
    try:
        data = read_regular_file(path)
    except OSError as e:
        raise DataError(f"{path}: cannot read checkpoint: {e.strerror}") from None
    return decode(data, str(path))


def decode(data: bytes, path: str = "<bytes>") -> Checkpoint:
    if data[:8] != MAGIC:
        raise DataError(f"{path}: bytes 0-7: not a gcompile checkpoint")
    if len(data) < 16:
        raise DataError(f"{path}: {len(data)} bytes is too short for a checkpoint")
    (stored,) = struct.unpack_from("<I", data, len(data) - 4)
    if zlib.crc32(memoryview(data)[:-4]) != stored:
        raise DataError(f"{path}: checksum mismatch over its {len(data)} bytes (corrupted or truncated file)")
    (version,) = struct.unpack_from("<I", data, 8)
    if version not in (2, VERSION):
        raise DataError(f"{path}: checkpoint format version {version}, this gcompile reads versions 2 and {VERSION}")
    at, end, tensors = 0, len(data) - 4, {}

    def take(fmt, what):
        nonlocal at
        size = struct.calcsize(fmt)
        if at + size > end:
            raise DataError(f"{path}: truncated at byte {at} while reading {what}")
        values = struct.unpack_from(fmt, data, at)
        at += size
        return values

    if version == 2:
        _, _, count, lhash, step, epoch, epoch_step, seed, shuffle, loss_sum = take(HEADER_V2.format, "header")
        batch = 0
    else:
        _, _, count, lhash, step, epoch, epoch_step, seed, shuffle, batch, loss_sum = take(HEADER.format, "header")
    for _ in range(count):
        start = at
        (length,) = take("<H", "name length")
        name = bytes(take(f"<{length}s", "name")[0]).decode(errors="replace")
        code, ndim = take("<BB", "dtype")
        if ndim > MAX_NDIM:   # no variable has more (numpy could not even hold some counts)
            raise DataError(f"{path}: byte {start}: tensor {name!r}: {ndim} dimensions, at most {MAX_NDIM}")
        dims = take(f"<{ndim}Q", "dims")
        (nbytes,) = take("<Q", "byte count")
        if code not in DTYPES:
            raise DataError(f"{path}: byte {start}: tensor {name!r}: unknown dtype code {code}")
        if name in tensors:
            raise DataError(f"{path}: byte {start}: tensor {name!r} appears twice")
        dtype = np.dtype(DTYPES[code])
        if nbytes != math.prod(dims) * dtype.itemsize:
            raise DataError(f"{path}: byte {start}: tensor {name!r}: byte count {nbytes} does not match its shape "
                            f"{dims} of {dtype.name}")
        if nbytes > end - at:
            raise DataError(f"{path}: tensor {name!r} truncated at byte {at}")
        tensors[name] = np.frombuffer(data, dtype=dtype, count=nbytes // dtype.itemsize, offset=at).reshape(dims).copy()
        at += nbytes
    if at != end:
        raise DataError(f"{path}: {end - at} unexpected bytes after the last tensor at byte {at}")
    return Checkpoint(tensors, lhash, step, epoch, epoch_step, seed, bool(shuffle), loss_sum, batch, path)
