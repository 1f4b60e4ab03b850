// gc_gemm_wgmma.cuh — the Hopper tensor-core GEMM: tiles with TF32 = 2 (gc_gemm_launch in gc_gemm_cuda.cuh
// dispatches here), tf32 products by wgmma.mma_async (sm_90a: the H100 and H200), a warpgroup of 4 warps a
// TM x TN tile of C in 64-row blocks of wgmma m64nNk8. The tile, the epilogue functors, the block's place and
// K slice (gc_gemm_block), split-K's cluster reduction (gc_gemm_finish) and the cp.async helpers are
// gc_gemm_cuda.cuh's. tf32 wgmma reads its B operand from shared memory K-major only (no transposed form as
// 16-bit types have), and its A operand from shared memory K-major or from registers in any order. So:
//   * an operand stored with k contiguous (A without TA, B with TB) is copied by cp.async, 16-byte chunks,
//     into the layout wgmma reads without a swizzle (core matrices of 8 rows x 4 k: gc_wg_layout);
//   * the operand stored with its rows along k that wgmma takes from registers — A with TA; B without TB when A
//     is K-major (x @ W: then the kernel computes C^T = op(B)^T op(A)^T, wgmma's M along C's n, so that B is
//     wgmma's A) — is copied by cp.async as it is stored (gc_wg_rows), and each K step's fragments are read
//     from there (4 loads of a k8 slice a 64-row block, no bank conflicts);
//   * with TA and without TB (x^T @ g) B is the third kind: its K steps go through registers, loaded as
//     16-byte vectors two steps ahead and stored transposed one step ahead (gc_wg_staged). (4-byte cp.async
//     copies that transpose measured 11-13 cycles a warp's copy; a layout copied so by every block is what
//     the role swap above avoids.)
// STAGES buffers; the cp.async copies run STAGES - 2 steps ahead; a K step is BK / 8 wgmma a 64-row block,
// asynchronous: the threads issue them and go on to the next steps' copies; a buffer is refilled once the
// wgmma that read it were waited for (wgmma.wait_group 1 at each step's end: the step before it) by every
// thread (the barrier at the next step's start). The tensor cores read an fp32 operand's top 19 bits: tf32
// truncated, not rounded to nearest as gc_gemm_tc_kernel's are (docs/compiler.md gives the tolerance; a NaN
// stays a NaN). The image input read in place (RA) comes from float rows only (cp.async does not convert
// uint8): the cuda trainer gives such GEMMs floats (GC_X_FLOAT, emit.rows_as_floats), and gc_gemm refuses
// uint8 rows for them. Built without sm_90a code (the compute_90 PTX of a build, or another GPU) the kernel
// traps; gc_gemm refuses a wgmma tile on a GPU that is not compute capability 9.0 before launching it.
#if GC_KERNELS   // the kernels part (gc_runtime.h)

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define GC_WGMMA 1
#else
#define GC_WGMMA 0
#endif

// wgmma's ordering: fence (before the first wgmma of a batch, after the accumulators were last touched by
// other instructions), commit (the wgmma issued since the last commit become a group), wait (until at most N
// groups are pending); and the proxy fence that makes this thread's shared-memory writes (cp.async's here)
// visible to the tensor cores, which read through the async proxy.
__device__ __forceinline__ void gc_wgmma_fence() {
#if GC_WGMMA
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void gc_wgmma_commit() {
#if GC_WGMMA
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void gc_wgmma_wait() {
#if GC_WGMMA
    asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(N) : "memory");
#endif
}
__device__ __forceinline__ void gc_fence_proxy_async() {
#if GC_WGMMA
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}
// The accumulators are the wgmma's operands while it runs: the compiler must neither move them nor read them
// between the issue and the wait (an empty asm that "changes" each, before the first wgmma and after the wait).
template <int N>
__device__ __forceinline__ void gc_wgmma_hold(float* d) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i]) :: "memory");
}
// A shared-memory matrix descriptor without swizzle: the start address, LBO (bytes from a core matrix to the
// next along K) and SBO (to the next 8 rows), each in 16-byte units.
__device__ __forceinline__ uint64_t gc_wgmma_desc(const void* smem, int lbo, int sbo) {
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(smem);
    return (uint64_t)((a & 0x3FFFF) >> 4) | (uint64_t)(lbo >> 4) << 16 | (uint64_t)(sbo >> 4) << 32;
}

// d (a warpgroup's 64 x N accumulators, N / 2 a thread) += A (64 x 8) B (8 x N), tf32 operands, fp32 sums; B
// read from shared memory through its descriptor, A through its descriptor (ss) or from registers (rs: a[0..3]
// of gc_wg_rows::fragment's order). Thread t of the warpgroup holds d[4 j + 2 h + r] = (16 (t / 32) + (t % 32) / 4
// + 8 h, 8 j + 2 (t % 4) + r) (gc_gemm_wg_kernel's for_runs).
template <int N> struct gc_wgmma;
// Their asm: the accumulators are operands %0 .. %(N/2 - 1) ("+f"), then A (a descriptor, or 4 registers) and
// B's descriptor. GC_WG_R<n>: the text of the first n operand numbers; GC_WG_D<n>: the first n accumulators.
// rs0: d = A B, the accumulators' input not read (scale-d 0: a K step's first product into its own sums, TF32 = 4).
#define GC_WG_R8(a, b, c, d, e, f, g, h) "%" #a ", %" #b ", %" #c ", %" #d ", %" #e ", %" #f ", %" #g ", %" #h
#define GC_WG_D8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
                    "+f"(d[i + 6]), "+f"(d[i + 7])
#define GC_WG_R32 GC_WG_R8(0, 1, 2, 3, 4, 5, 6, 7) ", " GC_WG_R8(8, 9, 10, 11, 12, 13, 14, 15) ", " GC_WG_R8(16, 17, 18, 19, 20, 21, 22, 23) ", " GC_WG_R8(24, 25, 26, 27, 28, 29, 30, 31)
#define GC_WG_R64 GC_WG_R32 ", " GC_WG_R8(32, 33, 34, 35, 36, 37, 38, 39) ", " GC_WG_R8(40, 41, 42, 43, 44, 45, 46, 47) ", " GC_WG_R8(48, 49, 50, 51, 52, 53, 54, 55) ", " GC_WG_R8(56, 57, 58, 59, 60, 61, 62, 63)
#define GC_WG_D32 GC_WG_D8(0), GC_WG_D8(8), GC_WG_D8(16), GC_WG_D8(24)
#define GC_WG_D64 GC_WG_D32, GC_WG_D8(32), GC_WG_D8(40), GC_WG_D8(48), GC_WG_D8(56)
#if GC_WGMMA
#define GC_WG_ASM(...) asm volatile(__VA_ARGS__)
#else
#define GC_WG_ASM(...) ((void)d, (void)a, (void)b)
#endif
// gc_wgmma<N>: REGS / DS its accumulators' text and operands, A0.. the operand numbers after them.
#define GC_WGMMA_N(N, REGS, DS, A0, A1, A2, A3, A4)                                                             \
    template <> struct gc_wgmma<N> {                                                                            \
        __device__ static __forceinline__ void ss(float* d, uint64_t a, uint64_t b) {                           \
            GC_WG_ASM("wgmma.mma_async.sync.aligned.m64n" #N "k8.f32.tf32.tf32 {" REGS "}, %" #A0 ", %" #A1        \
                      ", 1, 1, 1;" : DS : "l"(a), "l"(b));                                                       \
        }                                                                                                       \
        /* ss with scale-d a run-time flag (0: d = A B, its input not read: a tile's first product) */           \
        __device__ static __forceinline__ void ssp(float* d, uint64_t a, uint64_t b, int accumulate) {          \
            GC_WG_ASM("{ .reg .pred p; setp.ne.b32 p, %" #A2 ", 0; wgmma.mma_async.sync.aligned.m64n" #N          \
                      "k8.f32.tf32.tf32 {" REGS "}, %" #A0 ", %" #A1 ", p, 1, 1; }" : DS : "l"(a), "l"(b),          \
                      "r"(accumulate));                                                                         \
        }                                                                                                       \
        __device__ static __forceinline__ void rs(float* d, const uint32_t* a, uint64_t b) {                    \
            GC_WG_ASM("wgmma.mma_async.sync.aligned.m64n" #N "k8.f32.tf32.tf32 {" REGS "}, {%" #A0 ", %" #A1 ", %" \
                      #A2 ", %" #A3 "}, %" #A4 ", 1, 1, 1;" : DS : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]),     \
                      "l"(b));                                                                                  \
        }                                                                                                       \
        __device__ static __forceinline__ void rs0(float* d, const uint32_t* a, uint64_t b) {   /* d = a b */    \
            GC_WG_ASM("wgmma.mma_async.sync.aligned.m64n" #N "k8.f32.tf32.tf32 {" REGS "}, {%" #A0 ", %" #A1 ", %" \
                      #A2 ", %" #A3 "}, %" #A4 ", 0, 1, 1;" : DS : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]),     \
                      "l"(b));                                                                                  \
        }                                                                                                       \
    };
GC_WGMMA_N(64, GC_WG_R32, GC_WG_D32, 32, 33, 34, 35, 36)
GC_WGMMA_N(128, GC_WG_R64, GC_WG_D64, 64, 65, 66, 67, 68)

// One operand's K step in shared memory as wgmma reads it: X rows (M or N) of BK k, element (x, k) at byte
// (x / 8) SBO + (k / 4) LBO + (x % 8) 16 + (k % 4) 4: LBO = 128 (the core matrices of a row group follow each
// other along k), SBO = 32 BK + 16 (the row groups follow each other, 16 bytes apart: SBO = 16 mod 128 spreads
// the transposing 16-byte stores of gc_wg_staged over the 8 16-byte bank groups; gc_wg_async's 16-byte copies
// write whole core matrices, conflict-free either way).
template <int BK, int X>
struct gc_wg_layout {
    static constexpr int LBO = 128, SBO = BK * 32 + 16, CPR = BK / 4;   // CPR: core matrices (16-byte chunks) a row
    static constexpr int BYTES = X / 8 * SBO;
    static_assert(X % 32 == 0 && BK % 8 == 0, "gc_gemm: wgmma tile sides are multiples of 32 (X) and 8 (BK)");
    __device__ static __forceinline__ int offset(int x, int k) {
        return x / 8 * SBO + k / 4 * LBO + x % 8 * 16 + k % 4 * 4;
    }
};

// Each helper below is made once per block, before the K loop: it works out this thread's places then (sources,
// shared-memory offsets, which rows lie inside the matrix), and its sources move on by a step at each copy
// (the copies are called for steps 0, 1, 2, ... in order), so that a step's copies are an add and a copy each
// with compile-time offsets (the first version recomputed every place at every step: ~270 instructions a step
// and warp; rematerialized places, ~200). A matrix is plain (base, its stored rows ld apart) or, INDEXED, the
// image input read in place: stored row r is source row idx[r] (the block's indices, from its first row on).
// CX / CK: x / k may run past the matrix (those copies are dead: zeros are copied in, nothing is read, and the
// address they name is never dereferenced).

// A K-major operand (its stored rows are x, k contiguous) into its gc_wg_layout by cp.async, 16-byte chunks
// where vec allows: chunk j of the step is (x, k) = (8 (j / 8 / CPR) + j % 8, 4 (j / 8 % CPR)), so 8
// consecutive chunks are the rows of one core matrix (a quarter warp's 128 bytes), read from runs of 64 bytes
// of 8 rows; a thread's chunks are one k, rows XS apart. Else (odd or unaligned rows, rare) one element a copy.
template <int BK, int X, int THREADS, bool CX, bool CK, bool INDEXED>
struct gc_wg_async {
    typedef gc_wg_layout<BK, X> L;
    static constexpr int CPR = L::CPR, V = THREADS / 8, CHUNKS = X * CPR / THREADS, XS = V / CPR * 8;
    static_assert((CPR & (CPR - 1)) == 0 && X * CPR % THREADS == 0 && V % CPR == 0,
                  "gc_gemm: a wgmma step's copies do not share out");
    const float* src[INDEXED ? CHUNKS : 1];   // this thread's chunks at the next step (plain: the first's)
    const float* base;
    const uint32_t* idx;
    long long ld;
    int x_left, kt, to;   // to: the shared-memory offset of its first chunk
    unsigned live;        // bit i: chunk i's row is inside the matrix
    bool vec;

    // base: element (x0, k_begin) of a plain matrix, or (0, k_begin) of the indexed source; the block's x from 0.
    __device__ __forceinline__ gc_wg_async(const float* base_, const uint32_t* idx_, long long ld_, int x_left_,
                                           bool vec_)
        : base(base_), idx(idx_), ld(ld_), x_left(x_left_), vec(vec_) {
        const int u = threadIdx.x / 8, xt = u / CPR * 8 + threadIdx.x % 8;
        kt = u % CPR * 4;
        to = L::offset(xt, kt);
        live = 0;
#pragma unroll
        for (int i = 0; i < CHUNKS; i++) {
            if (INDEXED) src[i] = base + (long long)idx[xt + i * XS] * ld + kt;
            live |= (unsigned)(!CX || xt + i * XS < x_left) << i;
        }
        if (!INDEXED) src[0] = base + xt * ld + kt;
    }
    // The next K step (k0 from the block's first k: k_left = the K left from it) into s (bytes).
    __device__ __forceinline__ void copy(char* s, int k0, int k_left) {
        if (vec) {   // k_left's chunks are whole (K a multiple of 4): wholly inside or outside
            const bool in_k = !CK || kt < k_left;
#pragma unroll
            for (int i = 0; i < CHUNKS; i++)
                gc_cp_async<16>(s + to + i * (XS / 8) * L::SBO, INDEXED ? src[i] : src[0] + i * XS * ld,
                                in_k && (live >> i & 1));
#pragma unroll
            for (int i = 0; i < (INDEXED ? CHUNKS : 1); i++) src[i] += BK;
        } else {
#pragma unroll 1
            for (int e = threadIdx.x; e < X * BK; e += THREADS) {
                const int x = e / BK, k = e % BK;
                const bool ok = (!CX || x < x_left) && (!CK || k < k_left);
                const float* row = INDEXED ? base + (long long)idx[x] * ld : base + x * ld;
                gc_cp_async<4>(s + L::offset(x, k), row + k0 + k, ok);
            }
        }
    }
};

// N consecutive 4-byte entries of shared memory from p (16-byte aligned where N is a multiple of 4, 8-byte where
// of 2) into v, by the widest loads that fit.
template <int N>
__device__ __forceinline__ void gc_lds_run(const uint32_t* p, uint32_t* v) {
#pragma unroll
    for (int i = 0; i < N;) {
        if constexpr (N % 4 == 0) {
            const uint4 q = *reinterpret_cast<const uint4*>(p + i);
            v[i] = q.x, v[i + 1] = q.y, v[i + 2] = q.z, v[i + 3] = q.w;
            i += 4;
        } else if constexpr (N % 2 == 0) {
            const uint2 q = *reinterpret_cast<const uint2*>(p + i);
            v[i] = q.x, v[i + 1] = q.y;
            i += 2;
        } else {
            v[i] = p[i];
            i += 1;
        }
    }
}

// The operand wgmma takes from registers, stored with its rows along k (x contiguous): its K step copied by
// cp.async as it lies, BK rows of X elements padded to LD = X + 8 floats (so that a fragment read, 8 x by 4 k,
// hits 32 distinct banks) or X + 16 bytes (E = uint8_t, the image input's bytes, TF32 = 4 tiles: rows 2 tig
// apart 20 words, a row's 8 x 2 words: 8 distinct words on 8 banks, a word's bytes broadcast), in 16-byte chunks
// along x where vec allows (a warp's 32 chunks one or more whole rows: a thread's chunks are one x of CHUNKS
// consecutive rows, so that INDEXED, their row indices are one 16-byte load from shared memory — 4 loads a
// step before the nineteenth session, rows KS apart: with the transposed B's 16-byte stores, H100 b1000 trainer
// 25.85-26.11 -> 25.78-25.94 us tf32, 37.62-37.85 -> 37.49-37.50 fp32), else element by element. fragment()
// reads a 64-row block's k8 slice in wgmma's (and mma.m16n8k8's) order for warp w of the warpgroup: a[0..3] =
// (16 w + g, t), (16 w + g + 8, t), (16 w + g, t + 4), (16 w + g + 8, t + 4), lane = 4 g + t; bytes as their
// values (2^23 + u8 less 2^23, exact in tf32: unscaled).
template <int BK, int X, typename E = float>
struct gc_wg_rows_step {   // a K step of the register operand in shared memory (also gc_wg_roles's)
    static constexpr int LD = X + (sizeof(E) == 4 ? 8 : 16), BYTES = (BK * LD * (int)sizeof(E) + 15) / 16 * 16;
};

template <int BK, int X, int THREADS, bool CX, bool CK, bool INDEXED, typename E = float>
struct gc_wg_rows {
    typedef gc_wg_rows_step<BK, X, E> Step;
    static constexpr int W = 16 / (int)sizeof(E);   // elements a chunk
    static constexpr int LD = Step::LD, BYTES = Step::BYTES, XC = X / W, KS = THREADS / XC, CHUNKS = BK / KS;
    static_assert(X % 32 == 0 && X % W == 0 && THREADS % XC == 0 && KS <= BK && BK % KS == 0,
                  "gc_gemm: a wgmma step's copies do not share out");
    const E* src;   // plain: this thread's first chunk at the next step; INDEXED: the source at its x
    const uint32_t* idx;
    long long ld;
    int x_left, xt, kt, to, from;   // from: this thread's first fragment element (elements into the step)
    bool in_x, vec;

    // base: element (k_begin, x0) of a plain matrix (its stored rows are k), or (0, x0) of the indexed source
    // (idx from the block's first k on).
    __device__ __forceinline__ gc_wg_rows(const E* base, const uint32_t* idx_, long long ld_, int x_left_,
                                          bool vec_)
        : idx(idx_), ld(ld_), x_left(x_left_), vec(vec_) {
        xt = threadIdx.x % XC * W;
        kt = threadIdx.x / XC * CHUNKS;   // this thread's rows: kt .. kt + CHUNKS - 1
        to = (kt * LD + xt) * (int)sizeof(E);
        in_x = !CX || xt < x_left;   // vec: x_left is a multiple of W, a chunk is wholly inside or outside
        from = threadIdx.x % 4 * LD + threadIdx.x % 128 / 32 * 16 + threadIdx.x % 32 / 4;
        src = INDEXED ? base + xt : base + kt * ld + xt;
    }
    __device__ __forceinline__ void copy(char* s, int k0, int k_left) {
        if (vec) {
            uint32_t rows[INDEXED ? CHUNKS : 1];   // INDEXED: the rows' indices, consecutive entries
            if constexpr (INDEXED) gc_lds_run<CHUNKS>(idx + k0 + kt, rows);
#pragma unroll
            for (int i = 0; i < CHUNKS; i++) {
                const int k = kt + i;
                gc_cp_async<16>(s + to + i * LD * (int)sizeof(E),
                                INDEXED ? src + (long long)rows[i] * ld : src + i * ld,
                                in_x && (!CK || k < k_left));
            }
            if (!INDEXED) src += BK * ld;
        } else {
            E* d = reinterpret_cast<E*>(s);
            const E* origin = INDEXED ? src - xt : src - kt * ld - xt + (long long)k0 * ld;   // (k0, 0)
#pragma unroll 1
            for (int e = threadIdx.x; e < X * BK; e += THREADS) {
                const int k = e / X, x = e % X;
                const bool ok = (!CX || x < x_left) && (!CK || k < k_left);
                const E* row = INDEXED ? origin + (long long)idx[k0 + k] * ld : origin + k * ld;
                if constexpr (sizeof(E) == 4) gc_cp_async<4>(d + k * LD + x, row + x, ok);
                else d[k * LD + x] = ok ? row[x] : E(0);   // (no 1-byte cp.async: a load and a store)
            }
        }
    }
    // The fragment of rows x .. x + 63 (x: the block's first row, a compile-time offset from the warpgroup's),
    // k slice [k, k + 8).
    __device__ __forceinline__ void fragment(const char* s, int x, int k, uint32_t* a) const {
        const E* f = reinterpret_cast<const E*>(s) + from + k * LD + x;
        a[0] = bits(f[0]);
        a[1] = bits(f[8]);
        a[2] = bits(f[4 * LD]);
        a[3] = bits(f[4 * LD + 8]);
    }
    __device__ static __forceinline__ uint32_t bits(float v) { return __float_as_uint(v); }
    __device__ static __forceinline__ uint32_t bits(uint8_t v) { return __float_as_uint(gc_byte_value(v)); }
};

// A K step of an MN-major operand that wgmma reads from shared memory (B without TB, when A has TA), through
// registers: load() reads it (16-byte vectors along x where vec allows), store() writes it transposed into
// its gc_wg_layout. A thread's unit is 4 rows k (4 k0 .. 4 k0 + 3) of 4 x (4 x0 .. 4 x0 + 3): four 16-byte loads,
// one a row, and — transposed in its registers — four 16-byte stores, one an x: its 4 k are 16 consecutive
// bytes of a core matrix. A warp's loads are runs of 16 units along x (256 bytes a row); its stores, 8 core
// matrix rows of each of 4 (gc_wg_layout's SBO = 16 mod 128), 4 wavefronts of 128 bytes, the fewest. (Until the
// nineteenth session a thread held 4 x of one k and stored them one element at a time: 16 stores a step for the
// MLP's dW1, against 4.) Unit u = thread + i THREADS: (x0, k0) = (u % UX, u / UX), so unit i is unit 0 moved by
// dk(i) rows — compile-time offsets; threads past the units (a step of fewer than THREADS units) hold zeros and
// store nothing.
template <int BK, int X, int THREADS, bool CX, bool CK>
struct gc_wg_staged {
    typedef gc_wg_layout<BK, X> L;
    static constexpr int UX = X / 4, UNITS = UX * (BK / 4), PER = UNITS >= THREADS ? UNITS / THREADS : 1;
    static constexpr bool IDLE = UNITS < THREADS;   // some threads have no unit
    static_assert(THREADS % UX == 0 && (IDLE || UNITS % THREADS == 0),
                  "gc_gemm: a wgmma step's loads do not share out");

    __device__ __forceinline__ static int dk(int i) { return i * (THREADS / UX) * 4; }   // unit i's rows from unit 0's

    struct places {
        const float* src;   // unit 0's first row's vector at k 0
        long long ld;
        int x, k, to, x_left;   // unit 0's place and shared-memory offset
        bool vec, on;           // on: this thread has units
    };
    __device__ __forceinline__ static places place(const float* base, long long ld, int x0, int x_left, bool vec) {
        const int x = threadIdx.x % UX * 4, k = threadIdx.x / UX * 4;
        return {base + k * ld + x0 + x, ld, x, k, L::offset(x, k), x_left, vec, !IDLE || (int)threadIdx.x < UNITS};
    }

    float v[PER][4][4];   // [unit][row k][x]
    __device__ __forceinline__ void load(const places& p, int k0, int k_left) {
        const float* f = p.src + (long long)k0 * p.ld;
#pragma unroll
        for (int i = 0; i < PER; i++)
#pragma unroll
            for (int r = 0; r < 4; r++) {
                const float* q = f + (dk(i) + r) * p.ld;
                const bool live = p.on && (!CK || p.k + dk(i) + r < k_left);
                if (p.vec) {   // x_left is a multiple of 4: a vector is wholly inside or outside
                    if (live && (!CX || p.x < p.x_left)) gc_ld16(q, v[i][r]);
                    else v[i][r][0] = v[i][r][1] = v[i][r][2] = v[i][r][3] = 0.f;
                } else {
#pragma unroll
                    for (int j = 0; j < 4; j++) v[i][r][j] = live && (!CX || p.x + j < p.x_left) ? q[j] : 0.f;
                }
            }
    }
    // PARTS (TF32 = 4): each value's high tf32 part at s, its low part at the same place of `low` (gc_tf32_parts).
    template <bool PARTS = false>
    __device__ __forceinline__ void store(char* s, const places& p, char* low = nullptr) const {
        if (IDLE && !p.on) return;
#pragma unroll
        for (int i = 0; i < PER; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) {   // (x + j, k .. k + 3): x % 8 + j < 8, so j moves 16 bytes within
                                            // a core matrix
                const int at = p.to + dk(i) / 4 * L::LBO + j * 16;
                if constexpr (PARTS) {
                    uint32_t h[4], l[4];
#pragma unroll
                    for (int r = 0; r < 4; r++) gc_tf32_parts(__float_as_uint(v[i][r][j]), h[r], l[r]);
                    *reinterpret_cast<uint4*>(s + at) = make_uint4(h[0], h[1], h[2], h[3]);
                    *reinterpret_cast<uint4*>(low + at) = make_uint4(l[0], l[1], l[2], l[3]);
                } else {
                    *reinterpret_cast<float4*>(s + at) = make_float4(v[i][0][j], v[i][1][j], v[i][2][j], v[i][3][j]);
                }
            }
    }
};

// The roles of a wgmma tile's operands (see the top of this file) and its shared memory: STAGES steps, each the
// descriptor operands' layouts (Q: A then B; with a register operand R, Q alone) and R's rows; split: then the
// partial BM x BN tile in the same bytes; RA: after them, the block's row indices (gc_gemm_block::IDX). RA: the
// image input read in place, 1 float rows, 2 uint8 rows (R, TF32 = 4 only: E). TF32 = 4: after R's rows, Q's
// low tf32 parts (LOW, laid out as Q: B's, the tile having TA and not TB).
template <bool TA, bool TB, class Tile, int RA>
struct gc_wg_roles {
    static constexpr int BM = Tile::BM, BN = Tile::BN, BK = Tile::BK;
    static constexpr bool SWAP = !TA && !TB;   // C^T = op(B)^T op(A)^T: wgmma's M along C's n
    static constexpr bool REG = TA || SWAP;    // wgmma's A from registers (R: A with TA, else B)
    static constexpr bool STAGED = TA && !TB;  // B MN-major, read by wgmma from shared memory: transposed
    static constexpr int XR = SWAP ? BN : BM, XQ = SWAP ? BM : BN;
    typedef gc_wg_layout<BK, REG ? XQ : BM> L0;   // the first descriptor operand: Q, or A
    typedef gc_wg_layout<BK, BN> L1;              // without R: B
    typedef typename std::conditional<RA == 2, uint8_t, float>::type E;   // R's elements
    static constexpr int PART1 = REG ? gc_wg_rows_step<BK, XR, E>::BYTES : L1::BYTES;   // R's rows, or B
    static constexpr int LOW = Tile::TF32 == 4 ? L0::BYTES : 0;
    static constexpr int STAGE = L0::BYTES + PART1 + LOW;   // (a multiple of 16 bytes: the descriptors' unit)
    static constexpr size_t pipe = (size_t)Tile::STAGES * STAGE;
    static constexpr size_t red = Tile::SPLIT > 1 ? (size_t)BM * BN * 4 : 0;
    static constexpr size_t data = pipe > red ? pipe : red;
    static constexpr int NIDX = RA ? gc_gemm_block<float, TA, TB, Tile>::IDX : 0;
    static constexpr size_t bytes = data + (size_t)NIDX * 4;
};

// The start of both wgmma kernels (gc_gemm_wg_kernel, gc_gemm_ws_kernel): the checks of their tile (a split of
// 1..8 that divides BM, the shared memory one block may have, BYTES, a static shape where A is the image input
// read in place, RA), the wait for the kernel before; built without sm_90a code (the compute_90 PTX of a build,
// or another GPU) a trap, and the kernel's body is left out (gc_gemm refuses such launches before they start).
template <class Tile, size_t BYTES, int RA>
__device__ __forceinline__ void gc_wg_begin() {
    static_assert(Tile::SPLIT >= 1 && Tile::SPLIT <= 8 && Tile::BM % Tile::SPLIT == 0,
                  "gc_gemm: split must be 1..8 and divide BM");
    static_assert(BYTES <= 227 * 1024, "gc_gemm: wgmma tile needs over 227 KB of shared memory");
    static_assert(!RA || (Tile::SK > 0 && Tile::SM > 0), "gc_gemm: batch rows need a static shape");
    gc_wait_prior();
#if !GC_WGMMA
    __trap();
#endif
}

// RA: A is the image input read in place (gc_rows with an index; its stored rows are the batch's: M, or K with
// TA), 1: from float rows, 2: from uint8 rows (TF32 = 4 with TA: its bytes exact in tf32, taken unscaled, the
// sums scaled at the end).
// TF32 = 4 (fp32 on wgmma, A transposed and B not: the weight gradients x^T g): B's K steps pass through
// registers (STAGED) and are stored as two tf32 parts (gc_tf32_parts), the high in Q's layout and the low in
// LOW's; A's fragments (R, from registers) are split as they are read unless they are bytes (exact); each k8
// slice is three wgmma, a_low b_high + a_high b_low + a_high b_high (two for bytes), summed from zero for the
// K step (rs0) into sums of their own that are added into the fp32 sums once the step's wgmma are waited for,
// as gc_gemm_tc_kernel's TF32 = 3 tiles do (gc_gemm_tc.cuh: the error stays at fp32's).
template <typename T, bool TA, bool TB, class Tile, class Ep, int RA>
__global__ void __launch_bounds__(Tile::THREADS, 1)
gc_gemm_wg_kernel(const gc_gemm_params<T, Ep> p) {
#if GC_BODIES
    typedef gc_wg_roles<TA, TB, Tile, RA> R;
    // a warpgroup's wgmma: MB blocks of 64 rows along C's m (n when swapped), N along the other side
    constexpr int WM = R::SWAP ? Tile::TN : Tile::TM, NW = R::SWAP ? Tile::TM : Tile::TN;
    static_assert((Tile::TF32 == 2 || Tile::TF32 == 4) && sizeof(T) == 4 && Tile::STAGES >= 3,
                  "gc_gemm: wgmma tiles are float, 3+ stages");
    static_assert(Tile::TF32 != 4 || (TA && !TB), "gc_gemm: fp32 wgmma tiles (TF32 = 4) are for A transposed, B not");
    static_assert(RA != 2 || (TA && Tile::TF32 == 4), "gc_gemm: a wgmma tile reads uint8 rows only as TF32 = 4's A");
    static_assert(WM % 64 == 0 && (NW == 64 || NW == 128) && Tile::BM % Tile::TM == 0 && Tile::BN % Tile::TN == 0,
                  "gc_gemm: a wgmma warpgroup's tile is 64-row blocks by 64 or 128 (gc_wgmma's sizes)");
    gc_wg_begin<Tile, R::bytes, RA>();
#if GC_WGMMA
    constexpr int BM = Tile::BM, BN = Tile::BN, BK = Tile::BK, TM = Tile::TM, TN = Tile::TN;
    constexpr int ST = Tile::STAGES, S = Tile::SPLIT, THREADS = Tile::THREADS;
    constexpr bool SWAP = R::SWAP, REG = R::REG, STAGED = R::STAGED;
    constexpr bool X3 = Tile::TF32 == 4, EXACT = X3 && RA == 2;
    constexpr int MB = WM / 64, NACC = NW / 2;
    typedef typename R::E E;
    constexpr int LOW = R::L0::BYTES + R::PART1;   // X3: where a stage's low parts of Q (B) start
    extern __shared__ __align__(16) unsigned char gc_dynamic_smem[];
    char* smem = reinterpret_cast<char*>(gc_dynamic_smem);
    typedef gc_gemm_block<T, TA, TB, Tile> Block;
    constexpr bool EM = Block::EM, EN = Block::EN, EK = Block::EK;
    const Block g(p);
    const T* __restrict__ A = p.A + g.b * p.sa;
    const T* __restrict__ B = p.B + g.b * p.sb;
    T* __restrict__ C = p.C + g.b * p.sc;
    uint32_t* ridx = reinterpret_cast<uint32_t*>(gc_dynamic_smem + R::data);
    // EARLY: B's first two steps into their registers before the row indices (below); not X3's tiles: they have
    // not the registers (the fp32 b1000 dW1 reading float rows: 168 -> 176 a thread, 2 blocks an SM, not 3)
    constexpr bool EARLY = STAGED && !X3;
    if constexpr (RA && !EARLY) g.stage_rows(ridx, p.rows);

    // A's stored rows are K with TA (m contiguous), else M (k contiguous); B's are N with TB (k contiguous), else
    // K. RA: stored row r of A is source row idx[r - first], first the block's first row (m0, or k_begin with TA).
    const int lda = TA ? g.M : g.K, ldb = TB ? g.K : g.N;
    const bool va = RA ? lda % (16 / (int)sizeof(E)) == 0 && (uintptr_t)p.rows.source % 16 == 0 : g.va;
    // The copy helpers of the operands this role set has (an unused one is a placeholder int).
    const uint32_t* ia = RA ? ridx : nullptr;
    const E* a0 = RA ? (const E*)p.rows.source + (TA ? g.m0 : g.k_begin)
                     : (const E*)(TA ? A + (long long)g.k_begin * g.M + g.m0 : A + (long long)g.m0 * g.K + g.k_begin);
    const T* b0 = TB ? B + (long long)g.n0 * g.K + g.k_begin : B + (long long)g.k_begin * g.N + g.n0;
    auto async_a = [&] {   // A K-major, wgmma's B (swapped) or A (both from shared memory)
        if constexpr (!TA) return gc_wg_async<BK, BM, THREADS, !EM, !EK, RA != 0>(a0, ia, lda, g.M - g.m0, va);
        else return 0;
    }();
    auto async_b = [&] {   // B K-major, wgmma's B
        if constexpr (TB) return gc_wg_async<BK, BN, THREADS, !EN, !EK, false>(b0, nullptr, ldb, g.N - g.n0, g.vb);
        else return 0;
    }();
    auto rows = [&] {      // R: A with TA, B swapped
        if constexpr (TA) return gc_wg_rows<BK, BM, THREADS, !EM, !EK, RA != 0, E>(a0, ia, lda, g.M - g.m0, va);
        else if constexpr (SWAP) return gc_wg_rows<BK, BN, THREADS, !EN, !EK, false>(b0, nullptr, ldb, g.N - g.n0, g.vb);
        else return 0;
    }();
    // STAGED: two register sets of B, a step's loads issued two steps before they are stored
    typedef gc_wg_staged<BK, BN, THREADS, !EN, !EK> Staged;
    Staged sb[2];
    const typename Staged::places pb = Staged::place(B, ldb, g.n0, g.N - g.n0, g.vb);
    auto copy = [&](int buf, int kt) {   // the cp.async part of K step kt (the next one), into buffer buf
        const int k0 = kt * BK, k_left = g.k_end - g.k_begin - k0;
        char* s = smem + buf * R::STAGE;
        if constexpr (!TA) async_a.copy(s, k0, k_left);
        if constexpr (REG) rows.copy(s + R::L0::BYTES, k0, k_left);
        if constexpr (TB) async_b.copy(s + (REG ? 0 : R::L0::BYTES), k0, k_left);
    };
    auto fetch = [&](int set, int kt) {   // STAGED: B's K step kt into register set `set`
        if constexpr (STAGED) {
            const int k0 = g.k_begin + kt * BK;
            sb[set].load(pb, k0, g.k_end - k0);
        }
    };
    auto put = [&](int set, int buf) {    // ... and from there into buffer buf
        if constexpr (X3) sb[set].template store<true>(smem + buf * R::STAGE, pb, smem + buf * R::STAGE + LOW);
        else if constexpr (STAGED) sb[set].store(smem + buf * R::STAGE, pb);
    };

    // Warpgroup (wm, wn) owns the TM x TN tile at (wm TM, wn TN); its descriptors start at its rows of buffer 0,
    // k 0 (the buffer and the k slice move the start address only): without R, A's block i at rows wm TM + 64 i
    // and B at wn TN; with R, Q at wn TN (B) or wm TM (A, swapped), R's fragments from its rows wm TM (A) or
    // wn TN (B, swapped) + 64 i.
    const int wg = threadIdx.x / 128, wm = wg / (BN / TN), wn = wg % (BN / TN);
    const int warp = threadIdx.x % 128 / 32, gid = threadIdx.x % 32 / 4, tig = threadIdx.x % 4;
    typedef typename R::L0 L0;
    typedef typename R::L1 L1;
    uint64_t da[MB], db;
    if constexpr (REG) {
        db = gc_wgmma_desc(smem + (SWAP ? wm * TM : wn * TN) / 8 * L0::SBO, L0::LBO, L0::SBO);
    } else {
#pragma unroll
        for (int i = 0; i < MB; i++) da[i] = gc_wgmma_desc(smem + (wm * TM + 64 * i) / 8 * L0::SBO, L0::LBO, L0::SBO);
        db = gc_wgmma_desc(smem + L0::BYTES + wn * TN / 8 * L1::SBO, L1::LBO, L1::SBO);
    }
    const int xr = SWAP ? wn * TN : wm * TM;   // R's first row for this warpgroup
    const uint64_t dl = db + (LOW >> 4);       // X3: Q's low parts
    float acc[MB][NACC];
    float part[X3 ? MB : 1][X3 ? NACC : 1];    // X3: a K step's sums (the wgmma's accumulators)
#pragma unroll
    for (int i = 0; i < MB; i++)
#pragma unroll
        for (int j = 0; j < NACC; j++) acc[i][j] = 0.f;
#pragma unroll
    for (int i = 0; i < (X3 ? MB : 1); i++)
#pragma unroll
        for (int j = 0; j < (X3 ? NACC : 1); j++) part[i][j] = 0.f;
    // The accumulators as runs at tile coordinates (row, col): 2 consecutive columns; swapped (C^T's rows are
    // C's columns), single elements.
    constexpr int RUN = SWAP ? 1 : 2;
    auto for_runs = [&](auto&& f) {
#pragma unroll
        for (int i = 0; i < MB; i++)
#pragma unroll
            for (int j = 0; j < NW / 8; j++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int along = 64 * i + warp * 16 + gid + 8 * h, across = j * 8 + 2 * tig;
                    if constexpr (SWAP) {
                        f(wm * TM + across, wn * TN + along, &acc[i][4 * j + 2 * h]);
                        f(wm * TM + across + 1, wn * TN + along, &acc[i][4 * j + 2 * h + 1]);
                    } else {
                        f(wm * TM + along, wn * TN + across, &acc[i][4 * j + 2 * h]);
                    }
                }
    };

    // EARLY: B's steps 0 and 1 start into the register sets first — before the row indices' load with RA (the
    // weight gradient x^T g: the two loads' latencies overlap; H100, MLP b1000 tf32 trainer 27.00 -> 26.73 us).
    // The cp.async parts of steps 0..ST-3 start on their way (a group each, empty past the end, so that the
    // count of groups in flight is the same at every step); STAGED: step 0 goes to buffer 0 (X3: loaded first),
    // steps 1 and 2 into the register sets; then the epilogue's operands go to L1 (not for split tiles, whose
    // blocks load their part's into registers: gc_split_packs). Step kt: once it is in its
    // buffer for every thread (the copies' wait, the proxy fence after this thread's stores and copies, the
    // barrier), the copies of step kt + ST - 2 go into the buffer step kt - 2 used (whose wgmma every thread
    // waited for before this barrier); R's fragments of step kt are read and step kt's wgmma issued; while they
    // run, STAGED: step kt + 1 goes to its buffer from register set (kt + 1) % 2, which then loads step kt + 3.
    // The step ends waiting for its own wgmma with R (ptxas serializes every wgmma, C7513, where registers of
    // fragments are written while an earlier wgmma is in flight), else for the step before's.
    const int kt_all = g.ktiles;
    if (EARLY && kt_all > 0) fetch(0, 0);
    if (EARLY && kt_all > 1) fetch(1, 1);
    if constexpr (RA && EARLY) g.stage_rows(ridx, p.rows);   // (A's rows: their indices' load beside B's)
#pragma unroll
    for (int s = 0; s < ST - 2; s++) {
        if (s < kt_all) copy(s, s);
        gc_cp_commit();
    }
    if (STAGED && kt_all > 0) {
        if (!EARLY) fetch(0, 0);
        put(0, 0);
    }
    if (!EARLY && STAGED && kt_all > 1) fetch(1, 1);
    if (STAGED && kt_all > 2) fetch(0, 2);
    if constexpr (S == 1) gc_gemm_prefetch<RUN, !EM, !EN, T>(p.ep, g.b, g.m0, g.n0, g.M, g.N, for_runs);
    // (a split's: into registers, not waited for; not X3's: their registers, 168 -> 182 a thread for the fp32
    // b1000 dW1, cost a block an SM)
    gc_split_packs_for<Ep, BM, BN, S, THREADS, EN && !X3> split_packs;
    split_packs.template load<!EM>(p.ep, g.b, g.m0, g.n0, g.M);
    gc_wgmma_hold<MB * NACC>(&acc[0][0]);
    if constexpr (X3) gc_wgmma_hold<MB * NACC>(&part[0][0]);
    uint32_t frag[BK / 8][REG ? MB : 1][4];
    int cur = 0;
    auto step = [&](int kt, int set) {   // set: kt % 2, static in the loop below
        gc_cp_wait<ST - 3>();
        gc_fence_proxy_async();
        __syncthreads();
        const int ahead = kt + ST - 2, next = cur + 1 == ST ? 0 : cur + 1;
        if (ahead < kt_all) copy(ahead % ST, ahead);
        gc_cp_commit();
        const char* buf = smem + cur * R::STAGE;
        if constexpr (REG) {
#pragma unroll
            for (int k = 0; k < BK / 8; k++)
#pragma unroll
                for (int i = 0; i < MB; i++) rows.fragment(buf + L0::BYTES, xr + 64 * i, 8 * k, frag[k][i]);
        }
        // X3 with float A: its fragments' low parts (the high ones are the fragments: the tensor cores read an
        // operand's top 19 bits), all written before the first wgmma (ptxas waits for the wgmma in flight where
        // registers of fragments are written between them, C7513)
        uint32_t low[X3 && !EXACT ? BK / 8 : 1][X3 && !EXACT ? MB : 1][4];
        if constexpr (X3 && !EXACT) {
#pragma unroll
            for (int k = 0; k < BK / 8; k++)
#pragma unroll
                for (int i = 0; i < MB; i++)
#pragma unroll
                    for (int r = 0; r < 4; r++) {
                        uint32_t high;
                        gc_tf32_parts(frag[k][i][r], high, low[k][i][r]);
                    }
        }
        gc_wgmma_fence();
        const uint64_t at = (uint64_t)(cur * R::STAGE >> 4);
#pragma unroll
        for (int k = 0; k < BK / 8; k++)
#pragma unroll
            for (int i = 0; i < MB; i++) {
                if constexpr (X3) {   // the small terms first, the first of the step from zero
                    const uint64_t bh = db + at + k * 16, bl = dl + at + k * 16;
                    if constexpr (EXACT) {
                        if (k == 0) gc_wgmma<NW>::rs0(part[i], frag[k][i], bl);
                        else gc_wgmma<NW>::rs(part[i], frag[k][i], bl);
                    } else {
                        if (k == 0) gc_wgmma<NW>::rs0(part[i], low[k][i], bh);
                        else gc_wgmma<NW>::rs(part[i], low[k][i], bh);
                        gc_wgmma<NW>::rs(part[i], frag[k][i], bl);
                    }
                    gc_wgmma<NW>::rs(part[i], frag[k][i], bh);
                } else if constexpr (REG) {
                    gc_wgmma<NW>::rs(acc[i], frag[k][i], db + at + k * 16);
                } else {
                    gc_wgmma<NW>::ss(acc[i], da[i] + at + k * 16, db + at + k * 16);
                }
            }
        gc_wgmma_commit();
        if (STAGED && kt + 1 < kt_all) put(1 - set, next);
        if (STAGED && kt + 3 < kt_all) fetch(1 - set, kt + 3);
        gc_wgmma_wait<REG ? 0 : 1>();
        if constexpr (X3) {   // (REG: the step's own wgmma are done) its sums into the fp32 ones
            gc_wgmma_hold<MB * NACC>(&part[0][0]);
#pragma unroll
            for (int i = 0; i < MB; i++)
#pragma unroll
                for (int j = 0; j < NACC; j++) acc[i][j] += part[i][j];
        }
        cur = next;
    };
    for (int kt = 0; kt < kt_all; kt += 2) {   // by twos: which register sets a step uses is static
        step(kt, 0);
        if (kt + 1 < kt_all) step(kt + 1, 1);
    }
    gc_wgmma_wait<0>();
    gc_wgmma_hold<MB * NACC>(&acc[0][0]);
    if constexpr (EXACT) {   // the bytes' sums, scaled as gc_pixel scales a byte
        const float scale = p.rows.scale;
#pragma unroll
        for (int i = 0; i < MB; i++)
#pragma unroll
            for (int j = 0; j < NACC; j++) acc[i][j] *= scale;
    }
    gc_release_dependents(p.release);
    gc_gemm_finish<RUN, BM, BN, S, THREADS, !EM, !EN>(reinterpret_cast<T*>(smem), p.ep, g.b, g.m0, g.n0, g.M, g.N,
                                                      C, p.vc, for_runs, [] {
        gc_cp_wait<0>();   // (only empty groups are left, but no copy may land after the partial tile)
        __syncthreads();   // every warpgroup's wgmma are done with the buffers
    }, gc_gemm_packs<Ep, 1, false>(), (const T*)nullptr, split_packs);
#endif
#endif
}

// Whether this GPU runs wgmma (compute capability 9.0 only: sm_90a's), for both wgmma kernels' launches: GC_OK,
// else a message that says how to build instead (`instead`).
static int gc_wgmma_device(const char* instead) {
    const int cc = gc_compute_capability();
    if (cc == 0)
        return gc_fail(GC_ERR_DEVICE, "gc_gemm: this GEMM's tile uses wgmma tensor cores (sm_90a: H100, H200), and "
                       "the CUDA runtime cannot tell this GPU's compute capability");
    if (cc != 90)
        return gc_fail(GC_ERR_DEVICE, "gc_gemm: this GEMM's tile uses wgmma tensor cores (sm_90a: H100, H200), and "
                       "this GPU is of compute capability %d.%d; build %s for it", cc / 10, cc % 10, instead);
    return GC_OK;
}

// The launch (gc_gemm_launch has checked the shape and the rows, made the grid and the cluster attribute): a
// GPU of compute capability 9.0 only (wgmma is sm_90a's).
template <typename T, bool TA, bool TB, class Tile, class Ep, int RA>
static int gc_gemm_wg_launch_as(dim3 grid, cudaLaunchAttribute* cluster, const gc_gemm_params<T, Ep>& p) {
    return gc_gemm_launch_pipelined<gc_gemm_wg_kernel<T, TA, TB, Tile, Ep, RA>, Tile>(
        grid, cluster, gc_wg_roles<TA, TB, Tile, RA>::bytes, p);
}
template <typename T, bool TA, bool TB, class Tile, class Ep, bool RA>
static int gc_gemm_wg_launch(dim3 grid, cudaLaunchAttribute* cluster, const gc_gemm_params<T, Ep>& p) {
    GC_TRY(gc_wgmma_device(Tile::TF32 == 4 ? "without the tuning record that chose the tile" : "with precision fp32"));
    if constexpr (RA && TA && Tile::TF32 == 4) {   // uint8 rows: A's bytes (gc_gemm_launch refused them elsewhere)
        if (p.rows.u8) return gc_gemm_wg_launch_as<T, TA, TB, Tile, Ep, 2>(grid, cluster, p);
    }
    return gc_gemm_wg_launch_as<T, TA, TB, Tile, Ep, RA ? 1 : 0>(grid, cluster, p);
}
#endif   // GC_KERNELS
