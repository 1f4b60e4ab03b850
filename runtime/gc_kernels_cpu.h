// gc_kernels_cpu.h — the cpu target's versions of the generic kernels (same names and signatures as
// gc_gemm_cuda.cuh and gc_kernels_cuda.cuh): plain loops, parallel over independent outputs with OpenMP. Each output is
// accumulated by one thread in a fixed order, so results do not depend on the thread count. Sums are
// accumulated in double: at the reference experiment's lr = 1.0 the training trajectory amplifies float32
// rounding, and double accumulation keeps the cpu target on the float64 trajectory.
#include <omp.h>
#include <algorithm>
#include <cstring>
#include <exception>
#include <type_traits>
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

// GEMM (signature and meaning in gc_gemm.h; the tile is a cuda setting and ignored here). Each output is summed
// in double by one thread, in k order, and passed through the epilogue as it is stored (products of floats
// are exact in double, so the sums depend neither on how the loops are blocked nor on the thread count).
//
// The product is blocked for the caches and the vector registers. It computes a "rows" x "cols" result from two
// operands packed as doubles: the cols operand in panels of GC_CPU_NR columns (k-major, zeros past the last
// column), each value packed once for the call (once per batch entry where each has its own) — a chunk of columns
// and a block of k at a time — and the rows operand GC_CPU_MR rows at a time (k-major). A tile of GC_CPU_MR x
// GC_CPU_NR sums lives in registers (GC_CPU_MR x 2 vectors of doubles: 12 of AVX2's 16 registers or of AVX-512's
// 32) for a block of k: each step loads two vectors of the panel and multiplies each of the tile's row values into
// them (gc_cpu_tile). The k blocks are sized so that a block of the packed panels and a tile's rows stay in a
// core's L2 cache; a sum carried from one block to the next is kept in double. Normally rows = M and cols = N; with
// fewer columns than a panel and more rows (matrix-vector products) the roles swap (rows = N, cols = M), so that
// the vectors run along M instead of padding N with zeros. Only the epilogue's store is compiled for each GEMM; the
// packing and the loops are compiled once (the cpu build's compile time).
#if defined(__AVX512F__)
#define GC_CPU_VEC 8
#elif defined(__AVX__)
#define GC_CPU_VEC 4
#else
#define GC_CPU_VEC 2
#endif
typedef double gc_cpu_vd __attribute__((vector_size(GC_CPU_VEC * sizeof(double))));
constexpr int GC_CPU_MR = 6, GC_CPU_NR = 2 * GC_CPU_VEC;
constexpr long long GC_CPU_BLOCK_BYTES = 512 << 10;   // a k block's panels and a tile's rows: half of a 1 MB L2

// Element (b, i, k) of an operand: values[b * sb + i * si + k * sk], where the image input read in place maps
// i (or k, index_k) through its row indices and converts uint8 values as the trainer's gather does (gc_pixel).
struct gc_cpu_operand {
    const void* values;
    int type;                        // 0 float, 1 double, 2 uint8 scaled by `scale`
    float scale;
    long long si, sk, sb;
    const uint32_t* index;           // rows read in place: stored row of i (of k where index_k); NULL: none
    bool index_k;
};
template <typename T> static gc_cpu_operand gc_cpu_matrix(const T* p, long long si, long long sk, long long sb) {
    static_assert(std::is_same<T, float>::value || std::is_same<T, double>::value, "GEMMs are float32 or float64");
    return {p, sizeof(T) == 8 ? 1 : 0, 1.0f, si, sk, sb, NULL, false};
}

// a stored value as double (uint8: the trainer's pixel)
template <typename S> static inline double gc_cpu_double(S x, float scale) {
    return sizeof(S) == 1 ? (double)gc_pixel((unsigned)x, scale) : (double)x;
}
// element (i, k) of an operand whose batch entry starts at v
template <typename S, bool Indexed>
static inline double gc_cpu_at(const gc_cpu_operand& o, const S* v, long long i, long long k) {
    if (Indexed) (o.index_k ? k : i) = o.index[o.index_k ? k : i];
    return gc_cpu_double(v[i * o.si + k * o.sk], o.scale);
}

// Packing: w consecutive i from i0 (n of them real, zeros past), k in [k0, k1), into to[(k - k0) * w + r].
// k contiguous: one i at a time along k, in plain loops (gcc vectorized this with gathers: 4x slower on this
// machine's AMD EPYC)
#if defined(__GNUC__) && !defined(__clang__)
#define GC_CPU_SCALAR __attribute__((optimize("no-tree-vectorize")))
#else
#define GC_CPU_SCALAR
#endif
template <typename S, bool Indexed>
GC_CPU_SCALAR static void gc_cpu_pack_runs(const gc_cpu_operand& o, int b, int i0, int n, int w, int k0, int k1,
                                           double* to) {
    const S* v = (const S*)o.values + b * o.sb;
    for (int r = 0; r < w; r++) {
        if (r >= n) {
            for (int k = k0; k < k1; k++) to[(size_t)(k - k0) * w + r] = 0.0;
        } else if (Indexed && o.index_k) {   // (k contiguous and indexed: a one-row x^T)
            for (int k = k0; k < k1; k++) to[(size_t)(k - k0) * w + r] = gc_cpu_at<S, Indexed>(o, v, i0 + r, k);
        } else {   // the run of row i
            const S* run = v + (Indexed ? (long long)o.index[i0 + r] : (long long)(i0 + r)) * o.si;
            for (int k = k0; k < k1; k++) to[(size_t)(k - k0) * w + r] = gc_cpu_double(run[k], o.scale);
        }
    }
}
// else along i at each k
template <typename S, bool Indexed>
static void gc_cpu_pack_as(const gc_cpu_operand& o, int b, int i0, int n, int w, int k0, int k1, double* to) {
    if (o.sk == 1) return gc_cpu_pack_runs<S, Indexed>(o, b, i0, n, w, k0, k1, to);
    const S* v = (const S*)o.values + b * o.sb;
    for (int k = k0; k < k1; k++) {
        double* out = to + (size_t)(k - k0) * w;
        for (int r = 0; r < n; r++) out[r] = gc_cpu_at<S, Indexed>(o, v, i0 + r, k);
        for (int r = n; r < w; r++) out[r] = 0.0;
    }
}
static void gc_cpu_pack(const gc_cpu_operand& o, int b, int i0, int n, int w, int k0, int k1, double* to) {
    const bool indexed = o.index != NULL;
    if (o.type == 1) gc_cpu_pack_as<double, false>(o, b, i0, n, w, k0, k1, to);
    else if (o.type == 2) indexed ? gc_cpu_pack_as<uint8_t, true>(o, b, i0, n, w, k0, k1, to)
                                  : gc_cpu_pack_as<uint8_t, false>(o, b, i0, n, w, k0, k1, to);
    else indexed ? gc_cpu_pack_as<float, true>(o, b, i0, n, w, k0, k1, to)
                 : gc_cpu_pack_as<float, false>(o, b, i0, n, w, k0, k1, to);
}

// sums += a tile's packed rows (GC_CPU_MR a step) times a packed panel (two vectors a step), kc steps
__attribute__((noinline)) static void gc_cpu_tile(const double* rows, const gc_cpu_vd* panel, int kc,
                                                  double (&sums)[GC_CPU_MR][GC_CPU_NR]) {
    gc_cpu_vd acc[GC_CPU_MR][2];
    memcpy(acc, sums, sizeof acc);
    for (int k = 0; k < kc; k++) {
        const gc_cpu_vd c0 = panel[2 * k], c1 = panel[2 * k + 1];
        const double* x = rows + (size_t)k * GC_CPU_MR;
        for (int r = 0; r < GC_CPU_MR; r++) {
            acc[r][0] += x[r] * c0;
            acc[r][1] += x[r] * c1;
        }
    }
    memcpy(sums, acc, sizeof acc);
}

// store(ctx, b, i, j0, n, sums): the finished sums of result row i, columns j0 .. j0 + n - 1
typedef void (*gc_cpu_store)(const void* ctx, int b, int i, int j0, int n, const double* sums);

// element (i, k) of batch entry b of an operand (one element: dispatched on its type)
static inline double gc_cpu_value(const gc_cpu_operand& o, int b, long long i, long long k) {
    const bool indexed = o.index != NULL;
    const long long at = b * o.sb;
    if (o.type == 1) return gc_cpu_at<double, false>(o, (const double*)o.values + at, i, k);
    if (o.type == 2) return indexed ? gc_cpu_at<uint8_t, true>(o, (const uint8_t*)o.values + at, i, k)
                                    : gc_cpu_at<uint8_t, false>(o, (const uint8_t*)o.values + at, i, k);
    return indexed ? gc_cpu_at<float, true>(o, (const float*)o.values + at, i, k)
                   : gc_cpu_at<float, false>(o, (const float*)o.values + at, i, k);
}

// one thread for a small product (~2^20 multiply-adds take what starting the threads costs)
static inline bool gc_cpu_parallel(int batch, int rows, int cols, int K) {
    return GC_PARALLEL && (double)batch * rows * cols * K >= (1 << 20);
}

// The plain loops, without packing: the cols operand (a plain matrix) read where it lies, each k's run of a
// chunk of GC_CPU_PLAIN columns added into the sums of a tile's GC_CPU_MR rows, k in order; the batch entries,
// tiles and chunks shared out among the threads, no barrier between them. For small products (below) and for
// one row tile against a cols operand stored along j (a vector times a matrix), where packing would copy all
// of it for one use.
constexpr int GC_CPU_PLAIN = 512;
template <typename S>
static void gc_cpu_plain(int batch, int rows, int cols, int K, const gc_cpu_operand& rows_of,
                         const gc_cpu_operand& cols_of, gc_cpu_store store, const void* ctx) {
    const int tiles = (rows + GC_CPU_MR - 1) / GC_CPU_MR, chunks = (cols + GC_CPU_PLAIN - 1) / GC_CPU_PLAIN;
#pragma omp parallel for schedule(static) collapse(3) if (gc_cpu_parallel(batch, rows, cols, K))
    for (int b = 0; b < batch; b++)
        for (int t = 0; t < tiles; t++)
            for (int c = 0; c < chunks; c++) {
                const int i0 = t * GC_CPU_MR, n = std::min(GC_CPU_MR, rows - i0);
                const int j0 = c * GC_CPU_PLAIN, m = std::min(GC_CPU_PLAIN, cols - j0);
                double sums[GC_CPU_MR][GC_CPU_PLAIN];
                for (int r = 0; r < n; r++)
                    for (int j = 0; j < m; j++) sums[r][j] = 0.0;
                const S* v = (const S*)cols_of.values + b * cols_of.sb + j0 * cols_of.si;
                for (int k = 0; k < K; k++) {
                    const S* run = v + k * cols_of.sk;
                    for (int r = 0; r < n; r++) {
                        const double x = gc_cpu_value(rows_of, b, i0 + r, k);
                        double* out = sums[r];
                        if (cols_of.si == 1)
                            for (int j = 0; j < m; j++) out[j] += x * (double)run[j];
                        else
                            for (int j = 0; j < m; j++) out[j] += x * (double)run[j * cols_of.si];
                    }
                }
                for (int r = 0; r < n; r++) store(ctx, b, i0 + r, j0, m, sums[r]);
            }
}

// rows_of (b, i, k) and cols_of (b, j, k): the operands; cols_shared: one cols operand for every batch entry
static int gc_cpu_blocked(int batch, int rows, int cols, int K, const gc_cpu_operand& rows_of,
                          const gc_cpu_operand& cols_of, bool cols_shared, gc_cpu_store store, const void* ctx) {
    const int panels = (cols + GC_CPU_NR - 1) / GC_CPU_NR, tiles = (rows + GC_CPU_MR - 1) / GC_CPU_MR;
    // each batch entry in turn when each has its own cols operand (its panels), else all at once
    const int rounds = cols_shared ? 1 : batch, in_round = cols_shared ? batch : 1;
    const bool parallel = gc_cpu_parallel(batch, rows, cols, K);
    const int threads = parallel ? omp_get_max_threads() : 1;
    if (tiles == 1 && cols > GC_CPU_NR && cols_of.si == 1 && cols_of.sk != 1 && !cols_of.index && cols_of.type != 2) {
        if (cols_of.type == 1) gc_cpu_plain<double>(batch, rows, cols, K, rows_of, cols_of, store, ctx);
        else gc_cpu_plain<float>(batch, rows, cols, K, rows_of, cols_of, store, ctx);
        return GC_OK;
    }
    // few row tiles: the panels are shared out in groups too, so that every thread has work, and the tiles'
    // rows are packed once for all groups (else each tile's by the thread that uses them)
    const bool few = in_round * tiles < 4 * threads;
    // Panels are packed a chunk of columns and a block of k at a time: a 256-long block of the chunk's
    // panels in GC_CPU_BLOCK_BYTES, the k block longer where there are fewer panels (the same bytes).
    const int chunk = (int)std::min<long long>(panels, std::max<long long>(
        1, GC_CPU_BLOCK_BYTES / (256LL * GC_CPU_NR * (long long)sizeof(double))));
    auto k_block = [&](int np) {
        const long long per_k = (long long)(np * GC_CPU_NR + GC_CPU_MR) * sizeof(double);
        return (int)std::min<long long>(K, std::max<long long>(256, GC_CPU_BLOCK_BYTES / per_k));
    };
    const int kc_most = k_block(1);   // the longest k block
    const int width = chunk * GC_CPU_NR;   // a chunk's columns: the sums carried between k blocks are theirs
    // the packed panels, the sums carried between k blocks, the rows (shared, or each thread's own): all
    // allocated here, so that a failed allocation is an error returned, not an exception in the threads
    std::vector<gc_cpu_vd> packed;
    std::vector<double> part, shared_rows, own;
    try {
        packed.resize((size_t)chunk * std::min(K, kc_most) * 2);
        part.resize(K > k_block(chunk) ? (size_t)in_round * rows * width : 0);
        shared_rows.resize(few ? (size_t)in_round * tiles * kc_most * GC_CPU_MR : 0);
        own.resize(few ? 0 : (size_t)threads * kc_most * GC_CPU_MR);
    } catch (const std::exception&) {   // bad_alloc, or length_error past what a vector can hold
        return gc_fail(GC_ERR_MEMORY, "gc_gemm: no memory for the cpu GEMM's packed operands and partial sums "
                       "(%d x %d x %d, batch %d)", rows, cols, K, batch);
    }
#pragma omp parallel if (parallel)
    {
        double* mine = few ? NULL : own.data() + (size_t)omp_get_thread_num() * kc_most * GC_CPU_MR;
        for (int round = 0; round < rounds; round++)
            for (int p0 = 0; p0 < panels; p0 += chunk) {
                const int np = std::min(chunk, panels - p0), kc = k_block(np);
                const int want = few ? (4 * threads + in_round * tiles - 1) / (in_round * tiles) : 1;
                const int per_group = (np + std::min(np, want) - 1) / std::min(np, want);
                const int groups = (np + per_group - 1) / per_group;
                for (int k0 = 0; k0 < K || k0 == 0; k0 += kc) {
                    const int k1 = std::min(K, k0 + kc);
                    const bool last = k1 == K;
#pragma omp for schedule(static)
                    for (int p = 0; p < np; p++) {
                        const int j0 = (p0 + p) * GC_CPU_NR;
                        gc_cpu_pack(cols_of, round, j0, std::min(GC_CPU_NR, cols - j0), GC_CPU_NR, k0, k1,
                                    (double*)(packed.data() + (size_t)p * kc * 2));
                    }
                    if (few) {
#pragma omp for schedule(static) collapse(2)
                        for (int e = 0; e < in_round; e++)
                            for (int t = 0; t < tiles; t++) {
                                const int i0 = t * GC_CPU_MR;
                                gc_cpu_pack(rows_of, round + e, i0, std::min(GC_CPU_MR, rows - i0), GC_CPU_MR, k0, k1,
                                            shared_rows.data() + ((size_t)e * tiles + t) * kc * GC_CPU_MR);
                            }
                    }
#pragma omp for schedule(static) collapse(3)
                    for (int e = 0; e < in_round; e++)
                        for (int t = 0; t < tiles; t++)
                            for (int g = 0; g < groups; g++) {
                                const int b = round + e, i0 = t * GC_CPU_MR, n = std::min(GC_CPU_MR, rows - i0);
                                const double* rp = mine;
                                if (few) rp = shared_rows.data() + ((size_t)e * tiles + t) * kc * GC_CPU_MR;
                                else gc_cpu_pack(rows_of, b, i0, n, GC_CPU_MR, k0, k1, mine);
                                double* carried = part.empty() ? NULL : part.data() + (size_t)e * rows * width;
                                for (int p = g * per_group; p < std::min(np, (g + 1) * per_group); p++) {
                                    const int j0 = (p0 + p) * GC_CPU_NR, m = std::min(GC_CPU_NR, cols - j0);
                                    double sums[GC_CPU_MR][GC_CPU_NR] = {};
                                    if (k0)
                                        for (int r = 0; r < n; r++)
                                            memcpy(sums[r], carried + (size_t)(i0 + r) * width + p * GC_CPU_NR,
                                                   m * sizeof(double));
                                    gc_cpu_tile(rp, packed.data() + (size_t)p * kc * 2, k1 - k0, sums);
                                    for (int r = 0; r < n; r++) {
                                        if (last) store(ctx, b, i0 + r, j0, m, sums[r]);
                                        else memcpy(carried + (size_t)(i0 + r) * width + p * GC_CPU_NR, sums[r],
                                                    m * sizeof(double));
                                    }
                                }
                            }
                    if (K == 0) break;
                }
            }
    }
    return GC_OK;
}

// A small product (GC_CPU_SMALL multiply-adds or fewer an entry, N <= GC_CPU_SMALL_N), batched or not, takes
// the plain loops: a stack of 200000 2 x 2 products, each with its own B, ran 25-50 times slower in the
// blocked product's rounds (one entry at a time, a barrier after each phase).
constexpr int GC_CPU_SMALL = 4096, GC_CPU_SMALL_N = 256;

// C[b] (M x N) = op(A[b]) op(B[b]) through the epilogue, A given as an operand of (b, m, k)
template <typename T, bool TB, class Tile, class Ep>
static int gc_gemm_cpu(const gc_cpu_operand& A, const T* B, T* C, int M, int N, int K, Ep ep, int batch,
                       long long sb, long long sc) {
    GC_TRY(gc_gemm_check<Tile>(M, N, K, batch));
    if (!M || !N || !batch) return GC_OK;
    struct out {
        T* C;
        int N;
        long long sc;
        Ep ep;
        static void rows(const void* o, int b, int m, int n0, int n, const double* s) {   // i = m, j = n
            const out& x = *(const out*)o;
            for (int j = 0; j < n; j++) x.C[b * x.sc + (size_t)m * x.N + n0 + j] = x.ep(b, m, n0 + j, (T)s[j]);
        }
        static void cols(const void* o, int b, int n, int m0, int n_, const double* s) {  // i = n, j = m
            const out& x = *(const out*)o;
            for (int j = 0; j < n_; j++) x.C[b * x.sc + (size_t)(m0 + j) * x.N + n] = x.ep(b, m0 + j, n, (T)s[j]);
        }
    };
    const out o = {C, N, sc, ep};
    // B as an operand of (b, n, k)
    const gc_cpu_operand Bn = gc_cpu_matrix<T>(B, TB ? K : 1, TB ? 1 : N, sb);
    if ((long long)M * N * K <= GC_CPU_SMALL && N <= GC_CPU_SMALL_N) {
        gc_cpu_plain<T>(batch, M, N, K, A, Bn, out::rows, &o);
        return GC_OK;
    }
    // rows along N and the vectors along M where there are fewer columns than a panel's and more rows; decided
    // at compile time where the tile is specialized for the shape (one store compiled), else at run time
    constexpr int way = !(Tile::SM && Tile::SN) ? 0 : Tile::SN < GC_CPU_NR && Tile::SM > Tile::SN ? 1 : 2;
    if (way == 0 ? N < GC_CPU_NR && M > N : way == 1) {
        if constexpr (way != 2) return gc_cpu_blocked(batch, N, M, K, Bn, A, A.sb == 0, out::cols, &o);
    } else {
        if constexpr (way != 1) return gc_cpu_blocked(batch, M, N, K, A, Bn, sb == 0, out::rows, &o);
    }
    return GC_OK;
}

template <typename T, bool TA, bool TB, class Tile, class Ep>
static int gc_gemm(const T* A, const T* B, T* C, int M, int N, int K, Ep ep, int batch = 1, long long sa = 0,
                   long long sb = 0, long long sc = 0, bool = false) {
    const gc_cpu_operand a = gc_cpu_matrix<T>(A, TA ? 1 : K, TA ? M : 1, sa);
    return gc_gemm_cpu<T, TB, Tile>(a, B, C, M, N, K, ep, batch, sb, sc);
}

// A read in place (one matrix: the image input x, stored (batch, row)): row r of x is the source's row
// index[r] (A's m, or its k where A is x^T)
template <typename T, bool TA, bool TB, class Tile, class Ep>
static int gc_gemm(gc_rows A, const T* B, T* C, int M, int N, int K, Ep ep, int batch = 1, long long = 0,
                   long long sb = 0, long long sc = 0, bool = false) {
    if (!A.source) return gc_fail(GC_ERR_ARG, "gc_gemm: no batch input set (gc_batch_input) for the image input");
    const gc_cpu_operand a = {A.source, A.u8 ? 2 : 0, A.scale, TA ? 1 : K, TA ? M : 1, 0, A.index, TA};
    return gc_gemm_cpu<T, TB, Tile>(a, B, C, M, N, K, ep, batch, sb, sc);
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
