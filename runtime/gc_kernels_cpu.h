// gc_kernels_cpu.h — the cpu target's versions of the generic kernels (same names and signatures as
// gc_kernels_cuda.cuh): plain loops, parallel over independent outputs with OpenMP. Each output is
// accumulated by one thread in a fixed order, so results do not depend on the thread count. Sums are
// accumulated in double: at the reference experiment's lr = 1.0 the training trajectory amplifies float32
// rounding, and double accumulation keeps the cpu target on the float64 trajectory.
#include <omp.h>
#include <vector>

#ifndef GC_HD
#define GC_HD
#endif

// The GEMM's epilogue when the result is stored as is; a tile configuration (the cpu ignores it).
struct gc_ep_store { template <typename T> GC_HD T operator()(int, int, int, T acc) const { return acc; } };
template <int BM, int BN, int BK, int TM, int TN, int TF32> struct gc_tile {};

// C[b] (M, N) = ep(b, m, n, op(A[b]) @ op(B[b])) for b < batch, A[b] = A + b * sa (same for B, C); loop
// orders chosen per transpose case so the innermost loop is contiguous. The sum is rounded to T before the
// epilogue sees it, as a separate kernel would read it.
template <typename T, bool TA, bool TB, class Tile, class Ep>
static int gc_gemm(const T* A0, const T* B0, T* C0, int M, int N, int K, Ep ep,
                   int batch = 1, long long sa = 0, long long sb = 0, long long sc = 0) {
#pragma omp parallel
    {
        std::vector<double> acc(N);
#pragma omp for collapse(2) schedule(static)
        for (int bi = 0; bi < batch; bi++)
        for (int m = 0; m < M; m++) {
            const T* A = A0 + bi * sa;
            const T* B = B0 + bi * sb;
            T* C = C0 + bi * sc;
            T* c = C + (size_t)m * N;
            if (TB) {       // B is (N, K): each output is a dot product of two rows
                for (int n = 0; n < N; n++) {
                    const T* b = B + (size_t)n * K;
                    double s = 0;
                    if (TA) for (int k = 0; k < K; k++) s += (double)A[(size_t)k * M + m] * b[k];
                    else {
                        const T* a = A + (size_t)m * K;
#pragma omp simd reduction(+ : s)
                        for (int k = 0; k < K; k++) s += (double)a[k] * b[k];
                    }
                    c[n] = ep(bi, m, n, (T)s);
                }
            } else {        // B is (K, N): accumulate scaled rows of B
                for (int n = 0; n < N; n++) acc[n] = 0;
                for (int k = 0; k < K; k++) {
                    const double a = TA ? A[(size_t)k * M + m] : A[(size_t)m * K + k];
                    const T* b = B + (size_t)k * N;
#pragma omp simd
                    for (int n = 0; n < N; n++) acc[n] += a * b[n];
                }
                for (int n = 0; n < N; n++) c[n] = ep(bi, m, n, (T)acc[n]);
            }
        }
    }
    return GC_OK;
}

template <typename IMG>
static int gc_gather(const IMG* images, const int32_t* labels, const int32_t* index, int64_t first, int count,
                     int64_t row, float scale, float* x, int32_t* y, int batch) {
#pragma omp parallel for schedule(static)
    for (int b = 0; b < batch; b++) {
        int src = index[first + (b < count ? b : count - 1)];
        const IMG* in = images + (int64_t)src * row;
        float* out = x + (int64_t)b * row;
        for (int64_t e = 0; e < row; e++) out[e] = sizeof(IMG) == 1 ? (float)in[e] * scale : (float)in[e];
        y[b] = labels[src];
    }
    return GC_OK;
}

static int gc_count_correct(const float* logits, const int32_t* y, int count, int classes, int64_t* correct) {
    for (int b = 0; b < count; b++) {
        const float* row = logits + (size_t)b * classes;
        int best = 0;
        for (int c = 1; c < classes; c++) if (row[c] > row[best]) best = c;
        *correct += best == y[b];
    }
    return GC_OK;
}

static int gc_track_loss(const float* loss, double* sums) {
    sums[0] += *loss;
    sums[1] = *loss;
    return GC_OK;
}
