// gc_gemm.h — what both targets' GEMMs share: the tile configuration type, the plain-store epilogue and the
// check of a launch against the shape its tile was specialized for. The GEMMs themselves are
// gc_gemm_cuda.cuh (cuda) and gc_kernels_cpu.h (cpu), with one signature:
//
//   template <typename T, bool TA, bool TB, class Tile, class Ep>
//   static int gc_gemm(const T* A, const T* B, T* C, int M, int N, int K, Ep ep,
//                      int batch = 1, long long sa = 0, long long sb = 0, long long sc = 0, bool release = false);
//
// C[b] (M, N) = ep(b, m, n, sum_k op(A[b])[m, k] * op(B[b])[k, n]) for b < batch, A[b] = A + b * sa
// (elements), same for B and C. op(A) is A (M, K), or A^T when TA (A stored (K, M)); op(B) is B (K, N), or
// B^T when TB (B stored (N, K)). The epilogue's value is what is stored in C[b][m, n]. `release` (cuda): the
// next kernel on the stream may start once the GEMM's main loop is done (gc_release_dependents).
#if GC_KERNELS   // the kernels part (gc_runtime.h)

// A tile configuration (gcompile/gemm_tiles.py chooses one per GEMM; the cpu target ignores it).
//   BM x BN   the tile of C one block computes; K advances in steps of BK.
//   TM x TN   TF32 = 0: the outputs one thread computes (fp32 FMAs, multiples of 4);
//             TF32 = 1: the tile one warp computes with tf32 tensor cores (mma m16n8k8; multiples of 16 x 8);
//             TF32 = 2: the tile one warpgroup (4 warps) computes with wgmma (sm_90a; 64-row blocks by 64 or
//             128, one side or the other: gc_gemm_wg_kernel in gc_gemm_wgmma.cuh, pipelined, STAGES >= 3);
//             TF32 = 3: as 1, to fp32 accuracy: each fp32 operand split into two tf32 parts, three mma a
//             product (two where A is the uint8 image input: its bytes are exact; gc_gemm_tc_kernel only).
//             TF32 = 4: as 2 (wgmma), to fp32 accuracy as 3: B's parts stored side by side in shared memory,
//             A's split in registers (gc_gemm_wg_kernel; weight gradients, A transposed and B not, only).
//             TF32 = 5: as 3 (tf32 parts, three mma a product, a warp's TM x TN), for a short K slice: the
//             block stages BK x STAGES k of both operands at once (gc_gemm_sk_kernel in gc_gemm_sk.cuh).
//             TF32 = 6: as 2 (tf32 wgmma), warp-specialized: BM / 64 consumer warpgroups of 64 x BN (TM 64,
//             TN = BN: 64 or 128) and two producer warpgroups that copy, BK 32 into a 128-byte-swizzled layout,
//             mbarriers between them (gc_gemm_ws_kernel in gc_gemm_ws.cuh; A not transposed only).
//             TF32 = 7: as 5 in plain tf32: one mma a product (a tf32 tile; gc_gemm_sk_kernel).
//   SPLIT     > 1: K is split over a cluster of SPLIT blocks (sm_90) whose partial tiles are summed in
//             shared memory in a fixed order (deterministic, no atomics, no extra device memory).
//   SM SN SK  the static shape the GEMM was specialized for (0: any). Bounds checks on a dimension that the
//             tile divides are compiled out; gc_gemm refuses a launch whose shape differs.
//   STAGES    > 0: a pipelined kernel, operands copied to shared memory with cp.async, STAGES K steps deep:
//             gc_gemm_pipe_kernel (fp32 FMAs) or, TF32 = 1 or 3, gc_gemm_tc_kernel (gc_gemm_tc.cuh); TF32 = 5
//             and 7: the STAGES groups of BK k that gc_gemm_sk_kernel copies at once;
//             0: the register-staged one (gc_gemm_kernel).
//   KW        fp32 pipelined tiles: KW groups of (BM / TM) x (BN / TN) threads, group w computing every KW-th k
//             of each step (k = w, w + KW, ...) into its own accumulators; group 0 adds the others' in order
//             0..KW-1 at the end. More warps for a tile, the same shared-memory reads per FMA.
template <int BM_, int BN_, int BK_, int TM_, int TN_, int TF32_, int SPLIT_ = 1, int SM_ = 0, int SN_ = 0,
          int SK_ = 0, int STAGES_ = 0, int KW_ = 1>
struct gc_tile {
    static constexpr int BM = BM_, BN = BN_, BK = BK_, TM = TM_, TN = TN_, TF32 = TF32_, SPLIT = SPLIT_;
    static constexpr int SM = SM_, SN = SN_, SK = SK_, STAGES = STAGES_, KW = KW_;
    static constexpr int PRODUCERS = TF32 == 6 ? 256 : 0;   // TF32 = 6: two producer warpgroups' threads too
    static constexpr int THREADS = (BM / TM) * (BN / TN) * (TF32 == 2 || TF32 == 4 || TF32 == 6 ? 128 : TF32 ? 32 : 1) * KW
                                  + PRODUCERS;
};

// The epilogue that stores the sum unchanged.
struct gc_ep_store {
    template <typename T> GC_HD T operator()(int, int, int, T acc) const { return acc; }
};

// A split GEMM whose reader sums its splits (cuda; lower.py's fold_split_sums, gc_chain_sum_partials): each
// split's block stores its partial tile, unchanged, at C + split * M * N (C: the partials' workspace) — no
// cluster, no sum, no epilogue (the reader applies the GEMM's).
struct gc_ep_partial {
    static constexpr bool partials = true;
    template <typename T> GC_HD T operator()(int, int, int, T acc) const { return acc; }
};

// GC_OK when a launch fits its tile's static shape (and its sizes are not negative), else a message.
template <class Tile>
static int gc_gemm_check(int M, int N, int K, int batch) {
    if (M < 0 || N < 0 || K < 0 || batch < 0)
        return gc_fail(GC_ERR_ARG, "gc_gemm: negative size M=%d N=%d K=%d batch=%d", M, N, K, batch);
    if ((Tile::SM && Tile::SM != M) || (Tile::SN && Tile::SN != N) || (Tile::SK && Tile::SK != K))
        return gc_fail(GC_ERR_ARG, "gc_gemm: called with M=%d N=%d K=%d, but its tile was specialized for "
                       "M=%d N=%d K=%d", M, N, K, Tile::SM, Tile::SN, Tile::SK);
    return GC_OK;
}
#endif   // GC_KERNELS
