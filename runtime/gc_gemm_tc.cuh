// gc_gemm_tc.cuh — the tf32 tensor-core GEMM fed by a cp.async pipeline (tiles with TF32 = 1 and STAGES > 0;
// gc_gemm_launch in gc_gemm_cuda.cuh dispatches to gc_gemm_tc_launch here). The tile, the epilogue functors,
// the block's place and K slice (gc_gemm_block) and split-K's cluster reduction are gc_gemm_cuda.cuh's; what
// differs from its register-staged tf32 path (gc_gemm_kernel with TF32 tiles) is how the operands arrive:
//   * K steps of BK go through STAGES shared-memory buffers filled by cp.async (16-byte copies, no registers
//     held for loads), STAGES - 1 steps in flight while one is computed, one barrier per step;
//   * each operand stays in shared memory as it is stored in global memory (no transposing copies): k-major
//     (the matrix's rows are k: A with TA, B without TB) or x-major (rows are M or N, k contiguous), rows
//     padded so that a warp's fragment reads hit 32 distinct banks; the k of an 8-wide slice are permuted
//     alike on both sides so that an x-major operand's two k per lane are one 8-byte read (gc_tc_layout);
//   * the fragments of an 8-wide k slice are read while the previous slice's mma run (two register sets),
//     as they are: the mma truncates them to tf32, as wgmma does (gc_gemm_kernel's stores round them).
// The image input read in place (RA: rows gathered by index, uint8 or float; gc_rows) comes in by cp.async
// too, row by row (gc_tc_rows); a uint8 operand stays bytes in shared memory and is converted (gc_pixel, the
// value every other reader sees) as its fragments are read.
// TF32 = 3 (fp32 tiles on tensor cores): the same kernel, each fragment register split as it is used into a
// high and a low tf32 part (gc_tf32_parts: to 2^-21 of the operand, four instructions) and each product
// computed as three mma, a_low b_high + a_high b_low + a_high b_high (a_low b_low, under 2^-20 of the product,
// left out: each product to 2^-19 at worst, the mma's products exact). The mma sum into a K step's own
// accumulators, from zero, which are added into the fp32 sums at the step's end: the tensor cores add into
// an accumulator with truncation, and a chain over all of K drifted to 3 to 10 times the error of fp32 FMAs
// against float64 at the MLP's shapes; a step's chain (4 to 8 mma) added in fp32 stays under it. A uint8 A
// (the image input's bytes, integers under 256) is exact as a high part: the bytes go into the products
// unscaled, two mma a product (to 2^-21), and the sums are scaled at the end (against gc_pixel's values, one
// more rounding: 2^-24).
#if GC_KERNELS   // the kernels part (gc_runtime.h)

// One operand's K step in shared memory: element (x, k), x < X (BM or BN), k < BK. KMAJOR: the matrix's rows
// are k (x contiguous), stored s[k * LD + x]; else its rows are x, stored s[x * LD + k]. The block copied is
// ROWS x COLS of the row-major matrix either way, in chunks of 16 bytes. E: the element stored, float or
// uint8_t (the image input read in place, bytes as in its rows; SIZE is in floats either way).
// A lane (gid, tig) of an mma needs k = tig and tig + 4 of each 8-wide slice; both operands instead give it
// k = 2 tig and 2 tig + 1 (the same permutation of the slice's k on both sides, so the products summed are
// the same): x-major, one 8-byte read. Padding for 32 distinct banks per wavefront: x-major LD = BK + 8
// (a half-warp's 8-byte reads at gid * LD + 2 tig, LD = 8 mod 32), k-major LD = X + 4 (rows 2 tig and
// 2 tig + 1 at column gid: 2 LD = 8 mod 32). Bytes: x-major rows of 12 mod 32 words (a lane's 2-byte read,
// a row's 4 lanes 2 words: 8 rows on 16 distinct banks), k-major rows of X + 16 bytes (rows 2 tig 8 mod 32
// words apart, their 8 columns 2 words).
template <int BK, int X, bool KMAJOR, typename E = float>
struct gc_tc_layout {
    static constexpr bool U8 = sizeof(E) == 1;
    static constexpr int ROWS = KMAJOR ? BK : X, COLS = KMAJOR ? X : BK;
    static constexpr int LD = !U8 ? COLS + (KMAJOR ? 4 : 8) : COLS + (KMAJOR || COLS % 32 == 0 ? 16 : 32);
    static constexpr int SIZE = ROWS * LD * (int)sizeof(E) / 4;
    static_assert(X % 16 == 0 && BK % 16 == 0, "gc_gemm: tf32 pipelined tile sizes");
    // A float as a tf32 operand register: its bits as they are. The mma reads the top 19 (sign, exponent, 10
    // mantissa bits): the operand is truncated, as the wgmma tiles' are (a NaN with a payload in its top
    // mantissa bits, CUDA's 0x7fffffff among them, stays a NaN). Rounding to nearest here, at every
    // fragment read, took four integer instructions an element: over half the loop's instructions at the
    // MLP's batch-1000 x @ W1 (ncu), whose step was 5% slower for it (H200, docs/compiler.md).
    __device__ static __forceinline__ uint32_t tf32(float a) { return __float_as_uint(a); }
    // A byte (bits 0-7 of b, the rest zero) as gc_pixel converts it, u8 * scale (gc_byte_value: 8 a lane a k
    // slice of the 32-row warp tiles).
    __device__ static __forceinline__ float byte(uint32_t b, float scale) { return gc_byte_value(b) * scale; }
    // Elements (x, k) and (x, k + 1), k even, as tf32 operand registers (bytes: converted as gc_pixel does).
    __device__ static __forceinline__ void pair(const float* s, int x, int k, uint32_t& lo, uint32_t& hi,
                                                float scale = 1.f) {
        const E* e = reinterpret_cast<const E*>(s);
        if constexpr (U8) {
            uint32_t a, b;
            if (KMAJOR) {
                a = e[k * LD + x];
                b = e[(k + 1) * LD + x];
            } else {   // the two bytes of one 2-byte read, each moved into the low byte of 0x4B000000
                const uint32_t v = *reinterpret_cast<const uint16_t*>(e + x * LD + k);
                a = __byte_perm(v, 0, 0x4440);
                b = __byte_perm(v, 0, 0x4441);
            }
            lo = tf32(byte(a, scale));
            hi = tf32(byte(b, scale));
            return;
        }
        E a, b;
        if (KMAJOR) {
            a = e[k * LD + x];
            b = e[(k + 1) * LD + x];
        } else {
            const float2 v = *reinterpret_cast<const float2*>(e + x * LD + k);
            a = v.x;
            b = v.y;
        }
        lo = tf32(a);
        hi = tf32(b);
    }
};

// The copies of one operand's K steps, global -> shared: the ROWS x COLS block at src of a row-major matrix
// (row stride ld). CR / CC: rows / columns may run past the matrix (rows_left, cols_left from the
// block's origin; cp.async writes zeros there). vec: 16-byte copies (the columns, the stride and the pointer
// allow them; cols_left is then a multiple of 4, so a chunk is wholly inside or outside); else one element
// a copy, in a loop (odd or unaligned rows, rare). A thread's 16-byte copies are its first one plus
// compile-time offsets, so a step's addresses are one pointer and immediates.
template <typename T, class L, int THREADS, bool CR, bool CC>
struct gc_tc_operand {
    static constexpr int ROWS = L::ROWS, COLS = L::COLS, LD = L::LD, CPR = COLS / 4;   // chunks a row
    static constexpr int PER = ROWS * CPR / THREADS, DR = THREADS / CPR;           // a thread's chunks, rows apart
    static_assert(sizeof(T) == 4 && COLS % 4 == 0 && THREADS % CPR == 0 && ROWS % DR == 0,
                  "gc_gemm: tf32 pipelined tile: a step's chunks do not share out over the threads");
    const T* from;   // this thread's first chunk (vec) at K step 0
    const T* base;   // the block's origin at K step 0 (element copies)
    long long ld;
    int r1, c1, rows_left, cols_left;
    bool vec;

    __device__ __forceinline__ gc_tc_operand(const T* src, long long ld_, int rows_left_, int cols_left_, bool vec_)
        : base(src), ld(ld_), rows_left(rows_left_), cols_left(cols_left_), vec(vec_) {
        r1 = threadIdx.x / CPR;
        c1 = threadIdx.x % CPR * 4;
        from = src + r1 * ld + c1;
    }

    // The step whose block starts `dr` rows / `dc` columns further (the K advance: k-major rows, x-major
    // columns), with rows_left / cols_left reduced by as much, into s.
    __device__ __forceinline__ void copy(T* s, int dr, int dc) const {
        const int rl = rows_left - dr, cl = cols_left - dc;
        if (vec) {
            const T* f = from + dr * ld + dc;
            T* d = s + r1 * LD + c1;
#pragma unroll
            for (int i = 0; i < PER; i++) {
                const bool live = (!CR || r1 + i * DR < rl) && (!CC || c1 < cl);
                gc_cp_async<16>(d + i * DR * LD, live ? f + i * DR * ld : base, live);
            }
        } else {
            const T* f = base + dr * ld + dc;
#pragma unroll 1
            for (int e = threadIdx.x; e < ROWS * COLS; e += THREADS) {
                const int r = e / COLS, c = e % COLS;
                const bool live = (!CR || r < rl) && (!CC || c < cl);
                gc_cp_async<4>(s + r * LD + c, live ? f + r * ld + c : base, live);
            }
        }
    }
};

// The copies of the image input read in place (RA), global -> shared: the block's ROWS x COLS elements E
// (uint8 or float) where row r of the block is source row idx[r] (the block's row indices, staged in shared
// memory: its BM rows of M x-major, its split's K rows k-major), from column c0 on; the source's rows are
// ld elements. CR / CC as gc_tc_operand's. vec: 16-byte copies (the source and ld allow them: a chunk is
// then wholly inside or outside), else 4-byte ones (gc_gemm has checked that rows are 4-byte runs).
template <typename E, class L, int THREADS, bool CR, bool CC>
struct gc_tc_rows {
    static constexpr int ROWS = L::ROWS, COLS = L::COLS, LD = L::LD;
    static constexpr int V = 16 / sizeof(E), CPR = COLS / V, CHUNKS = ROWS * CPR;   // 16-byte chunks
    static constexpr int PER = (CHUNKS + THREADS - 1) / THREADS;
    static_assert(COLS % V == 0, "gc_gemm: a tf32 pipelined tile side is not a multiple of 16 bytes");
    const E* src;
    const uint32_t* idx;
    long long ld;
    int c0, rows_left, cols_left;
    bool vec;

    // The step whose block starts `dr` rows / `dc` columns further, into s.
    __device__ __forceinline__ void copy(float* s, int dr, int dc) const {
        E* d = reinterpret_cast<E*>(s);
        const int rl = rows_left - dr, cl = cols_left - dc;
        if (vec) {
#pragma unroll
            for (int i = 0; i < PER; i++) {
                const int j = threadIdx.x + i * THREADS, r = j / CPR, c = j % CPR * V;
                if (CHUNKS % THREADS != 0 && j >= CHUNKS) break;
                const bool live = (!CR || r < rl) && (!CC || c < cl);
                gc_cp_async<16>(d + r * LD + c, live ? src + (long long)idx[dr + r] * ld + c0 + dc + c : src, live);
            }
        } else {
            constexpr int W = 4 / sizeof(E);
#pragma unroll 1
            for (int j = threadIdx.x; j < ROWS * COLS / W; j += THREADS) {
                const int r = j / (COLS / W), c = j % (COLS / W) * W;
                const bool live = (!CR || r < rl) && (!CC || c < cl);
                gc_cp_async<4>(d + r * LD + c, live ? src + (long long)idx[dr + r] * ld + c0 + dc + c : src, live);
            }
        }
    }
};

// Shared memory of a tile (floats): STAGES steps of A and B as laid out for the transposes; split: then the
// partial BM x BN tile. RA (1: float rows, 2: uint8 rows, gathered): A's layout of those elements, and after
// the rest the block's NIDX row indices (BM rows x-major; k-major the K rows of a split, which the static
// shape bounds).
template <bool TA, bool TB, class Tile, int RA = 0>
struct gc_tc_smem {
    typedef gc_tc_layout<Tile::BK, Tile::BM, TA, typename std::conditional<RA == 2, uint8_t, float>::type> LA;
    typedef gc_tc_layout<Tile::BK, Tile::BN, !TB> LB;
    static constexpr int STAGE = LA::SIZE + LB::SIZE;
    static constexpr size_t pipe = (size_t)Tile::STAGES * STAGE * 4;
    static constexpr size_t red = Tile::SPLIT > 1 ? (size_t)Tile::BM * Tile::BN * 4 : 0;
    static constexpr size_t data = pipe > red ? pipe : red;
    static constexpr int NIDX = RA ? gc_gemm_block<float, TA, TB, Tile>::IDX : 0;
    static constexpr size_t bytes = data + (size_t)NIDX * 4;
};

// RA: A is the image input read in place (gc_gemm_kernel's RA), 1: float rows, 2: uint8 rows.
template <typename T, bool TA, bool TB, class Tile, class Ep, int RA>
__global__ void __launch_bounds__(Tile::THREADS, Tile::THREADS <= 128 ? 2 : 1)
gc_gemm_tc_kernel(const gc_gemm_params<T, Ep> p) {
#if GC_BODIES
    constexpr int BM = Tile::BM, BN = Tile::BN, BK = Tile::BK, TM = Tile::TM, TN = Tile::TN;
    constexpr int ST = Tile::STAGES, S = Tile::SPLIT, THREADS = Tile::THREADS;
    static_assert((Tile::TF32 == 1 || Tile::TF32 == 3) && sizeof(T) == 4 && ST >= 2,
                  "gc_gemm: tensor-core pipelined tiles are tf32 or tf32 parts, 2+ stages");
    static_assert(S >= 1 && S <= 8 && BM % S == 0, "gc_gemm: split must be 1..8 and divide BM");
    static_assert(Tile::KW == 1, "gc_gemm: K groups are for fp32 pipelined tiles");
    static_assert(BM % TM == 0 && BN % TN == 0 && TM % 16 == 0 && TN % 8 == 0, "gc_gemm: warp tile not 16 x 8 mma tiles");
    typedef gc_tc_smem<TA, TB, Tile, RA> Smem;
    typedef typename Smem::LA LA;
    typedef typename Smem::LB LB;
    static_assert(Smem::bytes <= 227 * 1024, "gc_gemm: tf32 pipelined tile needs over 227 KB of shared memory");
    static_assert(!RA || (Tile::SK > 0 && Tile::SM > 0), "gc_gemm: batch rows need a static shape");
    extern __shared__ __align__(16) unsigned char gc_dynamic_smem[];
    T* smem = reinterpret_cast<T*>(gc_dynamic_smem);
    gc_wait_prior();

    typedef gc_gemm_block<T, TA, TB, Tile> Block;
    constexpr bool EM = Block::EM, EN = Block::EN, EK = Block::EK;
    const Block g(p);
    const T* __restrict__ A = p.A + g.b * p.sa;
    const T* __restrict__ B = p.B + g.b * p.sb;
    T* __restrict__ C = p.C + g.b * p.sc;

    // A's block: (BK x BM) at (k_begin, m0) of A stored (K, M) with TA, else (BM x BK) at (m0, k_begin) of A
    // (M, K); B's: (BK x BN) at (k_begin, n0) of B (K, N), or (BN x BK) at (n0, k_begin) with TB.
    // RA: A's rows are the batch's (M x-major, K with TA): their indices into shared memory first.
    const int kl = g.k_end - g.k_begin;
    uint32_t* ridx = reinterpret_cast<uint32_t*>(gc_dynamic_smem + Smem::data);
    if constexpr (RA != 0) g.stage_rows(ridx, p.rows);
    typedef typename std::conditional<RA == 2, uint8_t, float>::type E;
    typedef gc_tc_operand<T, LA, THREADS, TA ? !EK : !EM, TA ? !EM : !EK> PlainA;
    typedef gc_tc_rows<E, LA, THREADS, TA ? !EK : !EM, TA ? !EM : !EK> RowsA;
    typedef typename std::conditional<RA != 0, RowsA, PlainA>::type OperandA;
    typedef gc_tc_operand<T, LB, THREADS, !TB ? !EK : !EN, !TB ? !EN : !EK> OperandB;
    const OperandA oa = [&] {
        if constexpr (RA != 0) {   // rows of ld elements; 16-byte copies where ld and the source allow them
            const int ld = TA ? g.M : g.K;
            return RowsA{(const E*)p.rows.source, ridx, ld, TA ? g.m0 : g.k_begin, TA ? kl : g.M - g.m0,
                         TA ? g.M - g.m0 : kl, ld % (16 / (int)sizeof(E)) == 0 && (uintptr_t)p.rows.source % 16 == 0};
        } else {
            return PlainA(TA ? A + (size_t)g.k_begin * g.M + g.m0 : A + (size_t)g.m0 * g.K + g.k_begin, TA ? g.M : g.K,
                          TA ? kl : g.M - g.m0, TA ? g.M - g.m0 : kl, g.va);
        }
    }();
    const OperandB ob(!TB ? B + (size_t)g.k_begin * g.N + g.n0 : B + (size_t)g.n0 * g.K + g.k_begin, TB ? g.K : g.N,
                      !TB ? kl : g.N - g.n0, !TB ? g.N - g.n0 : kl, g.vb);
    // X3: fp32 by tf32 parts (TF32 = 3); EXACT: A is uint8 bytes, taken as they are (scaled at the end)
    constexpr bool X3 = Tile::TF32 == 3, EXACT = X3 && RA == 2;
    const float scale = RA == 2 && !EXACT ? p.rows.scale : 1.f;
    auto load = [&](int buf, int kt) {   // K step kt into buffer buf
        const int dk = kt * BK;
        T* s = smem + buf * Smem::STAGE;
        oa.copy(s, TA ? dk : 0, TA ? 0 : dk);
        ob.copy(s + LA::SIZE, !TB ? dk : 0, !TB ? 0 : dk);
    };

    // Warp (wm, wn) owns a TM x TN tile: (TM / 16) x (TN / 8) mma tiles; lane = 4 * gid + tig.
    constexpr int MI = TM / 16, NI = TN / 8, WN = BN / TN, KS = BK / 8;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane / 4, tig = lane % 4;
    const int wm = warp / WN, wn = warp % WN;
    float acc[MI][NI][4] = {};
    // X3: a K step's tensor-core sums, added into acc at the step's end (gc_pipeline's step_end; above)
    float part[X3 ? MI : 1][X3 ? NI : 1][4];
    uint32_t af[2][MI][4], bf[2][NI][2];
    // The fragments of k slice [k, k + 8) of the step in buffer `as` (A, then B), tf32-rounded; registers 0 / 2
    // of A and 0 / 1 of B hold k = 2 tig, 2 tig + 1 (gc_tc_layout).
    auto fragments = [&](const T* as, int k, uint32_t (*a)[4], uint32_t (*b)[2]) {
        const T* bs = as + LA::SIZE;
#pragma unroll
        for (int i = 0; i < MI; i++) {
            const int x = wm * TM + i * 16 + gid;
            LA::pair(as, x, k + 2 * tig, a[i][0], a[i][2], scale);
            LA::pair(as, x + 8, k + 2 * tig, a[i][1], a[i][3], scale);
        }
#pragma unroll
        for (int j = 0; j < NI; j++) LB::pair(bs, wn * TN + j * 8 + gid, k + 2 * tig, b[j][0], b[j][1]);
    };
    // The accumulators as runs of 2 consecutive columns at tile coordinates (row, col).
    auto for_runs = [&](auto&& f) {
#pragma unroll
        for (int i = 0; i < MI; i++)
#pragma unroll
            for (int j = 0; j < NI; j++)
#pragma unroll
                for (int h = 0; h < 2; h++) f(wm * TM + i * 16 + gid + 8 * h, wn * TN + j * 8 + 2 * tig, &acc[i][j][2 * h]);
    };

    // gc_gemm_cuda.cuh's pipeline: a slice is 8 k of the step (one mma each); the functor's operands go to
    // L1 while the first steps are on their way (split tiles: not yet).
    gc_pipeline<ST, KS>(g.ktiles, load, [&] {
        if constexpr (S == 1) gc_gemm_prefetch<2, !EM, !EN, T>(p.ep, g.b, g.m0, g.n0, g.M, g.N, for_runs);
    }, [&](int buf, int ks, int set) { fragments(smem + buf * Smem::STAGE, ks * 8, af[set], bf[set]); }, [&](int set, int ks) {
        if constexpr (X3) {
            const bool fresh = ks == 0;   // the step's first slice: its first mma starts from zero
            uint32_t bh[NI][2], bl[NI][2];
#pragma unroll
            for (int j = 0; j < NI; j++)
#pragma unroll
                for (int r = 0; r < 2; r++) gc_tf32_parts(bf[set][j][r], bh[j][r], bl[j][r]);
#pragma unroll
            for (int i = 0; i < MI; i++) {
                uint32_t ah[4], al[4];
#pragma unroll
                for (int r = 0; r < 4; r++) {
                    if constexpr (EXACT) ah[r] = af[set][i][r];
                    else gc_tf32_parts(af[set][i][r], ah[r], al[r]);
                }
#pragma unroll
                for (int j = 0; j < NI; j++) {   // the small terms first
                    if constexpr (!EXACT) gc_mma_tf32(part[i][j], al, bh[j], fresh);
                    gc_mma_tf32(part[i][j], ah, bl[j], fresh && EXACT);
                    gc_mma_tf32(part[i][j], ah, bh[j]);
                }
            }
        } else {
#pragma unroll
            for (int i = 0; i < MI; i++)
#pragma unroll
                for (int j = 0; j < NI; j++) gc_mma_tf32(acc[i][j], af[set][i], bf[set][j]);
        }
    }, [&] {
        if constexpr (X3) gc_mma_add(acc, part);
    });
    if constexpr (EXACT) {   // the bytes' sums, scaled as gc_pixel scales a byte
        const float k = p.rows.scale;
#pragma unroll
        for (int i = 0; i < MI; i++)
#pragma unroll
            for (int j = 0; j < NI; j++)
#pragma unroll
                for (int r = 0; r < 4; r++) acc[i][j][r] *= k;
    }
    gc_release_dependents(p.release);
    gc_gemm_finish<2, BM, BN, S, THREADS, !EM, !EN>(smem, p.ep, g.b, g.m0, g.n0, g.M, g.N, C, p.vc, for_runs, [] {
        gc_cp_wait<0>();   // (only empty groups are left, but no copy may land after the partial tile)
        __syncthreads();   // every warp is past its last reads of the buffers
    });
#endif
}

// The launch (gc_gemm_launch has checked the shape, made the grid and the cluster attribute). RA: by the
// source's element type (p.rows.u8), the kernel for float or for uint8 rows.
template <typename T, bool TA, bool TB, class Tile, class Ep, int RA>
static int gc_gemm_tc_launch_as(dim3 grid, cudaLaunchAttribute* cluster, const gc_gemm_params<T, Ep>& p) {
    return gc_gemm_launch_pipelined<gc_gemm_tc_kernel<T, TA, TB, Tile, Ep, RA>, Tile>(
        grid, cluster, gc_tc_smem<TA, TB, Tile, RA>::bytes, p);
}
template <typename T, bool TA, bool TB, class Tile, class Ep, bool RA>
static int gc_gemm_tc_launch(dim3 grid, cudaLaunchAttribute* cluster, const gc_gemm_params<T, Ep>& p) {
    if constexpr (RA) {
        return p.rows.u8 ? gc_gemm_tc_launch_as<T, TA, TB, Tile, Ep, 2>(grid, cluster, p)
                         : gc_gemm_tc_launch_as<T, TA, TB, Tile, Ep, 1>(grid, cluster, p);
    } else {
        return gc_gemm_tc_launch_as<T, TA, TB, Tile, Ep, 0>(grid, cluster, p);
    }
}
#endif   // GC_KERNELS
