"""What the reliability tests share: a small trainable program, synthetic datasets in the trainer's format,
and running the standalone binary."""
from __future__ import annotations

import gzip
import io
import os
import struct
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest

import gcompile as gc
from gcompile import checkpoint as ck

FEATURES, CLASSES, BATCH = 6, 3, 4


def small_program(batch=BATCH, momentum=0.9, lr=0.1, positive=False) -> gc.Program:
    """A 6-5-3 ReLU MLP with momentum (so optimizer state exists); inputs x (batch, 6) and y (batch,).
    positive=True: W1 in [0.2, 1], so an image of 3e38s overflows the first layer however it is summed."""
    r = np.random.RandomState(5)
    x = gc.placeholder("x", (batch, FEATURES))
    y = gc.placeholder("y", (batch,), dtype="int32")
    w1 = r.uniform(0.2, 1.0, (FEATURES, 5)) if positive else r.normal(0, 0.5, (FEATURES, 5))
    W1 = gc.variable("W1", init=w1.astype(np.float32))
    b1 = gc.variable("b1", init=np.zeros(5, np.float32))
    W2 = gc.variable("W2", init=r.normal(0, 0.5, (5, CLASSES)).astype(np.float32))
    logits = gc.relu(x @ W1 + b1) @ W2
    loss = gc.softmax_cross_entropy(logits, y)
    return gc.Program(loss, [W1, b1, W2], gc.SGD(lr=lr, momentum=momentum), outputs={"logits": logits},
                      name="small")


def write_split(folder: Path, split: str, images: np.ndarray, labels: np.ndarray) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / f"{split}_images.npy", images)
    np.save(folder / f"{split}_labels.npy", labels)


def synthetic_dataset(folder: Path, n_train=40, n_valid=12, seed=0, features=FEATURES, classes=CLASSES,
                      dtype=np.uint8) -> Path:
    """train and valid splits as `gcompile data` writes them: uint8 (or float32) images (N, features),
    uint8 labels."""
    r = np.random.RandomState(seed)
    for split, n in (("train", n_train), ("valid", n_valid)):
        images = r.randint(0, 256, (n, features))
        write_split(folder, split, images.astype(dtype), r.randint(0, classes, n).astype(np.uint8))
    return folder


def run_binary(artifact, *args, timeout=300, check=None) -> subprocess.CompletedProcess:
    """Run the artifact's binary; `check` = the exit status it must return (stderr shown if not)."""
    proc = subprocess.run([artifact.binary, *map(str, args)], capture_output=True, text=True, timeout=timeout)
    if check is not None:
        assert proc.returncode == check, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def poisoned_dataset(folder, bad_example):
    """float32 images; one example holds 3e38s (finite, so the dataset is valid) and overflows its step in a
    program with positive first-layer weights."""
    synthetic_dataset(folder, n_train=24, n_valid=8, dtype=np.float32)
    images = np.load(folder / "train_images.npy") / np.float32(256)
    images[bad_example] = 3e38
    write_split(folder, "train", images, np.load(folder / "train_labels.npy"))
    return folder


# --- bad dataset files: test_validation.py checks each message, tests/fuzz_corpus holds them as seeds ------
def npy_bytes(array, header_edit=None) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    data = buffer.getvalue()
    if header_edit:
        old, new = header_edit
        data = data.replace(old, new.ljust(len(old)), 1)
    return data


def idx_bytes(array, code=0x08) -> bytes:
    return bytes([0, 0, code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape) + array.tobytes()


IMAGES = np.arange(40 * FEATURES, dtype=np.uint8).reshape(40, FEATURES)
LABELS = (np.arange(40) % CLASSES).astype(np.uint8)
NAN_IMAGES = IMAGES.astype(np.float32)
NAN_IMAGES[2, 3] = np.nan

DATASET_CASES = {  # name: (file -> bytes to write over it, message regex)
    "bad magic": ({"train_images.npy": b"GARBAGE!" * 8}, r"train_images.npy: bytes 0-5: neither a .npy file nor an "
                                                         r"IDX file"),
    "gzip": ({"train_images.npy": gzip.compress(npy_bytes(IMAGES))}, r"gzip-compressed; decompress it"),
    "unsupported dtype": ({"train_images.npy": npy_bytes(IMAGES.astype(np.int16))},
                          r"unsupported dtype '<i2' \(need uint8"),
    "big endian": ({"train_images.npy": npy_bytes(IMAGES.astype(">f4"))}, r"unsupported dtype '>f4'"),
    "integer images": ({"train_images.npy": npy_bytes(IMAGES.astype(np.int32))},
                       r"images must be uint8 or float32, not int32"),
    "float labels": ({"train_labels.npy": npy_bytes(LABELS.astype(np.float32))},
                     r"train_labels.npy: labels must be integers, not float32"),
    "fortran order": ({"train_images.npy": npy_bytes(np.asfortranarray(IMAGES))},
                      r"only C-order arrays are supported"),
    "version byte": ({"train_images.npy": npy_bytes(IMAGES)[:6] + b"\x07" + npy_bytes(IMAGES)[7:]},
                     r"byte 6: unsupported .npy format version 7"),
    "truncated": ({"train_images.npy": npy_bytes(IMAGES)[:-5]},
                  r"expected 240 data bytes after the header at byte 128, found 235 \(truncated or corrupt\)"),
    "extra bytes": ({"train_labels.npy": npy_bytes(LABELS) + b"\0"}, r"expected 40 data bytes .* found 41"),
    "header past the end": ({"train_images.npy": npy_bytes(IMAGES)[:60]}, r"header of 118 bytes runs past the end"),
    "count mismatch": ({"train_labels.npy": npy_bytes(LABELS[:39])},
                       r"train_labels.npy: expected 40 labels \(one per image in .*train_images.npy\), got 39"),
    "label out of range": ({"train_labels.npy": npy_bytes(np.where(np.arange(40) == 5, 3, LABELS).astype(np.uint8))},
                           r"label 3 at index 5 is outside \[0, 3\)"),
    "negative label": ({"train_labels.npy": npy_bytes(np.where(np.arange(40) == 7, -1, LABELS.astype(np.int32)))},
                       r"label -1 at index 7 is outside \[0, 3\)"),
    "image shape": ({"train_images.npy": npy_bytes(np.zeros((40, 7), np.uint8))},
                    r"expected images of 6 values each \(the program's input\), got shape with 40 examples of 7 "
                    r"values"),
    "no examples": ({"train_images.npy": npy_bytes(np.zeros((0, 6), np.uint8)),
                     "train_labels.npy": npy_bytes(np.zeros(0, np.uint8))}, r"train_images.npy: no examples"),
    "shape overflow": ({"train_images.npy": npy_bytes(IMAGES, (b"(40, 6)", b"(4294967296, 4294967296)"))},
                       r"the header's shape has more than 2\^40 elements"),
    "shape garbage": ({"train_images.npy": npy_bytes(IMAGES, (b"(40, 6)", b"(40, x)"))},
                      r".npy header byte 55: a dimension of 'shape' is not a whole number \(the header must be the "
                      r"dict numpy writes\)"),
    "shape not a tuple": ({"train_labels.npy": npy_bytes(LABELS, (b"(40,)", b"(40)"))},
                          r"a 1-dimensional 'shape' needs a comma"),
    "extra key": ({"train_images.npy": npy_bytes(IMAGES, (b"'shape'", b"'shapes'"))}, r"header byte 41: unexpected key"),
    "text after the dict": ({"train_images.npy": npy_bytes(IMAGES, (b"}", b"} x"))},
                            r"unexpected text after the dict"),
    "minor version": ({"train_images.npy": npy_bytes(IMAGES)[:7] + b"\x01" + npy_bytes(IMAGES)[8:]},
                      r"byte 7: unsupported .npy format version 1.1"),
    "non-finite image": ({"train_images.npy": npy_bytes(NAN_IMAGES)},
                         r"image 2 holds the non-finite value nan at position 3"),
    "idx element type": ({"train_images.npy": idx_bytes(IMAGES.astype(">f4"), 0x0D)},
                         r"byte 2: IDX element type 0x0d is not supported"),
    "idx dimensions": ({"train_images.npy": b"\0\0\x08\x09" + b"\0" * 40}, r"byte 3: bad IDX dimension count 9"),
    "idx truncated": ({"train_images.npy": idx_bytes(IMAGES)[:-1]}, r"expected 240 data bytes after the header"),
    "missing labels": ({"train_labels.npy": None}, r"train_labels.npy: cannot open: No such file"),
    "a folder": ({"train_labels.npy": "dir"}, r"train_labels.npy: not a regular file"),
    # opening a fifo to read waits for a writer: the readers hung on one before they opened without blocking
    "a fifo of labels": ({"train_labels.npy": "fifo"}, r"train_labels.npy: not a regular file"),
    "a fifo of images": ({"train_images.npy": "fifo"}, r"train_images.npy: not a regular file"),
}


def damaged_dataset(folder, case):
    synthetic_dataset(folder, n_train=40, n_valid=8)
    write_split(folder, "train", IMAGES, LABELS)
    for name, content in DATASET_CASES[case][0].items():
        (folder / name).unlink()
        if content == "dir":
            (folder / name).mkdir()
        elif content == "fifo":
            os.mkfifo(folder / name)
        elif content is not None:
            (folder / name).write_bytes(content)
    return folder



# --- bad checkpoints of small_program: test_checkpoint.py checks each message; corpus seeds too ------------
def resealed(body: bytes) -> bytes:
    """`body` (all but the CRC) with a correct CRC, so that only the problem under test remains."""
    return body + struct.pack("<I", zlib.crc32(body))


def crafted(model, change) -> bytes:
    """A checkpoint of the model's program after `change(tensors)`, sealed with the right layout hash."""
    tensors = dict(model.params)
    change(tensors)
    return ck.encode(ck.Checkpoint(tensors, int(model.manifest["layout_hash"], 16)))


def as_version_2(data: bytes) -> bytes:
    """A checkpoint of the current format (3) as format 2 wrote it: the same, without the batch."""
    head = ck.HEADER.unpack_from(data)
    return resealed(ck.HEADER_V2.pack(ck.MAGIC, 2, *head[2:9], head[10]) + data[ck.HEADER.size:-4])


def with_version(model, version: int) -> bytes:
    good = bytearray(crafted(model, lambda t: None)[:-4])
    good[8:12] = struct.pack("<I", version)
    return resealed(bytes(good))


BAD_CHECKPOINTS = {  # name: (bytes given the model, the message, as a regex)
    "empty": (lambda m: b"", r"bytes 0-7: not a gcompile checkpoint"),
    "not a checkpoint": (lambda m: b"\x93NUMPY\x01\x00" + b"x" * 100, r"bytes 0-7: not a gcompile checkpoint"),
    "magic only": (lambda m: b"GCKPT\0\0\0", r"8 bytes is too short for a checkpoint"),
    "truncated": (lambda m: crafted(m, lambda t: None)[:-37], r"checksum mismatch over its \d+ bytes \(corrupted or "
                                                              r"truncated file\)"),
    "flipped byte": (lambda m: flip(crafted(m, lambda t: None), 200), r"checksum mismatch"),
    "version 1": (lambda m: with_version(m, 1), r"checkpoint format version 1, this (program|gcompile) reads "
                                                r"versions 2 and 3"),
    "version 99": (lambda m: with_version(m, 99), r"format version 99"),
    "another program": (lambda m: ck.encode(ck.Checkpoint(dict(m.params), 1234)),
                        r"(written by a different program \(parameter layout hash 00000000000004d2|layout)"),
    "missing variable": (lambda m: crafted(m, lambda t: t.pop("W1.velocity")), r"'W1.velocity' is missing"),
    "unknown variable": (lambda m: crafted(m, lambda t: t.update(extra=np.zeros(2, np.float32))),
                         r"'extra' is not a variable of this program"),
    "another shape": (lambda m: crafted(m, lambda t: t.update(W2=np.zeros((3, 5), np.float32))),
                      r"'W2' is float32 \(3, 5\) in the file, float32 \(\d+, \d+\) in this program"),
    "another dtype": (lambda m: crafted(m, lambda t: t.update(step=np.zeros((), np.float32))),
                      r"'step' is float32 \(\) in the file, int32 \(\) in this program"),
    "another program's dtypes": (
        lambda m: ck.encode(ck.Checkpoint({k: v.astype(np.float64) if v.dtype == np.float32 else v
                                           for k, v in m.params.items()}, 1234)),
        r"written by a different program \(parameter layout hash 00000000000004d2, this program's is [0-9a-f]{16}\): "
        r"byte \d+: tensor '\S+' is float64 \(\d+(, \d+)?,?\) in the file, float32 \(\d+(, \d+)?,?\) in this program"),
    "trailing bytes": (lambda m: resealed(crafted(m, lambda t: None)[:-4] + b"\0" * 5),
                       r"5 unexpected bytes after the last tensor"),
}


def flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x40]) + data[at + 1:]


# --- fixtures shared by test_checkpoint.py and test_validation.py (imported there) ------------------------

@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    return gc.compile(small_program(), target="cpu", out_dir=tmp_path_factory.mktemp("small"))


@pytest.fixture
def model(artifact):
    with gc.load(artifact) as m:
        yield m
