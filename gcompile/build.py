"""build: write the generated source, the initial parameters and the manifest, then compile the source
(cpu: to one object; cuda: its kernels parts' device code, their launch parts and its host part, side by side,
see part_commands) and link the objects twice — a shared library (the C ABI, for gc.load) and a standalone
binary (the training command line). Builds are cached by a hash of source + every command + compiler versions.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from .checkpoint import Checkpoint, write_checkpoint
from .errors import BuildError, PerformanceWarning
from .resources import file_lock, make_folder, package_dir, sha256_of

DEFAULT_CUDA_ARCH = "sm_90,compute_90"  # without a GPU to ask: sm_90 machine code plus PTX
SUFFIX = {"cuda": ".cu", "cpu": ".cpp"}


@dataclass
class Artifact:
    """What gc.compile produced; paths are absolute."""
    name: str
    target: str
    out_dir: str
    source: str
    binary: str
    library: str
    manifest: str
    init: str
    cached: bool
    seconds: float


@functools.lru_cache(maxsize=None)
def compiler_version(compiler: str) -> str:
    try:
        out = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        hint = " (install the CUDA toolkit, or compile with target='cpu')" if compiler == "nvcc" else ""
        raise BuildError(f"compiler {compiler!r} not found on PATH{hint}") from None
    return out.stdout.strip()


@functools.lru_cache(maxsize=None)
def detect_arch() -> str | None:
    """The present GPU's architecture (sm_XY), or None when no GPU answers."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    caps = out.stdout.split()
    return "sm_" + caps[0].replace(".", "") if out.returncode == 0 and caps else None


def gencode_flags(arch: str) -> list[str]:
    """nvcc -gencode flags for `arch`: a comma-separated list of sm_XY (machine code for that architecture)
    and compute_XY (PTX for it, which the driver compiles for newer GPUs), e.g. "sm_80,sm_90,compute_90".
    What the list names is what the binary holds: "sm_80" alone cannot run on an sm_90 GPU. sm_90's machine
    code is sm_90a's, which runs on every GPU of compute capability 9.0 (the H100, H200) and has Hopper's own
    instructions (wgmma: the wgmma tiles, runtime/gc_gemm_wgmma.cuh); compute_90's PTX stays portable."""
    flags = []
    for item in arch.split(","):
        kind, _, number = item.strip().partition("_")
        if kind not in ("sm", "compute") or not re.fullmatch(r"\d{2,3}[a-z]?", number):
            raise BuildError(f"arch {arch!r}: {item.strip()!r} is not sm_XY or compute_XY (e.g. sm_90, "
                             "sm_80,compute_80)")
        if kind == "sm" and number == "90":
            number = "90a"
        flags.append(f"-gencode=arch=compute_{number},code={kind}_{number}")
    return flags


def check_wgmma_arch(kernels: dict, arch: str) -> None:
    """A program whose GEMMs have wgmma tiles (precision tf32 on the sm_90 calibration, or an fp32 tuning
    record's tf32-parts wgmma tiles) runs on sm_90a machine code only: refuse an arch list without sm_90 before
    nvcc runs, naming the GEMMs and what chose their tiles."""
    from .gemm_tiles import Tile
    tiles = {k.name: Tile.parse(k.values["tile"])[0] for ks in kernels.values() for k in ks if k.kind == "matmul"}
    wgmma = [name for name, tile in tiles.items() if tile.wgmma]
    if wgmma and not {item.strip() for item in arch.split(",")} & {"sm_90", "sm_90a"}:
        ways = (["build with precision fp32"] if any(not tiles[n].parts for n in wgmma) else []) + \
               (["build without the tuning record that chose fp32 wgmma tiles (as tf32 parts)"]
                if any(tiles[n].parts for n in wgmma) else [])
        raise BuildError(f"arch {arch!r}: the GEMMs {', '.join(wgmma)} have wgmma tiles (tensor cores of the H100 "
                         f"and H200), which need sm_90 machine code: add sm_90 to the arch list, or "
                         f"{', or '.join(ways)}")


def compile_flags(target: str, arch: str | None, cudart: str = "static",
                  sanitize: bool = False) -> tuple[str, list[str], list[str]]:
    """(compiler, compile flags, link flags). cudart="shared" links the CUDA runtime dynamically (so a
    preloaded library can observe its calls); the default static runtime makes a self-contained binary.
    sanitize=True builds the cpu target under AddressSanitizer and UndefinedBehaviorSanitizer, every report
    fatal (for the cuda target, run compute-sanitizer on a normal build instead)."""
    if target == "cuda":
        if sanitize:
            raise BuildError("sanitize=True builds the cpu target under AddressSanitizer/UBSan; for the cuda target "
                             "run compute-sanitizer (memcheck, racecheck) on a normal build")
        gencode = gencode_flags(arch or detect_arch() or DEFAULT_CUDA_ARCH)
        if cudart not in ("static", "shared"):
            raise BuildError(f"cudart must be 'static' or 'shared', not {cudart!r}")
        # Kernel launches go to the per-thread default stream: the runtime captures them into CUDA graphs.
        # Compile time (docs/compiler.md, "Compile time"): --split-compile 0 runs cicc's and ptxas's per-kernel
        # optimization on every CPU and --threads 0 the architectures of a list side by side (the machine
        # code, cuobjdump -sass, is the same as without them); -O1 is the host compiler's level only (the device compilers
        # take no -O) — the host code checks arguments, reads files and replays CUDA graphs, and -O1 still
        # defines __OPTIMIZE__ as -O3 does, so the device side sees the same preprocessed source.
        return "nvcc", ["-O1", "--split-compile", "0", "--threads", "0", "-std=c++17", *gencode,
                        "--default-stream", "per-thread", "-Xcompiler", "-fPIC,-fvisibility=hidden"], \
            [*gencode, f"-cudart={cudart}"]
    compiler = host_compiler()
    if sanitize:
        # (float-cast-overflow is not in gcc's `undefined`: a float out of an integer's range cast to it)
        checks = ["-fsanitize=address,undefined,float-cast-overflow", "-fno-sanitize-recover=all"]
        return compiler, ["-O1", "-g", "-fno-omit-frame-pointer", *checks, "-std=c++17", "-fopenmp", "-fPIC",
                          "-fvisibility=hidden"], ["-fopenmp", *checks]
    # the machine's own processor (its vectors: the GEMM's register tile, runtime/gc_kernels_cpu.h); no fused
    # multiply-adds, which -march=native allows gcc to form (a * b + c rounded once, where numpy, the reference,
    # rounds twice): the results are the bits of a build without -march
    native = ["-march=native", "-ffp-contract=off"] if native_target(compiler) else []
    return compiler, ["-O3", *native, "-std=c++17", "-fopenmp", "-fPIC", "-fvisibility=hidden"], ["-fopenmp"]


@functools.lru_cache(maxsize=None)
def native_target(compiler: str) -> str | None:
    """What -march=native means to `compiler` on this machine — the processor and its instruction sets from the
    front end's command line that `-v` prints (gcc: -march=znver3 -mavx2 ... --param l2-cache-size=1024; clang:
    -target-cpu znver3 -target-feature +avx2 ...) — or None when the compiler does not take -march=native. The
    cpu target is built for the processor it runs on: its vector width sets the GEMM's register tile
    (runtime/gc_kernels_cpu.h). These options are part of the build's key (build_settings), so a build folder or
    cache shared with a machine of another processor is rebuilt there, not reused."""
    try:
        out = subprocess.run([compiler, "-march=native", "-x", "c++", "-E", "-v", os.devnull, "-o", os.devnull],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    lines = [line for line in out.stderr.splitlines()
             if ("-march=" in line and "-march=native" not in line) or "-target-cpu" in line]
    if not lines:
        return "-march=native"
    # the processor's options only: the line also names paths (clang's -fdebug-compilation-dir is the working
    # directory), which would make the key differ from one directory to the next
    try:
        words = shlex.split(lines[0])
    except ValueError:
        words = lines[0].split()
    takes_value = ("--param", "-target-cpu", "-target-feature", "-tune-cpu")
    kept = [w for i, w in enumerate(words) if w.startswith("-m") or w in takes_value
            or (i and words[i - 1] in takes_value)]
    return " ".join(kept) or "-march=native"


def cuda_includes(nvcc: str) -> tuple[str, ...] | None:
    """The include flags nvcc gives its host compiler (the CUDA runtime's headers), as `nvcc --dryrun`
    prints them; None when it does not say (or there is no nvcc)."""
    path = shutil.which(nvcc)
    return nvcc_includes(path) if path else None


@functools.lru_cache(maxsize=None)
def nvcc_includes(path: str) -> tuple[str, ...] | None:
    try:
        out = subprocess.run([path, "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    flags = []
    for line in (out.stdout + out.stderr).splitlines():
        for name in ("INCLUDES", "SYSTEM_INCLUDES"):
            if line.startswith(f"#$ {name}="):
                flags += shlex.split(line[len(f"#$ {name}="):])
    return tuple(flags) if any(f.startswith("-I") for f in flags) else None


def part_commands(target: str, compiler: str, flags: list[str], kernel_parts: int = 1) -> list[list[str]]:
    """compiler + flags of each part the source is compiled to, up to the source and output paths; the compiles
    run side by side. cpu: one object. cuda: parts of the one source (runtime/gc_runtime.h): nvcc compiles each
    of the `kernel_parts` kernels parts twice, to device code only (--fatbin, GC_PART_KERNELS=p: part p's
    kernels; part 0 also the runtime's own; emit.py's assign_parts shares the kernels out) and to an object
    (GC_PART_LAUNCH=p: their launchers and host stubs, the kernels' bodies left out; part 0 also the steps, the
    streams and gc_kernel_of, which finds a stub's kernel in the parts' device code); the host C++ compiler,
    with the CUDA runtime's headers, compiles the host part (GC_PART_HOST: error messages, data, checkpoints,
    CUDA graphs, the C ABI, the trainer). Inside one nvcc run every step waits for the one before (the host
    compile for cicc and ptxas, which optimize one kernel after another's front end); separate runs overlap
    (docs/compiler.md, "Compile time"). Where nvcc does not say where its headers are, nvcc compiles the whole
    source."""
    includes = cuda_includes(compiler) if target == "cuda" else None
    if includes is None:
        return [[compiler, *flags, "-c"]]
    # nvcc's settings for its own host compile: -O1, C++17, position independent, hidden symbols, and the
    # macro that --default-stream per-thread defines (the runtime API's calls then use the per-thread stream)
    host = [host_compiler(), "-x", "c++", "-O1", "-std=c++17", "-fPIC", "-fvisibility=hidden",
            "-DCUDA_API_PER_THREAD_DEFAULT_STREAM=1", *includes, "-c", "-DGC_PART_HOST"]
    return [[compiler, *flags, "--fatbin", f"-DGC_PART_KERNELS={p}"] for p in range(kernel_parts)] + \
        [[compiler, *flags, "-c", f"-DGC_PART_LAUNCH={p}"] for p in range(kernel_parts)] + [host]


def host_compiler() -> str:
    """The host C++ compiler ($CXX, else c++): the cuda build's host part and its device code's embedding."""
    return os.environ.get("CXX", "c++")


def part_outputs(out: Path, name: str, parts: list[list[str]]) -> list[Path]:
    """Where each part's compile writes: a kernels part's fatbin, or an object."""
    return [out / (f"{name}.{i}.fatbin" if "--fatbin" in part else f"{name}.{i}.o") for i, part in enumerate(parts)]


def embed_device_code(out: Path, name: str, fatbins: list[Path], source: Path) -> Path | None:
    """The kernels parts' device code into an object: an assembly file whose symbols gc_device_code_<p> hold
    part p's fatbin (.incbin, in the .nv_fatbin section where cuobjdump looks), for the launch part's
    gc_device_code, assembled by the host compiler. Returns the object (None without kernels parts)."""
    if not fatbins:
        return None
    lines = ['.section .nv_fatbin, "a"']
    for p, fatbin in enumerate(fatbins):
        path = str(fatbin).replace("\\", "\\\\").replace('"', '\\"')
        lines += [".balign 16", f".globl gc_device_code_{p}", f".hidden gc_device_code_{p}",
                  f"gc_device_code_{p}:", f'.incbin "{path}"']
    lines.append('.section .note.GNU-stack, "", %progbits')
    assembly, obj = out / f"{name}.device.s", out / f"{name}.device.o"
    assembly.write_text("\n".join(lines) + "\n")
    try:
        run([[host_compiler(), "-c", str(assembly), "-o", str(obj)]], source)
    finally:
        assembly.unlink(missing_ok=True)
    return obj


def build_command(parts: list[list[str]]) -> str:
    """The compile commands as the source's header shows them ('&': side by side)."""
    return " & ".join(" ".join(p) for p in parts)


def header_commands(target: str, compiler: str, flags: list[str]):
    """What compile_program takes as its build_command: the header's commands for a number of kernels parts
    (known once emit has shared the kernels out)."""
    return lambda kernel_parts: build_command(part_commands(target, compiler, flags, kernel_parts))


def build_settings(target: str, compiler: str, flags: list[str], link_flags: list[str],
                   kernel_parts: int = 1) -> list[str]:
    """Every command of a build and every compiler's version: what the build caches are keyed by. (The
    program's fingerprint takes them for one kernels part: how many there are follows from the program.)"""
    parts = part_commands(target, compiler, flags, kernel_parts)
    versions = [compiler_version(c) for c in dict.fromkeys([compiler] + [p[0] for p in parts])]
    native = [native_target(compiler) or ""] if "-march=native" in flags else []
    return [" ".join(p) for p in parts] + [" ".join([compiler, *link_flags]), *versions, *native]


def write_if_changed(path: Path, data: bytes) -> None:
    """Generated files are rewritten only when their content changes (keeps timestamps meaningful)."""
    if path.exists() and path.read_bytes() == data:
        return
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def run(commands: list[list[str]], source: Path) -> str:
    """Run independent compiler commands side by side; the first failure raises BuildError. Returns what they
    printed (stderr, then stdout, command by command) when all succeed."""
    procs = [(cmd, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
             for cmd in commands]
    results = [(cmd, proc, *proc.communicate()) for cmd, proc in procs]
    for cmd, proc, out, err in results:
        if proc.returncode != 0:
            raise BuildError(f"compiling {source.name} failed (exit {proc.returncode})", command=cmd,
                             stderr=err + out, source_path=str(source))
    return "".join(err + out for _, _, out, err in results)


# ptxas's note that it gave up pipelining a kernel's wgmma (C7510): each wgmma then waits for the one before,
# and the GEMM runs several times slower with the same results — silently, since a build that succeeds shows
# nothing. Any call inside the kernel does it (a printf left in for timing: "wgmma pipeline crossing function
# boundary at a function call"), as do accumulators written between a wgmma and its wait. docs/compiler.md,
# "A build reports serialized wgmma".
_SERIALIZED = re.compile(r"\(C7510\)[^\n]*?wgmma\.mma_async instructions are serialized due to (?P<reason>[^\n]*?) "
                         r"in the function '(?P<kernel>[^'\n]+)'")


def serialized_wgmma(output: str) -> list[dict]:
    """The kernels whose wgmma ptxas serialized, from a compile's output (its C7510 notes), once each in the order
    reported: {"kernel": the name (demangled where c++filt is at hand), "symbol": as ptxas gave it, "reason"}."""
    found: dict[str, str] = {}
    for m in _SERIALIZED.finditer(output):
        found.setdefault(m["kernel"], m["reason"])
    symbols = list(found)
    names = symbols
    if symbols and shutil.which("c++filt"):
        try:
            out = subprocess.run(["c++filt"], input="\n".join(symbols), capture_output=True, text=True, timeout=60)
            if out.returncode == 0 and len(out.stdout.splitlines()) == len(symbols):
                names = out.stdout.splitlines()
        except (OSError, subprocess.TimeoutExpired):
            pass
    return [{"kernel": n, "symbol": s, "reason": found[s]} for n, s in zip(names, symbols)]


def warn_serialized(source: Path, serialized: list[dict]) -> None:
    """A PerformanceWarning for each kernel serialized_wgmma found, naming it and ptxas's reason."""
    for entry in serialized:
        warnings.warn(f"{source.name}: ptxas serialized the wgmma of kernel {entry['kernel']} "
                      f"({entry['reason']}): each waits for the one before, so this GEMM runs several times slower "
                      f"than it should (same results); the manifest lists it under wgmma_serialized",
                      PerformanceWarning, stacklevel=3)


def initial_checkpoint(module) -> Checkpoint:
    tensors = {v.name: np.asarray(v.attrs["init"](v.shape, v.dtype), dtype=v.dtype) for v in module.variables}
    return Checkpoint(tensors, module.layout_hash, batch=module.batch_size)


def program_key_file(out: Path, name: str) -> Path:
    return out / f".{name}.program-key"


def read_build_manifest(path: Path) -> dict:
    """A build's manifest as it wrote it, or {} where there is none to read (missing, unreadable, not JSON)."""
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return manifest if isinstance(manifest, dict) else {}


def cached_artifact(out_dir, name: str, program_key: str) -> Artifact | None:
    """The artifact already in out_dir when it was built from a program with this fingerprint."""
    out = Path(out_dir).resolve()
    try:
        if program_key_file(out, name).read_text() != program_key:
            return None
    except OSError:
        return None
    manifest = read_build_manifest(out / f"{name}.json")
    recorded = manifest.get("artifact")
    if recorded is None:
        return None
    artifact = Artifact(**dict(recorded, cached=True, seconds=0.0))
    if Path(artifact.out_dir).resolve() != out:
        return None   # a copy of another folder: its manifest names the other folder's files
    if not all(Path(p).exists() for p in (artifact.binary, artifact.library, artifact.init, artifact.source)):
        return None
    digests = {**output_digests(Path(artifact.library), Path(artifact.binary)), **init_digest(Path(artifact.init))}
    # changed since it was built: a truncated library would kill the process that loads it, a damaged init file
    # fail every run of the binary
    if not outputs_intact(manifest, digests):
        return None
    return artifact


def output_digests(library: Path, binary: Path) -> dict:
    """The manifest's record of the linked files: {"library_sha256", "binary_sha256"} (None: cannot be read)."""
    return {"library_sha256": file_sha256(library), "binary_sha256": file_sha256(binary)}


def init_digest(init: Path) -> dict:
    """The manifest's record of the initial values' file: {"init_sha256"} (written by every build)."""
    return {"init_sha256": file_sha256(init)}


def outputs_intact(manifest: dict, digests: dict) -> bool:
    """Whether the files with these digests (output_digests, init_digest) are the ones the build that wrote
    `manifest` made."""
    return None not in digests.values() and all(manifest.get(k) == v for k, v in digests.items())


def remove_generated(path: Path) -> None:
    """Remove path if gcompile generated it (its first line says so), not a user's file of that name."""
    try:
        with open(path, "rb") as f:
            generated = f.readline().startswith(b"// @generated by gcompile")
    except OSError:
        return
    if generated:
        path.unlink(missing_ok=True)


def check_folder(target: str, out_dir) -> Path:
    """The output folder, absolute, if the target can build there (before anything is made in it)."""
    out = Path(out_dir).resolve()
    if target == "cuda" and '"' in str(out):   # nvcc hands the objects to nvlink, which drops the quotes
        raise BuildError(f"out_dir {str(out)!r}: the cuda target cannot build in a folder whose path has a double "
                         "quote (nvcc's device linker, nvlink, cannot open such paths); choose another folder")
    return out


@contextlib.contextmanager
def folder_lock(out_dir, name: str):
    """Holds `out_dir/.<name>.lock` (made with the folder if missing) locked, exclusively, while inside: a
    build of `name` there by another process or thread waits (two at once deleted each other's objects and
    recorded a half-written library's digest). An flock: the system releases it when its holder dies.
    A folder that cannot hold the lock file (read-only, another user's) is used without it: a cache hit
    there needs no write, and a build fails at its first write with its own message."""
    with file_lock(make_folder(out_dir, "output", BuildError) / f".{name}.lock"):
        yield


def file_sha256(path) -> str | None:
    """The SHA-256 of a file's bytes (hex), None if it cannot be read."""
    try:
        return sha256_of(path)
    except OSError:
        return None


def build(compiled, out_dir, arch: str | None = None, cudart: str = "static", program_key: str = "",
          sanitize: bool = False) -> Artifact:
    start = time.perf_counter()
    module, target = compiled.module, compiled.target
    out = make_folder(check_folder(target, out_dir), "output", BuildError)
    if target == "cuda":
        arch = arch or detect_arch() or DEFAULT_CUDA_ARCH
        check_wgmma_arch(compiled.kernels, arch)
    compiler, flags, link_flags = compile_flags(target, arch, cudart, sanitize)
    settings = build_settings(target, compiler, flags, link_flags, compiled.kernel_parts)
    parts = part_commands(target, compiler, flags, compiled.kernel_parts)

    source = out / f"{module.name}{SUFFIX[target]}"
    for other in set(SUFFIX.values()) - {SUFFIX[target]}:   # the other target's source, of an older build
        remove_generated(out / f"{module.name}{other}")
    write_if_changed(source, compiled.source.encode())
    init = out / module.init_file
    binary, library = out / module.name, out / f"lib{module.name}.so"
    outputs = part_outputs(out, module.name, parts)
    objects = [o for o in outputs if o.suffix == ".o"]
    fatbins = [o for o in outputs if o.suffix == ".fatbin"]

    key = hashlib.sha256("\0".join([compiled.source, *settings]).encode()).hexdigest()
    key_file = out / f".{module.name}.build-key"
    manifest_path = out / f"{module.name}.json"
    former, digests = read_build_manifest(manifest_path), output_digests(library, binary)
    cached = key_file.exists() and key_file.read_text() == key and outputs_intact(former, digests)
    if cached:   # the serialized wgmma its build found (the manifest it wrote then)
        serialized = list(former.get("wgmma_serialized", []))
    else:   # until the new build is whole, no manifest says the folder holds one (the old binary keeps its init)
        for stale in (key_file, program_key_file(out, module.name), manifest_path):
            stale.unlink(missing_ok=True)
        stub = package_dir("runtime") / "gc_main_stub.cpp"
        serialized = serialized_wgmma(run([[*part, str(source), "-o", str(output)]
                                           for part, output in zip(parts, outputs)], source))
        warn_serialized(source, serialized)
        device = embed_device_code(out, module.name, fatbins, source)
        if device:
            objects.append(device)
        run([[compiler, *link_flags, "-shared", *map(str, objects), "-o", str(library)],
             [compiler, *link_flags, *map(str, objects), str(stub), "-o", str(binary)]], source)
        for path in [*fatbins, *objects]:   # every part's output and the embedded device code's object
            path.unlink(missing_ok=True)
        key_file.write_text(key)
        digests = output_digests(library, binary)
    write_checkpoint(init, initial_checkpoint(module))   # the binary loads it: only beside the binary built for it

    artifact = Artifact(module.name, target, str(out), str(source), str(binary), str(library),
                        str(manifest_path), str(init), cached, time.perf_counter() - start)
    manifest = dict(module.manifest, target=target, artifact=asdict(artifact),
                    compiler=parts[0], launch_compiler=parts[len(fatbins)] if fatbins else None,
                    host_compiler=parts[-1] if len(parts) > 1 else None,
                    kernel_parts=len(fatbins) or None, sanitize=sanitize,
                    arena_bytes=compiled.plan.arena_bytes,
                    batch_rows=any(b.rows for b in compiled.plan.buffers),
                    lower_bound_bytes=compiled.plan.lower_bound, naive_bytes=compiled.plan.naive_bytes,
                    wgmma_serialized=serialized, **digests, **init_digest(init))
    write_if_changed(Path(artifact.manifest), json.dumps(manifest, indent=1).encode())
    if program_key:
        program_key_file(out, module.name).write_text(program_key)
    return artifact
