// gemm_bench.h — what the GEMM micro-benchmark's driver (gemm_bench.cu) and its generated case functions
// share: the runtime's GEMM, the epilogues of the MLP's GEMMs and the case table's row type.
#include "gc_runtime.h"
#include "gc_gemm.h"
#include "gc_gemm_cuda.cuh"
#include "gc_gemm_tc.cuh"
#include "gc_gemm_wgmma.cuh"
#include "gc_gemm_sk.cuh"
#include "gc_gemm_ws.cuh"

// Forward: bias + ReLU (bias alone for the logits); backward: the ReLU mask on the data gradient, where the
// mask is the forward pre-activation (M, N) and the gradient passes where it is > 0.
struct ep_bias_relu {
    static constexpr bool prefetch = true;   // stores nothing itself (gc_gemm_cuda.cuh)
    const float* aux;
    GC_HD float operator()(int, int, int n, float acc) const { return fmaxf(acc + aux[n], 0.f); }
    static constexpr bool runs = true;
    typedef float4 pack;
    GC_HD pack load4(int, int, int n) const { return *reinterpret_cast<const float4*>(aux + n); }
    GC_HD void run4(const pack& a, int, int, int, float* v) const {
        v[0] = fmaxf(v[0] + a.x, 0.f); v[1] = fmaxf(v[1] + a.y, 0.f);
        v[2] = fmaxf(v[2] + a.z, 0.f); v[3] = fmaxf(v[3] + a.w, 0.f);
    }
};
struct ep_bias {
    static constexpr bool prefetch = true;   // stores nothing itself (gc_gemm_cuda.cuh)
    const float* aux;
    GC_HD float operator()(int, int, int n, float acc) const { return acc + aux[n]; }
    static constexpr bool runs = true;
    typedef float4 pack;
    GC_HD pack load4(int, int, int n) const { return *reinterpret_cast<const float4*>(aux + n); }
    GC_HD void run4(const pack& a, int, int, int, float* v) const {
        v[0] += a.x; v[1] += a.y; v[2] += a.z; v[3] += a.w;
    }
};
struct ep_relu_mask {
    static constexpr bool prefetch = true;   // stores nothing itself (gc_gemm_cuda.cuh)
    const float* aux;
    int ld;
    GC_HD float operator()(int, int m, int n, float acc) const { return aux[(size_t)m * ld + n] > 0.f ? acc : 0.f; }
    static constexpr bool runs = true;
    typedef float4 pack;
    GC_HD pack load4(int, int m, int n) const { return *reinterpret_cast<const float4*>(aux + (size_t)m * ld + n); }
    GC_HD void run4(const pack& a, int, int, int, float* v) const {
        v[0] = a.x > 0.f ? v[0] : 0.f; v[1] = a.y > 0.f ? v[1] : 0.f;
        v[2] = a.z > 0.f ? v[2] : 0.f; v[3] = a.w > 0.f ? v[3] : 0.f;
    }
};

typedef int (*gc_bench_fn)(const float* A, const float* B, float* C, const float* aux);
struct gc_bench_case {
    const char* name;
    int m, n, k, ta, tb;
    const char* precision;   // "fp32" or "tf32"
    const char* epilogue;    // "none", "bias_relu", "bias", "relu_mask"
    const char* tile;
    gc_bench_fn fn;
};
