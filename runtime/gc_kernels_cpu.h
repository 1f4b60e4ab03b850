// gc_kernels_cpu.h — the cpu target's versions of the generic kernels (same names and signatures as
// gc_gemm_cuda.cuh and gc_kernels_cuda.cuh): plain loops, parallel over independent outputs with OpenMP. Each output is
// accumulated by one thread in a fixed order, so results do not depend on the thread count. Sums are
// accumulated in double: at the reference experiment's lr = 1.0 the training trajectory amplifies float32
// rounding, and double accumulation keeps the cpu target on the float64 trajectory.
#include <omp.h>
#include <pthread.h>
#include <vector>

// OpenMP's thread pool does not survive fork(): a child's first parallel region waited forever for threads
// it does not have (a Python process that forked, multiprocessing's default on Linux, then called a loaded
// model). After a fork the child runs every parallel loop on its calling thread (GC_PARALLEL is false there;
// the results are the same: each output is summed by one thread in a fixed order). The parent is unchanged.
static int gc_forked = 0;
static void gc_note_fork(void) { gc_forked = 1; }
__attribute__((constructor)) static void gc_watch_fork(void) { pthread_atfork(NULL, NULL, gc_note_fork); }
#define GC_PARALLEL (!gc_forked)

// GEMM (signature and meaning in gc_gemm.h; the tile is a cuda setting and ignored here). Loop orders are
// chosen per transpose case so the innermost loop is contiguous; each output is summed in double by one
// thread, in k order, and passed through the epilogue as it is stored. `a(b, r, c)` is element (r, c) of
// A[b] as stored: a plain matrix, or the image input read in place (gc_rows: row r is the source's row
// index[r], uint8 sources scaled exactly as the trainer's gather converts them).
template <typename T>
struct gc_cpu_matrix {
    const T* p;
    long long ld, stride;
    double operator()(int b, size_t r, size_t c) const { return p[b * stride + (long long)r * ld + c]; }
};
struct gc_cpu_rows {
    gc_rows rows;
    long long ld;
    double operator()(int, size_t r, size_t c) const { return gc_rows_at(rows, (int64_t)r, ld, (int64_t)c); }
};

template <typename T, bool TA, bool TB, class Tile, class Ep, class AT>
static int gc_gemm_cpu(AT a, const T* B, T* C, int M, int N, int K, Ep ep, int batch, long long sb, long long sc);

// B transposed ((N, K) stored), 16 columns or more and 2^24 multiply-adds or more: each output's dot product
// re-read all of B for every row of C (A^T B^T strided through A as well; one thread, 1024^3: A B^T 689 ms,
// A^T B^T 3562, QA). B is copied to (K, N) rows and the rows form below runs, the same double products summed
// in k order: 174 and 173 ms. Smaller ones keep the dot products (the MNIST MLP's step at batch 128 was 5%
// slower with the copy; at batch 1000 5% faster).
template <typename T, bool TA, class Tile, class Ep, class AT>
static int gc_gemm_cpu_bt(AT a, const T* B, T* C, int M, int N, int K, Ep ep, int batch, long long sb, long long sc) {
    const int copies = sb ? batch : 1;
    std::vector<T> rows((size_t)copies * K * N);
#pragma omp parallel for schedule(static) collapse(2) if (GC_PARALLEL)
    for (int b = 0; b < copies; b++)
        for (int n = 0; n < N; n++) {
            const T* r = B + b * sb + (size_t)n * K;
            T* out = rows.data() + (size_t)b * K * N + n;
            for (int k = 0; k < K; k++) out[(size_t)k * N] = r[k];
        }
    return gc_gemm_cpu<T, TA, false, Tile>(a, rows.data(), C, M, N, K, ep, batch, sb ? (long long)K * N : 0, sc);
}

template <typename T, bool TA, bool TB, class Tile, class Ep, class AT>
static int gc_gemm_cpu(AT a, const T* B, T* C, int M, int N, int K, Ep ep, int batch, long long sb, long long sc) {
    GC_TRY(gc_gemm_check<Tile>(M, N, K, batch));
    if (TB && N >= 16 && (double)M * N * K * batch >= (1 << 24))
        return gc_gemm_cpu_bt<T, TA, Tile>(a, B, C, M, N, K, ep, batch, sb, sc);
#pragma omp parallel if (GC_PARALLEL)
    {
        std::vector<double> acc(N);
#pragma omp for schedule(static) collapse(2)
        for (int b = 0; b < batch; b++) {
            for (int m = 0; m < M; m++) {
                const T* Bb = B + b * sb;
                T* c = C + b * sc + (size_t)m * N;
                if (TB) {       // B is (N, K), under 16 rows: each output is a dot product of two rows
                    for (int n = 0; n < N; n++) {
                        const T* r = Bb + (size_t)n * K;
                        double s = 0;
                        if (TA) for (int k = 0; k < K; k++) s += a(b, k, m) * r[k];
                        else {
#pragma omp simd reduction(+ : s)
                            for (int k = 0; k < K; k++) s += a(b, m, k) * r[k];
                        }
                        acc[n] = s;
                    }
                } else {        // B is (K, N): accumulate scaled rows of B
                    for (int n = 0; n < N; n++) acc[n] = 0;
                    for (int k = 0; k < K; k++) {
                        const double v = TA ? a(b, k, m) : a(b, m, k);
                        const T* r = Bb + (size_t)k * N;
#pragma omp simd
                        for (int n = 0; n < N; n++) acc[n] += v * r[n];
                    }
                }
                for (int n = 0; n < N; n++) c[n] = ep(b, m, n, (T)acc[n]);
            }
        }
    }
    return GC_OK;
}

template <typename T, bool TA, bool TB, class Tile, class Ep>
static int gc_gemm(const T* A, const T* B, T* C, int M, int N, int K, Ep ep, int batch = 1, long long sa = 0,
                   long long sb = 0, long long sc = 0, bool = false) {
    return gc_gemm_cpu<T, TA, TB, Tile>(gc_cpu_matrix<T>{A, TA ? M : K, sa}, B, C, M, N, K, ep, batch, sb, sc);
}

// A read in place (one matrix: the image input x, stored (batch, row)).
template <typename T, bool TA, bool TB, class Tile, class Ep>
static int gc_gemm(gc_rows A, const T* B, T* C, int M, int N, int K, Ep ep, int batch = 1, long long = 0,
                   long long sb = 0, long long sc = 0, bool = false) {
    if (!A.source) return gc_fail(GC_ERR_ARG, "gc_gemm: no batch input set (gc_batch_input) for the image input");
    return gc_gemm_cpu<T, TA, TB, Tile>(gc_cpu_rows{A, TA ? M : K}, B, C, M, N, K, ep, batch, sb, sc);
}

// ---- the trainer's kernels (what each computes: gc_kernels_cuda.cuh, trainer section) ----------------
template <typename IMG>
static int gc_gather(const IMG* images, const int32_t* labels, const gc_cursor* cursor, int64_t first, int count,
                     int row, float scale, float* x, int32_t* y, int batch, const float* loss, double* sums) {
#pragma omp parallel for schedule(static) if (GC_PARALLEL)
    for (int b = 0; b < batch; b++) {
        const uint32_t src = gc_batch_source(cursor, first, count, batch, b);
        const IMG* in = images + (int64_t)src * row;
        float* out = x + (int64_t)b * row;
        for (int e = 0; e < row; e++) out[e] = sizeof(IMG) == 1 ? gc_pixel((unsigned)in[e], scale) : (float)in[e];
        y[b] = labels[src];
    }
    if (sums) {
        gc_record_loss(sums, *loss);
    }
    return GC_OK;
}

static int gc_batch_rows(const void*, int, const int32_t* labels, const gc_cursor* cursor, int64_t first, int count,
                         uint32_t* rows, int32_t* y, int batch, const float* loss, double* sums) {
    for (int b = 0; b < batch; b++) {
        const uint32_t src = gc_batch_source(cursor, first, count, batch, b);
        rows[b] = src;
        y[b] = labels[src];
    }
    if (sums) gc_record_loss(sums, *loss);
    return GC_OK;
}

static int gc_set_cursor(gc_cursor* cursor, int64_t step, gc_perm order, int shuffle, double* sums) {
    gc_cursor_start(cursor, step, order, shuffle, sums);
    return GC_OK;
}

static int gc_steps_done(gc_cursor* cursor, int64_t steps, const float* loss, double* sums) {
    gc_cursor_advance(cursor, steps, loss, sums);
    return GC_OK;
}

static int gc_count_correct(const float* logits, const int32_t* y, int count, int classes, int64_t* correct,
                            int first) {
    if (first) *correct = 0;
    for (int b = 0; b < count; b++) *correct += gc_argmax(logits + (size_t)b * classes, classes) == y[b];
    return GC_OK;
}
