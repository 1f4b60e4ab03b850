"""The checkpoint format, read and written from Python (runtime/gc_checkpoint.h is the C side).

    magic "GCKPT\\0\\0\\0" | u32 version | u32 tensor count | u64 layout hash | u64 step | u64 epoch | u64 rng
    per tensor: u16 name length | name | u8 dtype | u8 ndim | u64 dims[ndim] | u64 byte count | bytes
    u32 CRC-32 (zlib's) of everything before it             (little endian)

`read_checkpoint` returns the parameters as numpy arrays without any compiled program; `write_checkpoint`
writes atomically (temporary file in the same directory, fsync, rename).
"""
from __future__ import annotations

import os
import struct
import tempfile
import zlib
from dataclasses import dataclass, field

import numpy as np

from .errors import DataError

MAGIC = b"GCKPT\0\0\0"
VERSION = 1
DTYPES = {0: "uint8", 1: "int32", 2: "float32", 3: "int64", 4: "float64"}
CODES = {v: k for k, v in DTYPES.items()}
FNV_SEED, FNV_PRIME = 0xCBF29CE484222325, 0x100000001B3


def fnv1a(data: bytes, h: int = FNV_SEED) -> int:
    """FNV-1a 64, as the C runtime's gc_fnv1a (used for the short layout-hash text only)."""
    for byte in data:
        h = ((h ^ byte) * FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return h


def layout_hash(variables) -> int:
    """Identifies a program's variable layout: names, dtypes and shapes, sorted by name."""
    text = "".join(f"{v.name}:{v.dtype}:{','.join(map(str, v.shape))};" for v in sorted(variables, key=lambda v: v.name))
    return fnv1a(text.encode())


@dataclass
class Checkpoint:
    tensors: dict[str, np.ndarray]
    layout_hash: int
    step: int = 0
    epoch: int = 0
    rng: int = 0
    path: str = field(default="")


def encode(ckpt: Checkpoint) -> bytes:
    parts = [MAGIC, struct.pack("<II", VERSION, len(ckpt.tensors)),
             struct.pack("<QQQQ", ckpt.layout_hash, ckpt.step, ckpt.epoch, ckpt.rng)]
    for name, arr in ckpt.tensors.items():
        arr = np.asarray(arr, order="C")
        raw = name.encode()
        parts += [struct.pack("<H", len(raw)), raw, struct.pack("<BB", CODES[arr.dtype.name], arr.ndim),
                  struct.pack(f"<{arr.ndim}Q", *arr.shape), struct.pack("<Q", arr.nbytes), arr.tobytes()]
    body = b"".join(parts)
    return body + struct.pack("<I", zlib.crc32(body))


def write_checkpoint(path, ckpt: Checkpoint) -> None:
    data = encode(ckpt)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_checkpoint(path) -> Checkpoint:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise DataError(f"{path}: cannot read checkpoint: {e.strerror}") from None
    if len(data) < 52:
        raise DataError(f"{path}: {len(data)} bytes is too short for a checkpoint")
    if data[:8] != MAGIC:
        raise DataError(f"{path}: bytes 0-7: not a gcompile checkpoint")
    (stored,) = struct.unpack_from("<I", data, len(data) - 4)
    if zlib.crc32(memoryview(data)[:-4]) != stored:
        raise DataError(f"{path}: checksum mismatch (corrupted or truncated file)")
    version, count = struct.unpack_from("<II", data, 8)
    if version != VERSION:
        raise DataError(f"{path}: checkpoint format version {version}, this gcompile reads version {VERSION}")
    lhash, step, epoch, rng = struct.unpack_from("<QQQQ", data, 16)
    at, end, tensors = 48, len(data) - 4, {}

    def take(fmt, what):
        nonlocal at
        size = struct.calcsize(fmt)
        if at + size > end:
            raise DataError(f"{path}: truncated at byte {at} while reading {what}")
        values = struct.unpack_from(fmt, data, at)
        at += size
        return values

    for _ in range(count):
        (length,) = take("<H", "name length")
        name = bytes(take(f"<{length}s", "name")[0]).decode(errors="replace")
        code, ndim = take("<BB", "dtype")
        if code not in DTYPES:
            raise DataError(f"{path}: tensor {name}: unknown dtype code {code} at byte {at - 2}")
        dims = take(f"<{ndim}Q", "dims")
        (nbytes,) = take("<Q", "byte count")
        dtype = np.dtype(DTYPES[code])
        if nbytes != int(np.prod(dims, dtype=np.int64)) * dtype.itemsize or at + nbytes > end:
            raise DataError(f"{path}: tensor {name}: byte count {nbytes} does not match its shape {dims} or the file")
        tensors[name] = np.frombuffer(data, dtype=dtype, count=nbytes // dtype.itemsize, offset=at).reshape(dims).copy()
        at += nbytes
    return Checkpoint(tensors, lhash, step, epoch, rng, str(path))
