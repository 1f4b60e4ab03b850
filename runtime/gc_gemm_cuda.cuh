// gc_gemm_cuda.cuh — the cuda target's GEMM (signature and tile type in gc_gemm.h). The register-staged kernel
// template, specialized at compile time by its tile (sizes, precision, split, static shape) and its epilogue:
//   * each block computes a BM x BN tile of C; K advances in steps of BK through two shared-memory buffers:
//     the next steps' global loads (16-byte vectors where the layout allows) are in flight in registers
//     while the current step computes (two steps ahead for small register blocks), one barrier per step;
//   * both operands sit in shared memory k-major (As[k][m], Bs[k][n]), whatever the transposes: the inner
//     loop reads 16-byte vectors of A and B (fp32: a TM x TN register block per thread) or tf32 fragments
//     (mma.sync m16n8k8, a TM x TN tile per warp); rows are padded by 8 words so the fragment loads are
//     free of bank conflicts;
//   * the epilogue functor is applied to each sum before it is stored (bias, ReLU, masks fuse here), to all of
//     a thread's sums before the first store, so that the functor's loads are in flight together;
//   * split-K: the SPLIT blocks of a cluster each sum a slice of K, then each reduces a slice of the tile's
//     rows over the cluster's shared memories in rank order 0..SPLIT-1. No atomics anywhere: results are
//     bit-for-bit reproducible.
// A second template, gc_gemm_pipe_kernel (tiles with STAGES > 0: the large problems' tile and two of the
// catalogue's): the same fp32 register blocks, epilogue and split, fed by a cp.async pipeline STAGES steps
// deep instead of registers (see there). A third, for tf32 tiles with STAGES > 0, is in gc_gemm_tc.cuh, and a
// fourth, wgmma tiles (TF32 = 2, sm_90a), in gc_gemm_wgmma.cuh.
#if GC_KERNELS   // the kernels part (gc_runtime.h)

template <typename T, class Ep>
struct gc_gemm_params {
    const T* A;
    const T* B;
    T* C;
    int M, N, K;
    long long sa, sb, sc;
    Ep ep;
    gc_rows rows;          // RA: the image input read in place (A is its source)
    bool va, vb, vc;   // 16-byte accesses allowed: loads of A, of B (along their contiguous dimension), stores of C
    bool release;      // the next kernel may start once the main loop is done (gc_release_dependents; the
                       // pipelined, tensor-core, wgmma and short-K kernels: not the register-staged one)
};

// Whether an operand's 16-byte accesses of `width` elements are allowed: its contiguous dimension, the
// pointer and (batch > 1) the batch stride allow them (gc_gemm_params' va, vb, vc).
GC_HD inline bool gc_gemm_vectors(const void* ptr, int contiguous, long long stride, int width, int batch) {
    return contiguous % width == 0 && (uintptr_t)ptr % 16 == 0 && (batch == 1 || stride % width == 0);
}

// 16-byte loads and stores of 4 (float) or 2 (double) elements, and runs of 4 / 2 elements.
__device__ __forceinline__ void gc_ld16(const float* p, float* o) {
    float4 v = *reinterpret_cast<const float4*>(p);
    o[0] = v.x; o[1] = v.y; o[2] = v.z; o[3] = v.w;
}
__device__ __forceinline__ void gc_ld16(const double* p, double* o) {
    double2 v = *reinterpret_cast<const double2*>(p);
    o[0] = v.x; o[1] = v.y;
}
__device__ __forceinline__ void gc_st16(float* p, const float* o) {
    *reinterpret_cast<float4*>(p) = make_float4(o[0], o[1], o[2], o[3]);
}
__device__ __forceinline__ void gc_st16(double* p, const double* o) {
    *reinterpret_cast<double2*>(p) = make_double2(o[0], o[1]);
}
// 16-byte stores of C (global memory): the plain float4 assignment of gc_st16 comes out of nvcc as four
// scalar stores there, the st.global intrinsic does not.
__device__ __forceinline__ void gc_stg16(float* p, const float* o) {
    __stwb(reinterpret_cast<float4*>(p), make_float4(o[0], o[1], o[2], o[3]));
}
__device__ __forceinline__ void gc_stg16(double* p, const double* o) {
    __stwb(reinterpret_cast<double2*>(p), make_double2(o[0], o[1]));
}
// RUN consecutive elements (RUN * sizeof(T) bytes, aligned to that).
template <int RUN, typename T>
__device__ __forceinline__ void gc_ld_run(const T* p, T* o) {
    constexpr int W = 16 / sizeof(T);
    if constexpr (RUN % W == 0) {
#pragma unroll
        for (int h = 0; h < RUN / W; h++) gc_ld16(p + h * W, o + h * W);
    } else if constexpr (RUN == 2 && sizeof(T) == 4) {
        float2 v = *reinterpret_cast<const float2*>(p);
        o[0] = v.x; o[1] = v.y;
    } else {
#pragma unroll
        for (int r = 0; r < RUN; r++) o[r] = p[r];
    }
}
template <int RUN, typename T>
__device__ __forceinline__ void gc_st_run(T* p, const T* o) {
    constexpr int W = 16 / sizeof(T);
    if constexpr (RUN % W == 0) {
#pragma unroll
        for (int h = 0; h < RUN / W; h++) gc_st16(p + h * W, o + h * W);
    } else if constexpr (RUN == 2 && sizeof(T) == 4) {
        *reinterpret_cast<float2*>(p) = make_float2(o[0], o[1]);
    } else {
#pragma unroll
        for (int r = 0; r < RUN; r++) p[r] = o[r];
    }
}

// tf32 rounding (to nearest, ties away) and the tensor-core product d += a b of one 16x8x8 step.
__device__ __forceinline__ float gc_tf32(float x) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return __uint_as_float(r);
#else
    return x;
#endif
}
// A byte (bits 0-7 of b, the rest zero) as the float of its value, exactly: the float whose bits are
// 0x4B000000 | u8 is 2^23 + u8, less 2^23 — an integer and a float add instead of a conversion (I2F, a quarter of
// the rate). The tensor-core kernels' uint8 operands (gc_gemm_tc.cuh, gc_gemm_wgmma.cuh).
__device__ __forceinline__ float gc_byte_value(uint32_t b) { return __uint_as_float(0x4B000000u | b) - 8388608.f; }
// An fp32 operand x as two tf32 parts (TF32 = 3 tiles, gc_gemm_tc.cuh), in four instructions: high = x truncated
// to tf32 (its top 19 bits: |x - high| < 2^-10 |x|; a NaN stays one) and low = x - high (exact in fp32) rounded
// to nearest tf32 on its bits (a carry may reach the exponent: still the nearest), so that |x - high - low| <=
// 2^-21 |x| and |low| < 2^-10 |x|. The mma reads both whole (their low 13 bits are zero). An infinite x gives a
// NaN low part. NEAREST (gc_row_mma X3's rows, the chains' A, whose parts go to the mma from registers): high
// rounded to nearest tf32 on its bits instead, one instruction more, so that low takes either sign: the product
// term a tf32-parts step leaves out, low x low, then no more has the product's own sign (with both highs
// truncated: a shrink of ~2^-23 of each product, always the same way) but either, <= 2^-21 of it; one operand's
// rounding is enough for that (and the rows' splits are the fewer: 2 a k step against the weights' 4 a tile). An
// x within 2^-12 of the largest float then has an infinite high part and the opposite infinite low one (the
// products' sum a NaN, as an infinite x gives). (The GEMM tiles keep the truncation: the wgmma tf32-parts tile's
// tensor cores read x itself from shared memory as the high part, its top 19 bits, and the other tiles' sums stay
// those they were tuned and tested with.)
template <bool NEAREST = false>
__device__ __forceinline__ void gc_tf32_parts(uint32_t x, uint32_t& high, uint32_t& low) {
    high = (NEAREST ? x + 0x1000u : x) & 0xffffe000u;
    low = (__float_as_uint(__uint_as_float(x) - __uint_as_float(high)) + 0x1000u) & 0xffffe000u;
}
// d += a b, one 16x8x8 tensor-core step; fresh: d = a b (the accumulator's input zero, so no wait on what d
// held).
__device__ __forceinline__ void gc_mma_tf32(float* d, const uint32_t* a, const uint32_t* b, bool fresh = false) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    if (fresh)
        asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};"
            : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(0.f));
    else
        asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    __trap();   // tf32 tiles need sm_80 or newer
#endif
}
// acc += part, fragment by fragment: the tf32-parts kernels' mma sums of a K step or group, made from zero
// (the tensor cores truncate as they accumulate), added into the fp32 sums.
template <int MI, int NJ>
__device__ __forceinline__ void gc_mma_add(float (&acc)[MI][NJ][4], const float (&part)[MI][NJ][4]) {
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int j = 0; j < NJ; j++)
#pragma unroll
            for (int r = 0; r < 4; r++) acc[i][j][r] += part[i][j][r];
}

// mbarriers (shared::cta, 8 bytes; sm_90's try_wait; the warp-specialized GEMM's steps, a chain's staged Bs):
// init with an arrival count; an arrive; a wait for the phase of this parity to complete; cp.async's arrive
// once this thread's copies so far have landed (noinc: it counts as one of the barrier's arrivals).
__device__ __forceinline__ void gc_mbar_init(void* bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"((unsigned)__cvta_generic_to_shared(bar)),
                 "r"(count) : "memory");
}
__device__ __forceinline__ void gc_mbar_arrive(void* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"((unsigned)__cvta_generic_to_shared(bar))
                 : "memory");
}
__device__ __forceinline__ void gc_mbar_wait(void* bar, int parity) {
    asm volatile("{ .reg .pred done; GC_MBAR_WAIT: mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1; "
                 "@!done bra GC_MBAR_WAIT; }" :: "r"((unsigned)__cvta_generic_to_shared(bar)), "r"(parity)
                 : "memory");
}
// An init (one thread) that the async proxy (bulk copies, st.async) and the cluster's other blocks see.
__device__ __forceinline__ void gc_mbar_init_published(void* bar, int count) {
    gc_mbar_init(bar, count);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// An arrive that also expects `bytes` of asynchronous writes (st.async, bulk copies) to complete on it.
__device__ __forceinline__ void gc_mbar_expect(void* bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                 :: "r"((unsigned)__cvta_generic_to_shared(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void gc_mbar_copies_arrive(void* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];"
                 :: "r"((unsigned)__cvta_generic_to_shared(bar)) : "memory");
#endif
}

// Thread-block clusters (sm_90) in PTX: the cluster barrier (arrive, then wait with acquire; arrive and wait
// may be apart; an arrive that orders nothing is relaxed, one that publishes writes is preceded by one thread's
// fence: gc_cluster_arrive_published, one after reads of other blocks' shared memory is every thread's release:
// gc_cluster_arrive_release), this block's rank, and the address
// of a shared variable in another block of the cluster (a generic pointer that plain loads read; or its
// shared::cluster address, st.async's and remote mbarriers' operand).
__device__ __forceinline__ void gc_cluster_arrive_relaxed() {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
__device__ __forceinline__ void gc_cluster_arrive_release() {
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void gc_cluster_wait() {
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// The arrive that publishes the block's writes made before it, with one thread's fence: the block's threads
// meet at the CTA barrier (their writes reach thread 0's fence through it, cumulatively), thread 0 fences at
// cluster scope, and the relaxed arrive after the fence is the release (PTX: a release fence, then a strong
// write; fence.mbarrier_init and a relaxed arrive publish an mbarrier's init the same way). Where every thread
// arrived with .release (a MEMBAR.ALL.GPU each), the MLP's b1000 dW1 spent ~1,930 cycles in the barrier, here
// ~1,670 (clock64 stamps; H100, its tf32 trainer 24.99 -> 24.74 us, 6 interleaved rounds, checkpoints
// identical). Without the fence the partial tiles read after the wait were stale (the checkpoints differed).
__device__ __forceinline__ void gc_cluster_arrive_published() {
    __syncthreads();
    if (threadIdx.x == 0) asm volatile("fence.acq_rel.cluster;" ::: "memory");
    gc_cluster_arrive_relaxed();
}
__device__ __forceinline__ unsigned gc_cluster_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
template <typename T>
__device__ __forceinline__ const T* gc_cluster_map(const T* p, unsigned rank) {
    uint64_t out;
    asm volatile("mapa.u64 %0, %1, %2;" : "=l"(out) : "l"(p), "r"(rank));
    return reinterpret_cast<const T*>(out);
}
__device__ __forceinline__ unsigned gc_cluster_addr(const void* p, unsigned rank) {
    unsigned out;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(out) : "r"((unsigned)__cvta_generic_to_shared(p)),
                 "r"(rank));
    return out;
}

// One step's block of an operand on its way from global to shared memory: ROWS x COLS of a row-major matrix
// (COLS contiguous, row stride ld), held in registers as slots of W = 16 / sizeof(T) elements. CR / CC:
// rows / columns may run past the matrix (zeros are loaded there). Rows of the block become rows of the
// shared array (`direct`, a 16-byte store per slot) or its columns (transposed, W scalar stores).
template <typename T, int ROWS, int COLS, int THREADS>
struct gc_gemm_stage {
    static constexpr int W = 16 / sizeof(T);
    static_assert(COLS % W == 0, "gc_gemm: a tile side is not a multiple of 16 bytes");
    static constexpr int SLOTS = ROWS * COLS / W;
    static constexpr int PER = (SLOTS + THREADS - 1) / THREADS;
    T v[PER][W];

    template <bool CR, bool CC>
    __device__ __forceinline__ void load(const T* __restrict__ src, long long ld, int rows_left, int cols_left,
                                         bool vec) {
#pragma unroll
        for (int i = 0; i < PER; i++) {
            const int slot = threadIdx.x + i * THREADS;
            const int r = slot / (COLS / W), c = slot % (COLS / W) * W;
            const bool live = (SLOTS % THREADS == 0 || slot < SLOTS) && (!CR || r < rows_left);
            const T* p = src + (long long)r * ld + c;
            if (vec) {   // cols_left is a multiple of W here: a slot is wholly inside or wholly outside
                if (live && (!CC || c < cols_left)) gc_ld16(p, v[i]);
                else {
#pragma unroll
                    for (int j = 0; j < W; j++) v[i][j] = T(0);
                }
            } else {
#pragma unroll
                for (int j = 0; j < W; j++) v[i][j] = live && (!CC || c + j < cols_left) ? p[j] : T(0);
            }
        }
    }

    // The same block of the image input read in place (gc_rows): row r of the block is row index[r] of the
    // source, from column c0 on, in runs of 4 elements (its rows' length is a multiple of 4 and the source
    // aligned: gc_gemm checks). A uint8 run stays packed in v[i][0] until store_rows converts it: converting
    // here would wait for the load, at every K step, where the pipeline means it to be in flight.
    template <bool CR, bool CC>
    __device__ __forceinline__ void load_rows(const void* source, bool u8, const uint32_t* index, int c0,
                                              long long ld, int rows_left, int cols_left) {
        static_assert(W == 4, "gc_gemm: batch rows are float operands");
#pragma unroll
        for (int i = 0; i < PER; i++) {
            const int slot = threadIdx.x + i * THREADS;
            const int r = slot / (COLS / W), c = slot % (COLS / W) * W;
            const bool live = (SLOTS % THREADS == 0 || slot < SLOTS) && (!CR || r < rows_left) && (!CC || c < cols_left);
            if (!live) {
#pragma unroll
                for (int j = 0; j < W; j++) v[i][j] = T(0);
                continue;
            }
            const long long at = (long long)index[r] * ld + c0 + c;
            if (u8) v[i][0] = __uint_as_float(*(const uint32_t*)((const uint8_t*)source + at));
            else gc_ld16((const T*)source + at, v[i]);
        }
    }

    // Shared memory gets each slot's W values through `convert` (raw registers -> elements), tf32-rounded
    // for tf32 tiles; rows of the block become rows of the array, or its columns (TRANSPOSED).
    template <bool TRANSPOSED, bool TF32, class Convert>
    __device__ __forceinline__ void store_with(T* s, int lds, Convert convert) {
#pragma unroll
        for (int i = 0; i < PER; i++) {
            const int slot = threadIdx.x + i * THREADS;
            if (SLOTS % THREADS != 0 && slot >= SLOTS) continue;
            const int r = slot / (COLS / W), c = slot % (COLS / W) * W;
            T w[W];
            convert(v[i], w);
#pragma unroll
            for (int j = 0; j < W; j++) w[j] = TF32 ? (T)gc_tf32((float)w[j]) : w[j];
            if (TRANSPOSED) {
#pragma unroll
                for (int j = 0; j < W; j++) s[(c + j) * lds + r] = w[j];
            } else {
                gc_st16(s + r * lds + c, w);
            }
        }
    }

    template <bool TRANSPOSED, bool TF32>
    __device__ __forceinline__ void store(T* s, int lds) {
        store_with<TRANSPOSED, TF32>(s, lds, [](const T* in, T* out) {
#pragma unroll
            for (int j = 0; j < W; j++) out[j] = in[j];
        });
    }

    // What load_rows loaded: uint8 runs become gc_pixel(u8, scale), as the trainer's gather converts them.
    template <bool TRANSPOSED, bool TF32>
    __device__ __forceinline__ void store_rows(T* s, int lds, bool u8, float scale) {
        store_with<TRANSPOSED, TF32>(s, lds, [&](const T* in, T* out) {
            const uint32_t q = __float_as_uint(in[0]);
#pragma unroll
            for (int j = 0; j < W; j++) out[j] = u8 ? gc_pixel((q >> (8 * j)) & 0xff, scale) : in[j];
        });
    }
};

template <class...> using gc_void_t = void;
// The epilogue of RUN results of row m, columns n..n+RUN-1, in place (outputs outside the matrix are left
// alone: the functor may read operands there). Then their store: n a multiple of RUN; CM / CN: the tile may
// overhang the matrix in that dimension; vec: C's rows allow aligned RUN-wide stores. A thread applies the
// epilogue to all its runs before it stores any: the functor's loads (a bias, a mask) may alias C as far as
// the compiler knows, so interleaved with the stores each would wait for the one before it.
// A functor may also say `static constexpr bool runs = true;` and define, for a run of 4 columns n..n+3 of
// row m (n a multiple of 4, all four inside the matrix), `pack load4(b, m, n)`: the operands it reads there,
// 16-byte vectors where they lie along the row, and `void run4(const pack&, b, m, n, T* v)`: the epilogue of
// v[0..3] from them. Whole runs take it; the fp32 kernels load their runs' packs into registers while their
// first K steps are on their way (gc_gemm_packs) instead of prefetching to L1 and waiting there.
template <class Ep, class = void> struct gc_ep_runs { static constexpr bool value = false; };
template <class Ep> struct gc_ep_runs<Ep, gc_void_t<decltype(Ep::runs)>> { static constexpr bool value = Ep::runs; };
// Registers a thread's NR packs would hold: the packs stay in registers only up to GC_PACK_REGISTERS (an
// 8 x 8 block's 16 runs of a 2-vector pack would not fit beside its accumulators).
#define GC_PACK_REGISTERS 32
template <class Ep, bool = gc_ep_runs<Ep>::value> struct gc_ep_pack_words { static constexpr int value = 0; };
template <class Ep> struct gc_ep_pack_words<Ep, true> { static constexpr int value = sizeof(typename Ep::pack) / 4; };
template <class Ep, int NR> struct gc_ep_packed {
    static constexpr bool value = gc_ep_runs<Ep>::value && NR * gc_ep_pack_words<Ep>::value <= GC_PACK_REGISTERS;
};
template <int RUN, bool CM, bool CN, typename T, class Ep>
__device__ __forceinline__ void gc_gemm_epilogue(const Ep& ep, int b, int m, int n, int M, int N, T* v) {
    if (CM && m >= M) return;
    if constexpr (gc_ep_runs<Ep>::value && RUN % 4 == 0 && !CN) {
#pragma unroll
        for (int r = 0; r < RUN; r += 4) ep.run4(ep.load4(b, m, n + r), b, m, n + r, v + r);
    } else {
#pragma unroll
        for (int r = 0; r < RUN; r++)
            if (!CN || n + r < N) v[r] = ep(b, m, n + r, v[r]);
    }
}
// gc_ep_partial (gc_gemm.h) says `partials`: a split's block stores its partial tile for the reader to sum.
template <class Ep, class = void> struct gc_ep_partials { static constexpr bool value = false; };
template <class Ep> struct gc_ep_partials<Ep, gc_void_t<decltype(Ep::partials)>> { static constexpr bool value = Ep::partials; };
// An epilogue functor whose GEMM keeps a mirror of C says so (`static constexpr bool mirrored = true;` and
// `T* mirror() const`: lower.py's mirror_variables — C is a variable W that GEMMs on warp-specialized tiles read
// as W^T): the kernel's end stores each final value at (n, m) of the mirror too (M x N -> N x M), after C's.
template <class Ep, class = void> struct gc_ep_mirror { static constexpr bool value = false; };
template <class Ep> struct gc_ep_mirror<Ep, gc_void_t<decltype(Ep::mirrored)>> { static constexpr bool value = Ep::mirrored; };
// A run of RUN final values at (m, n .. n + RUN - 1) into the mirror (a column each: single stores).
template <int RUN, bool CM, bool CN, typename T>
__device__ __forceinline__ void gc_gemm_mirror_store(T* mirror, int m, int n, int M, int N, const T* v) {
    if (CM && m >= M) return;
#pragma unroll
    for (int r = 0; r < RUN; r++)
        if (!CN || n + r < N) mirror[(size_t)(n + r) * M + m] = v[r];
}
// An epilogue functor that stores nothing itself may say so (`static constexpr bool prefetch = true;`): the
// kernel then calls it once on zeros while the first K step's loads are in flight, and waits for its loads
// there, so that the operands it reads (a mask, a bias) are in L1 when the real epilogue runs.
template <class Ep, class = void> struct gc_ep_prefetch { static constexpr bool value = false; };
template <class Ep> struct gc_ep_prefetch<Ep, gc_void_t<decltype(Ep::prefetch)>> { static constexpr bool value = Ep::prefetch; };
// A zero the compiler cannot see through (so that the functor's loads are not folded away), and a value it
// must have computed at this point.
__device__ __forceinline__ void gc_opaque_zero(float& x) { asm("mov.b32 %0, 0;" : "=f"(x)); }
__device__ __forceinline__ void gc_opaque_zero(double& x) { asm("mov.b64 %0, 0;" : "=d"(x)); }
__device__ __forceinline__ void gc_wait_value(float x) { asm volatile("" :: "f"(x)); }
__device__ __forceinline__ void gc_wait_value(double x) { asm volatile("" :: "d"(x)); }
// That call, at each run of RUN results a thread will store (for_runs(f) calls f(row, col, values) per run
// at tile coordinates, as the kernels' epilogues do); nothing for functors that do not say prefetch.
template <int RUN, bool CM, bool CN, typename T, class Ep, class ForRuns>
__device__ __forceinline__ void gc_gemm_prefetch(const Ep& ep, int b, int m0, int n0, int M, int N,
                                                 ForRuns&& for_runs) {
    if constexpr (gc_ep_prefetch<Ep>::value) {
        for_runs([&](int row, int col, T*) {
            T zero[RUN];
#pragma unroll
            for (int r = 0; r < RUN; r++) gc_opaque_zero(zero[r]);
            gc_gemm_epilogue<RUN, CM, CN>(ep, b, m0 + row, n0 + col, M, N, zero);
#pragma unroll
            for (int r = 0; r < RUN; r++) gc_wait_value(zero[r]);
        });
    }
}

// The epilogue's operands of a thread's NR runs of 4 (an fp32 tile's TM x TN accumulators, run v at acc +
// 4 i): ON where the functor has packs, the tile's runs are whole (the tile divides N) and the block applies
// its own epilogue (no split). load() while the first K steps are on their way, apply() to each run's sums
// (gc_gemm_finish): the packs into registers, then run4; ON false: the L1 prefetch (gc_gemm_prefetch, not for
// split tiles), then the functor's own loads.
template <class Ep, int NR, bool ON> struct gc_gemm_packs {
    template <int RUN, bool CM, bool CN, int S, typename T, class ForRuns>
    __device__ __forceinline__ void load(const Ep& ep, int b, int m0, int n0, int M, int N, const T*,
                                         ForRuns&& for_runs) {
        if constexpr (S == 1) gc_gemm_prefetch<RUN, CM, CN, T>(ep, b, m0, n0, M, N, for_runs);
    }
    template <int RUN, bool CM, bool CN, typename T>
    __device__ __forceinline__ void apply(const Ep& ep, int b, int m, int n, int M, int N, const T*, T* v) const {
        gc_gemm_epilogue<RUN, CM, CN>(ep, b, m, n, M, N, v);
    }
};
template <class Ep, int NR> struct gc_gemm_packs<Ep, NR, true> {
    typename Ep::pack pk[NR];
    template <int RUN, bool CM, bool CN, int S, typename T, class ForRuns>
    __device__ __forceinline__ void load(const Ep& ep, int b, int m0, int n0, int M, int, const T* acc,
                                         ForRuns&& for_runs) {
        static_assert(RUN == 4 && S == 1, "gc_gemm_packs: runs of 4 of a block's own epilogue");
        for_runs([&](int row, int col, T* v) {
            if (!CM || m0 + row < M) pk[(v - acc) / 4] = ep.load4(b, m0 + row, n0 + col);
        });
    }
    template <int RUN, bool CM, bool CN, typename T>
    __device__ __forceinline__ void apply(const Ep& ep, int b, int m, int n, int M, int, const T* acc, T* v) const {
        if (!CM || m < M) ep.run4(pk[(v - acc) / 4], b, m, n, v);
    }
};

template <int RUN, bool CM, bool CN, typename T>
__device__ __forceinline__ void gc_gemm_store(T* C, int m, int n, int M, int N, const T* v, bool vec) {
    if (CM && m >= M) return;
    T* row = C + (size_t)m * N;
    if (vec && (!CN || n < N)) {   // vec: N is a multiple of 4, so the whole run is inside
        if constexpr (RUN * sizeof(T) % 16 == 0) {
#pragma unroll
            for (int h = 0; h < RUN; h += 16 / sizeof(T)) gc_stg16(row + n + h, v + h);
        } else {   // tf32 runs of 2 (the plain 8-byte store; the intrinsic costs the 128 x 128 tile spills)
            gc_st_run<RUN>(row + n, v);
        }
    } else {
#pragma unroll
        for (int r = 0; r < RUN; r++)
            if (!CN || n + r < N) row[n + r] = v[r];
    }
}

// The end of a split's sum: block `rank` holds the sums of its rows [rank RS, (rank + 1) RS) of the tile (RS =
// BM / S) as runs of 4 columns (run_at(i, row, col) places run i); the epilogue, C's stores, then
// `after_stores`, and a mirror (gc_ep_mirror) from the rows transposed in `free` (shared memory no block reads
// any more: a column's RS values are then one run of the mirror's row n, stored by consecutive threads; single
// stores down the columns took 0.8 us more in the MLP's dW1).
template <int BM, int BN, int S, int THREADS, bool CM, bool CN, int PER, typename T, class Ep, class RunAt,
          class After, class Packs>
__device__ __forceinline__ void gc_gemm_split_rows(T (&sum)[PER][4], RunAt&& run_at, T* free, const Ep& ep, int b,
                                                   int m0, int n0, int M, int N, T* C, bool vc, int rank,
                                                   After&& after_stores, const Packs& packs) {
    constexpr int RS = BM / S;
#pragma unroll
    for (int i = 0; i < PER; i++) {
        int row, col;
        if (run_at(i, row, col)) packs.template apply<CM, CN>(ep, i, b, m0 + row, n0 + col, M, N, sum[i]);
    }
#pragma unroll
    for (int i = 0; i < PER; i++) {
        int row, col;
        if (run_at(i, row, col)) gc_gemm_store<4, CM, CN>(C, m0 + row, n0 + col, M, N, sum[i], vc);
    }
    after_stores();
    if constexpr (gc_ep_mirror<Ep>::value) {
        constexpr int LD = RS + 1;   // (a column of the transposed rows, padded: fewer bank conflicts)
        static_assert(BN * LD <= BM * BN, "gc_gemm: the mirror's transposed rows fit the partial tile's bytes");
        T* rows = free;
#pragma unroll
        for (int i = 0; i < PER; i++) {
            int row, col;
            if (run_at(i, row, col))
#pragma unroll
                for (int r = 0; r < 4; r++) rows[(col + r) * LD + row - rank * RS] = sum[i][r];
        }
        __syncthreads();
        T* mirror = ep.mirror();
        for (int e = threadIdx.x; e < BN * RS; e += THREADS) {
            const int c = e / RS, j = e % RS, m = m0 + rank * RS + j, n = n0 + c;
            if ((!CM || m < M) && (!CN || n < N)) mirror[(size_t)n * M + m] = rows[c * LD + j];
        }
    }
}

// The runs of 4 columns a thread sums in block `rank`'s rows of a split's tile: run i at (row, col) of the tile;
// add: each run's S partials in rank order, block q's at at(q, row, col).
template <int BM, int BN, int S, int THREADS>
struct gc_split_runs {
    static constexpr int RS = BM / S, RUNS = RS * BN / 4, PER = (RUNS + THREADS - 1) / THREADS;
    int rank;
    __device__ __forceinline__ bool operator()(int i, int& row, int& col) const {
        const int e = threadIdx.x + i * THREADS;
        row = rank * RS + e / (BN / 4), col = e % (BN / 4) * 4;
        return RUNS % THREADS == 0 || e < RUNS;
    }
    template <typename T, class At>
    __device__ __forceinline__ void add(T (&sum)[PER][4], At&& at) const {
#pragma unroll
        for (int i = 0; i < PER; i++) {
            int row, col;
            if (!(*this)(i, row, col)) continue;
#pragma unroll
            for (int q = 0; q < S; q++) {
                T v[4];
                gc_ld_run<4>(at(q, row, col), v);
#pragma unroll
                for (int r = 0; r < 4; r++) sum[i][r] += v[r];
            }
        }
    }
    // Once add's loads have their values: a store of the thread's total waits for every one of them. Stored
    // over the first run it read from `own`, its block's partial tile (rows no other block reads; the mirror
    // overwrites them after the wait). It was meant to order the reads before a relaxed arrive, which proved
    // not enough (gc_gemm_split_reduce); beside the release arrive it orders nothing more, but without it the
    // MLP's b1000 fp32 step was 1.4 us slower (H100 trainer, 5 interleaved rounds: 38.86 -> 40.22 us; its dW2
    // tile, tensor-core split 8, 80 -> 85 registers) and its tf32 step the same (25.22 / 25.21): it stays.
    template <typename T>
    __device__ __forceinline__ void settle(const T (&sum)[PER][4], T* own) const {
        int row, col;
        if (!(*this)(0, row, col)) return;
        T total = 0;
#pragma unroll
        for (int i = 0; i < PER; i++)
#pragma unroll
            for (int r = 0; r < 4; r++) total += sum[i][r];
        *(volatile T*)(own + row * BN + col) = total;
    }
};

// The epilogue operands of a split block's runs (gc_split_runs: the rows of the sum it ends with, which its
// rank fixes from the start), for functors with packs (gc_ep_runs) on tiles that divide N: the kernel loads them
// into registers while its K steps run (load), and gc_gemm_split_rows applies the functor's run4 to them (apply)
// — instead of its loads after the cluster's sum, an L2 latency more at the kernel's end. ON false: the
// functor's own loads there (gc_gemm_epilogue).
template <class Ep, int BM, int BN, int S, int THREADS, bool ON>
struct gc_split_packs {
    template <bool CM> __device__ __forceinline__ void load(const Ep&, int, int, int, int) {}
    template <bool CM, bool CN, typename T>
    __device__ __forceinline__ void apply(const Ep& ep, int, int b, int m, int n, int M, int N, T* v) const {
        gc_gemm_epilogue<4, CM, CN>(ep, b, m, n, M, N, v);
    }
};
template <class Ep, int BM, int BN, int S, int THREADS>
struct gc_split_packs<Ep, BM, BN, S, THREADS, true> {
    typedef gc_split_runs<BM, BN, S, THREADS> Runs;
    typename Ep::pack pk[Runs::PER];
    template <bool CM> __device__ __forceinline__ void load(const Ep& ep, int b, int m0, int n0, int M) {
        const Runs run_at{(int)gc_cluster_rank()};
#pragma unroll
        for (int i = 0; i < Runs::PER; i++) {
            int row, col;
            if (run_at(i, row, col) && (!CM || m0 + row < M)) pk[i] = ep.load4(b, m0 + row, n0 + col);
        }
    }
    template <bool CM, bool CN, typename T>
    __device__ __forceinline__ void apply(const Ep& ep, int i, int b, int m, int n, int M, int, T* v) const {
        static_assert(!CN, "gc_split_packs: runs of 4 inside N");
        if (!CM || m < M) ep.run4(pk[i], b, m, n, v);
    }
};
// WHERE: the kernel has them (its tile divides N, it has the registers).
template <class Ep, int BM, int BN, int S, int THREADS, bool WHERE>
using gc_split_packs_for = gc_split_packs<Ep, BM, BN, S, THREADS, WHERE && (S > 1) && !gc_ep_partials<Ep>::value &&
                                          gc_ep_packed<Ep, gc_split_runs<BM, BN, S, THREADS>::PER>::value>;

// Split-K's end (sm_90): each block of the cluster has its partial BM x BN tile in its shared memory (smem,
// row-major); block `rank` sums rows [rank * BM / S, (rank + 1) * BM / S) over ranks 0..S-1, in that order,
// applies the epilogue to the sums and stores them (a thread's runs of 4 columns).
template <int BM, int BN, int S, int THREADS, bool CM, bool CN, typename T, class Ep,
          class Packs = gc_split_packs<Ep, BM, BN, S, THREADS, false>>
__device__ __forceinline__ void gc_gemm_split_reduce(const T* smem, const Ep& ep, int b, int m0, int n0, int M,
                                                     int N, T* C, bool vc, const Packs& packs = Packs()) {
    gc_cluster_arrive_published();   // this block's partial tile, for the others' reads
    gc_cluster_wait();
    typedef gc_split_runs<BM, BN, S, THREADS> Runs;
    const int rank = (int)gc_cluster_rank();
    const Runs run_at{rank};
    T sum[Runs::PER][4] = {};
    run_at.add(sum, [&](int q, int row, int col) { return gc_cluster_map<T>(smem, q) + row * BN + col; });
    // No block may leave while another still reads its shared memory: this block's reads are done here, so
    // it says so before its epilogue and stores; the wait comes after them, before the mirror reuses this
    // block's bytes. The arrive is a release: a relaxed one after the reads had their values
    // (gc_split_runs::settle) was 0.6 us faster in the MLP's b1000 tf32 step but let another block's mirror
    // overwrite rows this block was still reading when other streams' kernels ran beside it (H100: plain
    // launches of that trainer, a variant reading dh1^T, wrote another checkpoint in 3-7 of 40 runs; with the
    // release 0 of 40); a CTA barrier, one thread's fence and a relaxed arrive (gc_cluster_arrive_published)
    // kept one checkpoint too but was no faster (docs/compiler.md, "A cross-stream nondeterminism").
    run_at.settle(sum, const_cast<T*>(smem));
    gc_cluster_arrive_release();
    gc_gemm_split_rows<BM, BN, S, THREADS, CM, CN>(sum, run_at, const_cast<T*>(smem), ep, b, m0, n0, M, N, C, vc,
                                                   rank, [] { gc_cluster_wait(); }, packs);
}

// The same sum by pushes (gc_gemm_ws_kernel: x @ W1 at the MLP's step's head, no kernel beside it): once every
// block of the cluster is done with its shared memory (free_smem, then the cluster barrier, arrive relaxed: it
// publishes nothing but the mbarrier's init, which fence.mbarrier_init does), each sends its partial rows
// [q RS, (q + 1) RS) to block q's `inbox` (its shared memory, S slots of RS rows of BN + 8: slot `rank`) and
// waits for its own S slots: the threads store their accumulators (for_runs' runs of RUN) into a staging copy of
// the slots after the inbox (while the others arrive), then one thread sends each slot by one bulk copy
// (cp.async.bulk shared::cta to shared::cluster), counted on q's mbarrier (complete_tx) — where each thread's
// st.async of its runs took ~1200 cycles to go out (clock64 stamps, the MLP's b1000 x @ W1; its trainer step
// 27.32 -> 27.10 us, 5 interleaved rounds, H100). The caller's bytes at `inbox`: 2 BM (BN + 8) of T.
// No block reads another's shared memory, so none meets the others again before it leaves and no thread fences
// its writes for them, where gc_gemm_split_reduce publishes its partial tile (a release: one thread's fence
// after a CTA barrier) and meets the cluster at a second barrier (a sixth of the stall samples of the MLP's b1000 x @ W1,
// H100 ncu). The same sums in the same order: the same bits. Measured for every split kernel, or for the
// wgmma ones too, and not kept: docs/compiler.md.
template <int RUN, int BM, int BN, int S, int THREADS, bool CM, bool CN, typename T, class Ep, class ForRuns,
          class FreeSmem, class Packs = gc_split_packs<Ep, BM, BN, S, THREADS, false>>
__device__ __forceinline__ void gc_gemm_split_push(T* inbox, const Ep& ep, int b, int m0, int n0, int M, int N,
                                                   T* C, bool vc, ForRuns&& for_runs, FreeSmem&& free_smem,
                                                   const Packs& packs = Packs()) {
    typedef gc_split_runs<BM, BN, S, THREADS> Runs;
    constexpr int RS = Runs::RS, LD = BN + 8;   // (rows 8 mod 32 words apart: a warp's runs of 2 on distinct banks)
    static_assert(RUN == 1 || RUN == 2 || RUN == 4, "gc_gemm_split_push: runs of 1, 2 or 4");
    __shared__ __align__(8) uint64_t bar;   // the inbox's: one arrival (the expecting thread's), then the bytes
    T* const stage = inbox + S * RS * LD;   // this block's partial rows, slot q for block q (2 BM x LD in all)
    const int rank = (int)gc_cluster_rank();
    free_smem();
    if (threadIdx.x == 0) gc_mbar_init_published(&bar, 1);
    gc_cluster_arrive_relaxed();   // this block's inbox is free and its mbarrier set
    if (threadIdx.x == 0) gc_mbar_expect(&bar, S * RS * LD * (unsigned)sizeof(T));
    for_runs([&](int row, int col, T* v) {   // (while the others arrive)
#pragma unroll
        for (int r = 0; r < RUN; r++) stage[row * LD + col + r] = v[r];
    });
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");   // the rows, for the bulk copies
    __syncthreads();
    gc_cluster_wait();             // ... and every other block's
    if (threadIdx.x == 0) {
#pragma unroll
        for (int q = 0; q < S; q++)
            asm volatile("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes"
                         " [%0], [%1], %2, [%3];"
                         :: "r"(gc_cluster_addr(inbox + rank * RS * LD, (unsigned)q)),
                            "r"((unsigned)__cvta_generic_to_shared(stage + q * RS * LD)), "r"(RS * LD * (int)sizeof(T)),
                            "r"(gc_cluster_addr(&bar, (unsigned)q))
                         : "memory");
    }
    gc_mbar_wait(&bar, 0);
    const Runs run_at{rank};
    T sum[Runs::PER][4] = {};
    run_at.add(sum, [&](int q, int row, int col) { return inbox + (q * RS + row - rank * RS) * LD + col; });
    // (the mirror reuses the inbox once every thread has read its slots)
    gc_gemm_split_rows<BM, BN, S, THREADS, CM, CN>(sum, run_at, inbox, ep, b, m0, n0, M, N, C, vc, rank, [] {
        if constexpr (gc_ep_mirror<Ep>::value) __syncthreads();
    }, packs);
}

// The block's tile of C at (m0, n0): blocks walk groups of 8 tile rows column by column, so blocks running
// together share rows of A and columns of B in L2.
template <int BM, int BN>
__device__ __forceinline__ void gc_gemm_origin(int M, int N, int& m0, int& n0, int x = blockIdx.x) {
    constexpr int G = 8;
    const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN;
    const int group = x / (G * tiles_n), first = group * G;
    const int rows = min(tiles_m - first, G), local = x - group * G * tiles_n;
    m0 = (first + local % rows) * BM;
    n0 = local / rows * BN;
}

// What both kernels derive from the tile, the static shape and the launch: the sizes (the static ones where
// the tile was specialized); EM / EN / EK: the tile divides that static dimension (K: times the split), so
// its bounds checks compile out; va / vb: 16-byte loads of A / B, where their contiguous dimension (CA, CB)
// allows them; the block's tile of C at (m0, n0), its matrix b of the batch, and its split s's slice
// [k_begin, k_end) of K, ktiles steps of BK.
template <typename T, bool TA, bool TB, class Tile>
struct gc_gemm_block {
    static constexpr int S = Tile::SPLIT, BK = Tile::BK, W = 16 / sizeof(T);
    static constexpr bool EM = Tile::SM > 0 && Tile::SM % Tile::BM == 0;
    static constexpr bool EN = Tile::SN > 0 && Tile::SN % Tile::BN == 0;
    static constexpr bool EK = Tile::SK > 0 && Tile::SK % (BK * S) == 0;
    static constexpr int CA = TA ? Tile::SM : Tile::SK, CB = TB ? Tile::SK : Tile::SN;   // contiguous dimensions
    int M, N, K;
    bool va, vb;
    int m0, n0, b, s, k_begin, k_end, ktiles;

    // x, z: the block's place in the grid (a post kernel's short-K stage passes its own, gc_gemm_sk_post)
    template <class Ep>
    __device__ __forceinline__ explicit gc_gemm_block(const gc_gemm_params<T, Ep>& p, int x = blockIdx.x,
                                                      int z = blockIdx.z)
        : M(Tile::SM ? Tile::SM : p.M), N(Tile::SN ? Tile::SN : p.N), K(Tile::SK ? Tile::SK : p.K),
          va((CA == 0 || CA % W == 0) && p.va), vb((CB == 0 || CB % W == 0) && p.vb) {
        gc_gemm_origin<Tile::BM, Tile::BN>(M, N, m0, n0, x);
        b = z / S;
        s = z % S;
        const int KS = ((K + S - 1) / S + BK - 1) / BK * BK;    // K per split, a multiple of BK
        k_begin = s * KS;
        k_end = min(K, k_begin + KS);
        ktiles = k_end > k_begin ? (k_end - k_begin + BK - 1) / BK : 0;
    }

    // A read in place (the kernels' RA): the block's row indices, staged in shared memory once so that a K
    // step's loads wait on shared memory only, not on a dependent global load — its BM rows of M, or with TA
    // its split's K range, which the static shape bounds: IDX entries (those past the rows: 0).
    // In two halves where a kernel has other work for the loads' latency: load_rows, this thread's entries
    // (NI of them) into registers; put_rows, into shared memory (a barrier must follow before they are read).
    static constexpr int IDX = TA ? ((Tile::SK + S - 1) / S + BK - 1) / BK * BK : Tile::BM;
    static constexpr int NI = (IDX + Tile::THREADS - 1) / Tile::THREADS;
    // the block's first row (m0, or k_begin with TA) and its count of rows
    __device__ __forceinline__ void row_span(int& first, int& count) const {
        first = TA ? k_begin : m0;
        count = TA ? k_end - k_begin : min(Tile::BM, M - m0);
    }
    // entry i (< IDX) from the block's first row and its count of rows
    __device__ __forceinline__ uint32_t row_index(int i, int first, int count, const gc_rows& rows) const {
        return i >= count ? 0 : rows.index ? rows.index[first + i] : first + i;
    }
    __device__ __forceinline__ void stage_rows(uint32_t* ridx, const gc_rows& rows) const {
        int first, count;
        row_span(first, count);
        for (int i = threadIdx.x; i < IDX; i += Tile::THREADS) ridx[i] = row_index(i, first, count, rows);
        __syncthreads();
    }
    __device__ __forceinline__ void load_rows(uint32_t (&v)[NI], const gc_rows& rows) const {
        int first, count;
        row_span(first, count);
#pragma unroll
        for (int q = 0; q < NI; q++) {
            const int i = threadIdx.x + q * Tile::THREADS;
            v[q] = i < IDX ? row_index(i, first, count, rows) : 0;
        }
    }
    __device__ __forceinline__ void put_rows(uint32_t* ridx, const uint32_t (&v)[NI]) const {
#pragma unroll
        for (int q = 0; q < NI; q++)
            if (threadIdx.x + q * Tile::THREADS < IDX) ridx[threadIdx.x + q * Tile::THREADS] = v[q];
    }
};

// The end of every GEMM kernel, from its accumulators as runs of RUN results at tile coordinates (for_runs):
// without a split, the epilogue and the stores; with one (sm_90), once free_smem() has made the shared
// memory free (the register-staged kernel's loop ends at a barrier; the pipelined ones wait for theirs),
// the partial tile into shared memory and the cluster's sum; with one whose reader sums it (gc_ep_partial),
// the split's partial tile stored as it is, at C + split * M * N.
// packs, acc: the block's epilogue operands (gc_gemm_packs) and the accumulators they are indexed by.
// split_packs: with a split, its epilogue operands (gc_split_packs) where the kernel loaded them.
template <int RUN, int BM, int BN, int S, int THREADS, bool CM, bool CN, typename T, class Ep, class ForRuns,
          class FreeSmem, class Packs = gc_gemm_packs<Ep, 1, false>,
          class SplitPacks = gc_split_packs<Ep, BM, BN, S, THREADS, false>>
__device__ __forceinline__ void gc_gemm_finish(T* smem, const Ep& ep, int b, int m0, int n0, int M, int N, T* C,
                                               bool vc, ForRuns&& for_runs, FreeSmem&& free_smem,
                                               const Packs& packs = Packs(), const T* acc = nullptr,
                                               const SplitPacks& split_packs = SplitPacks()) {
    if constexpr (S == 1) {
        for_runs([&](int row, int col, T* v) {
            packs.template apply<RUN, CM, CN>(ep, b, m0 + row, n0 + col, M, N, acc, v);
        });
        for_runs([&](int row, int col, T* v) { gc_gemm_store<RUN, CM, CN>(C, m0 + row, n0 + col, M, N, v, vc); });
        if constexpr (gc_ep_mirror<Ep>::value)
            for_runs([&](int row, int col, T* v) {
                gc_gemm_mirror_store<RUN, CM, CN>(ep.mirror(), m0 + row, n0 + col, M, N, v);
            });
    } else if constexpr (gc_ep_partials<Ep>::value) {   // the reader sums the splits: this one's partial, as it is
        T* part = C + (size_t)(blockIdx.z % S) * M * N;
        for_runs([&](int row, int col, T* v) { gc_gemm_store<RUN, CM, CN>(part, m0 + row, n0 + col, M, N, v, vc); });
    } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
        __trap();   // split tiles need thread-block clusters (sm_90); gc_gemm refuses them before launch
#else
        free_smem();
        for_runs([&](int row, int col, T* v) { gc_st_run<RUN>(smem + row * BN + col, v); });
        gc_gemm_split_reduce<BM, BN, S, THREADS, CM, CN>(smem, ep, b, m0, n0, M, N, C, vc, split_packs);
#endif
    }
}

// RA: A is the image input read in place through row indices or from a uint8 source (p.rows, gc_rows) — a
// program whose batch gather is fused into its GEMMs. A's stored rows are the batch's rows: M without TA
// (x @ W), K with TA (x^T @ g). (A float source without indices, the library's input buffer, is a plain
// matrix: gc_gemm launches the RA = false kernel for it.)
template <typename T, bool TA, bool TB, class Tile, class Ep, bool RA>
__global__ void __launch_bounds__(Tile::THREADS, Tile::THREADS >= 256 ? 2 : 384 / Tile::THREADS)
gc_gemm_kernel(const gc_gemm_params<T, Ep> p) {
#if GC_BODIES
    constexpr int BM = Tile::BM, BN = Tile::BN, BK = Tile::BK, TM = Tile::TM, TN = Tile::TN;
    constexpr int S = Tile::SPLIT, THREADS = Tile::THREADS;
    constexpr bool TC = Tile::TF32 != 0;
    static_assert(Tile::TF32 != 3, "gc_gemm: tf32-part (fp32) tiles are pipelined (gc_gemm_tc_kernel)");
    static_assert(!TC || sizeof(T) == 4, "gc_gemm: tf32 tiles are for float GEMMs");
    static_assert(BM % TM == 0 && BN % TN == 0 && BK % 8 == 0, "gc_gemm: tile sizes do not divide");
    static_assert(TC ? (TM % 16 == 0 && TN % 8 == 0) : (TM % 4 == 0 && TN % 4 == 0),
                  "gc_gemm: per-thread (fp32) or per-warp (tf32) tile not a multiple of 4x4 (16x8)");
    static_assert(S >= 1 && S <= 8 && BM % S == 0 && BN % 4 == 0, "gc_gemm: split must be 1..8 and divide BM");
    static_assert(Tile::KW == 1, "gc_gemm: K groups are for fp32 pipelined tiles (gc_gemm_pipe_kernel)");
    // Row padding: tf32 fragment loads hit 32 distinct banks with 8 words; fp32 blocks are read along rows
    // (any padding will do) and 4 words spread the transposed stores of a warp's 16 rows over all banks.
    constexpr int LDA = BM + (TC ? 8 : 4), LDB = BN + (TC ? 8 : 4);
    constexpr int PIPE = 2 * BK * (LDA + LDB), RED = S > 1 ? BM * BN : 0;
    // RA: the row indices this block reads (gc_gemm_block::stage_rows)
    static_assert(!RA || (Tile::SK > 0 && Tile::SM > 0 && sizeof(T) == 4), "gc_gemm: batch rows need a static shape");
    constexpr int NIDX = RA ? gc_gemm_block<T, TA, TB, Tile>::IDX : 1;
    static_assert(((PIPE > RED ? PIPE : RED) * sizeof(T) + NIDX * 4) <= 48 * 1024, "gc_gemm: tile needs over 48 KB of shared memory");
    __shared__ __align__(16) T smem[PIPE > RED ? PIPE : RED];
    __shared__ uint32_t ridx[NIDX];
    T* As = smem;
    T* Bs = smem + 2 * BK * LDA;
    gc_wait_prior();

    // The static shape's bounds checks and vector loads, the block's tile of C and slice of K (gc_gemm_block).
    typedef gc_gemm_block<T, TA, TB, Tile> Block;
    constexpr bool EM = Block::EM, EN = Block::EN, EK = Block::EK;
    const Block blk(p);
    const int M = blk.M, N = blk.N, K = blk.K, m0 = blk.m0, n0 = blk.n0, b = blk.b;
    const int k_begin = blk.k_begin, k_end = blk.k_end, ktiles = blk.ktiles;
    const bool va = blk.va, vb = blk.vb;
    const T* __restrict__ A = p.A + b * p.sa;
    const T* __restrict__ B = p.B + b * p.sb;
    T* __restrict__ C = p.C + b * p.sc;
    if constexpr (RA) blk.stage_rows(ridx, p.rows);

    // A's block is (BM x BK) of A, or (BK x BM) of A stored transposed; B's likewise. Two register sets:
    // with DEEP, a step's loads are issued two steps before their data is stored to shared memory.
    typedef gc_gemm_stage<T, TA ? BK : BM, TA ? BM : BK, THREADS> StageA;
    typedef gc_gemm_stage<T, TB ? BN : BK, TB ? BK : BN, THREADS> StageB;
    StageA ga0, ga1;
    StageB gb0, gb1;
    auto load = [&](StageA& ga, StageB& gb, int kt) {
        const int k0 = k_begin + kt * BK;
        if constexpr (RA) {
            const void* src = p.rows.source;
            if (TA) ga.template load_rows<!EK, !EM>(src, p.rows.u8, ridx + kt * BK, m0, M, k_end - k0, M - m0);
            else    ga.template load_rows<!EM, !EK>(src, p.rows.u8, ridx, k0, K, M - m0, k_end - k0);
        } else {
            if (TA) ga.template load<!EK, !EM>(A + (size_t)k0 * M + m0, M, k_end - k0, M - m0, va);
            else    ga.template load<!EM, !EK>(A + (size_t)m0 * K + k0, K, M - m0, k_end - k0, va);
        }
        if (TB) gb.template load<!EN, !EK>(B + (size_t)n0 * K + k0, K, N - n0, k_end - k0, vb);
        else    gb.template load<!EK, !EN>(B + (size_t)k0 * N + n0, N, k_end - k0, N - n0, vb);
    };
    auto store = [&](StageA& ga, StageB& gb, int buf) {
        if constexpr (RA) ga.template store_rows<!TA, TC>(As + buf * BK * LDA, LDA, p.rows.u8, p.rows.scale);
        else ga.template store<!TA, TC>(As + buf * BK * LDA, LDA);
        gb.template store<TB, TC>(Bs + buf * BK * LDB, LDB);
    };

    // fp32: thread (ty, tx) owns rows g * 4 * MT + 4 * ty + r and columns g * 4 * NT + 4 * tx + r (r < 4):
    // 16-byte groups spread over the tile, so a warp's shared-memory reads are few distinct vectors.
    constexpr int MT = BM / TM, NT = BN / TN;
    const int tx = threadIdx.x % NT, ty = threadIdx.x / NT;
    // tf32: warp (wm, wn) owns a TM x TN tile: (TM / 16) x (TN / 8) mma tiles; lane = 4 * gid + tig.
    constexpr int MI = TC ? TM / 16 : 1, NI = TC ? TN / 8 : 1, WN = BN / TN;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane / 4, tig = lane % 4;
    const int wm = warp / WN, wn = warp % WN;
    T acc[TC ? 1 : TM][TC ? 1 : TN] = {};
    float tacc[MI][NI][4] = {};

    auto compute = [&](int buf) {
        const T* as = As + buf * BK * LDA;
        const T* bs = Bs + buf * BK * LDB;
        if constexpr (!TC) {
#pragma unroll
            for (int k = 0; k < BK; k++) {
                T a[TM], bv[TN];
#pragma unroll
                for (int g = 0; g < TM / 4; g++) gc_ld_run<4>(as + k * LDA + g * 4 * MT + 4 * ty, a + 4 * g);
#pragma unroll
                for (int g = 0; g < TN / 4; g++) gc_ld_run<4>(bs + k * LDB + g * 4 * NT + 4 * tx, bv + 4 * g);
#pragma unroll
                for (int i = 0; i < TM; i++)
#pragma unroll
                    for (int j = 0; j < TN; j++) acc[i][j] += a[i] * bv[j];
            }
        } else {
#pragma unroll
            for (int k = 0; k < BK; k += 8) {
                uint32_t af[MI][4], bf[NI][2];
#pragma unroll
                for (int i = 0; i < MI; i++) {
                    const float* q = (const float*)as + (k + tig) * LDA + wm * TM + i * 16 + gid;
                    af[i][0] = __float_as_uint(q[0]);
                    af[i][1] = __float_as_uint(q[8]);
                    af[i][2] = __float_as_uint(q[4 * LDA]);
                    af[i][3] = __float_as_uint(q[4 * LDA + 8]);
                }
#pragma unroll
                for (int j = 0; j < NI; j++) {
                    const float* q = (const float*)bs + (k + tig) * LDB + wn * TN + j * 8 + gid;
                    bf[j][0] = __float_as_uint(q[0]);
                    bf[j][1] = __float_as_uint(q[4 * LDB]);
                }
#pragma unroll
                for (int i = 0; i < MI; i++)
#pragma unroll
                    for (int j = 0; j < NI; j++) gc_mma_tf32(tacc[i][j], af[i], bf[j]);
            }
        }
    };

    // Step kt computes from buffer kt % 2 while tile kt + 1 waits in registers (ga, gb), then stores it to
    // the other buffer. DEEP (tiles with little work per step, where a load's latency would show): tile
    // kt + 1 was loaded two steps earlier, and tile kt + 3 is loaded into the registers it frees (when
    // the accumulators and two register sets fit; the 8 x 8 fp32 block has work enough to hide a load).
    constexpr int STAGED = (BM * BK + BK * BN) / THREADS, ACCS = TC ? TM * TN / 32 : TM * TN;
    constexpr bool DEEP = ACCS + 2 * STAGED <= 48;
    // The accumulators as runs of RUN consecutive columns at tile coordinates (row, col).
    constexpr int RUN = TC ? 2 : 4;
    auto for_runs = [&](auto&& f) {
        if constexpr (!TC) {
#pragma unroll
            for (int i = 0; i < TM; i++)
#pragma unroll
                for (int g = 0; g < TN / 4; g++) f(i / 4 * 4 * MT + 4 * ty + i % 4, g * 4 * NT + 4 * tx, &acc[i][4 * g]);
        } else {
#pragma unroll
            for (int i = 0; i < MI; i++)
#pragma unroll
                for (int j = 0; j < NI; j++)
#pragma unroll
                    for (int h = 0; h < 2; h++)
                        f(wm * TM + i * 16 + gid + 8 * h, wn * TN + j * 8 + 2 * tig, (T*)&tacc[i][j][2 * h]);
        }
    };

    if (ktiles > 0) load(ga0, gb0, 0);
    gc_gemm_packs<Ep, TM * TN / 4, !TC && S == 1 && EN && gc_ep_packed<Ep, TM * TN / 4>::value> packs;
    packs.template load<RUN, !EM, !EN, S>(p.ep, b, m0, n0, M, N, &acc[0][0], for_runs);   // while tile 0 loads
    if (ktiles > 0) store(ga0, gb0, 0);
    if (DEEP && ktiles > 1) load(ga1, gb1, 1);
    if (DEEP && ktiles > 2) load(ga0, gb0, 2);
    __syncthreads();
    auto step = [&](int kt, StageA& ga, StageB& gb) {
        if (!DEEP && kt + 1 < ktiles) load(ga, gb, kt + 1);
        compute(kt & 1);
        if (kt + 1 < ktiles) store(ga, gb, (kt + 1) & 1);
        if (DEEP && kt + 3 < ktiles) load(ga, gb, kt + 3);
        __syncthreads();
    };
    if constexpr (DEEP) {
        for (int kt = 0; kt < ktiles; kt += 2) {   // by twos: which register set holds a tile is static
            step(kt, ga1, gb1);
            if (kt + 1 < ktiles) step(kt + 1, ga0, gb0);
        }
    } else {
        for (int kt = 0; kt < ktiles; kt++) step(kt, ga0, gb0);
    }

    // (no gc_release_dependents here: the 128 x 128 tf32 tile spilled 32 bytes of registers with it)
    gc_gemm_finish<RUN, BM, BN, S, THREADS, !EM, !EN>(smem, p.ep, b, m0, n0, M, N, C, p.vc, for_runs,
                                                    [] {},   // (the loop's last barrier freed the buffers)
                                                    packs, &acc[0][0]);
#endif
}

// ---- the pipelined kernel (tiles with STAGES > 0) -------------------------------------------------------
// cp.async (sm_80): a SIZE-byte copy from global to shared memory that bypasses registers; a dead copy
// (live false) writes zeros and reads nothing (its source address may lie outside the matrix). Copies are
// grouped (commit) and waited for by group: all but the newest N. Before sm_80: a plain copy through a
// register, and nothing to wait for.
template <int SIZE>
__device__ __forceinline__ void gc_cp_async(void* dst, const void* src, bool live) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    if constexpr (SIZE == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(d), "l"(src), "r"(live ? 16 : 0));
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;" :: "r"(d), "l"(src), "n"(SIZE), "r"(live ? SIZE : 0));
#else
    struct alignas(SIZE) chunk { unsigned w[SIZE / 4]; };
    chunk v = {};
    if (live) v = *reinterpret_cast<const chunk*>(src);
    *reinterpret_cast<chunk*>(dst) = v;
#endif
}
__device__ __forceinline__ void gc_cp_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void gc_cp_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory");
#endif
}

// The K loop of the pipelined kernels (gc_gemm_pipe_kernel, gc_gemm_tc_kernel), KT steps through ST
// shared-memory buffers. Steps 0..ST-1 start on their way (load(buf, kt); a group each, empty past the
// end, so that the count of groups in flight is the same at every step) and meanwhile() runs (the
// epilogue prefetch). A step is SLICES slices: fragments(buf, slice, set) reads a slice of the step in
// buffer buf into register set `set` (0 or 1), compute(set) computes one from it; a slice's fragments are
// read while the previous slice is computed. At the last slice of step kt, once step kt + 1 has arrived
// (all but the newest ST - 2 groups) and every thread has read its last fragments of step kt (the
// barrier), step kt + ST goes into kt's buffer and step kt + 1's first fragments are read. compute gets
// the slice's index in its step too; step_end() runs after each step's last slice is computed.
template <int ST, int SLICES, class Load, class Meanwhile, class Fragments, class Compute, class StepEnd>
__device__ __forceinline__ void gc_pipeline(int ktiles, Load&& load, Meanwhile&& meanwhile, Fragments&& fragments,
                                            Compute&& compute, StepEnd&& step_end) {
    for (int s = 0; s < ST; s++) {
        if (s < ktiles) load(s, s);
        gc_cp_commit();
    }
    meanwhile();
    gc_cp_wait<ST - 1>();
    __syncthreads();
    fragments(0, 0, 0);
    int cur = 0;
    for (int kt = 0; kt < ktiles; kt++) {
        const int next = cur + 1 == ST ? 0 : cur + 1;
#pragma unroll
        for (int k = 0; k < SLICES; k++) {
            if (k < SLICES - 1) {
                fragments(cur, k + 1, (k + 1) % 2);
            } else {
                gc_cp_wait<ST - 2>();
                __syncthreads();
                if (kt + ST < ktiles) load(cur, kt + ST);
                gc_cp_commit();
                fragments(next, 0, (k + 1) % 2);   // past the end: unused
            }
            compute(k % 2, k);
        }
        step_end();
        cur = next;
    }
}

// The K steps of an operand, copied to shared memory k-major: s[k * LD + x] for k < BK, x < X (BM or BN),
// from a row-major matrix with row stride ld. ALONG: the matrix's rows are k and x is contiguous (16-byte
// copies where vec allows, else one element each); else its rows are x and k is contiguous: element copies
// that transpose, a warp's 32 covering 8 consecutive k (32 bytes of a row) of 4 rows, which land in 32
// distinct banks (LD is 4 words over a multiple of 32). CK / CX: k / x may run past the matrix (zeros are
// copied in there). A thread's copies are its first one plus compile-time offsets: the addresses of a step
// are one pointer and immediates, not a register pair per copy held over the K loop.
template <typename T, int BK, int X, int LD, int THREADS, bool ALONG, bool CK, bool CX>
struct gc_pipe_operand {
    static constexpr int W = 16 / sizeof(T);
    static constexpr int ROW = X / W, DK = THREADS / ROW;   // vector copies: chunks of a row, rows a pass covers
    static constexpr int R = THREADS / 8;                   // transposing copies: rows of the matrix a pass covers
    static_assert(X % W == 0 && BK % 8 == 0 && THREADS % ROW == 0 && BK % DK == 0 && X % R == 0 &&
                  (THREADS % X == 0 || X % THREADS == 0), "gc_gemm: pipelined tile sizes");
    const T* from;   // this thread's first copy at K step 0
    long long ld;
    int to, k1, x1, x_left;
    bool vec;

    // This thread's first copy: element (k1, x1) of the step (vec: 16-byte copies along the rows).
    __device__ __forceinline__ static void place(bool vector, int& k1, int& x1) {
        const int t = threadIdx.x;
        if (vector) { k1 = t / ROW; x1 = t % ROW * W; }
        else if (ALONG) { k1 = t / X; x1 = t % X; }
        else { k1 = t % 8; x1 = t / 8; }
    }
    // src: the matrix's element (k, x) = (0, x0); x_left: x left in the matrix from x0.
    __device__ __forceinline__ gc_pipe_operand(const T* src, long long ld_, int x_left_, bool vec_)
        : ld(ld_), x_left(x_left_), vec(ALONG && vec_) {
        place(vec, k1, x1);
        from = src + (ALONG ? k1 * ld + x1 : x1 * ld + k1);
        to = k1 * LD + x1;
    }

    // K step [k0, k0 + BK) into s; k_left: K - k0.
    __device__ __forceinline__ void copy(T* s, int k0, int k_left) const {
        const T* f = from + (ALONG ? k0 * ld : k0);
        T* d = s + to;
        if (ALONG && vec) {   // x_left is a multiple of W here: a chunk is wholly inside or outside
#pragma unroll
            for (int i = 0; i < BK / DK; i++) {
                const bool live = (!CK || k1 + i * DK < k_left) && (!CX || x1 < x_left);
                gc_cp_async<16>(d + i * DK * LD, f + i * DK * ld, live);
            }
        } else if (ALONG) {   // unaligned or odd rows: one element a copy, a loop (rare, registers for the rest)
#pragma unroll 1
            for (int i = 0; i < BK * X / THREADS; i++) {
                const int dk = i * THREADS / X, dx = i * THREADS % X;
                const bool live = (!CK || k1 + dk < k_left) && (!CX || x1 + dx < x_left);
                gc_cp_async<sizeof(T)>(d + dk * LD + dx, f + dk * ld + dx, live);
            }
        } else {
#pragma unroll
            for (int i = 0; i < BK * X / THREADS; i++) {
                // copy i: (k, x) = (k1 + dk, x1 + dx)
                const int dk = i * R / X * 8, dx = i * R % X;
                const bool live = (!CK || k1 + dk < k_left) && (!CX || x1 + dx < x_left);
                gc_cp_async<sizeof(T)>(d + dk * LD + dx, f + dx * ld + dk, live);
            }
        }
    }
};

// gc_pipe_operand's copies for A read in place (RA) from float rows (gc_rows without u8): the matrix's
// rows are the batch's, stored row r being source row idx[r] (the block's indices, staged in shared memory
// by gc_gemm_block::stage_rows). ALONG (A transposed: x^T @ g): the rows are k, idx counting from the
// split's first k (kb), x from x0 on; else the rows are x (the block's BM rows), each thread's few rows
// looked up once (their pointers held), k contiguous. The same thread mapping and shared-memory places as
// gc_pipe_operand's; only the source addresses differ.
template <typename T, int BK, int X, int LD, int THREADS, bool ALONG, bool CK, bool CX>
struct gc_pipe_rows {
    typedef gc_pipe_operand<T, BK, X, LD, THREADS, ALONG, CK, CX> Plain;
    static constexpr int W = Plain::W, ROW = Plain::ROW, DK = Plain::DK, R = Plain::R;
    static constexpr int NR = ALONG ? 1 : X / R;   // the rows a thread copies (transposing copies)
    const T* src;
    const uint32_t* idx;
    const T* row[NR];
    long long ld;
    int x0, kb, to, k1, x1, x_left;
    bool vec;

    __device__ __forceinline__ gc_pipe_rows(const T* source, const uint32_t* idx_, long long ld_, int x0_, int kb_,
                                            int x_left_, bool vec_)
        : src(source), idx(idx_), ld(ld_), x0(x0_), kb(kb_), x_left(x_left_), vec(ALONG && vec_) {
        Plain::place(vec, k1, x1);
        to = k1 * LD + x1;
        if constexpr (!ALONG) {
#pragma unroll
            for (int j = 0; j < NR; j++) row[j] = src + (long long)idx[x1 + j * R] * ld + k1;
        }
    }

    __device__ __forceinline__ void copy(T* s, int k0, int k_left) const {
        T* d = s + to;
        if (ALONG && vec) {
#pragma unroll
            for (int i = 0; i < BK / DK; i++) {
                const int k = k1 + i * DK;
                const bool live = (!CK || k < k_left) && (!CX || x1 < x_left);
                gc_cp_async<16>(d + i * DK * LD, live ? src + (long long)idx[k0 - kb + k] * ld + x0 + x1 : src, live);
            }
        } else if (ALONG) {
#pragma unroll 1
            for (int i = 0; i < BK * X / THREADS; i++) {
                const int dk = i * THREADS / X, dx = i * THREADS % X;
                const bool live = (!CK || k1 + dk < k_left) && (!CX || x1 + dx < x_left);
                gc_cp_async<sizeof(T)>(d + dk * LD + dx,
                                       live ? src + (long long)idx[k0 - kb + k1 + dk] * ld + x0 + x1 + dx : src, live);
            }
        } else {
#pragma unroll
            for (int i = 0; i < BK * X / THREADS; i++) {
                const int dk = i * R / X * 8, dx = i * R % X;
                const bool live = (!CK || k1 + dk < k_left) && (!CX || x1 + dx < x_left);
                gc_cp_async<sizeof(T)>(d + dk * LD + dx, row[dx / R] + k0 + dk, live);
            }
        }
    }
};

// Shared memory of a pipelined tile: STAGES K steps of A (BK x (BM + 4)) and B (BK x (BN + 4)), k-major;
// then the partial tiles (BM x BN): groups 1..KW-1's, and the split's sum.
template <typename T, class Tile>
struct gc_pipe_smem {
    static constexpr size_t pipe = (size_t)Tile::STAGES * Tile::BK * (Tile::BM + 4 + Tile::BN + 4) * sizeof(T);
    static constexpr int tiles = Tile::KW - 1 > (Tile::SPLIT > 1) ? Tile::KW - 1 : (Tile::SPLIT > 1);
    static constexpr size_t red = (size_t)tiles * Tile::BM * Tile::BN * sizeof(T);
    static constexpr size_t bytes = pipe > red ? pipe : red;
};

// The pipelined kernel: fp32 FMAs on TM x TN register blocks as gc_gemm_kernel's, fed differently. The K
// steps go through STAGES shared-memory buffers filled by cp.async (STAGES - 1 steps in flight while one is
// computed, one barrier per step, no registers held for loads); each k's A and B fragments are read while
// the previous k's FMAs run (two register sets). A warp takes a 4 x 8 patch of the thread grid: a k's
// reads are 4 distinct vectors of A and 8 of B (ncu, b1000 x @ W1: 2.4 shared-memory wavefronts a read).
// Split-K and the epilogue prefetch as gc_gemm_kernel's. RA: A is the image input read in place from float
// rows (gc_pipe_rows; cp.async copies, it does not convert uint8 ones: the trainer gives such GEMMs floats).
template <typename T, bool TA, bool TB, class Tile, class Ep, bool RA = false>
__global__ void __launch_bounds__(Tile::THREADS, Tile::TM * Tile::TN * sizeof(T) <= 256 ? 2 : 1)
gc_gemm_pipe_kernel(const gc_gemm_params<T, Ep> p) {
#if GC_BODIES
    constexpr int BM = Tile::BM, BN = Tile::BN, BK = Tile::BK, TM = Tile::TM, TN = Tile::TN;
    constexpr int ST = Tile::STAGES, S = Tile::SPLIT, THREADS = Tile::THREADS, KW = Tile::KW, GT = THREADS / KW;
    static_assert(!Tile::TF32 && ST >= 2, "gc_gemm: pipelined tiles are fp32, 2+ stages");
    static_assert(KW >= 1 && BK % KW == 0 && GT % 32 == 0, "gc_gemm: K groups must divide BK, whole warps each");
    static_assert(S >= 1 && S <= 8 && BM % S == 0, "gc_gemm: split must be 1..8 and divide BM");
    static_assert(BM % TM == 0 && BN % TN == 0 && TM % 4 == 0 && TN % 4 == 0, "gc_gemm: tile sizes do not divide");
    constexpr int LDA = BM + 4, LDB = BN + 4, STAGE = BK * (LDA + LDB);
    static_assert(gc_pipe_smem<T, Tile>::bytes <= 227 * 1024, "gc_gemm: pipelined tile needs over 227 KB of shared memory");
    constexpr int MT = BM / TM, NT = BN / TN, PW = NT < 8 ? NT : 8, PH = 32 / PW;
    static_assert(MT % PH == 0 && NT % PW == 0, "gc_gemm: no 4 x 8 warp patches");
    extern __shared__ __align__(16) unsigned char gc_dynamic_smem[];
    T* smem = reinterpret_cast<T*>(gc_dynamic_smem);
    gc_wait_prior();

    // As gc_gemm_kernel's (gc_gemm_block g): bounds checks the static shape rules out compiled away, 16-byte
    // copies where allowed, the block's tile of C and slice of K.
    typedef gc_gemm_block<T, TA, TB, Tile> Block;
    const Block g(p);
    const T* __restrict__ A = p.A + g.b * p.sa;
    const T* __restrict__ B = p.B + g.b * p.sb;
    T* __restrict__ C = p.C + g.b * p.sc;
    static_assert(!RA || (Tile::SK > 0 && Tile::SM > 0 && sizeof(T) == 4), "gc_gemm: batch rows need a static shape");
    __shared__ uint32_t ridx[RA ? Block::IDX : 1];   // RA: the row indices this block reads
    if constexpr (RA) g.stage_rows(ridx, p.rows);

    // A's steps are (BK x BM) of A stored transposed (TA) or (BM x BK) of A; B's likewise.
    typedef gc_pipe_operand<T, BK, BM, LDA, THREADS, TA, !Block::EK, !Block::EM> OperandA;
    typedef gc_pipe_operand<T, BK, BN, LDB, THREADS, !TB, !Block::EK, !Block::EN> OperandB;
    const auto oa = [&] {
        if constexpr (RA)
            return gc_pipe_rows<T, BK, BM, LDA, THREADS, TA, !Block::EK, !Block::EM>(
                (const T*)p.rows.source, ridx, TA ? g.M : g.K, TA ? g.m0 : 0, g.k_begin, g.M - g.m0, g.va);
        else
            return OperandA(A + (TA ? g.m0 : (size_t)g.m0 * g.K), TA ? g.M : g.K, g.M - g.m0, g.va);
    }();
    const OperandB ob(B + (TB ? (size_t)g.n0 * g.K : g.n0), TB ? g.K : g.N, g.N - g.n0, g.vb);
    auto load = [&](int buf, int kt) {   // K step kt into buffer buf
        const int k0 = g.k_begin + kt * BK;
        oa.copy(smem + buf * STAGE, k0, g.k_end - k0);
        ob.copy(smem + buf * STAGE + BK * LDA, k0, g.k_end - k0);
    };

    // Thread (ty, tx) of its K group owns rows g * 4 * MT + 4 * ty + r and columns g * 4 * NT + 4 * tx + r
    // (r < 4), as in gc_gemm_kernel; warp w of the group takes the patch of PH rows and PW columns of the
    // (ty, tx) grid at its place.
    const int group = KW > 1 ? threadIdx.x / GT : 0;
    const unsigned warp = threadIdx.x % GT / 32, lane = threadIdx.x % 32;
    const int ty = warp / (NT / PW) * PH + lane / PW, tx = warp % (NT / PW) * PW + lane % PW;
    T acc[TM][TN] = {};
    T a[2][TM], bv[2][TN];
    auto fragments = [&](const T* as, int k, T* a, T* bv) {
        const T* bs = as + BK * LDA;
#pragma unroll
        for (int g = 0; g < TM / 4; g++) gc_ld_run<4>(as + k * LDA + g * 4 * MT + 4 * ty, a + 4 * g);
#pragma unroll
        for (int g = 0; g < TN / 4; g++) gc_ld_run<4>(bs + k * LDB + g * 4 * NT + 4 * tx, bv + 4 * g);
    };

    // The accumulators as runs of 4 columns at tile coordinates (row, col).
    auto for_runs = [&](auto&& f) {
#pragma unroll
        for (int i = 0; i < TM; i++)
#pragma unroll
            for (int g = 0; g < TN / 4; g++) f(i / 4 * 4 * MT + 4 * ty + i % 4, g * 4 * NT + 4 * tx, &acc[i][4 * g]);
    };
    // A slice is one k of the step for each K group (k = slice * KW + group); the epilogue prefetch (group 0,
    // which applies it) while the first steps are on their way (split tiles: not yet).
    gc_gemm_packs<Ep, TM * TN / 4, S == 1 && Block::EN && gc_ep_packed<Ep, TM * TN / 4>::value> packs;
    gc_pipeline<ST, BK / KW>(g.ktiles, load, [&] {
        if (group == 0)
            packs.template load<4, !Block::EM, !Block::EN, S>(p.ep, g.b, g.m0, g.n0, g.M, g.N, &acc[0][0], for_runs);
    }, [&](int buf, int k, int set) { fragments(smem + buf * STAGE, k * KW + group, a[set], bv[set]); }, [&](int set, int) {
#pragma unroll
        for (int i = 0; i < TM; i++)
#pragma unroll
            for (int j = 0; j < TN; j++) acc[i][j] += a[set][i] * bv[set][j];
    }, [] {});
    if constexpr (KW > 1) {   // group 0 adds the other groups' sums to its own, in group order
        __syncthreads();      // every warp is past its last reads of the buffers
        if (group > 0)
            for_runs([&](int row, int col, T* v) { gc_st_run<4>(smem + (group - 1) * BM * BN + row * BN + col, v); });
        __syncthreads();
        if (group > 0 && S == 1) return;
        if (group == 0)
            for_runs([&](int row, int col, T* v) {
#pragma unroll
                for (int w = 1; w < KW; w++) {
                    T u[4];
                    gc_ld_run<4>(smem + (w - 1) * BM * BN + row * BN + col, u);
#pragma unroll
                    for (int r = 0; r < 4; r++) v[r] += u[r];
                }
            });
    }
    gc_release_dependents(p.release);
    // (with K groups, group 0's sums are the block's: only it stores them, into the places it read group 1's)
    gc_gemm_finish<4, BM, BN, S, THREADS, !Block::EM, !Block::EN>(smem, p.ep, g.b, g.m0, g.n0, g.M, g.N, C, p.vc,
                                                                  [&](auto&& f) { if (group == 0) for_runs(f); }, [] {
        if constexpr (KW == 1) __syncthreads();   // every warp is past its last reads of the buffers
    }, packs, &acc[0][0]);
#endif
}

// Whether this device launches thread-block clusters (asked once).
static bool gc_cluster_launch_supported() {
    static int supported = -1;
    if (supported < 0) {
        int dev = 0, value = 0;
        supported = cudaGetDevice(&dev) == cudaSuccess &&
                    cudaDeviceGetAttribute(&value, cudaDevAttrClusterLaunch, dev) == cudaSuccess && value;
    }
    return supported == 1;
}

// A pipelined kernel's launch (fp32, mma.sync and wgmma alike): its dynamic shared memory (over 48 KB, the
// kernel's limit is raised, once), a cluster for a split; `more`: parameters after the GEMM's (the
// warp-specialized kernel's tensor map of B).
template <auto Kernel, class Tile, typename Params, typename... More>
static int gc_gemm_launch_pipelined(dim3 grid, cudaLaunchAttribute* cluster, size_t smem, const Params& p,
                                    const More&... more) {
    GC_TRY(gc_raise_smem<Kernel>(smem));
    return gc_launch_smem(Kernel, grid, Tile::THREADS, smem, cluster, cluster && Tile::SPLIT > 1, p, more...);
}

// The tf32 tensor-core pipeline's launch (gc_gemm_tc.cuh: tiles with TF32 and STAGES > 0; RA too).
template <typename T, bool TA, bool TB, class Tile, class Ep, bool RA>
static int gc_gemm_tc_launch(dim3 grid, cudaLaunchAttribute* cluster, const gc_gemm_params<T, Ep>& p);
// The short-K tensor-core kernel's launch (gc_gemm_sk.cuh: tiles with TF32 = 5; RA from float rows).
template <typename T, bool TA, bool TB, class Tile, class Ep, bool RA>
static int gc_gemm_sk_launch(dim3 grid, cudaLaunchAttribute* cluster, const gc_gemm_params<T, Ep>& p);
// The wgmma kernel's launch (gc_gemm_wgmma.cuh: tiles with TF32 = 2; RA from float rows).
template <typename T, bool TA, bool TB, class Tile, class Ep, bool RA>
static int gc_gemm_wg_launch(dim3 grid, cudaLaunchAttribute* cluster, const gc_gemm_params<T, Ep>& p);

// The warp-specialized wgmma kernel's launch (gc_gemm_ws.cuh: tiles with TF32 = 6, A not transposed; RA from
// float rows).
template <typename T, bool TA, bool TB, class Tile, class Ep, bool RA>
static int gc_gemm_ws_launch(dim3 grid, cudaLaunchAttribute* cluster, const gc_gemm_params<T, Ep>& p);

// The fp32 pipelined kernel's launch (its dynamic shared memory; a cluster for a split).
template <typename T, bool TA, bool TB, class Tile, class Ep, bool RA>
static int gc_gemm_pipe_launch(dim3 grid, cudaLaunchAttribute* cluster, const gc_gemm_params<T, Ep>& p) {
    return gc_gemm_launch_pipelined<gc_gemm_pipe_kernel<T, TA, TB, Tile, Ep, RA>, Tile>(
        grid, cluster, gc_pipe_smem<T, Tile>::bytes, p);
}

// The launch of both forms of A (RA: the image input in place, A = its source).
template <typename T, bool TA, bool TB, class Tile, class Ep, bool RA>
static int gc_gemm_launch(const T* A, gc_rows rows, const T* B, T* C, int M, int N, int K, Ep ep, int batch,
                          long long sa, long long sb, long long sc, bool release) {
    GC_TRY(gc_gemm_check<Tile>(M, N, K, batch));
    if (M == 0 || N == 0 || batch == 0) return GC_OK;
    constexpr int W = 16 / sizeof(T), S = Tile::SPLIT;
    gc_gemm_params<T, Ep> p = {A, B, C, M, N, K, sa, sb, sc, ep, rows, gc_gemm_vectors(A, TA ? M : K, sa, W, batch),
                               gc_gemm_vectors(B, TB ? K : N, sb, W, batch), gc_gemm_vectors(C, N, sc, 4, batch),
                               release};
    const long long tiles = (long long)((M + Tile::BM - 1) / Tile::BM) * ((N + Tile::BN - 1) / Tile::BN);
    if (tiles > 0x7fffffffLL || (long long)batch * S > 65535)
        return gc_fail(GC_ERR_ARG, "gc_gemm: M=%d N=%d batch=%d is too large for one launch", M, N, batch);
    dim3 grid((unsigned)tiles, 1, batch * S);
    constexpr bool clustered = S > 1 && !gc_ep_partials<Ep>::value;   // partials: no cluster sums them
    if (gc_ep_partials<Ep>::value && (S == 1 || batch != 1))
        return gc_fail(GC_ERR_ARG, "gc_gemm: split partials for their reader need a split tile and one matrix "
                       "(split %d, batch %d)", S, batch);
    if (clustered && !gc_cluster_launch_supported())
        return gc_fail(GC_ERR_DEVICE, "gc_gemm: this GEMM splits K over a thread-block cluster, which this "
                       "GPU cannot launch (sm_90 or newer needed)");
    cudaLaunchAttribute cluster;
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = 1;
    cluster.val.clusterDim.y = 1;
    cluster.val.clusterDim.z = S;
    cudaLaunchAttribute* cl = clustered ? &cluster : nullptr;
    // The fp32 pipelined, the wgmma and the short-K tensor-core kernels copy A's rows (cp.async) without
    // converting them: float rows only where they read the image input in place
    // (gemm_tiles.Tile.float_rows_only; the mma.sync pipeline converts uint8 rows as it stages them).
    if constexpr (Tile::STAGES > 0 && Tile::TF32 != 1 && Tile::TF32 != 3 && !(Tile::TF32 == 4 && TA)) {
        if (RA && rows.u8)
            return gc_fail(GC_ERR_ARG, "gc_gemm: a %s tile reads the image input in place from float rows only, "
                           "and these are uint8 (the trainer converts them where such a tile reads them: "
                           "GC_X_FLOAT)", Tile::TF32 == 5 || Tile::TF32 == 7 ? "short-K tensor-core"
                           : Tile::TF32 == 2 || Tile::TF32 == 4 || Tile::TF32 == 6 ? "wgmma" : "pipelined fp32");
    }
    if constexpr (Tile::TF32 == 5 || Tile::TF32 == 7) {
        return gc_gemm_sk_launch<T, TA, TB, Tile, Ep, RA>(grid, cl, p);
    } else if constexpr (Tile::TF32 == 2 || Tile::TF32 == 4) {
        return gc_gemm_wg_launch<T, TA, TB, Tile, Ep, RA>(grid, cl, p);
    } else if constexpr (Tile::TF32 == 6) {
        if constexpr (TA)
            return gc_fail(GC_ERR_ARG, "gc_gemm: a warp-specialized wgmma tile (TF32 = 6) takes A not transposed");
        else return gc_gemm_ws_launch<T, TA, TB, Tile, Ep, RA>(grid, cl, p);
    } else if constexpr (Tile::TF32 && Tile::STAGES > 0) {
        return gc_gemm_tc_launch<T, TA, TB, Tile, Ep, RA>(grid, cl, p);
    } else if constexpr (Tile::STAGES > 0) {   // rows read in place (RA) through gc_pipe_rows
        return gc_gemm_pipe_launch<T, TA, TB, Tile, Ep, RA>(grid, cl, p);
    } else {
        if (!clustered) return gc_launch(gc_gemm_kernel<T, TA, TB, Tile, Ep, RA>, grid, Tile::THREADS, p);
        return gc_launch_ex(gc_gemm_kernel<T, TA, TB, Tile, Ep, RA>, grid, Tile::THREADS, cl, 1, p);
    }
}

template <typename T, bool TA, bool TB, class Tile, class Ep>
static int gc_gemm(const T* A, const T* B, T* C, int M, int N, int K, Ep ep, int batch = 1, long long sa = 0,
                   long long sb = 0, long long sc = 0, bool release = false) {
    return gc_gemm_launch<T, TA, TB, Tile, Ep, false>(A, gc_rows{}, B, C, M, N, K, ep, batch, sa, sb, sc, release);
}

// A read in place: the image input x (batch, row) of a program whose batch gather is fused into its GEMMs.
// The library's input buffer (float rows 0..batch-1) is a plain matrix: the kernel every other GEMM of this
// tile and epilogue is, with the same loads. Indexed rows or uint8 data (the trainer's dataset) take the
// kernel that reads rows (RA): two instantiations, so that the plain one keeps its registers and speed.
template <typename T, bool TA, bool TB, class Tile, class Ep>
static int gc_gemm(gc_rows A, const T* B, T* C, int M, int N, int K, Ep ep, int batch = 1, long long = 0,
                   long long sb = 0, long long sc = 0, bool release = false) {
    if (!A.source) return gc_fail(GC_ERR_ARG, "gc_gemm: no batch input set (gc_batch_input) for the image input");
    if (!A.index && !A.u8)
        return gc_gemm_launch<T, TA, TB, Tile, Ep, false>((const T*)A.source, A, B, C, M, N, K, ep, batch, 0, sb, sc,
                                                          release);
    // the rows kernel moves runs of 4 elements (plan_memory.batch_rows wants rows of a multiple of 4)
    if ((TA ? M : K) % 4 || (uintptr_t)A.source % (A.u8 ? 4 : 16))
        return gc_fail(GC_ERR_ARG, "gc_gemm: the image input's rows (%d elements, at %p) are not 4-element runs",
                       TA ? M : K, A.source);
    return gc_gemm_launch<T, TA, TB, Tile, Ep, true>((const T*)A.source, A, B, C, M, N, K, ep, batch, 0, sb, sc,
                                                     release);
}
#endif   // GC_KERNELS
