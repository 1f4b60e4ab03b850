// gc_gemm_ws.cuh — the warp-specialized Hopper tensor-core GEMM: tiles with TF32 = 6 (gc_gemm_launch in
// gc_gemm_cuda.cuh dispatches here), A not transposed (x @ W, x @ W^T; the image input read in place from
// float rows too). tf32 wgmma.mma_async m64nBNk8 with BOTH operands read from shared memory by descriptor, in
// the 128-byte-swizzled K-major layout (a K step is 32 k: each row of an operand's step is one 128-byte line,
// its 16-byte chunks permuted by the row's place in its group of 8 rows, so that the tensor cores read 8 rows'
// chunks from 8 distinct bank groups). The block is BM / 64 consumer warpgroups (64 rows of C each, the tile's
// whole width) and two producer warpgroups that only copy (PT = 256 threads):
//   * A's step by cp.async, 16-byte chunks straight into the swizzled layout, its rows shared out over both
//     producer warpgroups (the MLP's b1000 x @ W1: the first steps issued ~400 cycles apart instead of ~500
//     with one; the consumers still receive a step about every 500: docs/compiler.md); the copies signal the
//     step's mbarrier when they land (cp.async.mbarrier.arrive.noinc);
//   * B's with TB (k contiguous too) by the TMA unit where a tensor map can describe it (gc_ws_tensor_map:
//     batch 1, B 16-byte aligned, rows a multiple of 16 bytes): one bulk copy a step by one producer thread into
//     the same layout (the unit's 128-byte swizzle), counted on the step's mbarrier by its bytes; else by
//     cp.async as A, by the first producer warpgroup;
//   * B without TB (W stored k x n: n contiguous, which tf32 wgmma cannot read) by the first producer
//     warpgroup, warp by warp: warp w copies
//     its BN / 4 columns of the step as they lie into a staging slot of its own (cp.async, P slots deep), and
//     once they landed (its own wait, no barrier with the other warps) lane l reads row k = l and stores its
//     values transposed into the layout (8 columns' stores of a lane on 8 distinct banks), then the fence that
//     makes them visible to the tensor cores and an arrive on the step's mbarrier.
// STAGES steps in flight: a consumer waits for a step's mbarrier ("full"), issues its 4 wgmma, and once the
// step before's wgmma are waited for (wgmma.wait_group 1) frees that step's buffers (its "empty" mbarrier, a
// lane a consumer warp); the producer waits for that before refilling them. Nothing else synchronizes the
// two roles: the consumers issue wgmma and little else, the producer copies and nothing else — against
// gc_gemm_wg_kernel, whose 4 warps a tile copy, read fragments and issue wgmma in turn (one warp a scheduler
// at these sizes: issue-bound). Measured (H100, the MLP's b1000 x @ W1, 1000 x 256 x 784, A by row index,
// alone, 20 launches in a CUDA graph): see docs/compiler.md. The tensor cores read an fp32 operand's top 19
// bits (tf32 truncated, as gc_gemm_wg_kernel). The end: a split's cluster sum by pushes (gc_gemm_split_push:
// all threads, the producer's too), else gc_gemm_finish's (the epilogue and the stores, or the partials for
// their reader).
#if GC_KERNELS   // the kernels part (gc_runtime.h)
#include <cuda.h>           // CUtensorMap (the driver's encoder comes through the runtime: no libcuda link)
#include <cudaTypedefs.h>

// B with TB by the TMA unit (TMA: a tile's launch with batch 1, B 16-byte aligned with rows of a multiple of 16
// bytes): a tensor map of B (K x N as stored, k inner) whose box is a step's BN rows of 32 k, written by the
// unit into the 128-byte-swizzled layout below (its swizzle is this layout's: a row's 16-byte chunk c of 8 rows'
// 1024 bytes at c ^ (row % 8)), k past K and rows past N as zeros. One copy a step by one producer thread,
// counted on the step's mbarrier by its bytes, instead of the warpgroup's 16-byte cp.async copies: those went
// out at about 600 cycles a step of 16 KB a block (clock64 stamps, H100, the MLP's b1000 x @ W1), the rate
// that bounded the kernel. gc_ws_tensor_map: the map, or false where the driver gives no encoder or refuses.
static bool gc_ws_tensor_map(CUtensorMap* map, const void* b, int K, int N, int box_rows) {
    static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {   // asked once (a thread-safe static's init)
        void* fn = nullptr;
        cudaDriverEntryPointQueryResult found;
        return cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) ==
                       cudaSuccess && found == cudaDriverEntryPointSuccess
                   ? (PFN_cuTensorMapEncodeTiled_v12000)fn : nullptr;
    }();
    if (!encode || (uintptr_t)b % 16 != 0 || (size_t)K * 4 % 16 != 0) return false;
    const cuuint64_t dims[2] = {(cuuint64_t)K, (cuuint64_t)N}, strides[1] = {(cuuint64_t)K * 4};
    const cuuint32_t box[2] = {32, (cuuint32_t)box_rows}, unit[2] = {1, 1};
    return encode(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, const_cast<void*>(b), dims, strides, box, unit,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// A K step of one operand in the 128-byte-swizzled K-major layout: X rows of 32 k, row x's 128 bytes at
// x * 128, its chunk c (k 4c .. 4c + 3) at position c ^ (x % 8). The descriptor's stride between 8-row groups
// (SBO) is 1024 bytes; the k8 slice j starts 32 j bytes into each line (the swizzle is applied by the tensor
// cores on the address, so each buffer starts on a 1024-byte boundary).
struct gc_ws_layout {
    __device__ static __forceinline__ int chunk(int x, int c) { return x * 128 + ((c ^ (x & 7)) << 4); }
    __device__ static __forceinline__ int element(int x, int k) { return chunk(x, k >> 2) + (k & 3) * 4; }
    __device__ static __forceinline__ uint64_t desc(const void* s) {   // gc_wgmma_desc's, and the swizzle mode
        return gc_wgmma_desc(s, 16, 1024) | (uint64_t)1 << 62;                // (LBO: unused by this layout)
    }
};

// The shared memory of a TF32 = 6 tile: STAGES steps of A (BM lines) and B (BN lines), 1024-aligned; without
// TB the producer warps' staging slots (P steps of 32 k x BN / 4 columns each, rows padded by 4 words); the
// mbarriers; RA: the block's row indices. The split's partial tile reuses the steps' bytes. ALIGN: the slack
// that lets the kernel round the dynamic shared memory's start up to 1024 bytes.
template <bool TB, class Tile, int RA>
struct gc_ws_smem {
    static constexpr int BM = Tile::BM, BN = Tile::BN, ST = Tile::STAGES, WN = BN / 4, LDW = WN + 4;
    static constexpr int P = ST < 4 ? ST : 4;   // (the producer's P - 1 steps ahead must fit in STAGES: else it waits
                                                // for a buffer whose step it has not yet transposed)
    static constexpr int STEP = (BM + BN) * 128;
    static constexpr int SLOT = 32 * LDW * 4, RAW = TB ? 0 : 4 * P * SLOT;
    static constexpr size_t pipe = (size_t)ST * STEP;
    static constexpr size_t red = Tile::SPLIT > 1 ? (size_t)2 * BM * (BN + 8) * 4 : 0;   // gc_gemm_split_push's
    static constexpr size_t raw_at = pipe > red ? pipe : red;
    static constexpr size_t bars_at = raw_at + RAW;
    static constexpr size_t idx_at = bars_at + 2 * ST * 8;
    static constexpr int NIDX = RA ? BM : 0;
    static constexpr size_t ALIGN = 1024, bytes = idx_at + NIDX * 4 + ALIGN;
};

// Step rows n0 .. n0 + BN - 1, k .. k + 31 of B by the TMA unit into `dst` (its 128-byte swizzle: the layout),
// counted on `bar` by its bytes (this thread's arrival expects them).
__device__ __forceinline__ void gc_ws_tma_b(char* dst, const CUtensorMap& map, int k, int n0, uint64_t* bar,
                                            unsigned bytes) {
    gc_mbar_expect(bar, bytes);
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];"
                 :: "r"((unsigned)__cvta_generic_to_shared(dst)), "l"(reinterpret_cast<uint64_t>(&map)), "r"(k),
                    "r"(n0), "r"((unsigned)__cvta_generic_to_shared(bar))
                 : "memory");
}

template <typename T, bool TA, bool TB, class Tile, class Ep, int RA, bool TMA>
__global__ void __launch_bounds__(Tile::THREADS, 1)
gc_gemm_ws_kernel(const gc_gemm_params<T, Ep> p, const __grid_constant__ CUtensorMap tmap_b) {
#if GC_BODIES
    static_assert(!TMA || TB, "gc_gemm: the TMA unit copies B with TB");
    typedef gc_ws_smem<TB, Tile, RA> SM;
    constexpr int BM = Tile::BM, BN = Tile::BN, BK = Tile::BK, ST = Tile::STAGES, S = Tile::SPLIT;
    constexpr int CW = BM / 64, THREADS = Tile::THREADS, P = SM::P, WN = SM::WN, LDW = SM::LDW;
    static_assert(Tile::TF32 == 6 && sizeof(T) == 4 && !TA, "gc_gemm: warp-specialized wgmma tiles are float, A "
                  "not transposed");
    constexpr int PT = Tile::PRODUCERS;   // the producer warpgroups' threads
    static_assert(BK == 32 && Tile::TM == 64 && Tile::TN == BN && (BN == 64 || BN == 128) && BM % 64 == 0 &&
                  THREADS == CW * 128 + PT && ST >= 2, "gc_gemm: a warp-specialized wgmma tile is BM / 64 "
                  "warpgroups of 64 x BN (64 or 128), BK 32, and two producer warpgroups");
    gc_wg_begin<Tile, SM::bytes, RA>();
#if GC_WGMMA
    extern __shared__ __align__(16) unsigned char gc_dynamic_smem[];
    char* smem = reinterpret_cast<char*>(((uintptr_t)gc_dynamic_smem + SM::ALIGN - 1) & ~(uintptr_t)(SM::ALIGN - 1));
    uint64_t* full = reinterpret_cast<uint64_t*>(smem + SM::bars_at);
    uint64_t* empty = full + ST;
    uint32_t* ridx = reinterpret_cast<uint32_t*>(smem + SM::idx_at);
    typedef gc_gemm_block<T, TA, TB, Tile> Block;
    constexpr bool EM = Block::EM, EN = Block::EN;
    const Block g(p);
    const T* __restrict__ A = p.A + g.b * p.sa;
    const T* __restrict__ B = p.B + g.b * p.sb;
    T* __restrict__ C = p.C + g.b * p.sc;
    uint32_t rows_at[RA ? Block::NI : 1];
    if constexpr (RA) g.load_rows(rows_at, p.rows);   // (on their way while thread 0 sets the mbarriers)
    if (threadIdx.x == 0) {
        for (int s = 0; s < ST; s++) {
            // the producers' copies (+ the first one's warps' transposed stores, or the TMA copy's expecting
            // arrival)
            gc_mbar_init(full + s, TB ? PT + TMA : PT + 4);
            gc_mbar_init(empty + s, CW * 4);              // a lane of each consumer warp
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    if constexpr (RA) g.put_rows(ridx, rows_at);
    __syncthreads();   // the mbarriers' init and the row indices published
    const int wg = threadIdx.x / 128, kt_all = g.ktiles;
    gc_split_packs_for<Ep, BM, BN, S, THREADS, EN> split_packs;   // (a split's: into registers, not waited for)
    split_packs.template load<!EM>(p.ep, g.b, g.m0, g.n0, g.M);

    // The accumulators of consumer warpgroup wg (rows 64 wg .. + 63 of the tile): thread t holds
    // acc[4 j + 2 h + r] = (16 (t / 32) + (t % 32) / 4 + 8 h, 8 j + 2 (t % 4) + r), as runs of 2 columns.
    float acc[BN / 2];
    const int warp = threadIdx.x % 128 / 32, gid = threadIdx.x % 32 / 4, tig = threadIdx.x % 4;
    auto for_runs = [&](auto&& f) {
        if (wg >= CW) return;   // the producers have none
#pragma unroll
        for (int j = 0; j < BN / 8; j++)
#pragma unroll
            for (int h = 0; h < 2; h++) f(64 * wg + 16 * warp + gid + 8 * h, 8 * j + 2 * tig, &acc[4 * j + 2 * h]);
    };

    if (wg >= CW) {   // ---- the producer warpgroups ----
        const int t = threadIdx.x - CW * 128, ch = t % 8, lane = t % 32;
        const bool first = t < 128;   // the first producer warpgroup: B's copies too
        const int k_left = g.k_end - g.k_begin;   // the split's k
        const bool va = RA ? g.K % 4 == 0 && (uintptr_t)p.rows.source % 16 == 0 : g.va;
        // A's lines: thread t copies chunk ch of rows t / 8 + 32 i (the same chunk place in each, as the
        // swizzle depends on the row's place in its 8: rows 32 apart share it)
        const T* arow[BM / 32];
#pragma unroll
        for (int i = 0; i < BM / 32; i++) {
            const int r = t / 8 + 32 * i;
            const bool in = EM || g.m0 + r < g.M;
            arow[i] = !in ? nullptr
                    : RA ? (const T*)p.rows.source + (long long)ridx[r] * g.K + g.k_begin
                         : A + (long long)(g.m0 + r) * g.K + g.k_begin;
        }
        const T* brow[TB && !TMA ? BN / 16 : 1];
        if constexpr (TB && !TMA) {
#pragma unroll
            for (int i = 0; i < BN / 16; i++) {
                const int r = t % 128 / 8 + 16 * i;
                brow[i] = (EN || g.n0 + r < g.N) ? B + (long long)(g.n0 + r) * g.K + g.k_begin : nullptr;
            }
        }
        const int at = gc_ws_layout::chunk(t / 8, ch);   // (rows t / 8 + 32 i: + 4096 i; B's t / 8 + 16 i: + 2048 i)
        // one line's chunk: 16 bytes where the rows allow vectors, else its 4 elements one by one
        auto line = [&](char* dst, const T* row, int k, bool vec) {
            if (vec) {
                gc_cp_async<16>(dst, row ? row + k : p.B, row && k < k_left);
            } else {
#pragma unroll
                for (int e = 0; e < 4; e++)
                    gc_cp_async<4>(dst + 4 * e, row ? row + k + e : p.B, row && k + e < k_left);
            }
        };
        // without TB: warp `warp` stages columns n0 + warp WN .. of B's step rows (k), lane chunks q = lane + 32 i
        char* raw = smem + SM::raw_at + warp * P * SM::SLOT;
        const T* bcol = B + (long long)g.k_begin * g.N + g.n0 + warp * WN;
        constexpr int CPR = WN / 4, RAWC = 32 * CPR / 32;
        for (int i = 0; i < kt_all + (TB ? 0 : P - 1); i++) {
            if constexpr (!TB) {   // step q = i - (P - 1): its staged columns, transposed into its buffer
                const int q = i - (P - 1);
                if (first && q >= 0) {
                    gc_cp_wait<P - 2>();   // (a group a step: this thread's copies of step q have landed)
                    __syncwarp();
                    const float* rs = reinterpret_cast<const float*>(raw + q % P * SM::SLOT);
                    char* bs = smem + q % ST * SM::STEP + BM * 128;
#pragma unroll
                    for (int c = 0; c < WN / 8; c++) {
                        const float4 v0 = *reinterpret_cast<const float4*>(rs + lane * LDW + 8 * c);
                        const float4 v1 = *reinterpret_cast<const float4*>(rs + lane * LDW + 8 * c + 4);
                        const float v[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
#pragma unroll
                        for (int j = 0; j < 8; j++)
                            *reinterpret_cast<float*>(bs + gc_ws_layout::element(warp * WN + 8 * c + j, lane)) = v[j];
                    }
                    gc_fence_proxy_async();
                    __syncwarp();
                    if (lane == 0) gc_mbar_arrive(full + q % ST);
                }
            }
            if (i < kt_all) {   // step i's copies, once its buffers are free
                const int s = i % ST, k = i * BK + ch * 4;
                if (i >= ST) gc_mbar_wait(empty + s, (i / ST - 1) & 1);
                char* as = smem + s * SM::STEP;
#pragma unroll
                for (int r = 0; r < BM / 32; r++) line(as + at + 4096 * r, arow[r], k, va);
                if constexpr (TMA) {
                    if (t == 0) gc_ws_tma_b(as + BM * 128, tmap_b, g.k_begin + i * BK, g.n0, full + s, BN * 128);
                } else if constexpr (TB) {
                    if (first) {
#pragma unroll
                        for (int r = 0; r < BN / 16; r++) line(as + BM * 128 + at + 2048 * r, brow[r], k, g.vb);
                    }
                }
                gc_mbar_copies_arrive(full + s);
                if constexpr (!TB) {   // (the first producer warpgroup stages B's columns)
                    if (first) {
                        char* rs = raw + i % P * SM::SLOT;
#pragma unroll
                        for (int c = 0; c < RAWC; c++) {
                            const int qc = lane + 32 * c, row = qc / CPR, col = qc % CPR * 4, kr = i * BK + row;
                            const T* src = bcol + (long long)kr * g.N + col;
                            const bool live_k = kr < k_left;
                            if (g.vb) {
                                gc_cp_async<16>(rs + (row * LDW + col) * 4, live_k ? src : p.B,
                                                live_k && (EN || g.n0 + warp * WN + col < g.N));
                            } else {
#pragma unroll
                                for (int e = 0; e < 4; e++) {
                                    const bool live = live_k && (EN || g.n0 + warp * WN + col + e < g.N);
                                    gc_cp_async<4>(rs + (row * LDW + col + e) * 4, live ? src + e : p.B, live);
                                }
                            }
                        }
                    }
                }
            }
            if constexpr (!TB) gc_cp_commit();
        }
    } else {          // ---- a consumer warpgroup ----
        if constexpr (S == 1) gc_gemm_prefetch<2, !EM, !EN, T>(p.ep, g.b, g.m0, g.n0, g.M, g.N, for_runs);
        const uint64_t da = gc_ws_layout::desc(smem + wg * 64 * 128), db = gc_ws_layout::desc(smem + BM * 128);
        for (int i = 0; i < kt_all; i++) {
            const int s = i % ST;
            gc_mbar_wait(full + s, (i / ST) & 1);
            const uint64_t step = (uint64_t)(s * SM::STEP >> 4);
            gc_wgmma_fence();
#pragma unroll
            for (int k = 0; k < BK / 8; k++)   // k8 slice k: 32 k bytes into each line
                gc_wgmma<BN>::ssp(acc, da + step + 2 * k, db + step + 2 * k, i > 0 || k > 0);
            gc_wgmma_commit();
            gc_wgmma_wait<1>();
            if (i > 0 && threadIdx.x % 32 == 0) gc_mbar_arrive(empty + (i - 1) % ST);
        }
        gc_wgmma_wait<0>();
        gc_wgmma_hold<BN / 2>(acc);
        if (kt_all == 0) {   // an empty split: its sums are zeros
#pragma unroll
            for (int j = 0; j < BN / 2; j++) acc[j] = 0.f;
        }
    }
    auto free_smem = [] {
        gc_cp_wait<0>();
        __syncthreads();   // every warpgroup is done with the buffers
    };
    gc_release_dependents(p.release);
    if constexpr (S > 1 && !gc_ep_partials<Ep>::value)   // the cluster's sum, pushed into the blocks' step bytes
        gc_gemm_split_push<2, BM, BN, S, THREADS, !EM, !EN>(reinterpret_cast<T*>(smem), p.ep, g.b, g.m0, g.n0, g.M,
                                                            g.N, C, p.vc, for_runs, free_smem, split_packs);
    else
        gc_gemm_finish<2, BM, BN, S, THREADS, !EM, !EN>(reinterpret_cast<T*>(smem), p.ep, g.b, g.m0, g.n0, g.M, g.N,
                                                        C, p.vc, for_runs, free_smem, gc_gemm_packs<Ep, 1, false>(),
                                                        (const T*)nullptr, split_packs);
#endif
#endif
}

// The launch (gc_gemm_launch has checked the shape and the rows, made the grid and the cluster attribute): a
// GPU of compute capability 9.0 only (wgmma is sm_90a's); B by the TMA unit where a tensor map describes it.
template <typename T, bool TA, bool TB, class Tile, class Ep, bool RA>
static int gc_gemm_ws_launch(dim3 grid, cudaLaunchAttribute* cluster, const gc_gemm_params<T, Ep>& p) {
    GC_TRY(gc_wgmma_device("with precision fp32"));
    constexpr int R = RA ? 1 : 0;
    constexpr size_t smem = gc_ws_smem<TB, Tile, R>::bytes;
    CUtensorMap map;
    memset(&map, 0, sizeof map);
    // (a grid of one batch: z is the split)
    if (TB && grid.z == (unsigned)Tile::SPLIT && gc_ws_tensor_map(&map, p.B, p.K, p.N, Tile::BN))
        return gc_gemm_launch_pipelined<gc_gemm_ws_kernel<T, TA, TB, Tile, Ep, R, TB>, Tile>(grid, cluster, smem, p,
                                                                                          map);
    return gc_gemm_launch_pipelined<gc_gemm_ws_kernel<T, TA, TB, Tile, Ep, R, false>, Tile>(grid, cluster, smem, p,
                                                                                         map);
}
#endif   // GC_KERNELS
