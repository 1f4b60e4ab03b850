// gc_gemm_sk.cuh — GEMMs with a short K slice on tensor cores (tiles with TF32 = 5: fp32, and TF32 = 7: tf32;
// gc_gemm_launch in gc_gemm_cuda.cuh dispatches to gc_gemm_sk_launch here). Made for the small GEMMs of a
// training step at a small batch, whose time is latency, not arithmetic: the weight gradients x^T g (K = the
// batch) and a split x @ W whose splits are summed by their reader (K / SPLIT per block). The block copies its
// whole K slice (up to KC = BK x STAGES k; longer slices go in rounds of KC) into shared memory at once —
// STAGES cp.async groups of BK k, all in flight together — and loads its epilogue's operands meanwhile, so the
// block waits for global memory about once; then the warps compute group after group as they land.
//   * A warp computes a TM x TN tile of C (TM a multiple of 16, TN of 8) with mma.sync m16n8k8 on tf32 parts:
//     each fp32 operand split into a high and a low tf32 part (gc_tf32_parts, to 2^-21 of it) and each product
//     as three mma (a_high b_low + a_low b_high + a_high b_high; a_low b_low, under 2^-20 of it, left out), as
//     the TF32 = 3 tiles of gc_gemm_tc.cuh do: fp32 accuracy. Two where A's values are tf32 values already
//     (gc_rows.exact: the trainer's gathered floats of uint8 images), a_low being zero. A group's mma sum from
//     zero into sums of their own, added into the fp32 sums after the group (the tensor cores truncate as they
//     accumulate). TF32 = 7, the tf32 tiles: one mma a product on the operands as they are (the tensor cores
//     read an fp32 operand's top 19 bits: truncated, as gc_gemm_tc_kernel's tf32 tiles), the same groups.
//   * Each operand stays in shared memory as it lies in global memory (no transposing copies), its rows
//     padded so that a warp's fragment reads hit 32 distinct banks: rows along k (A with TA, B without TB)
//     padded to X + 8 words, rows along x (k contiguous) to KC + 4.
//   * The end is gc_gemm_finish's, on runs of 4 columns (two lanes' fragment pairs, swapped by a shuffle): the
//     epilogue, whose operands were loaded as packs while the copies were in flight (gc_gemm_packs), and the
//     stores; a split's partial tile for its reader (gc_ep_partial); or a cluster's sum.
// RA: A is the image input read in place from float rows (gc_rows: through its row indices); gc_gemm_launch
// refuses uint8 rows (gemm_tiles.Tile.float_rows_only: the trainer gives these tiles float rows, GC_X_FLOAT).
#if GC_KERNELS   // the kernels part (gc_runtime.h)

// What a TF32 = 5 tile stages: KC k of each operand, rows padded as above; and the block's partial tile for a
// cluster's sum (split tiles whose reader does not sum them), in the same memory once the operands are read.
template <bool TA, bool TB, class Tile>
struct gc_sk_smem {
    static constexpr int KC = Tile::BK * Tile::STAGES;
    static constexpr int LDA = TA ? Tile::BM + 8 : KC + 4, LDB = TB ? KC + 4 : Tile::BN + 8;
    static constexpr int A_WORDS = TA ? KC * LDA : Tile::BM * LDA, B_WORDS = TB ? Tile::BN * LDB : KC * LDB;
    static constexpr int WORDS = A_WORDS + B_WORDS > Tile::BM * Tile::BN ? A_WORDS + B_WORDS : Tile::BM * Tile::BN;
    static constexpr size_t bytes = (size_t)WORDS * 4;
};

template <bool B> struct gc_sk_bool { static constexpr bool value = B; };

// cp.async.wait_group with a count known at run time (the group loop is not unrolled): all but the newest n.
template <int MAX>
__device__ __forceinline__ void gc_cp_wait_upto(int n) {
    if constexpr (MAX > 0) {
        if (n >= MAX) { gc_cp_wait<MAX>(); return; }
        gc_cp_wait_upto<MAX - 1>(n);
    } else {
        gc_cp_wait<0>();
    }
}

// Rows [r0, r0 + rows) x columns [c0, c0 + cols) of an operand into shared memory (s[r * LD + c], from column
// c0 at c = 0), by THREADS threads: 16-byte copies where `vec` (the columns and the row starts allow them),
// else 4-byte ones; rows past `rows_in` or columns past `cols_in` (the matrix's end) are zeros (their copies
// read nothing: `base`, a valid address, stands for their source). row(r): the address of the operand's row r
// (the image input's rows go through their indices).
template <int ROWS, int COLS, int LD, int THREADS, class Row>
__device__ __forceinline__ void gc_sk_copy(float* s, Row&& row, const float* base, int r0, int rows_in, int c0,
                                           int cols_in, bool vec) {
    if (vec) {
        constexpr int Q = COLS / 4, E = ROWS * Q;
#pragma unroll
        for (int i = 0; i < (E + THREADS - 1) / THREADS; i++) {   // straight-line: a few copies a thread
            const int e = threadIdx.x + i * THREADS, r = e / Q, c = e % Q * 4;
            if (E % THREADS != 0 && e >= E) break;
            const bool live = r0 + r < rows_in && c0 + c < cols_in;
            gc_cp_async<16>(s + r * LD + c, live ? row(r0 + r) + c0 + c : base, live);
        }
    } else {
        constexpr int E = ROWS * COLS;
#pragma unroll 4
        for (int i = 0; i < (E + THREADS - 1) / THREADS; i++) {
            const int e = threadIdx.x + i * THREADS, r = e / COLS, c = e % COLS;
            if (E % THREADS != 0 && e >= E) break;
            const bool live = r0 + r < rows_in && c0 + c < cols_in;
            gc_cp_async<4>(s + r * LD + c, live ? row(r0 + r) + c0 + c : base, live);
        }
    }
}

// The tile of grid place (x, z) (gc_gemm_block), in the block's `smem` (gc_sk_smem<TA, TB, Tile>::bytes).
template <typename T, bool TA, bool TB, class Tile, class Ep, bool RA>
__device__ __forceinline__ void gc_gemm_sk_tile(const gc_gemm_params<T, Ep>& p, int x, int z, float4* smem) {
    static_assert(sizeof(T) == 4, "gc_gemm: tensor-core tiles are for float GEMMs");
    static_assert(Tile::TF32 == 5 || Tile::TF32 == 7, "gc_gemm: short-K tiles are TF32 = 5 (parts) or 7 (tf32)");
    constexpr int BM = Tile::BM, BN = Tile::BN, BK = Tile::BK, TM = Tile::TM, TN = Tile::TN;
    constexpr int S = Tile::SPLIT, THREADS = Tile::THREADS, ST = Tile::STAGES;
    constexpr bool PLAIN = Tile::TF32 == 7;   // tf32: one mma a product
    constexpr int MI = TM / 16, NJ = TN / 8, WM = BM / TM;
    using Sm = gc_sk_smem<TA, TB, Tile>;
    constexpr int KC = Sm::KC, LDA = Sm::LDA, LDB = Sm::LDB;
    static_assert(TM % 16 == 0 && TN % 8 == 0 && BM % TM == 0 && BN % TN == 0 && BK % 8 == 0 && ST >= 1,
                  "gc_gemm: a TF32 = 5 tile is warps of 16 x 8 multiples, K groups of 8 multiples");
    float* const As = (float*)smem;
    float* const Bs = As + Sm::A_WORDS;
    using Block = gc_gemm_block<T, TA, TB, Tile>;
    Block g(p, x, z);
    const T* A = p.A + (RA ? 0 : g.b * p.sa);
    const T* B = p.B + g.b * p.sb;
    T* C = p.C + g.b * p.sc;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, gq = lane / 4, tq = lane % 4;
    const int wm = warp % WM * TM, wn = warp / WM * TN;
    // acc[i][j]: fragment (i, j) as the mma leaves it (rows g, g + 8 of the 16, columns 2 t, 2 t + 1 of the 8);
    // at the end, runs of 4: lanes t and t ^ 1 swap halves, so that an even t holds row g's columns 2 t .. 2 t + 3
    // and an odd one row g + 8's 2 t - 2 .. 2 t + 1 (the epilogue's operands load as packs of 4, gc_gemm_packs)
    float acc[MI][NJ][4];
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int j = 0; j < NJ; j++)
#pragma unroll
            for (int r = 0; r < 4; r++) acc[i][j][r] = 0.f;
    const int odd = tq & 1;
    auto for_runs = [&](auto&& f) {
#pragma unroll
        for (int i = 0; i < MI; i++)
#pragma unroll
            for (int j = 0; j < NJ; j++) f(wm + 16 * i + gq + 8 * odd, wn + 8 * j + 4 * (tq / 2), &acc[i][j][0]);
    };
    constexpr int NR = MI * NJ;
    gc_gemm_packs<Ep, NR, S == 1 && Block::EN && gc_ep_packed<Ep, NR>::value> packs;
    const int lda = TA ? g.M : g.K, ldb = TB ? g.K : g.N;
    // A's row r: a batch row through the image input's indices (RA), else the matrix's
    auto a_row = [&](int r) -> const float* {
        if constexpr (RA) return A + (int64_t)(p.rows.index ? p.rows.index[r] : (uint32_t)r) * lda;
        else return A + (int64_t)r * lda;
    };
    auto b_row = [&](int r) -> const float* { return B + (int64_t)r * ldb; };
    const bool exact = p.rows.exact;   // A's values are tf32 values: a_low is zero, its mma left out
    gc_wait_prior();
    bool first = true;
    for (int kr = g.k_begin; kr < g.k_end; kr += KC) {
        if (!first) __syncthreads();   // every warp is past its reads of the last round
#pragma unroll 1
        for (int q = 0; q < ST; q++) {   // group q: k in [kr + q BK, kr + (q + 1) BK), zeros past the slice
            const int k0 = kr + q * BK;
            if constexpr (TA) gc_sk_copy<BK, BM, LDA, THREADS>(As + q * BK * LDA, a_row, A, k0, g.k_end, g.m0, g.M, g.va);
            else gc_sk_copy<BM, BK, LDA, THREADS>(As + q * BK, a_row, A, g.m0, g.M, k0, g.k_end, g.va);
            if constexpr (TB) gc_sk_copy<BN, BK, LDB, THREADS>(Bs + q * BK, b_row, B, g.n0, g.N, k0, g.k_end, g.vb);
            else gc_sk_copy<BK, BN, LDB, THREADS>(Bs + q * BK * LDB, b_row, B, k0, g.k_end, g.n0, g.N, g.vb);
            gc_cp_commit();
        }
        if (first)   // the epilogue's operands, meanwhile
            packs.template load<4, !Block::EM, !Block::EN, S>(p.ep, g.b, g.m0, g.n0, g.M, g.N, &acc[0][0][0], for_runs);
        first = false;
        const int groups = min(ST, (g.k_end - kr + BK - 1) / BK);
        // group q of the round into the sums; EX: A's values are used as they are — tf32 values (two mma a
        // product), or PLAIN (one)
        auto group = [&](int q, auto ex) {
            constexpr bool EX = decltype(ex)::value;
            float part[MI][NJ][4];
#pragma unroll
            for (int k8 = 0; k8 < BK; k8 += 8) {
                const int k = q * BK + k8;   // within the round's KC
                uint32_t ah[MI][4], al[MI][4];
#pragma unroll
                for (int i = 0; i < MI; i++) {
                    const int m = wm + 16 * i + gq;
                    float a[4];
                    if constexpr (TA) {
                        const float* s = As + (k + tq) * LDA + m;
                        a[0] = s[0], a[1] = s[8], a[2] = s[4 * LDA], a[3] = s[4 * LDA + 8];
                    } else {
                        const float* s = As + m * LDA + k + tq;
                        a[0] = s[0], a[1] = s[8 * LDA], a[2] = s[4], a[3] = s[8 * LDA + 4];
                    }
#pragma unroll
                    for (int r = 0; r < 4; r++) {
                        if constexpr (EX) ah[i][r] = __float_as_uint(a[r]);
                        else gc_tf32_parts(__float_as_uint(a[r]), ah[i][r], al[i][r]);
                    }
                }
#pragma unroll
                for (int j = 0; j < NJ; j++) {
                    const int n = wn + 8 * j + gq;
                    float b[2];
                    if constexpr (TB) {
                        const float* s = Bs + n * LDB + k + tq;
                        b[0] = s[0], b[1] = s[4];
                    } else {
                        const float* s = Bs + (k + tq) * LDB + n;
                        b[0] = s[0], b[1] = s[4 * LDB];
                    }
                    uint32_t bh[2], bl[2];
                    if constexpr (PLAIN) {
                        bh[0] = __float_as_uint(b[0]), bh[1] = __float_as_uint(b[1]);
#pragma unroll
                        for (int i = 0; i < MI; i++) gc_mma_tf32(part[i][j], ah[i], bh, k8 == 0);
                    } else {
                        gc_tf32_parts(__float_as_uint(b[0]), bh[0], bl[0]);
                        gc_tf32_parts(__float_as_uint(b[1]), bh[1], bl[1]);
#pragma unroll
                        for (int i = 0; i < MI; i++) {   // the small terms first
                            gc_mma_tf32(part[i][j], ah[i], bl, k8 == 0);
                            if constexpr (!EX) gc_mma_tf32(part[i][j], al[i], bh);
                            gc_mma_tf32(part[i][j], ah[i], bh);
                        }
                    }
                }
            }
            gc_mma_add(acc, part);
        };
#pragma unroll 1
        for (int q = 0; q < groups; q++) {
            gc_cp_wait_upto<ST - 1>(ST - 1 - q);
            __syncthreads();
            if (PLAIN || exact) group(q, gc_sk_bool<true>{});
            else group(q, gc_sk_bool<false>{});
        }
    }
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int j = 0; j < NJ; j++) {   // the halves of the runs of 4 (above)
            float* c = acc[i][j];
            const float r0 = __shfl_xor_sync(0xffffffffu, odd ? c[0] : c[2], 1);
            const float r1 = __shfl_xor_sync(0xffffffffu, odd ? c[1] : c[3], 1);
            if (odd) c[0] = r0, c[1] = r1;
            else c[2] = r0, c[3] = r1;
        }
    gc_release_dependents(p.release);
    gc_gemm_finish<4, BM, BN, S, THREADS, !Block::EM, !Block::EN>(
        (T*)smem, p.ep, g.b, g.m0, g.n0, g.M, g.N, C, p.vc, for_runs, [] {
            gc_cp_wait<0>();
            __syncthreads();   // every warp is past its last reads of the operands
        }, packs, &acc[0][0][0]);
}

template <typename T, bool TA, bool TB, class Tile, class Ep, bool RA>
__global__ void __launch_bounds__(Tile::THREADS)
gc_gemm_sk_kernel(const gc_gemm_params<T, Ep> p) {
#if GC_BODIES
    extern __shared__ float4 gc_sk_dyn[];
    gc_gemm_sk_tile<T, TA, TB, Tile, Ep, RA>(p, blockIdx.x, blockIdx.z, gc_sk_dyn);
#endif
}

// The launch (gc_gemm_launch has checked the shape and that rows read in place are floats, made the grid and
// the cluster attribute).
template <typename T, bool TA, bool TB, class Tile, class Ep, bool RA>
static int gc_gemm_sk_launch(dim3 grid, cudaLaunchAttribute* cluster, const gc_gemm_params<T, Ep>& p) {
    return gc_gemm_launch_pipelined<gc_gemm_sk_kernel<T, TA, TB, Tile, Ep, RA>, Tile>(
        grid, cluster, gc_sk_smem<TA, TB, Tile>::bytes, p);
}
#endif   // GC_KERNELS
