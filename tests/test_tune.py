"""Tuning records (gcompile/tune.py): what they apply, what they refuse; gc.tune itself on the GPU."""
import json
import os
import re
import shutil

import numpy as np
import pytest

import gcompile as gc
from gcompile.cli import main
from gcompile.gemm_tiles import (TILES, Tile, alternatives, choose_tile, short_k_choice, tensor_core_choice,
                                 tile_by_name, tuned_tile)
from gcompile.pipeline import compile_program
from gcompile.tune import FORMAT, TF32_STEP_AGREE, disagreeing, followers, gemm_sites, program_digest, read_record

from conftest import EXAMPLES as EXAMPLES_DIR, load_bench, load_example


def mlp(batch=128):
    return load_example("mnist_mlp").program(batch_size=batch)


def record_for(program, kernels, precision="fp32"):
    cs = compile_program(program, "cuda", "mnist_mlp", precision=precision)
    return {"format": FORMAT, "program": program_digest(cs.stages["simplify"], precision), "name": "mnist_mlp",
            "precision": precision, "kernels": kernels}


def train_tiles(cs):
    return {k.name.split("_")[0]: k.values["tile"] for k in cs.kernels["train"] if k.kind == "matmul"}


def test_a_record_sets_the_tiles_it_names_and_only_those():
    program = mlp()
    default = train_tiles(compile_program(program, "cuda", "mnist_mlp"))
    kw = {"kernel": "k0", "m": 128, "n": 256, "k": 784, "batch": 1, "tile": "64x64x16/8x4/fp32/cp4/kw2", "split": 8}
    cs = compile_program(program, "cuda", "mnist_mlp", tuning=record_for(program, [kw]))
    tiles = train_tiles(cs)
    assert tiles["k0"] == "gc_tile<64, 64, 16, 8, 4, 0, 8, 128, 256, 784, 4, 2>" != default["k0"]
    assert {k: v for k, v in tiles.items() if k != "k0"} == {k: v for k, v in default.items() if k != "k0"}
    assert "gc_tile<64, 64, 16, 8, 4, 0, 8, 128, 256, 784, 4, 2>" in cs.source
    # the sites tuning sees: the step's GEMMs by their stable key, the default tiles
    sites = gemm_sites(compile_program(program, "cuda", "mnist_mlp"))
    assert [s["kernel"] for s in sites] == list(default) and sites[0]["rows"] and sites[0]["dtype"] == "float32"
    # node ids differ from process to process (and program to program): the key and the digest do not
    again = mlp()
    assert train_tiles(compile_program(again, "cuda", "mnist_mlp", tuning=record_for(program, [kw]))) == tiles


def test_the_evaluation_twin_of_a_tuned_gemm_follows_it():
    """The MLP's evaluation step computes x @ W1 as the training step does (its own kernel, the image input
    read in place): tuning gives the two one tile, so that the tile of the one does not make the rows floats
    for the other (GC_X_FLOAT); the record names both, and a build with it has no float rows."""
    program = mlp(1000)
    cs = compile_program(program, "cuda", "mnist_mlp")
    twins = followers(cs)
    x_w1 = next(s for s in gemm_sites(cs) if s["rows"] and not s["trans_a"])
    assert len(twins[x_w1["kernel"]]) == 1
    twin = twins[x_w1["kernel"]][0]
    assert (twin["m"], twin["n"], twin["k"], twin["rows"]) == (1000, 256, 784, True) and twin["kernel"] != x_w1["kernel"]
    assert all(not t for k, t in twins.items() if k != x_w1["kernel"])   # dW1 (x^T g) and the rest have none
    # the default fp32 tiles of x @ W1 and dW1 (tf32 parts: gemm_tiles.tensor_core_choice) take uint8 rows
    assert "#define GC_X_FLOAT 0" in cs.source
    dw1 = next(s for s in gemm_sites(cs) if s["rows"] and s["trans_a"])
    floats = [{"kernel": s["kernel"], "m": s["m"], "n": s["n"], "k": s["k"], "batch": 1,
               "tile": "64x64x16/8x4/fp32/cp4", "split": 2} for s in (x_w1, twin, dw1)]
    assert "#define GC_X_FLOAT 1" in compile_program(program, "cuda", "mnist_mlp",
                                                     tuning=record_for(program, floats)).source
    # the training step's x @ W1 alone on a float-rows tile makes the rows floats for its twin and dW1 too
    assert "#define GC_X_FLOAT 1" in compile_program(program, "cuda", "mnist_mlp",
                                                     tuning=record_for(program, floats[:1])).source


def test_a_record_for_another_program_or_an_unusable_tile_is_refused(tmp_path):
    program = mlp()
    kw = {"kernel": "k0", "m": 128, "n": 256, "k": 784, "batch": 1, "tile": "64x64x16/8x4/fp32/cp4/kw2", "split": 8}
    record = record_for(program, [kw])
    with pytest.raises(gc.GCompileError, match="another graph or other shapes"):
        compile_program(mlp(64), "cuda", "mnist_mlp", tuning=record)
    # initial values are not the graph: another learning rate keeps the record (it was refused)
    compile_program(load_example("mnist_mlp").program(batch_size=128, lr=0.05), "cuda", "mnist_mlp", tuning=record)
    with pytest.raises(gc.GCompileError, match="precision 'fp32', this build is 'tf32'"):
        compile_program(program, "cuda", "mnist_mlp", precision="tf32", tuning=record)
    cases = [({"split": 3}, "split 3 does not fit"), ({"tile": "7x7x7/1x1/fp32"}, "not a catalogue tile"),
             ({"tile": "64x64x16/32x32/tf32"}, "not a fp32 catalogue tile"),
             ({"kernel": "k9"}, "does not have"), ({"m": 64}, "does not have")]
    for change, message in cases:
        with pytest.raises(gc.GCompileError, match=message):
            compile_program(program, "cuda", "mnist_mlp", tuning=record_for(program, [{**kw, **change}]))
    # files: unreadable, not JSON, not a record, entries lacking fields
    with pytest.raises(gc.GCompileError, match="cannot read the tuning record"):
        read_record(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{\"format\": ")
    with pytest.raises(gc.GCompileError, match="invalid JSON at line 1"):
        read_record(tmp_path / "bad.json")
    (tmp_path / "other.json").write_text(json.dumps({"kernels": []}))
    with pytest.raises(gc.GCompileError, match="not a tuning record"):
        read_record(tmp_path / "other.json")
    with pytest.raises(gc.GCompileError, match="lacks kernel"):
        read_record({**record, "kernels": [{"kernel": "k0"}]})
    # wrong types are refused with the entry and the field (they raised TypeError / ValueError, or a split of
    # 8.9 became 8), a file that is not text too, and a kernel listed twice (the last entry won)
    entry = record["kernels"][0]
    for change, message in ((5, "needs \"program\" and a \"kernels\" list"),
                            ([{**entry, "split": "abc"}], "split must be a whole number, not 'abc'"),
                            ([{**entry, "split": None}], "split must be a whole number, not None"),
                            ([{**entry, "split": 8.9}], "split must be a whole number, not 8.9"),
                            ([{**entry, "split": True}], "split must be a whole number, not True"),
                            ([{**entry, "tile": 7, "m": "64"}], "tile must be a string, not 7, m must be"),
                            ([entry, entry], "kernel 'k0' is listed twice")):
        path = tmp_path / "typed.json"
        path.write_text(json.dumps({**record, "kernels": change}))
        with pytest.raises(gc.GCompileError, match=f"{re.escape(str(path))}: .*{re.escape(message)}"):
            read_record(path)
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe{}")
    with pytest.raises(gc.GCompileError, match="binary.json: not a tuning record: not UTF-8 text \\(byte 0\\)"):
        read_record(tmp_path / "binary.json")
    # the checks after reading name the file too
    path = tmp_path / "split3.json"
    path.write_text(json.dumps({**record, "kernels": [{**entry, "split": 3}]}))
    with pytest.raises(gc.GCompileError, match=f"{re.escape(str(path))}: lower: kernel k0.* split 3 does not fit"):
        compile_program(program, "cuda", "mnist_mlp", tuning=read_record(path))
    with pytest.raises(gc.GCompileError, match=f"{re.escape(str(path))}: the tuning record was made with precision"):
        compile_program(program, "cuda", "mnist_mlp", precision="tf32", tuning=read_record(path))
    with pytest.raises(gc.GCompileError, match="tiles of the cuda target, not 'cpu'"):
        gc.compile(program, target="cpu", out_dir=tmp_path / "cpu", tuning=record)


def test_cli_tuning_flags(tmp_path, capsys):
    program = mlp()
    kw = {"kernel": "k3", "m": 784, "n": 256, "k": 128, "batch": 1, "tile": "32x32x16/4x4/fp32/cp4/kw2", "split": 1}
    path = tmp_path / "rec.json"
    path.write_text(json.dumps(record_for(program, [kw])))
    model = str(EXAMPLES_DIR / "mnist_mlp.py")
    assert main(["inspect", model, "--batch-size", "128", "--target", "cuda", "--tuning", str(path), "--after", "emit"]) == 0
    assert "gc_tile<32, 32, 16, 4, 4, 0, 1, 784, 256, 128, 4, 2>" in capsys.readouterr().out
    assert main(["build", model, "--batch-size", "128", "--target", "cpu", "--tuning", str(path), "-o", str(tmp_path / "b")]) == 1
    assert "tiles of the cuda target" in capsys.readouterr().err
    if gc.build.detect_arch() is None:   # (CI: no GPU) tuning says why it cannot run, writes nothing
        assert main(["tune", model, "-o", str(tmp_path / "t.json")]) == 1
        assert "no GPU answers" in capsys.readouterr().err and not (tmp_path / "t.json").exists()


def test_alternatives_are_usable_tiles_of_the_gemm():
    for m, n, k, ta, rows in ((128, 256, 784, False, True), (784, 256, 1000, True, True), (256, 100, 1000, True, False),
                              (100, 10, 128, True, False)):
        for precision in ("fp32", "tf32"):
            options = alternatives(m, n, k, ta, False, precision, rows=rows)
            # fp32 on tensor cores: large GEMMs only, 2 splits a tile (the wgmma ones: A^T B only; the three
            # short-K ones, TF32 = 5, every case); likewise the warp-specialized tf32 ones (A not transposed) and
            # the plain tf32 short-K ones (every case)
            parts = sum(t.parts for t, _ in options)
            ws = sum(t.tf32 == 6 for t, _ in options)
            sk = sum(t.tf32 == 7 for t, _ in options)
            assert 6 <= len(options) - parts - ws - sk == len(set(options)) - parts - ws - sk <= 10
            large = m * n * k >= 1 << 24
            assert parts == (18 + 2 * ta if large and precision == "fp32" else 0)
            assert ws == (2 * sum(t.tf32 == 6 for t in TILES["tf32"]) if large and precision == "tf32" and not ta else 0)
            assert sk == (2 * sum(t.tf32 == 7 for t in TILES["tf32"]) if large and precision == "tf32" else 0)
            for tile, split in options:
                assert tile in TILES[precision]
                tuned_tile(tile.name, split, m, n, k, precision, rows=rows, trans_a=ta)   # raises when unusable
            # the measured choice comes first; choose_tile's is it but where short_k_choice puts the GEMM on a
            # short-K tile (b128's x @ W1) or tensor_core_choice on a tensor-core one (b1000's fp32 dW1 and dW2),
            # which is among the options
            short = short_k_choice(m, n, k, ta, False, precision)
            assert (short is not None) == ((m, k) == (128, 784))
            ruled = tensor_core_choice(m, n, k, ta, False, precision, rows=rows)
            assert (ruled is not None) == (precision == "fp32" and k == 1000)
            chosen = short or ruled or options[0]
            assert Tile.parse(choose_tile(m, n, k, ta, False, precision, rows=rows)) == chosen and chosen in options
    assert alternatives(4096, 4096, 4096, False, False, "fp32") == []   # large problems keep their tile
    assert alternatives(64, 64, 64, False, False, "fp32", dtype="float64") == []


def test_the_benchmark_records_fit_the_benchmark_programs():
    """bench/tuned/ (make tune) must keep matching the programs make bench builds, else it runs untuned."""
    load_bench()
    from bench.tasks import LR, load_example as bench_example, make_program
    from bench.report import gpu_slug
    from bench.tune import CONFIGS, TUNED, record_path
    gpus = sorted(p.name for p in TUNED.iterdir() if p.is_dir())
    found = 0
    for folder in gpus:
        for model, batch, precision in CONFIGS:
            path = record_path(model, batch, precision, folder)   # a folder's name is its own slug
            if path.is_file():
                found += 1
                record = read_record(path)
                assert gpu_slug(record["gpu"]) == folder, f"{path}: measured on {record['gpu']}"
                cs = compile_program(make_program(bench_example(model), batch, LR), "cuda", model,
                                     precision=precision, tuning=record)
                if "3xwgmma" in path.read_text():   # reads the image's bytes: the trainer keeps them uint8
                    assert "#define GC_X_FLOAT 0" in cs.source, path
                # the example as a user builds it (`gcompile build --tuning`): its own learning rate (1.0)
                compile_program(bench_example(model).program(batch_size=batch), "cuda", model,
                                precision=precision, tuning=record)
    assert not list(TUNED.glob("*.json")), "records belong in their GPU's folder"
    # on each GPU machine: the MLP's fp32 records (b128, b1000) and its b1000 tf32 one
    for gpu in ("NVIDIA H100 80GB HBM3", "NVIDIA H200"):
        assert all(record_path("mnist_mlp", batch, precision, gpu).is_file()
                   for batch, precision in ((128, "fp32"), (1000, "fp32"), (1000, "tf32"))), gpu
    assert found >= 6


def test_disagreeing_names_the_updates_off_by_more_than_the_bound():
    ref = {"W": np.array([3.0, 4.0]), "b": np.array([1.0]), "step": np.array(1.0), "skip": np.array(0.0)}
    # |W - ref| = 5e-3 of |ref| = 5: within 1e-2, beyond 1e-3; an update that should be zero stays so
    got = {"W": np.array([3.0 + 0.015, 4.0 + 0.02]), "b": np.array([1.0]), "step": np.array(1.0),
           "skip": np.array(0.0)}
    assert disagreeing(got, ref, TF32_STEP_AGREE) == []
    assert disagreeing(got, ref, 1e-3) == ["W"]
    assert disagreeing({**got, "skip": np.array(1e-9)}, ref, TF32_STEP_AGREE) == ["skip"]
    assert disagreeing({**got, "b": np.array([-1.0])}, ref, TF32_STEP_AGREE) == ["b"]


@pytest.mark.gpu
def test_tune_keeps_what_is_faster_and_the_results_agree(tmp_path):
    if not shutil.which("nvcc"):
        pytest.skip("nvcc is not installed")
    # (at batch 128 its step has no tiled GEMM: dW is a post stage of the chain)
    program = load_example("mnist_logreg").program(batch_size=1000)
    lines = []
    record = gc.tune(program, count=2, windows=3, workdir=tmp_path / "work", log=lines.append)
    assert record["format"] == FORMAT and record["gpu"] and len(lines) >= 3
    assert record["tuned_us"] <= record["baseline_us"] * 1.05
    assert len(record["trials"]) >= 1 and all(t["kernel"] == "k2" for t in record["trials"])
    tuned = gc.compile(program, out_dir=tmp_path / "tuned", tuning=record)
    plain = gc.compile(program, out_dir=tmp_path / "plain")
    rng = np.random.RandomState(1)
    x, y = rng.rand(1000, 784).astype(np.float32), rng.randint(0, 10, 1000).astype(np.int32)
    with gc.load(tuned) as a, gc.load(plain) as b:
        assert np.isclose(a.train_step(x, y), b.train_step(x, y), rtol=1e-5)
        np.testing.assert_allclose(a.get("W1"), b.get("W1"), rtol=1e-4, atol=1e-6)


def test_gpu_name_asks_for_the_first_visible_device(tmp_path, monkeypatch):
    from gcompile.tune import gpu_name
    fake = tmp_path / "nvidia-smi"
    fake.write_text('#!/bin/sh\nfor a in "$@"; do last="$a"; done\necho "GPU $last"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert gpu_name() == "GPU 0"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    assert gpu_name() == "GPU 3"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-5d3c,GPU-aa")
    assert gpu_name() == "GPU GPU-5d3c"


def test_trainer_step_us_reads_the_binarys_epochs(tmp_path):
    """tune(data=...) times the trainer: the binary's epochs after the first (its --log: examples_per_s), as
    microseconds a step; a binary that logs none (or fails) is an error naming it and its last lines."""
    from gcompile.tune import trainer_step_us
    fake = tmp_path / "model"
    fake.write_text("#!/bin/sh\n"
                    "while [ $# -gt 0 ]; do [ \"$1\" = --log ] && log=$2; shift; done\n"
                    "echo 'training model: 100 examples, batch 4, 25 steps per epoch, cuda, CUDA graphs'\n"
                    "for e in '1 1000' '2 200000' '3 400000'; do set -- $e\n"
                    "  echo \"{\\\"epoch\\\": $1, \\\"val_acc\\\": 0.5, \\\"examples_per_s\\\": $2}\" >> \"$log\"\n"
                    "done\n")
    fake.chmod(0o755)
    assert trainer_step_us(str(fake), str(tmp_path), 4) == [20.0, 10.0]
    fake.write_text("#!/bin/sh\necho 'error: no dataset here' >&2\nexit 2\n")
    with pytest.raises(gc.GCompileError, match=r"model train --data .* gave no epoch times \(exit 2\): error: no "):
        trainer_step_us(str(fake), str(tmp_path), 4)


WS_TILE = {"kernel": "k0", "m": 1000, "n": 256, "k": 784, "batch": 1, "tile": "64x64x32/64x64/wgmma-ws/cp6",
           "split": 2}


def test_a_warp_specialized_x_at_w1_reads_w1s_mirror():
    """x @ W1 on a wgmma-ws tile (TF32 = 6) reads W1^T from a workspace (its mirror, B k-contiguous: TB), which
    the GEMM that updates W1 (dW1's) stores too, at (n, m): its epilogue functor says where (gc_ep_mirror),
    still storing nothing itself (its runs of 4 and prefetch stay); gc_refresh_mirrors remakes it after the
    host writes W1; without such a tile (fp32) there is no mirror. tf32's default tiles put x @ W1 on one of 5
    stages (gemm_tiles.tensor_core_choice), both steps'; the record here gives the training step's 6."""
    program = mlp(1000)
    plain = compile_program(program, "cuda", "mnist_mlp")
    # (the chain's stages read W2 from its copy in shared memory, chain_mma: no W2 mirror; a chain that reads
    # W2's, of more blocks than SMs, is test_lower's)
    assert not plain.plan.mirrors
    assert "W1^T" not in "".join(k.comment for k in plain.kernels["train"])
    default = compile_program(program, "cuda", "mnist_mlp", precision="tf32")
    assert [m["name"] for m in default.plan.mirrors] == ["W1"]
    assert "gc_gemm<float, false, true, gc_tile<64, 64, 32, 64, 64, 6, 2, 1000, 256, 784, 5>>" in default.source
    cs = compile_program(program, "cuda", "mnist_mlp", precision="tf32",
                         tuning=record_for(program, [WS_TILE], "tf32"))
    (mirror,) = [m for m in cs.plan.mirrors if m["name"] == "W1"]
    (w1,) = [b for b in cs.plan.buffers if b.node.name == "W1"]
    assert (mirror["name"], mirror["src"], mirror["rows"], mirror["cols"]) == ("W1", w1.offset, 784, 256)
    offset, size = cs.plan.workspaces["mirror of W1"]
    assert mirror["dst"] == offset and size == 784 * 256 * 4
    train = {k.name.split("_")[0]: k for k in cs.kernels["train"]}
    reader = train["k0"]
    assert reader.values["trans_b"] == 1 and reader.values["b"] == f"((const float*)(A + {offset}))"
    assert (offset, offset + size) in reader.reads
    (writer,) = [k for k in cs.kernels["train"] if (offset, offset + size) in k.writes]
    ep = writer.values["epilogue"]
    assert writer.values["c_at"] == w1.offset and ep["mirror"] == offset and not ep["stores"] and ep["runs"]
    assert f"float* mirror() const {{ return (float*)(A + {offset}); }}" in cs.source
    assert "gc_gemm<float, false, true, gc_tile<64, 64, 32, 64, 64, 6, 2, 1000, 256, 784, 6>>" in cs.source
    assert f"gc_transpose((const float*)(A + {w1.offset}), (float*)(A + {offset}), 784, 256)" in cs.source
    # the eval step's x @ W1 keeps its own (default) tile and reads the mirror too
    (ev,) = [k for k in cs.kernels["eval"] if k.kind == "matmul" and k.values["k"] == 784]
    assert Tile.parse(ev.values["tile"]) == (tile_by_name("64x64x32/64x64/wgmma-ws/cp5"), 2)
    assert ev.values["trans_b"] == 1 and ev.values["b"] == f"((const float*)(A + {offset}))"


@pytest.mark.gpu
@pytest.mark.parametrize("dw1_split", [None, 1])
def test_the_mirror_follows_w1_through_steps_and_the_hosts_writes(tmp_path, dw1_split):
    """On the GPU: the MLP's b1000 tf32 step with x @ W1 on a wgmma-ws tile (reading W1's mirror) gives the
    losses of the same step without it, to tf32's tolerance, over steps (the update keeps the mirror: dW1 on
    its default split tile, the mirror from the cluster's sum, or on one without a split), after
    gc_set_variable of W1 and after gc_load of a checkpoint (both refresh it)."""
    program = mlp(1000)
    tiles = [WS_TILE] + ([{"kernel": "k5", "m": 784, "n": 256, "k": 1000, "batch": 1,
                           "tile": "64x64x32/64x64/wgmma/cp4", "split": dw1_split}] if dw1_split else [])
    rng = np.random.default_rng(5)
    x = rng.random((1000, 784), dtype=np.float32)
    y = rng.integers(0, 10, 1000).astype(np.int32)
    models = {}
    for label, tuning in (("plain", None), ("ws", record_for(program, tiles, "tf32"))):
        models[label] = gc.load(gc.compile(program, target="cuda", out_dir=tmp_path / label, precision="tf32",
                                           tuning=tuning))
    losses = {label: [m.train_step(x, y) for _ in range(4)] for label, m in models.items()}
    np.testing.assert_allclose(losses["ws"], losses["plain"], rtol=2e-3)
    w1 = rng.normal(scale=0.05, size=(784, 256)).astype(np.float32)
    for m in models.values():
        m.set("W1", w1)
    after_set = {label: m.train_step(x, y) for label, m in models.items()}
    np.testing.assert_allclose(after_set["ws"], after_set["plain"], rtol=2e-3)
    models["ws"].save(tmp_path / "c.ckpt")
    models["ws"].set("W1", np.zeros((784, 256), np.float32))
    models["ws"].load(tmp_path / "c.ckpt")
    np.testing.assert_allclose(models["ws"].train_step(x, y), models["plain"].train_step(x, y), rtol=2e-3)
