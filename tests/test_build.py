"""build: cache hits, BuildError reporting, the initial-parameter checkpoint, what the cuda program includes,
the cuda build's parts."""
import hashlib
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import gcompile as gc
from gcompile import build
from gcompile.checkpoint import read_checkpoint
from gcompile.passes.emit import PART0_COST, gemm_cost, part_units
from gcompile.pipeline import compile_program
from conftest import load_bench
from graphs import mlp_program


def tiny_program():
    x = gc.placeholder("x", (4, 3))
    y = gc.placeholder("y", (4,), dtype="int32")
    W = gc.variable("W", (3, 2), init=gc.init.normal(0.5, seed=4))
    logits = x @ W
    return gc.Program(gc.softmax_cross_entropy(logits, y), [W], gc.SGD(lr=0.1), outputs={"logits": logits},
                      name="tiny")


def test_second_build_is_a_cache_hit_and_a_change_rebuilds(tmp_path):
    first = gc.compile(tiny_program(), target="cpu", out_dir=tmp_path)
    again = gc.compile(tiny_program(), target="cpu", out_dir=tmp_path)
    assert not first.cached and again.cached and again.binary == first.binary
    changed = tiny_program()
    changed.optimizer.lr = 0.2  # the learning rate is an initial value: a new fingerprint
    rebuilt = gc.compile(gc.Program(changed.loss, changed.params, gc.SGD(lr=0.2), changed.outputs, name="tiny"),
                         target="cpu", out_dir=tmp_path)
    assert not rebuilt.cached
    assert read_checkpoint(rebuilt.init).tensors["lr"] == np.float32(0.2)


@pytest.mark.parametrize("damage", ["truncated", "missing", "binary truncated"])
@pytest.mark.parametrize("level", ["fingerprint", "build key"])
def test_a_changed_library_is_not_a_cache_hit(tmp_path, damage, level):
    """A library cut short, or gone with its manifest, since its build is built again, not handed to gc.load:
    by the program's fingerprint (gc.compile: cached_artifact) and by the build key (build.build of the same
    generated source)."""
    program = tiny_program()
    if level == "fingerprint":
        make = lambda: gc.compile(program, target="cpu", out_dir=tmp_path)   # noqa: E731
    else:
        source = compile_program(program, "cpu", "tiny")
        make = lambda: build.build(source, tmp_path)   # noqa: E731
    first = make()
    library = Path(first.library).read_bytes()
    if damage == "truncated":
        Path(first.library).write_bytes(library[:1000])
    elif damage == "binary truncated":
        Path(first.binary).write_bytes(Path(first.binary).read_bytes()[:1000])
    else:
        Path(first.library).unlink()
        Path(first.manifest).unlink()
    again = make()
    assert not again.cached
    assert json.loads(Path(again.manifest).read_text())["library_sha256"] == \
        hashlib.sha256(Path(again.library).read_bytes()).hexdigest()
    with gc.load(again) as m:
        assert m.params["W"].shape == (3, 2)
    assert make().cached


def test_a_damaged_init_file_is_not_a_cache_hit(tmp_path):
    """The initial values' file is recorded in the manifest too: a cache hit by the program's fingerprint
    handed out a damaged one, which every run of the binary then refused (checksum mismatch)."""
    program = tiny_program()
    first = gc.compile(program, target="cpu", out_dir=tmp_path)
    good = Path(first.init).read_bytes()
    with open(first.init, "ab") as f:
        f.write(b"x")
    again = gc.compile(program, target="cpu", out_dir=tmp_path)
    assert Path(again.init).read_bytes() == good
    assert json.loads(Path(again.manifest).read_text())["init_sha256"] == hashlib.sha256(good).hexdigest()
    assert gc.compile(program, target="cpu", out_dir=tmp_path).cached


def test_a_copied_build_folder_is_built_again_in_place(tmp_path):
    """Its manifest names the original folder's files: a cache hit there handed out those (and their initial
    values, whatever the original folder had been rebuilt with since)."""
    first = gc.compile(tiny_program(), target="cpu", out_dir=tmp_path / "a")
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    copy = gc.compile(tiny_program(), target="cpu", out_dir=tmp_path / "b")
    assert not copy.cached and Path(copy.binary).parent == tmp_path / "b"
    assert Path(first.binary).parent == tmp_path / "a"
    assert gc.compile(tiny_program(), target="cpu", out_dir=tmp_path / "b").cached


def test_what_the_fingerprint_covers():
    """trainable (the manifest says it) and the data files gcompile reads (the GEMM tile calibration that
    `bench/gemm_bench.py --calibrate` rewrites), besides the graph, values, settings and code."""
    from gcompile import resources
    from gcompile.compiler import fingerprint
    assert "gemm_tiles_sm90.json" in {p.name for p in resources.digested_files()}
    prints = []
    for trainable in (True, False):
        x = gc.placeholder("x", (4, 3))
        W = gc.variable("W", (3, 2), init=gc.init.normal(0.5, seed=4))
        c = gc.variable("c", (2,), trainable=trainable)
        prints.append(fingerprint([x @ W + c], ["cpu"]))
    assert prints[0] != prints[1]


def test_a_failed_rebuild_leaves_no_manifest_over_the_old_build(tmp_path, monkeypatch):
    """The new initial values are written only beside the binary built for them, and the manifest is gone
    until a build is whole: the old binary kept running with the new program's init file."""
    first = gc.compile(tiny_program(), target="cpu", out_dir=tmp_path)
    old_init, old_binary = Path(first.init).read_bytes(), Path(first.binary).read_bytes()

    def failing(commands, source):
        raise gc.BuildError("the compiler failed")
    monkeypatch.setattr(build, "run", failing)
    changed = tiny_program()
    changed.optimizer.lr = 0.3
    with pytest.raises(gc.BuildError, match="the compiler failed"):
        gc.compile(gc.Program(changed.loss, changed.params, gc.SGD(lr=0.3), {"logits": changed.loss}, name="tiny"),
                   target="cpu", out_dir=tmp_path)
    assert not Path(first.manifest).exists()
    assert Path(first.init).read_bytes() == old_init and Path(first.binary).read_bytes() == old_binary


@pytest.mark.skipif(not shutil.which("nvcc"), reason="nvcc is not installed")
def test_another_target_in_the_same_folder_leaves_one_source(tmp_path):
    gc.compile(tiny_program(), target="cpu", out_dir=tmp_path)
    gc.compile(tiny_program(), target="cuda", arch="sm_90", out_dir=tmp_path)
    assert (tmp_path / "tiny.cu").exists() and not (tmp_path / "tiny.cpp").exists()


def test_initial_checkpoint_holds_the_initializers_values(tmp_path):
    artifact = gc.compile(tiny_program(), target="cpu", out_dir=tmp_path)
    ckpt = read_checkpoint(artifact.init)
    np.testing.assert_array_equal(ckpt.tensors["W"], gc.init.normal(0.5, seed=4)((3, 2)))
    assert gc.load(artifact).params["W"].tolist() == ckpt.tensors["W"].tolist()


def test_missing_compiler_is_a_clear_build_error(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    with pytest.raises(gc.BuildError, match="no-such-compiler.*not found"):
        gc.compile(tiny_program(), target="cpu", out_dir=tmp_path / "out")


def test_failed_compile_reports_command_stderr_and_kept_source(tmp_path, monkeypatch):
    compiler = tmp_path / "broken-cc"
    compiler.write_text("#!/bin/sh\necho 'broken-cc: internal error' >&2\nexit 3\n")
    compiler.chmod(0o755)
    monkeypatch.setenv("CXX", str(compiler))
    with pytest.raises(gc.BuildError) as info:
        gc.compile(tiny_program(), target="cpu", out_dir=tmp_path / "out")
    err = info.value
    assert "exit 3" in str(err) and "broken-cc: internal error" in err.stderr
    assert err.command[0] == str(compiler) and err.source_path.endswith("tiny.cpp")
    assert open(err.source_path).read().startswith("// @generated by gcompile")


def test_cuda_program_includes_no_cpp_library_header():
    """Compile time: nvcc's preprocessor, cudafe++, cicc and the host compiler each parse everything the
    program includes; a C++ library header (<mutex> was one) adds up to 0.7 s to a cold build. The cuda
    program includes C and POSIX headers and cuda_runtime.h only."""
    source = compile_program(tiny_program(), target="cuda").source
    headers = re.findall(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', source, re.M)
    assert "cuda_runtime.h" in headers and "stdio.h" in headers
    assert [h for h in headers if not h.endswith(".h")] == []


def test_kernels_parts_share_out_the_gemm_instantiations():
    """Compile time: the kernels are shared out to several nvcc runs (emit.assign_parts). Kernels that share
    a gc_gemm instantiation or an epilogue type stay in one part (two parts would compile a template kernel
    twice, and an epilogue type is defined once); the estimated costs are balanced; a launcher that the steps
    (part 0) call from another part is GC_SHARED and declared for part 0; the cpu target has one part."""
    compiled = compile_program(mlp_program(128), "cuda")
    kernels = [k for ks in compiled.kernels.values() for k in ks]
    assert compiled.kernel_parts == 3     # 3 GEMMs (x @ W1 shared by train and eval), a chain, a post kernel
    part_of = {}
    for k in kernels:
        v = k.values
        keys = [("ep", v.get("ep_type"))] if v.get("ep_type") else []
        if k.kind == "matmul":
            keys.append((v["ctype"], v["trans_a"], v["trans_b"], v["tile"], v.get("ep_type")))
        for key in keys:
            assert part_of.setdefault(key, v["part"]) == v["part"], (k.name, key)
    # heaviest unit first to the least loaded part: the loads differ by at most the heaviest unit
    loads = [gemm_cost([k for k in kernels if k.values["part"] == p]) + (PART0_COST if p == 0 else 0)
             for p in range(compiled.kernel_parts)]
    assert max(loads) - min(loads) <= max(gemm_cost(u) for u in part_units(kernels))
    assert sum(loads) == pytest.approx(gemm_cost(kernels) + PART0_COST)
    for k in kernels:
        shared = f"\nGC_SHARED int {k.name}(unsigned char* A)"
        assert (shared + " {" in compiled.source) == (shared + ";" in compiled.source) == (k.values["part"] > 0)
    assert compile_program(mlp_program(128), "cpu").kernel_parts == 1


def test_cuda_build_refuses_a_folder_nvlink_cannot_open(tmp_path):
    """nvcc hands the objects to nvlink, which drops a path's double quotes ("Could not open input file"): the
    build refuses such a folder first, naming it, and creates nothing."""
    out = tmp_path / 'a "quoted" folder'
    with pytest.raises(gc.BuildError, match=r"the cuda target cannot build in a folder whose path has a double quote"):
        gc.compile(tiny_program(), target="cuda", arch="sm_90", out_dir=out)
    assert not out.exists()


@pytest.mark.skipif(not shutil.which("nvcc"), reason="nvcc is not installed")
def test_cuda_build_compiles_parts_that_export_only_the_abi(tmp_path, monkeypatch):
    """Compile time: nvcc compiles the kernels parts of the one source while the host C++ compiler compiles
    the host part (build.part_commands). What one part calls in another is hidden: the library exports
    the C ABI only. A failing host part names its command and the source; the cache key holds every command;
    nvcc alone still compiles the whole source."""
    broken = tmp_path / "broken-cc"
    broken.write_text("#!/bin/sh\necho 'broken-cc: internal error' >&2\nexit 3\n")
    broken.chmod(0o755)
    monkeypatch.setenv("CXX", str(broken))
    with pytest.raises(gc.BuildError) as info:
        gc.compile(tiny_program(), target="cuda", arch="sm_90", out_dir=tmp_path / "broken")
    assert info.value.command[0] == str(broken) and "-DGC_PART_HOST" in info.value.command
    assert info.value.source_path.endswith("tiny.cu") and "broken-cc: internal error" in info.value.stderr
    monkeypatch.delenv("CXX")

    # the MLP: three kernels parts, linked without a clash
    artifact = gc.compile(mlp_program(128), target="cuda", arch="sm_90", out_dir=tmp_path / "out")
    manifest = json.loads(open(artifact.manifest).read())
    assert manifest["compiler"][0] == "nvcc" and "-DGC_PART_KERNELS=0" in manifest["compiler"]
    assert manifest["host_compiler"][0] != "nvcc" and "-DGC_PART_HOST" in manifest["host_compiler"]
    assert manifest["kernel_parts"] == 3
    compiler, flags, link_flags = build.compile_flags("cuda", "sm_90")
    settings = build.build_settings("cuda", compiler, flags, link_flags, 3)
    assert " ".join(manifest["host_compiler"]) in settings
    assert " ".join([compiler, *flags, "--fatbin", "-DGC_PART_KERNELS=1"]) in settings
    assert manifest["launch_compiler"] == [compiler, *flags, "-c", "-DGC_PART_LAUNCH=0"]
    assert " ".join(manifest["launch_compiler"]) in settings
    header = open(artifact.source).readline() + open(artifact.source).readlines()[2]
    assert header.count("-DGC_PART_KERNELS=") == 3
    source = open(artifact.source).read()
    abi = set(re.findall(r"^GC_EXPORT [^(\n]*?\b(gc_\w+)\(", source, re.M))
    assert {"gc_create", "gc_train_step", "gc_last_error", "gc_main"} <= abi
    nm = subprocess.run(["nm", "-D", "--defined-only", artifact.library], capture_output=True, text=True, check=True)
    assert {line.split()[-1] for line in nm.stdout.splitlines()} == abi

    whole = subprocess.run([compiler, *flags, "-c", artifact.source, "-o", str(tmp_path / "whole.o")],
                           capture_output=True, text=True)
    assert whole.returncode == 0, whole.stderr[-4000:]


@pytest.mark.skipif(not shutil.which("nvcc"), reason="nvcc is not installed")
@pytest.mark.parametrize("batch, precision", [(128, "fp32"), (1000, "tf32")])
def test_launch_part_names_the_kernels_parts_kernels(tmp_path, batch, precision):
    """Launch part p holds the host stubs of kernels part p's kernels with their bodies left out (GC_BODIES), and
    the launches find each kernel by its stub's name in the parts' device code (gc_kernel_of): each part's
    stubs name exactly its kernels, and no kernel is in two parts. (The MLP's fp32 GEMMs, chain and post
    kernel; at b1000 tf32 its wgmma and warp-specialized tiles, TMA included.)"""
    compiled = compile_program(mlp_program(batch), "cuda", precision=precision)
    compiler, flags, _ = build.compile_flags("cuda", "sm_90")
    parts = build.part_commands("cuda", compiler, flags, compiled.kernel_parts)
    n = compiled.kernel_parts
    assert [p[-1] for p in parts[:-1]] == [f"-DGC_PART_KERNELS={p}" for p in range(n)] + \
        [f"-DGC_PART_LAUNCH={p}" for p in range(n)]
    source = tmp_path / "m.cu"
    source.write_text(compiled.source)
    ptx = [tmp_path / f"{i}.ptx" for i in range(len(parts) - 1)]
    build.run([[*(f for f in part if f not in ("--fatbin", "-c")), "--ptx", str(source), "-o", str(out)]
               for part, out in zip(parts, ptx)], source)
    texts = [p.read_text() for p in ptx]
    entries = [re.findall(r"\.entry (\S+)\(", text) for text in texts]
    for kernels, launch, text in zip(entries[:n], entries[n:], texts[n:]):   # part by part
        assert kernels and sorted(launch) == sorted(kernels)
        assert not re.search(r"\b(ld|st|cp|mma|wgmma)\.", text)   # the launch part's kernels are empty
    names = [name for part in entries[:n] for name in part]
    assert len(names) == len(set(names)) >= 6


# ptxas's C7510 note, as nvcc 13 prints it for a kernel with a call between a wgmma and its wait
C7510 = ("ptxas info    : (C7510) Potential Performance Loss: wgmma.mma_async instructions are serialized due to "
         "wgmma pipeline crossing function boundary at a function call in the function '_Z20serialized_by_printfPfmm'\n")


def test_serialized_wgmma_reads_ptxas_notes():
    other = ("ptxas info    : (C7510) Potential Performance Loss: wgmma.mma_async instructions are serialized due to "
             "insufficient register resources for the wgmma pipeline in the function '_Z1kv'\n")
    found = build.serialized_wgmma("ptxas info    : 0 bytes gmem\n" + C7510 + other + C7510)
    assert [f["symbol"] for f in found] == ["_Z20serialized_by_printfPfmm", "_Z1kv"]   # once each, in order
    assert found[0]["reason"] == "wgmma pipeline crossing function boundary at a function call"
    assert found[1]["reason"] == "insufficient register resources for the wgmma pipeline"
    if shutil.which("c++filt"):
        assert found[0]["kernel"] == "serialized_by_printf(float*, unsigned long, unsigned long)"
    assert build.serialized_wgmma("ptxas info    : Used 40 registers\n") == []


WGMMA_KERNELS = r"""
#include <cstdio>
#include <cstdint>
// a wgmma with a printf before its wait: ptxas serializes it (C7510); the same wgmma pipelined beside it
__global__ void serialized_by_printf(float* out, uint64_t a, uint64_t b) {
    float d[4] = {0.f, 0.f, 0.f, 0.f};
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
    asm volatile("wgmma.mma_async.sync.aligned.m64n8k8.f32.tf32.tf32 {%0, %1, %2, %3}, %4, %5, 1, 1, 1;"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "l"(a), "l"(b));
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    if (threadIdx.x == 0) printf("in flight\n");
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    out[threadIdx.x] = d[0] + d[1] + d[2] + d[3];
}
__global__ void pipelined(float* out, uint64_t a, uint64_t b) {
    float d[4] = {0.f, 0.f, 0.f, 0.f};
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
    for (int k = 0; k < 4; k++)
        asm volatile("wgmma.mma_async.sync.aligned.m64n8k8.f32.tf32.tf32 {%0, %1, %2, %3}, %4, %5, 1, 1, 1;"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "l"(a + 2 * k), "l"(b + 2 * k));
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    out[threadIdx.x] = d[0] + d[1] + d[2] + d[3];
}
"""


@pytest.mark.skipif(not shutil.which("nvcc"), reason="nvcc is not installed")
def test_a_real_ptxas_note_names_the_serialized_kernel_only(tmp_path):
    """The note's wording is ptxas's, not ours: read from a real compile, only the kernel with the call."""
    src = tmp_path / "k.cu"
    src.write_text(WGMMA_KERNELS)
    compiler, flags, _ = build.compile_flags("cuda", "sm_90a")
    out = build.run([[compiler, *flags, "-c", str(src), "-o", str(tmp_path / "k.o")]], src)
    assert [f["symbol"] for f in build.serialized_wgmma(out)] == ["_Z20serialized_by_printfPfmm"]


def test_a_build_warns_of_serialized_wgmma_and_records_it(tmp_path, monkeypatch):
    """A serialized kernel is a silent slowdown: the build warns (PerformanceWarning) and writes it into the
    manifest, which a later build from the same source and commands (no compile) keeps."""
    compiled = compile_program(tiny_program(), "cpu", "tiny")
    real = build.run
    monkeypatch.setattr(build, "run", lambda commands, source: real(commands, source) + C7510)
    with pytest.warns(gc.errors.PerformanceWarning, match=r"serialized the wgmma of kernel .*serialized_by_printf"):
        first = build.build(compiled, tmp_path / "a")
    entry = json.loads(open(first.manifest).read())["wgmma_serialized"]
    assert [e["symbol"] for e in entry] == ["_Z20serialized_by_printfPfmm"]
    monkeypatch.undo()
    again = build.build(compiled, tmp_path / "a")
    assert again.cached and json.loads(open(again.manifest).read())["wgmma_serialized"] == entry
    fresh = build.build(compiled, tmp_path / "b")
    assert not fresh.cached and json.loads(open(fresh.manifest).read())["wgmma_serialized"] == []


@pytest.mark.skipif(not shutil.which("nvcc"), reason="nvcc is not installed")
def test_the_benchmark_programs_wgmma_are_pipelined(tmp_path):
    """The tuned MNIST programs make bench runs that have wgmma tiles, built for sm_90a: ptxas pipelines every
    wgmma of their GEMMs (serialized, x @ W1's 4 wgmma a K step took ~340 cycles instead of ~140, H100:
    docs/compiler.md, "A build reports serialized wgmma")."""
    load_bench()
    from bench.tasks import LR, load_example, make_program
    from bench.tune import CONFIGS, record_path
    built = 0
    for model, batch, precision in CONFIGS:
        path = record_path(model, batch, precision, "NVIDIA H100 80GB HBM3")
        if not path.is_file() or "wgmma" not in path.read_text():
            continue
        name = f"{model}_b{batch}_{precision}"
        artifact = gc.compile(make_program(load_example(model), batch, LR), target="cuda", arch="sm_90a",
                              precision=precision, tuning=path, out_dir=tmp_path / name, name=model)
        assert json.loads(open(artifact.manifest).read())["wgmma_serialized"] == [], name
        built += 1
    assert built >= 2   # b1000 tf32 (x @ W1, dW1) and b1000 fp32 (dW1's three-part wgmma)


def test_a_read_only_folder_still_gives_its_cache_hit(tmp_path, monkeypatch):
    """The folder lock's file cannot be made in a read-only folder: a cache hit there needs no write (it raised
    OSError once the lock came in)."""
    first = gc.compile(tiny_program(), target="cpu", out_dir=tmp_path)
    Path(tmp_path / ".tiny.lock").unlink()

    def read_only(path, *args, **kwargs):
        if str(path).endswith(".lock"):
            raise OSError(30, "Read-only file system")
        return open(path, *args, **kwargs)
    monkeypatch.setattr(build, "open", read_only, raising=False)
    again = gc.compile(tiny_program(), target="cpu", out_dir=tmp_path)
    assert again.cached and again.binary == first.binary


def test_a_users_file_with_the_other_targets_name_is_kept(tmp_path):
    """Building for one target removes the other target's source only where gcompile generated it."""
    (tmp_path / "tiny.cu").write_text("// my own kernels\n")
    gc.compile(tiny_program(), target="cpu", out_dir=tmp_path)
    assert (tmp_path / "tiny.cu").read_text() == "// my own kernels\n"
