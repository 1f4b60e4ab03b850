"""A standalone test program for gc_gemm (runtime/gc_gemm.h) on either target: each case is one gc_gemm call
with its own types, transposes, tile, shape, batch strides, pointer alignment and epilogue; the program reads
the operands from files, runs every case and writes the results, which Python compares with float64 numpy.

The epilogue `ep_test` uses all of (b, m, n) and a bias row: relu(acc + bias[n] + 0.25 (m % 3) - b).
"""
from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gcompile.build import compile_flags
from gcompile.gemm_tiles import Tile
from gcompile.resources import package_dir

C_TYPES = {"float32": "float", "float64": "double"}

PRELUDE = """\
#include <vector>
#include "gc_runtime.h"
#include "gc_gemm.h"
#ifdef GC_CUDA
#include "gc_gemm_cuda.cuh"
#include "gc_gemm_tc.cuh"
#include "gc_gemm_wgmma.cuh"
#include "gc_gemm_sk.cuh"
#include "gc_gemm_ws.cuh"
#else
#include "gc_kernels_cpu.h"
#endif

struct ep_test {
    static constexpr bool prefetch = true;   // stores nothing itself: the kernels' early call runs too
    const void* bias;
    template <typename T> GC_HD T operator()(int b, int m, int n, T acc) const {
        T v = acc + ((const T*)bias)[n] + T(0.25) * (m % 3) - T(b);
        return v > T(0) ? v : T(0);
    }
};
// The same epilogue on runs of 4 columns (gc_gemm_cuda.cuh's `runs`): the bias as a 16-byte vector, m and b
// once for the run (the pack holds them, as a generated epilogue's scalar operands).
struct ep_test_runs : ep_test {
#ifdef __CUDACC__
    static constexpr bool runs = true;
    struct pack { float4 bias; int m3; };
    GC_HD pack load4(int, int m, int n) const { return {*(const float4*)((const float*)bias + n), m % 3}; }
    template <typename T> GC_HD void run4(const pack& q, int b, int, int, T* v) const {
        const float w[4] = {q.bias.x, q.bias.y, q.bias.z, q.bias.w};
        for (int j = 0; j < 4; j++) {
            const T x = v[j] + T(w[j]) + T(0.25) * q.m3 - T(b);
            v[j] = x > T(0) ? x : T(0);
        }
    }
#endif
};
static ep_test make_ep(ep_test*, const void* bias) { return ep_test{bias}; }
static ep_test_runs make_ep(ep_test_runs*, const void* bias) { return ep_test_runs{{bias}}; }
static gc_ep_store make_ep(gc_ep_store*, const void*) { return gc_ep_store{}; }

// <what><i>.bin from dir into device memory, `shift` elements past a 256-byte boundary.
template <typename T>
static int upload(const char* dir, const char* what, int i, int shift, T** out, std::vector<T>& host) {
    char name[64], path[4096];
    snprintf(name, sizeof name, "%s%d", what, i);
    snprintf(path, sizeof path, "%s/%s.bin", dir, name);
    FILE* f = fopen(path, "rb");
    if (!f) return gc_fail(GC_ERR_IO, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long bytes = ftell(f);
    fseek(f, 0, SEEK_SET);
    host.resize(bytes / sizeof(T));
    size_t got = fread(host.data(), 1, bytes, f);
    fclose(f);
    if ((long)got != bytes) return gc_fail(GC_ERR_IO, "short read of %s", path);
    void* base;
    GC_TRY(gc_device_alloc(&base, bytes + (shift + 1) * sizeof(T) + 256, name));
    *out = (T*)base + shift;
    return gc_copy_to_device(*out, host.data(), bytes);
}

// The result c (host copy hc) into dir/out<i>.bin.
template <typename T>
static int download(const char* dir, int i, const T* c, std::vector<T>& hc) {
    GC_TRY(gc_copy_to_host(hc.data(), c, hc.size() * sizeof(T)));
    char path[4096];
    snprintf(path, sizeof path, "%s/out%d.bin", dir, i);
    FILE* f = fopen(path, "wb");
    if (!f || fwrite(hc.data(), sizeof(T), hc.size(), f) != hc.size()) return gc_fail(GC_ERR_IO, "cannot write %s", path);
    fclose(f);
    return GC_OK;
}

template <typename T, bool TA, bool TB, class Tile, class Ep>
static int run_case(const char* dir, int i, int M, int N, int K, int batch, long long sa, long long sb,
                    long long sc, int shift) {
    std::vector<T> ha, hb, hbias, hc;
    T *a, *b, *bias, *c;
    GC_TRY(upload(dir, "a", i, shift, &a, ha));
    GC_TRY(upload(dir, "b", i, 0, &b, hb));
    GC_TRY(upload(dir, "bias", i, 0, &bias, hbias));
    GC_TRY(upload(dir, "c", i, 0, &c, hc));
    GC_TRY((gc_gemm<T, TA, TB, Tile>(a, b, c, M, N, K, make_ep((Ep*)0, bias), batch, sa, sb, sc)));
    return download(dir, i, c, hc);
}

// The same GEMM with A the image input read in place (gc_rows): the source's rows (uint8 or float, `shift`
// elements past an aligned address), gathered by the index (or rows 0.. in order), uint8 scaled by 1/255.
template <typename T, bool TA, bool TB, class Tile, class Ep>
static int run_rows_case(const char* dir, int i, int M, int N, int K, int u8, int indexed, int shift, int exact) {
    std::vector<uint8_t> hs8;
    std::vector<float> hs32;
    std::vector<uint32_t> hidx;
    std::vector<T> hb, hbias, hc;
    uint8_t* s8 = nullptr;
    float* s32 = nullptr;
    uint32_t* idx = nullptr;
    T *b, *bias, *c;
    GC_TRY(u8 ? upload(dir, "src", i, shift, &s8, hs8) : upload(dir, "src", i, shift, &s32, hs32));
    if (indexed) GC_TRY(upload(dir, "idx", i, 0, &idx, hidx));
    GC_TRY(upload(dir, "b", i, 0, &b, hb));
    GC_TRY(upload(dir, "bias", i, 0, &bias, hbias));
    GC_TRY(upload(dir, "c", i, 0, &c, hc));
    gc_rows rows = {u8 ? (const void*)s8 : (const void*)s32, idx, 1.f / 255.f, u8, exact};
    GC_TRY((gc_gemm<T, TA, TB, Tile>(rows, b, c, M, N, K, make_ep((Ep*)0, bias))));
    return download(dir, i, c, hc);
}
"""


@dataclass
class Case:
    dtype: str
    ta: bool
    tb: bool
    tile: str
    m: int
    n: int
    k: int
    batch: int = 1
    sa: int | None = None       # batch strides in elements (None: the matrices are packed)
    sb: int | None = None
    sc: int | None = None
    shift: int = 0              # A starts this many elements past an aligned address
    ep: bool = False            # ep_test instead of gc_ep_store
    runs: bool = False          # with ep: ep_test_runs (the epilogue on runs of 4 columns, float32)
    tf32: bool = False          # compare with the tf32 tolerance
    nans: bool = False          # op(A)[0, 0:2] are NaNs (0x7fffffff, CUDA's, and its negation): C's row 0 is NaN
    expect_error: str | None = None
    rows: str | None = None     # A read in place (gc_rows) from a "u8" or "f32" source (float32, batch 1)
    index: bool = True          # rows: gathered by an index (else rows 0.. in order)
    exact: bool = False         # rows "f32": values k / 256 (k < 256), flagged exact tf32 values (gc_rows.exact)
    cuda_only: bool = False     # what it checks is the cuda kernels' (the cpu target ignores tiles)

    def strides(self):
        return (self.sa or self.m * self.k, self.sb or self.k * self.n, self.sc or self.m * self.n)

    def call(self, index: int) -> str:
        sa, sb, sc = self.strides()
        ep = ("ep_test_runs" if self.runs else "ep_test") if self.ep else "gc_ep_store"
        if self.rows:
            return (f"run_rows_case<float, {str(self.ta).lower()}, {str(self.tb).lower()}, {self.tile}, {ep}>(dir, "
                    f"{index}, {self.m}, {self.n}, {self.k}, {int(self.rows == 'u8')}, {int(self.index)}, {self.shift}, "
                    f"{int(self.exact)})")
        return (f"run_case<{C_TYPES[self.dtype]}, {str(self.ta).lower()}, {str(self.tb).lower()}, {self.tile}, "
                f"{ep}>(dir, {index}, {self.m}, {self.n}, {self.k}, {self.batch}, {sa}, {sb}, {sc}, {self.shift})")


def sources(cases: list[Case], parts: int) -> list[str]:
    """The program as `parts` translation units (compiled side by side): cases spread over them, main last."""
    units = []
    for p in range(parts):
        text = [PRELUDE]
        for i, case in enumerate(cases):
            if i % parts == p:
                text.append(f"int gc_case_{i}(const char* dir) {{\n    int rc = {case.call(i)};\n"
                            f"    if (rc != GC_OK) printf(\"case {i} error: %s\\n\", gc_error_message);\n"
                            f"    return rc;\n}}\n")
        units.append("\n".join(text))
    main = ["#include <stdio.h>"]
    main += [f"int gc_case_{i}(const char* dir);" for i in range(len(cases))]
    main.append("int main(int argc, char** argv) {\n    if (argc != 2) return 2;")
    main += [f"    printf(\"case {i} rc %d\\n\", gc_case_{i}(argv[1]));" for i in range(len(cases))]
    main.append("    return 0;\n}\n")
    units.append("\n".join(main))
    return units


def build(cases: list[Case], target: str, workdir: Path, parts: int = 2, arch: str | None = None) -> Path:
    compiler, flags, link_flags = compile_flags(target, arch)
    suffix = ".cu" if target == "cuda" else ".cpp"
    include = ["-I", str(package_dir("runtime"))]
    objects, commands = [], []
    for p, text in enumerate(sources(cases, parts)):
        src = workdir / f"gemm_part{p}{suffix}"
        src.write_text(text)
        objects.append(workdir / f"gemm_part{p}.o")
        commands.append([compiler, *flags, *include, "-c", str(src), "-o", str(objects[-1])])
    with ThreadPoolExecutor(len(commands)) as pool:
        results = list(pool.map(lambda cmd: subprocess.run(cmd, capture_output=True, text=True), commands))
    for cmd, r in zip(commands, results):
        assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stderr[-6000:]}"
    exe = workdir / "gemm_harness"
    r = subprocess.run([compiler, *link_flags, *map(str, objects), "-o", str(exe)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-6000:]
    return exe


def operands(case: Case, rng):
    """Packed-or-strided buffers for A, B, the bias and C (NaN everywhere: unwritten outputs stay NaN)."""
    sa, sb, sc = case.strides()
    dt = np.dtype(case.dtype)
    a = rng.uniform(-1, 1, (case.batch - 1) * sa + case.m * case.k).astype(dt)
    b = rng.uniform(-1, 1, (case.batch - 1) * sb + case.k * case.n).astype(dt)
    bias = rng.uniform(-1, 1, max(case.n, 1)).astype(dt)
    c = np.full((case.batch - 1) * sc + case.m * case.n, np.nan, dt)
    if case.nans:   # op(A)[0, 0] and op(A)[0, 1] of each batch entry
        bits = a.view(np.uint32)
        for i in range(case.batch):
            bits[i * sa] = 0x7fffffff
            bits[i * sa + (case.m if case.ta else 1)] = 0xffffffff
    files = {}
    if case.rows:   # A (its stored rows: M, K with ta) gathered from a larger source as gc_pixel converts it
        rows, length = (case.k, case.m) if case.ta else (case.m, case.k)
        index = rng.permutation(rows + 7)[:rows].astype(np.uint32) if case.index else np.arange(rows, dtype=np.uint32)
        if case.rows == "u8":
            source = rng.integers(0, 256, (rows + 7, length), dtype=np.uint8)
            a = (source[index].astype(np.float32) * np.float32(1 / 255)).reshape(-1)
        elif case.exact:   # tf32 values (the trainer's gathered uint8 images)
            source = (rng.integers(0, 256, (rows + 7, length)) / 256).astype(np.float32)
            a = source[index].reshape(-1)
        else:
            source = rng.uniform(-1, 1, (rows + 7, length)).astype(np.float32)
            a = source[index].reshape(-1)
        files = {"src": source, "idx": index}
    return a, b, bias, c, files


def matrices(case: Case, a, b):
    """op(A[i]), op(B[i]) in float64 for each batch entry."""
    sa, sb, _ = case.strides()
    for i in range(case.batch):
        ai = a[i * sa:i * sa + case.m * case.k].astype(np.float64)
        bi = b[i * sb:i * sb + case.k * case.n].astype(np.float64)
        ai = ai.reshape(case.k, case.m).T if case.ta else ai.reshape(case.m, case.k)
        bi = bi.reshape(case.n, case.k).T if case.tb else bi.reshape(case.k, case.n)
        yield ai, bi


def reference(case: Case, a, b, bias):
    """Per batch entry: (expected C in float64, |op(A)| @ |op(B)| for the error bound)."""
    out = []
    for i, (ai, bi) in enumerate(matrices(case, a, b)):
        c = ai @ bi
        if case.ep:
            m = np.arange(case.m)[:, None] % 3
            c = np.maximum(c + bias[None, :case.n].astype(np.float64) + 0.25 * m - i, 0)
        out.append((c, np.abs(ai) @ np.abs(bi)))
    return out


def tolerance(case: Case) -> float:
    """Relative bound on |C - C64| / (|op(A)| @ |op(B)|): per product, the operands' rounding (tf32: 10
    mantissa bits: rounded to nearest by the register-staged kernel, 2^-11 each; truncated by the tensor cores
    of the pipelined mma.sync and the wgmma tiles, which get the operands as they are, 2^-10 each; fp32 on
    tensor cores, tf32 parts: 2^-19) and the float sum's (K steps of 2^-24 at worst), with a factor 2 of
    slack; the epilogue's own rounding is added relative to |C|."""
    eps = 2.0 ** -53 if case.dtype == "float64" else 2.0 ** -24
    kind = Tile.parse(case.tile)[0] if "gc_tile<" in case.tile else None
    truncated = case.tf32 and kind is not None and kind.stages > 0
    # fp32 on tensor cores (tf32 parts, TF32 = 3 and 4): each product to 2^-19 (gc_gemm_tc.cuh)
    parts = kind is not None and kind.parts
    operand = 2 * 2.0 ** (-10 if truncated else -11) if case.tf32 else 2.0 ** -19 if parts else 0.0
    return 2 * (operand + max(case.k, 1) * eps)
