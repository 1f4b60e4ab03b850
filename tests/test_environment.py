"""Environment errors: no nvcc, no GPU for a cuda build, a GPU the build has no kernels for, an arena larger
than memory; and the fallback to the cpu target that `make demo` relies on."""
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

import gcompile as gc
from gcompile import build
from gcompile.commands import model_file
from reliability import poisoned_dataset, run_binary, small_program, synthetic_dataset

HAS_NVCC = shutil.which("nvcc") is not None


def test_no_nvcc_is_a_clear_build_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    build.compiler_version.cache_clear()   # it remembers the nvcc it found
    try:
        with pytest.raises(gc.BuildError, match=r"compiler 'nvcc' not found on PATH \(install the CUDA toolkit, or "
                                                r"compile with target='cpu'\)"):
            gc.compile(small_program(), target="cuda", arch="sm_90", out_dir=tmp_path / "out")
    finally:
        build.compiler_version.cache_clear()


@pytest.mark.parametrize("gpu,nvcc,want", [(None, True, "cpu"), ("sm_90", False, "cpu"), ("sm_90", True, "cuda")])
def test_default_target_falls_back_to_cpu(monkeypatch, capsys, gpu, nvcc, want):
    """`make demo` (gcompile run without --target) builds for the cpu target unless a GPU and nvcc are there."""
    monkeypatch.setattr(model_file, "detect_arch", lambda: gpu)
    monkeypatch.setattr(model_file.shutil, "which", lambda name: "/usr/bin/nvcc" if nvcc else None)
    assert model_file.default_target() == want
    assert ("a GPU is present but nvcc is not on PATH" in capsys.readouterr().err) == (gpu is not None and not nvcc)


@pytest.mark.parametrize("arch,flags", [
    ("sm_90", ["-gencode=arch=compute_90a,code=sm_90a"]),   # sm_90's machine code has Hopper's own instructions
    ("sm_90,compute_90", ["-gencode=arch=compute_90a,code=sm_90a", "-gencode=arch=compute_90,code=compute_90"]),
    ("sm_80,compute_80", ["-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_80,code=compute_80"]),
    ("sm_90a", ["-gencode=arch=compute_90a,code=sm_90a"]),
])
def test_arch_lists(arch, flags):
    assert build.gencode_flags(arch) == flags


@pytest.mark.parametrize("arch", ["90", "sm90", "sm_x", "sm_90,", "ptx_90"])
def test_bad_arch_is_refused_before_nvcc_runs(arch):
    with pytest.raises(gc.BuildError, match="is not sm_XY or compute_XY"):
        build.gencode_flags(arch)


def test_wgmma_tiles_need_sm_90_in_the_arch_list(tmp_path):
    """The MLP's tf32 step at batch 1000 has wgmma tiles (sm_90a machine code only): an arch list without sm_90
    is refused before nvcc runs, naming the GEMMs; the fp32 step builds for any arch list."""
    from conftest import load_example
    from gcompile.pipeline import compile_program
    program = load_example("mnist_mlp").program(batch_size=1000)
    kernels = compile_program(program, "cuda", precision="tf32").kernels
    with pytest.raises(gc.BuildError, match=r"arch 'sm_80,compute_80': the GEMMs .* have wgmma tiles"):
        build.check_wgmma_arch(kernels, "sm_80,compute_80")
    for arch in ("sm_90", "sm_80,sm_90a,compute_90"):
        build.check_wgmma_arch(kernels, arch)
    build.check_wgmma_arch(compile_program(program, "cuda", precision="fp32").kernels, "sm_80")
    with pytest.raises(gc.BuildError, match="or build with precision fp32$"):
        build.check_wgmma_arch(kernels, "sm_80")
    # an fp32 record's wgmma tiles (tf32 parts): the record chose them, not the precision
    from gcompile.tune import read_record
    record = read_record(Path(__file__).resolve().parents[1] / "bench" / "tuned" / "nvidia-h100-80gb-hbm3" /
                         "mnist_mlp_b1000_fp32.json")
    with pytest.raises(gc.BuildError, match="or build without the tuning record that chose fp32 wgmma tiles"):
        build.check_wgmma_arch(compile_program(program, "cuda", precision="fp32", tuning=record).kernels, "sm_80")


def huge_program(elements: int):
    """A forward program whose arena (input and output, each `elements` float32s) fits in no memory."""
    x = gc.placeholder("x", (elements // 2**20, 2**20))
    return [x * 2.0]


def test_arena_larger_than_memory_reports_its_size(tmp_path):
    artifact = gc.compile(huge_program(2**50), target="cpu", out_dir=tmp_path)
    with pytest.raises(gc.RuntimeFailure, match=r"gc_create: could not allocate 9007199254740992 bytes "
                                                r"\(8388608.00 GiB\) of memory for the arena"):
        gc.load(artifact)


@pytest.mark.skipif(not HAS_NVCC or build.detect_arch() is not None, reason="needs nvcc and no GPU")
def test_cuda_build_without_a_gpu(tmp_path):
    artifact = gc.compile(small_program(), target="cuda", arch="sm_90", out_dir=tmp_path / "build")
    with pytest.raises(gc.RuntimeFailure, match=r"gc_create: no usable CUDA device \(.+\); this program was built "
                                                r"for the cuda target: build it with target='cpu'"):
        gc.load(artifact)
    data = synthetic_dataset(tmp_path / "data")
    proc = run_binary(artifact, "train", "--data", data, check=1)
    assert "error: no usable CUDA device" in proc.stderr


# --- on a GPU machine (make gpu-test) -------------------------------------------------------------------------
def other_arch(device: str) -> str:
    """Machine code for an architecture that is not the device's, and no PTX."""
    return "sm_75" if device != "sm_75" else "sm_80"


@pytest.mark.gpu
def test_gpu_architecture_the_build_does_not_cover(tmp_path):
    device = build.detect_arch()
    arch = other_arch(device)
    artifact = gc.compile(small_program(), target="cuda", arch=arch, out_dir=tmp_path)
    with pytest.raises(gc.RuntimeFailure) as info:
        gc.load(artifact)
    message = str(info.value)
    print(message)
    assert re.search(rf"gc_create: the GPU .+ is {device}, but this program's kernels were built for compute "
                     rf"architecture\(s\) {arch[3:]}0 and cannot run on it \(.+\); rebuild with --arch {device}",
                     message)


@pytest.mark.gpu
def test_arena_larger_than_device_memory(tmp_path):
    artifact = gc.compile(huge_program(2**40), target="cuda", out_dir=tmp_path)
    with pytest.raises(gc.RuntimeFailure) as info:
        gc.load(artifact)
    print(info.value)
    assert re.search(r"gc_create: could not allocate 8796093022208 bytes \(8192.00 GiB\) of device memory for the "
                     r"arena: out of memory \(the device has [0-9.]+ GiB free of [0-9.]+ GiB\)", str(info.value))


@pytest.mark.gpu
def test_cuda_trainer_runs_the_guard_and_checkpoints(tmp_path):
    """On the device: save-every and resume give the cpu target's parameters; a bad step stops training as
    on the cpu, keeping the checkpoint."""
    data = synthetic_dataset(tmp_path / "data", n_train=40, n_valid=12)
    poisoned = poisoned_dataset(tmp_path / "poisoned", bad_example=13)
    results, stops = {}, {}
    for target in ("cpu", "cuda"):
        artifact = gc.compile(small_program(positive=True), target=target, out_dir=tmp_path / target)
        ckpt = tmp_path / f"{target}.ckpt"
        run_binary(artifact, "train", "--data", data, "--epochs", 1, "--save", ckpt, "--save-every", 3, check=0)
        run_binary(artifact, "train", "--resume", ckpt, "--data", data, "--epochs", 2, check=0)
        results[target] = gc.read_checkpoint(ckpt)
        proc = run_binary(artifact, "train", "--data", poisoned, "--no-shuffle", "--save", tmp_path / "p.ckpt",
                          "--save-every", 2, check=3)
        stops[target] = proc.stderr
    assert results["cuda"].step == results["cpu"].step == 20
    for name, value in results["cpu"].tensors.items():
        # 20 momentum steps apart, float sums on the device vs double on the cpu: looser than the golden bound
        np.testing.assert_allclose(results["cuda"].tensors[name], value, rtol=1e-3, atol=1e-4, err_msg=name)
    assert "non-finite loss at step 4 of the run (epoch 1, step 4 of 6)" in stops["cuda"]
    assert stops["cuda"] == stops["cpu"]


def test_sanitize_is_for_the_cpu_target():
    assert "-fsanitize=address,undefined,float-cast-overflow" in build.compile_flags("cpu", None, sanitize=True)[1]
    with pytest.raises(gc.BuildError, match="for the cuda target run compute-sanitizer"):
        build.compile_flags("cuda", "sm_90", sanitize=True)
