// gc_kernels_cpu.h — the cpu target's versions of the generic kernels (same names and signatures as
// gc_kernels_cuda.cuh): plain loops, parallel over independent outputs with OpenMP. Each output is
// accumulated by one thread in a fixed order, so results do not depend on the thread count. Sums are
// accumulated in double: at the reference experiment's lr = 1.0 the training trajectory amplifies float32
// rounding, and double accumulation keeps the cpu target on the float64 trajectory.
#include <omp.h>
#include <vector>

// C (M, N) = op(A) @ op(B), loop orders chosen per transpose case so the innermost loop is contiguous.
template <typename T, bool TA, bool TB>
static int gc_gemm(const T* A, const T* B, T* C, int M, int N, int K) {
#pragma omp parallel
    {
        std::vector<double> acc(N);
#pragma omp for schedule(static)
        for (int m = 0; m < M; m++) {
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
                    c[n] = (T)s;
                }
            } else {        // B is (K, N): accumulate scaled rows of B
                for (int n = 0; n < N; n++) acc[n] = 0;
                for (int k = 0; k < K; k++) {
                    const double a = TA ? A[(size_t)k * M + m] : A[(size_t)m * K + k];
                    const T* b = B + (size_t)k * N;
#pragma omp simd
                    for (int n = 0; n < N; n++) acc[n] += a * b[n];
                }
                for (int n = 0; n < N; n++) c[n] = (T)acc[n];
            }
        }
    }
    return GC_OK;
}

template <typename T, bool LOG>
static int gc_softmax(const T* x, T* y, int outer, int length, int inner) {
#pragma omp parallel for schedule(static)
    for (int64_t row = 0; row < (int64_t)outer * inner; row++) {
        const size_t o = row / inner, in = row % inner;
        const T* xr = x + o * (size_t)length * inner + in;
        T* yr = y + o * (size_t)length * inner + in;
        T mx = -INFINITY;
        double sum = 0;
        for (int j = 0; j < length; j++) mx = std::fmax(mx, xr[(size_t)j * inner]);
        for (int j = 0; j < length; j++) sum += std::exp(xr[(size_t)j * inner] - mx);
        const T lse = (T)std::log(sum);
        for (int j = 0; j < length; j++) {
            T s = xr[(size_t)j * inner] - mx;
            yr[(size_t)j * inner] = LOG ? s - lse : (T)(std::exp(s) / sum);
        }
    }
    return GC_OK;
}

template <typename T, typename L>
static int gc_softmax_xent(const T* logits, const L* labels, T* out, int batch, int classes) {
    double total = 0;
    for (int b = 0; b < batch; b++) {
        const T* row = logits + (size_t)b * classes;
        T mx = -INFINITY;
        double sum = 0;
        for (int c = 0; c < classes; c++) mx = std::fmax(mx, row[c]);
        for (int c = 0; c < classes; c++) sum += std::exp(row[c] - mx);
        int label = (int)labels[b];
        total += (label >= 0 && label < classes) ? std::log(sum) + mx - row[label] : NAN;
    }
    *out = (T)(total / batch);
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
    if (isfinite(*loss)) sums[0] += *loss;
    sums[1] = *loss;
    return GC_OK;
}
