"""Checkpoints: the format read and written from Python and from C, optimizer state included, every way a
file can be wrong (each with its message, from both readers), and atomic writes."""
import os
import stat
import struct
import threading
from pathlib import Path

import numpy as np
import pytest

import gcompile as gc
from gcompile import checkpoint as ck
from gcompile import data as gcdata
from reliability import artifact, model  # noqa: F401 - pytest fixtures
from reliability import BAD_CHECKPOINTS, BATCH, CLASSES, FEATURES, as_version_2, resealed, small_program


def batches(n, seed=0):
    r = np.random.RandomState(seed)
    return [(r.uniform(0, 1, (BATCH, FEATURES)).astype(np.float32), r.randint(0, CLASSES, BATCH).astype(np.int32))
            for _ in range(n)]


def test_read_checkpoint_is_public_and_documented():
    assert gc.read_checkpoint is ck.read_checkpoint and gc.write_checkpoint is ck.write_checkpoint
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert "gc.read_checkpoint(" in readme


def test_read_checkpoint_takes_paths_only(tmp_path):
    """An int would be taken by open() as a file descriptor, and closed after."""
    with pytest.raises(gc.GCompileError, match="a path must be a str, bytes or os.PathLike, not int"):
        gc.read_checkpoint(1)


def test_save_holds_every_variable_and_the_position(model, tmp_path):
    for x, y in batches(3):
        model.train_step(x, y)
    model.save(tmp_path / "a.ckpt")
    saved = gc.read_checkpoint(tmp_path / "a.ckpt")
    names = {v["name"] for v in model.manifest["variables"]}
    assert set(saved.tensors) == names
    assert {"W1.velocity", "b1.velocity", "W2.velocity", "lr", "step", "guard.skip"} <= names  # not only params
    for name, value in model.params.items():
        assert saved.tensors[name].dtype == value.dtype
        np.testing.assert_array_equal(saved.tensors[name], value)
    assert saved.step == 3 and saved.tensors["step"] == 3 and saved.layout_hash == int(model.manifest["layout_hash"], 16)


def test_resuming_from_a_checkpoint_continues_bit_for_bit(artifact, tmp_path):
    """Momentum buffers are saved: 3 steps, save, 3 more == load into a fresh model, the same 3 more."""
    data = batches(6, seed=1)
    with gc.load(artifact) as first:
        for x, y in data[:3]:
            first.train_step(x, y)
        first.save(tmp_path / "mid.ckpt")
        for x, y in data[3:]:
            first.train_step(x, y)
        want = first.params
    with gc.load(artifact) as second:
        second.load(tmp_path / "mid.ckpt")
        for x, y in data[3:]:
            second.train_step(x, y)
        got = second.params
    for name in want:
        assert got[name].tobytes() == want[name].tobytes(), name


def test_python_and_c_write_the_same_bytes(model, tmp_path):
    model.train_step(*batches(1)[0])
    model.save(tmp_path / "c.ckpt")
    from_c = gc.read_checkpoint(tmp_path / "c.ckpt")
    gc.write_checkpoint(tmp_path / "py.ckpt", from_c)
    assert (tmp_path / "py.ckpt").read_bytes() == (tmp_path / "c.ckpt").read_bytes()
    changed = gc.read_checkpoint(tmp_path / "py.ckpt")
    changed.tensors["W2"] = changed.tensors["W2"] + np.float32(1)
    gc.write_checkpoint(tmp_path / "py.ckpt", changed)
    model.load(tmp_path / "py.ckpt")
    np.testing.assert_array_equal(model.get("W2"), changed.tensors["W2"])


# --- bad files: every reader names the file and the problem; a failed load changes nothing --------------
@pytest.mark.parametrize("case", sorted(BAD_CHECKPOINTS))
def test_bad_checkpoints_are_refused_by_both_readers(model, tmp_path, case):
    make, message = BAD_CHECKPOINTS[case]
    path = tmp_path / "bad.ckpt"
    path.write_bytes(make(model))
    before = model.params
    with pytest.raises(gc.RuntimeFailure, match=f"gc_load: {path}: .*{message}"):
        model.load(path)
    with pytest.raises(gc.DataError, match=f"{path}: .*{message}"):
        model.check_file("checkpoint", path)
    for name, value in model.params.items():   # a refused file leaves the model as it was
        np.testing.assert_array_equal(value, before[name])
    python_only = {"another program", "missing variable", "unknown variable", "another shape", "another dtype",
                   "another program's dtypes"}
    if case not in python_only:    # read_checkpoint knows no program, so it checks the file's own consistency
        with pytest.raises(gc.DataError, match=f"{path}: .*{message}"):
            gc.read_checkpoint(path)


def test_python_reader_checks_the_files_own_consistency(tmp_path):
    tensors = {"a": np.arange(6, dtype=np.float32).reshape(2, 3)}
    body = bytearray(ck.encode(ck.Checkpoint(tensors, 7))[:-4])
    nbytes_at = ck.HEADER.size + 2 + 1 + 2 + 16
    body[nbytes_at:nbytes_at + 8] = struct.pack("<Q", 20)
    (tmp_path / "a.ckpt").write_bytes(resealed(bytes(body)))
    with pytest.raises(gc.DataError, match=rf"byte {ck.HEADER.size}: tensor 'a': byte count 20 does not match its "
                                           r"shape \(2, 3\) of float32"):
        gc.read_checkpoint(tmp_path / "a.ckpt")
    twice = ck.encode(ck.Checkpoint(tensors, 7))[:-4]
    twice = twice[:12] + struct.pack("<I", 2) + twice[16:] + twice[ck.HEADER.size:]
    (tmp_path / "b.ckpt").write_bytes(resealed(twice))
    with pytest.raises(gc.DataError, match=r"tensor 'a' appears twice"):
        gc.read_checkpoint(tmp_path / "b.ckpt")
    deep = ck.encode(ck.Checkpoint({"d": np.zeros((1,) * 9, dtype=np.float32)}, 7))   # a fuzzer's header said 50
    (tmp_path / "c.ckpt").write_bytes(deep)
    with pytest.raises(gc.DataError, match=rf"c.ckpt: byte {ck.HEADER.size}: tensor 'd': 9 dimensions, at most 8"):
        gc.read_checkpoint(tmp_path / "c.ckpt")


def test_version_2_files_are_still_read(model, tmp_path):
    """Format 2 is format 3 without the batch in the header: both readers take it (batch 0: not recorded)."""
    model.train_step(*batches(1)[0])
    model.save(tmp_path / "v3.ckpt")
    head = ck.HEADER.unpack_from((tmp_path / "v3.ckpt").read_bytes())
    assert head[1] == 3 and head[9] == BATCH   # version, batch
    (tmp_path / "v2.ckpt").write_bytes(as_version_2((tmp_path / "v3.ckpt").read_bytes()))
    old, new = gc.read_checkpoint(tmp_path / "v2.ckpt"), gc.read_checkpoint(tmp_path / "v3.ckpt")
    assert (old.batch, new.batch, old.step, old.layout_hash) == (0, BATCH, 1, new.layout_hash)
    assert old.tensors.keys() == new.tensors.keys()
    assert all(old.tensors[n].tobytes() == new.tensors[n].tobytes() for n in new.tensors)
    before = model.params
    model.train_step(*batches(1)[0])
    model.load(tmp_path / "v2.ckpt")
    for name, value in model.params.items():
        np.testing.assert_array_equal(value, before[name])


def test_saving_through_a_link_replaces_the_file_it_names(model, tmp_path):
    """Not the link; and a device or fifo at the path is refused rather than replaced by a plain file."""
    (tmp_path / "real").mkdir()
    (tmp_path / "link.ckpt").symlink_to("real/file.ckpt")   # dangling until the first save
    model.save(tmp_path / "link.ckpt")
    gc.write_checkpoint(tmp_path / "plink.ckpt", gc.read_checkpoint(tmp_path / "link.ckpt"))
    (tmp_path / "plink2.ckpt").symlink_to(tmp_path / "plink.ckpt")
    gc.write_checkpoint(tmp_path / "plink2.ckpt", gc.read_checkpoint(tmp_path / "real" / "file.ckpt"))
    assert (tmp_path / "link.ckpt").is_symlink() and (tmp_path / "plink2.ckpt").is_symlink()
    assert (tmp_path / "real" / "file.ckpt").read_bytes() == (tmp_path / "plink.ckpt").read_bytes()
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(gc.RuntimeFailure, match=r"fifo: a device, fifo or socket, not a regular file"):
        model.save(tmp_path / "fifo")
    with pytest.raises(gc.DataError, match=r"fifo: a device, fifo or socket, not a regular file"):
        gc.write_checkpoint(tmp_path / "fifo", gc.read_checkpoint(tmp_path / "plink.ckpt"))
    assert not (tmp_path / "fifo").is_file()


def test_chains_and_loops_of_links(model, tmp_path):
    """A chain of links that ends nowhere yet names its last file, for C and Python alike; a loop is refused."""
    (tmp_path / "real").mkdir()
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "l2").symlink_to("../real/x.ckpt")
    (tmp_path / "chain").symlink_to("d/l2")
    model.save(tmp_path / "chain")
    assert (tmp_path / "real" / "x.ckpt").is_file() and (tmp_path / "d" / "l2").is_symlink()
    (tmp_path / "real" / "x.ckpt").unlink()
    gc.write_checkpoint(tmp_path / "chain", ck.Checkpoint({"a": np.zeros(2, np.float32)}, 7))
    assert (tmp_path / "real" / "x.ckpt").is_file() and (tmp_path / "d" / "l2").is_symlink()
    (tmp_path / "loop-a").symlink_to("loop-b")
    (tmp_path / "loop-b").symlink_to("loop-a")
    with pytest.raises(gc.RuntimeFailure, match="loop-a: a loop of symbolic links"):
        model.save(tmp_path / "loop-a")
    with pytest.raises(gc.DataError, match="loop-a: a loop of symbolic links"):
        gc.write_checkpoint(tmp_path / "loop-a", ck.Checkpoint({"a": np.zeros(2, np.float32)}, 7))
    assert (tmp_path / "loop-a").is_symlink() and (tmp_path / "loop-b").is_symlink()


def test_paths_that_are_not_files(model, tmp_path):
    with pytest.raises(gc.RuntimeFailure, match=f"{tmp_path}/none.ckpt: cannot open: No such file"):
        model.load(tmp_path / "none.ckpt")
    with pytest.raises(gc.RuntimeFailure, match=f"{tmp_path}: not a regular file"):
        model.load(tmp_path)
    with pytest.raises(gc.DataError, match="none.ckpt: cannot read checkpoint: No such file"):
        gc.read_checkpoint(tmp_path / "none.ckpt")
    with pytest.raises(gc.DataError, match="cannot read checkpoint: not a regular file"):
        gc.read_checkpoint(tmp_path)
    with pytest.raises(gc.GCompileError, match="contains a NUL byte"):
        model.load("a\0b")
    # a fifo: opening one to read waits for a writer (both readers hung on one)
    os.mkfifo(tmp_path / "fifo.ckpt")
    with pytest.raises(gc.RuntimeFailure, match="fifo.ckpt: not a regular file"):
        model.load(tmp_path / "fifo.ckpt")
    with pytest.raises(gc.DataError, match="fifo.ckpt: cannot read checkpoint: not a regular file"):
        gc.read_checkpoint(tmp_path / "fifo.ckpt")


def test_a_failed_save_leaves_the_existing_file_and_no_temporary(model, tmp_path):
    target = tmp_path / "kept.ckpt"
    model.save(target)
    before = target.read_bytes()
    (tmp_path / "sub").mkdir()
    with pytest.raises(gc.RuntimeFailure, match=r"gc_save: .*/sub: a folder, not a regular file: a checkpoint is "
                                                r"not written there"):
        model.save(tmp_path / "sub")
    with pytest.raises(gc.RuntimeFailure, match=r"dir.ckpt: a checkpoint cannot be written there: No such file or "
                                                r"directory"):
        model.save(tmp_path / "no" / "such" / "dir.ckpt")
    with pytest.raises(gc.DataError, match="cannot store complex128"):
        gc.write_checkpoint(target, ck.Checkpoint({"z": np.zeros(2, complex)}, 0))
    assert target.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.ckpt", "sub"]


def test_files_take_the_umask_and_saves_leave_it_alone(artifact, tmp_path):
    """Checkpoints written by C and by Python, and the data command's files, are made 0666 less the umask, as
    any new file is; saves on several threads at once leave the process's umask as it was (the C runtime read
    it by setting it for a moment: a save could then restore another's 000, one run in three)."""
    old = os.umask(0o027)
    try:
        models = [gc.load(artifact) for _ in range(4)]
        try:
            def saves(i):
                for j in range(25):
                    models[i].save(tmp_path / f"c{i}-{j}.ckpt")
            threads = [threading.Thread(target=saves, args=(i,)) for i in range(len(models))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            for m in models:
                m.close()
        assert os.umask(0o027) == 0o027
        gc.write_checkpoint(tmp_path / "python.ckpt", gc.read_checkpoint(tmp_path / "c0-0.ckpt"))
        gcdata.write_atomically(tmp_path / "data.bin", lambda f: f.write(b"data"))
    finally:
        os.umask(old)
    modes = {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in tmp_path.iterdir()}
    assert len(modes) == 102 and set(modes.values()) == {"0o640"}, modes
