// gc_kernels_cuda.cuh — generic CUDA kernels the generated launchers instantiate with static shapes:
// the fixed-order reductions fused kernels use, the batch gather (uint8 -> float on the device) or the
// batch's row indices (where the GEMMs read x in place), and the accuracy count (the GEMM is
// gc_gemm_cuda.cuh). Reductions use a fixed-shape tree in shared memory and no atomics on floats, so every
// run is bit-for-bit reproducible.

#if GC_KERNELS   // every kernels part (gc_runtime.h)
#define GC_BLOCK 256

// V consecutive elements of T moved as one access (a float4 for V = 4 floats): the map kernels' vector loop.
template <typename T, int V>
struct alignas(sizeof(T) * V) gc_vec {
    T v[V];
};

// An operand of a GEMM epilogue's pack (load4, gc_gemm_cuda.cuh), loaded where the pack is loaded. The packs
// are loaded while the first K steps are on their way; as plain loads the compilers moved them to their use
// after the K loop: the front end into the branch of a where() (the learning rate loaded only once the guard
// had come, a round trip after it), ptxas behind the last barrier, one run's operands after another's. As
// volatile asm the front end keeps them unconditional and in order, and ptxas issues every run's loads
// together (H100, 8 interleaved rounds, the trainer with this GPU's record: MLP b128 15.14 -> 14.49 us a
// step; b1000 unchanged, docs/compiler.md). Weak loads (L1 as before); relaxed gpu-scope ones (L2 only) gave
// b128 14.67 and tf32 b1000 36.13. Other sizes load plainly.
template <typename T>
__host__ __device__ __forceinline__ T gc_pack_load(const T* p) {
#ifdef __CUDA_ARCH__
    T v;
    if constexpr (sizeof(T) == 4) {
        uint32_t u;
        asm volatile("ld.global.b32 %0, [%1];" : "=r"(u) : "l"(p));
        memcpy(&v, &u, 4);
    } else if constexpr (sizeof(T) == 8) {
        uint64_t u;
        asm volatile("ld.global.b64 %0, [%1];" : "=l"(u) : "l"(p));
        memcpy(&v, &u, 8);
    } else if constexpr (sizeof(T) == 16 && alignof(T) == 16) {
        uint32_t u[4];
        asm volatile("ld.global.v4.b32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(u[0]), "=r"(u[1]), "=r"(u[2]), "=r"(u[3]) : "l"(p));
        memcpy(&v, u, 16);
    } else {
        v = *p;
    }
    return v;
#else
    return *p;
#endif
}

// One step of a fixed-order reduction: mine + o, or the max of the two (a max keeps a NaN, as numpy's does).
template <typename T, bool MAX>
__device__ __forceinline__ T gc_combine(T mine, T o) {
    return MAX ? (o > mine || o != o ? o : mine) : mine + o;
}

// Sum (or max) of v over the SY threads y of column x, thread t = x + SX * y of a block of SX * SY threads,
// in a fixed tree order: at each level h = SY/2, SY/4, ..., 1, thread t < h * SX adds thread t + h * SX's
// value; every thread of the column gets the result. `scratch` holds SX * SY values of T. A block of
// GC_BLOCK threads may reduce over its first SX * SY threads only (the others' values are ignored). The
// levels whose partner is in another warp (h * SX >= 32) go through shared memory, a barrier each; the rest
// are warp 0's shuffles — the same pairs in the same order, so the same bits, with 4 barriers fewer for a
// whole block (10 -> 6).
template <typename T, bool MAX, int SX, int SY>
__device__ T gc_reduce_columns(T v, void* scratch) {
    if (SY == 1) return v;
    T* s = (T*)scratch;
    s[threadIdx.x] = v;
    __syncthreads();
    int h = SY / 2;
    for (; h > 0 && h * SX >= 32; h >>= 1) {
        if (threadIdx.x < h * SX) s[threadIdx.x] = gc_combine<T, MAX>(s[threadIdx.x], s[threadIdx.x + h * SX]);
        __syncthreads();
    }
    if (h > 0) {   // lanes t < 2 h SX <= 32 hold the values the remaining levels combine
        if (threadIdx.x < 32) {
            T w = s[threadIdx.x];
            for (; h > 0; h >>= 1) w = gc_combine<T, MAX>(w, __shfl_down_sync(0xffffffffu, w, h * SX));
            if (threadIdx.x < SX) s[threadIdx.x] = w;
        }
        __syncthreads();
    }
    T r = s[threadIdx.x % SX];
    __syncthreads();
    return r;
}

// The same over the 32 lanes of each warp (a warp's slice: lower.py's warp rows; gc_row_gemm's sums), without
// shared memory or a barrier: the tree gc_reduce_columns<T, MAX, 1, 32> would make (lane t adds lane t + h at
// h = 16, 8, .., 1), by shuffles; every lane gets lane 0's result.
template <typename T, bool MAX>
__device__ __forceinline__ T gc_reduce_lanes(T v) {
#pragma unroll
    for (int h = 16; h > 0; h >>= 1) v = gc_combine<T, MAX>(v, __shfl_down_sync(0xffffffffu, v, h));
    return __shfl_sync(0xffffffffu, v, 0);
}

// Sum (or max) of the values of lane 0 of warps 0 .. C - 1 (warp rows' slices: their global reductions), in
// the order gc_reduce_columns<T, MAX, 1, C> takes threads 0 .. C - 1's (the slices' partials in the tree they
// take with a thread a slice).
template <typename T, bool MAX, int C>
__device__ T gc_reduce_warp_leads(T v, void* scratch) {
    static_assert(C <= GC_BLOCK / 32, "gc_reduce_warp_leads: a value a warp");
    T* s = (T*)scratch;
    if (threadIdx.x % 32 == 0 && threadIdx.x / 32 < C) s[threadIdx.x / 32] = v;
    __syncthreads();
    const T w = threadIdx.x < C ? s[threadIdx.x] : v;   // (read before gc_reduce_columns stores over it)
    return gc_reduce_columns<T, MAX, 1, C>(w, scratch);
}

// Sum (or max) of one value per thread over a block of GC_BLOCK threads, in a fixed order.
template <typename T, bool MAX>
__device__ T gc_block_reduce(T v, T* shared) {
    return gc_reduce_columns<T, MAX, 1, GC_BLOCK>(v, shared);
}

// ---- a reduction over several blocks ------------------------------------
// A rows kernel whose slices feed a global reduction (the batch-mean loss) runs on several blocks: each block
// reduces its slices, thread 0 stores the block's partials, and the last block to arrive sums them in block
// order and finishes the kernel. `ticket` is an int of the arena's workspace (zero when the arena is made);
// the last block sets it back to zero, so the next launch (a graph replay) finds it so. No float atomics:
// the sums' order is fixed, and results are bit-for-bit the same run to run.
static __device__ bool gc_last_block(unsigned int* ticket, unsigned int blocks) {
    // The barrier orders every thread's writes before thread 0's; thread 0's ticket is a release (this
    // block's partials, and what the barrier ordered before it, are visible before the ticket is) and an
    // acquire (the last block sees every block's partials), and the second barrier passes that on to the
    // block's other threads. Only thread 0 waits for memory: a __threadfence in every thread, as before, made
    // the whole block wait for its own stores (MLP step b1000 on an H100: 57.5 -> 56.5 us).
    __shared__ bool last;
    __syncthreads();
    if (threadIdx.x == 0) {
#if __CUDA_ARCH__ >= 700
        unsigned int before;
        asm volatile("atom.add.acq_rel.gpu.u32 %0, [%1], 1;" : "=r"(before) : "l"(ticket) : "memory");
#else
        __threadfence();
        const unsigned int before = atomicAdd(ticket, 1u);
        __threadfence();
#endif
        last = before == blocks - 1;
        if (last) *ticket = 0;
    }
    __syncthreads();
    return last;
}

// Bring the line holding p into this SM's L1: a kernel's last block reads the scalars its global part needs
// (the guard's state, the step) after the ticket's round trip, and they are in L1 by then. Only for what
// this kernel does not write (another SM's store would leave the line stale).
__device__ __forceinline__ void gc_prefetch_l1(const void* p) {
    asm volatile("prefetch.global.L1 [%0];" :: "l"(p));
}

// The sum (or max) of `blocks` blocks' partials in block order, by one block: thread t takes partials t,
// t + GC_BLOCK, ... in order (load(j): block j's), then a fixed tree across the block. The last block to
// arrive (gc_reduce_partials) and a chain's collector (gc_collect_partials) both sum this way: the same bits.
template <typename T, bool MAX, typename Load>
__device__ T gc_sum_partials(int blocks, T init, void* scratch, Load load) {
    T v = init;
    for (int j = threadIdx.x; j < blocks; j += GC_BLOCK) v = gc_combine<T, MAX>(v, load(j));
    return gc_reduce_columns<T, MAX, 1, GC_BLOCK>(v, scratch);
}

// The last block's sum (or max) of the blocks' partials. Partials are read past L1 (__ldcg): they were
// written by other SMs.
template <typename T, bool MAX>
__device__ T gc_reduce_partials(const T* partials, int blocks, T init, void* scratch) {
    return gc_sum_partials<T, MAX>(blocks, init, scratch, [&](int j) { return __ldcg(partials + j); });
}

// ---- a chain's global reduction in a block of its own -----------------------------------------------------
// In a chain (lower.py's chain), a rows stage's global reduction (the batch-mean loss) does not wait for the
// last block to arrive: one more block, the collector, runs no stage and does the global part. Each stage
// block stores its partial right after its stage, tagged with the launch's number in the same 8-byte store
// (gc_tag_partial: one store, so no fence has to order the value before the tag), and goes on to its next
// stage without waiting; the collector waits for every block's partial of this launch (polling L2) and sums
// them in block order as gc_reduce_partials does (the same bits), computes what follows (the loss, the
// guard) and stores it, while the stage blocks still run their later stages. The launch's number is the
// workspace's ticket word plus one: every block reads it at its start (the previous launch's collector
// wrote it), the collector writes it back once it has every partial, so a graph replay finds the next
// number there, and a partial of an earlier launch is never taken for one of this launch. The stage blocks
// never wait for the collector, so they finish whichever way the blocks are scheduled. 4-byte partials.
template <typename T>
__device__ __forceinline__ void gc_tag_partial(unsigned long long* slot, T v, unsigned int tag) {
    static_assert(sizeof(T) == 4, "gc_tag_partial: 4-byte partials");
    unsigned int bits;
    memcpy(&bits, &v, 4);
    const unsigned long long word = (unsigned long long)tag << 32 | bits;
    asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" :: "l"(slot), "l"(word) : "memory");
}

// The collector's sum (or max) of the stage blocks' partials tagged `tag` (gc_sum_partials: block order),
// each waited for until its tag is this launch's.
template <typename T, bool MAX>
__device__ T gc_collect_partials(const unsigned long long* slots, int blocks, T init, unsigned int tag,
                                 void* scratch) {
    return gc_sum_partials<T, MAX>(blocks, init, scratch, [&](int j) {
        unsigned long long word;
        do {
            asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(word) : "l"(slots + j) : "memory");
        } while ((unsigned int)(word >> 32) != tag);
        const unsigned int bits = (unsigned int)word;
        T x;
        memcpy(&x, &bits, 4);
        return x;
    });
}

// ---- a chain's GEMM stage (lower.py's chain) -------------------------------------------------------------
// Row m of A as a chain's GEMM reads it: a plain matrix of K columns (written by an earlier kernel, or by an
// earlier stage of the same kernel: plain loads, no read-only cache), or the image input read in place
// (gc_rows: row index[m] of the source, uint8 converted as the trainer's gather does).
template <typename T>
struct gc_row_matrix {
    const T* p;
    int k;
    __device__ T operator()(int m, int c) const { return p[(int64_t)m * k + c]; }
};
struct gc_row_input {
    gc_rows rows;
    int k;
    __device__ float operator()(int m, int c) const { return gc_rows_at(rows, m, k, c); }
};

// The shape of gc_row_gemm<T, TB, N, K, R, ONE>'s work (below) and the shared memory it needs: A's rows (staged
// when short) and the G groups' partial sums. A chain's stages run one after another, a barrier between
// two, so they share one buffer of the largest stage's size (gc_chain_work; a chain's T is float32: at most
// 24 KB). ONE (B K x N, the mirror of a B^T the stage would read with TB: lower.py's mirror_variables): a
// thread owns one column and sums k in order, as with TB — the same sums, so the same bits — its loads a
// warp's run of 32 columns a k.
template <typename T, bool TB, int N, int K, int R, bool ONE = false>
struct gc_row_gemm_shape {
    static constexpr int WARPS = GC_BLOCK / 32;
    static constexpr bool STAGE = N > 32 && R * K <= 2048;          // A's rows in shared memory
    // B moves in vectors of V along its contiguous dimension: columns (B is K x N) or k (B is N x K, TB);
    // the loop steps S k at a time, staged A rows read as vectors of S (S = 4 where K allows)
    static constexpr int V = !ONE && (TB ? K : N) % 4 == 0 ? 4 : 1;
    static constexpr int S = TB ? V : (STAGE && K % 4 == 0 ? 4 : 1);
    // steps unrolled: their B loads (L2 hits) go out together; a step's latency is the stage's cost. H100, MLP
    // step: 8 steps of S = 4 at 4 rows a block (batch 1000) 55.9 us, 2 of them 56.8; at 1 row (batch 128) 8
    // steps 23.4 us, 2 (8 k, as many as before A was read as vectors) 23.2; 4 steps of one k 0.65 us slower
    // than 8 at batch 128, 16 slower too
    static constexpr int UNROLL = R > 1 ? 8 : 8 / S;
    static constexpr int NV = TB ? N : (N + V - 1) / V;              // a thread's column (vector)s
    static constexpr int NC = (NV + 31) / 32 * 32 < GC_BLOCK ? (NV + 31) / 32 * 32 : GC_BLOCK;
    static constexpr int GT = GC_BLOCK / NC, GS = 4096 / (R * N) > 1 ? 4096 / (R * N) : 1;
    // K groups: N <= 32, 8 / R warps a row; N > 32, GC_BLOCK / NC (their partials: <= 16 KB of floats)
    static constexpr int G = N <= 32 ? (R >= WARPS ? 1 : WARPS / R) : (GT < GS ? GT : GS);
    static constexpr int KS = S > V ? S : V;                         // (both 1 or 4: their multiple)
    static constexpr int KG = ((K + G - 1) / G + KS - 1) / KS * KS;  // a group's share of K (whole steps)
    static constexpr int LD = N <= 32 ? 32 : N;                      // the partials' row stride
    static constexpr int AROW = STAGE ? R * K : 0, PARTIAL = G > 1 ? G * R * LD : 0;
    static constexpr size_t bytes = (size_t)(AROW + PARTIAL) * sizeof(T);
};

// The end of gc_row_gemm where G groups of threads each summed a share of K: row r, column n of group h's
// sums is partial[(h * R + r) * LD + n]; they are added in group order, the epilogue applied and C stored.
template <typename T, int M, int N, int R, int G, int LD, typename Ep>
__device__ __forceinline__ void gc_row_gemm_sum(const T* partial, T* C, const Ep& ep, int row0) {
    __syncthreads();
    for (int t = threadIdx.x; t < R * N; t += GC_BLOCK) {
        const int r = t / N, n = t % N;
        T v = 0;
        for (int h = 0; h < G; h++) v += partial[(h * R + r) * LD + n];
        if (row0 + r < M) C[(int64_t)(row0 + r) * N + n] = ep(0, row0 + r, n, v);
    }
}

// Rows row0 .. row0 + R - 1 of C = ep(A @ op(B)) (M x N, K), by the block: each of G groups of threads sums a
// share of K, the groups' sums are added in group order (shared memory), the epilogue applied and C stored.
// N <= 32: a warp per row and K share, lane l summing k = l, l + 32, ... of it for every column, the lanes
// added by a fixed shuffle tree (G = 8 / R warps per row; R >= 8: a warp per row, rows in turn). N > 32: A's
// rows are staged in shared memory (read alike by a warp, 4 k at a time where K allows), thread c of a group
// owns the R rows of a few columns: 4 neighbouring ones, B's rows read as 16-byte vectors (B is K x N), or
// one, B's rows read 4 k at a time (TB); G = GC_BLOCK / (threads a row's columns take), fewer where the
// partials would pass 16 KB. `smem`: the block's gc_row_gemm_shape::bytes of shared memory. Every sum has
// a fixed order: results are the same run to run.
template <typename T, bool TB, int M, int N, int K, int R, bool ONE = false, typename AL, typename Ep>
__device__ void gc_row_gemm(AL a, const T* __restrict__ B, T* C, Ep ep, int row0, void* smem) {
    using Sh = gc_row_gemm_shape<T, TB, N, K, R, ONE>;
    constexpr int G = Sh::G;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    T* const arow = (T*)smem;
    T* const partial = arow + Sh::AROW;
    if constexpr (N <= 32) {
        const int g = G > 1 ? warp / R : 0;
        for (int r = G > 1 ? warp % R : warp; r < R; r += G > 1 ? R : Sh::WARPS) {
            const int m = min(row0 + r, M - 1);   // rows past M: computed again, not stored
            T acc[N];
#pragma unroll
            for (int n = 0; n < N; n++) acc[n] = 0;
#pragma unroll 4
            for (int k = g * 32 + lane; k < K; k += 32 * G) {
                const T x = a(m, k);
#pragma unroll
                for (int n = 0; n < N; n++) acc[n] += x * (TB ? B[(int64_t)n * K + k] : B[(int64_t)k * N + n]);
            }
            T mine = 0;
#pragma unroll
            for (int n = 0; n < N; n++) {
                const T v = gc_reduce_lanes<T, false>(acc[n]);
                if (lane == n) mine = v;
            }
            if (G > 1) {
                if (lane < N) partial[(g * R + r) * 32 + lane] = mine;
            } else if (lane < N && row0 + r < M) {
                C[(int64_t)(row0 + r) * N + lane] = ep(0, row0 + r, lane, mine);
            }
        }
        if constexpr (G > 1) gc_row_gemm_sum<T, M, N, R, G, 32>(partial, C, ep, row0);
    } else {
        constexpr bool STAGE = Sh::STAGE;
        constexpr int V = Sh::V, S = Sh::S, NV = Sh::NV, NC = Sh::NC, KG = Sh::KG, UNROLL = Sh::UNROLL;
        if constexpr (STAGE) {
            for (int t = threadIdx.x; t < R * K; t += GC_BLOCK) arow[t] = a(min(row0 + t / K, M - 1), t % K);
            __syncthreads();
        }
        // A's k .. k + S - 1 at row r
        auto at = [&](int r, int k) -> gc_vec<T, S> {
            if constexpr (STAGE && S > 1) {
                return *(const gc_vec<T, S>*)(arow + r * K + k);
            } else {
                gc_vec<T, S> x;
#pragma unroll
                for (int s = 0; s < S; s++) x.v[s] = STAGE ? arow[r * K + k + s] : a(min(row0 + r, M - 1), k + s);
                return x;
            }
        };
        const int c = threadIdx.x % NC, g = threadIdx.x / NC;
        const int k0 = g * KG, k1 = min(K, k0 + KG);
        if (g < G) {
            for (int cv = c; cv < (NV + NC - 1) / NC * NC; cv += NC) {
                const int j = min(cv, NV - 1);   // (vectors past the last: computed again, not stored)
                constexpr int W = TB ? 1 : V;      // columns per thread
                T acc[R][W];
#pragma unroll
                for (int r = 0; r < R; r++)
#pragma unroll
                    for (int w = 0; w < W; w++) acc[r][w] = 0;
#pragma unroll (UNROLL)
                for (int k = k0; k < k1; k += S) {
                    gc_vec<T, V> b[TB ? 1 : S];
#pragma unroll
                    for (int s = 0; s < (TB ? 1 : S); s++)
                        b[s] = TB ? *(const gc_vec<T, V>*)(B + (int64_t)j * K + k)
                                  : *(const gc_vec<T, V>*)(B + (int64_t)(k + s) * N + j * V);
#pragma unroll
                    for (int r = 0; r < R; r++) {
                        const gc_vec<T, S> x = at(r, k);
#pragma unroll
                        for (int s = 0; s < S; s++)
#pragma unroll
                            for (int w = 0; w < W; w++) acc[r][w] += x.v[s] * (TB ? b[0].v[s] : b[s].v[w]);
                    }
                }
                if (cv < NV) {
#pragma unroll
                    for (int r = 0; r < R; r++)
#pragma unroll
                        for (int w = 0; w < W; w++) {
                            const int n = j * W + w;
                            if (n >= N) continue;
                            if (G > 1) partial[(g * R + r) * N + n] = acc[r][w];
                            else if (row0 + r < M) C[(int64_t)(row0 + r) * N + n] = ep(0, row0 + r, n, acc[r][w]);
                        }
                }
            }
        }
        if constexpr (G > 1) gc_row_gemm_sum<T, M, N, R, G, N>(partial, C, ep, row0);
    }
}

// ---- a chain's warp stage (lower.py's warp_stages) ----------------------------------------------------------
// An epilogue functor that says `ones` (lower.py's epilogue_ones) gives each column's operands as a pack
// (`pack1 load1(b, m, n)`, `T run1(pack, b, m, n, acc)`): a chain's stage at a row a block loads its columns'
// packs when it starts (gc_row_packs), where the functor's own loads came after its sums (H100, MLP b128
// trainer: the warp stage's head, with the rows' early loads, 14.66 -> 14.28 us a step). Behind a barrier
// ptxas may still issue or wait for them late: `anchor` stores a word made of a pack's bits to shared memory
// before the stage's first barrier (a shared store does not cross bar.sync), so the thread has its operands
// when it arrives there (gc_reg_row_gemm's bias: 14.14 -> 13.99 us in the prototype; loaded early without
// the anchor, 14.12). Without `ones`, the functor's own loads at the end, as before.
template <class Ep, class = void> struct gc_ep_ones { static constexpr bool value = false; };
template <class Ep> struct gc_ep_ones<Ep, decltype((void)Ep::ones)> { static constexpr bool value = Ep::ones; };
// A thread's NP columns of row `row`: load(ep, row, column) with column(j) the j-th (each inside C), then
// apply(ep, row, j, n, acc) gives column n = column(j)'s value.
template <class Ep, int NP, bool = gc_ep_ones<Ep>::value> struct gc_row_packs {
    template <class Column>
    __device__ __forceinline__ void load(const Ep&, int, Column&&) {}
    __device__ __forceinline__ void anchor(float*) const {}
    template <typename T>
    __device__ __forceinline__ T apply(const Ep& ep, int row, int, int n, T acc) const { return ep(0, row, n, acc); }
};
// A pack's 4-byte words xor-ed: a value that needs all of them loaded (an anchor's).
template <class Pack>
__device__ __forceinline__ uint32_t gc_pack_bits(const Pack& pk) {
    static_assert(sizeof(Pack) % 4 == 0, "gc_pack_bits: a pack of 4-byte words");
    uint32_t bits = 0;
#pragma unroll
    for (int w = 0; w < (int)(sizeof(Pack) / 4); w++) {
        uint32_t word;
        memcpy(&word, (const char*)&pk + 4 * w, 4);
        bits ^= word;
    }
    return bits;
}
template <class Ep, int NP> struct gc_row_packs<Ep, NP, true> {
    typename Ep::pack1 pk[NP];
    template <class Column>
    __device__ __forceinline__ void load(const Ep& ep, int row, Column&& column) {
#pragma unroll
        for (int j = 0; j < NP; j++) pk[j] = ep.load1(0, row, column(j));
    }
    __device__ __forceinline__ void anchor(float* slot) const {   // (a slot the stage overwrites after its barrier)
        uint32_t bits = 0;
#pragma unroll
        for (int j = 0; j < NP; j++) bits ^= gc_pack_bits(pk[j]);
        memcpy(slot, &bits, 4);
    }
    template <typename T>
    __device__ __forceinline__ T apply(const Ep& ep, int row, int j, int n, T acc) const { return ep.run1(pk[j], 0, row, n, acc); }
};

// At a row a block, a GEMM of N <= 32 columns, the rows stage reading its C and the GEMM reading that stage's
// values run in the block's first warp, the row in registers. gc_warp_row_head: row `row` of C = ep(A @ B)
// (B is K x N): lane l sums k = l, l + 32, ... for every column, the lanes' sums are added by an xor tree (a
// fixed order; each level adds the same two values in every lane of a pair, so every lane ends with the same
// bits), the epilogue is applied in every lane and column n is stored by lane n % 32. `hc`: the row, in
// every lane.
template <typename T, int N, int K, typename AL, typename Ep>
__device__ __forceinline__ void gc_warp_row_head(AL a, const T* __restrict__ B, T* C, const Ep& ep, int row,
                                                 T (&hc)[N]) {
    const int lane = threadIdx.x % 32;
    gc_row_packs<Ep, N> packs;
    packs.load(ep, row, [](int n) { return n; });
#pragma unroll
    for (int n = 0; n < N; n++) hc[n] = 0;
#pragma unroll
    for (int k0 = 0; k0 < K; k0 += 32) {
        const int k = k0 + lane;
        if (k < K) {
            const T x = a(row, k);
#pragma unroll
            for (int n = 0; n < N; n++) hc[n] += x * B[(int64_t)k * N + n];
        }
    }
#pragma unroll
    for (int h = 16; h > 0; h >>= 1)
#pragma unroll
        for (int n = 0; n < N; n++) hc[n] += __shfl_xor_sync(0xffffffffu, hc[n], h);
#pragma unroll
    for (int n = 0; n < N; n++) hc[n] = packs.apply(ep, row, n, n, hc[n]);   // (every operand load before the first store)
#pragma unroll
    for (int n = 0; n < N; n++)
        if (n % 32 == lane) C[(int64_t)row * N + n] = hc[n];
}

// Row `row` of C = ep(a @ op(B)) (N columns, K) by a warp from the row's K values a[] held by every lane: lane
// l computes columns l, l + 32, ..., k in order. B is N x K (TB) or K x N.
template <typename T, bool TB, int N, int K, typename Ep>
__device__ __forceinline__ void gc_warp_row_gemm(const T (&a)[K], const T* __restrict__ B, T* C, const Ep& ep,
                                                 int row) {
    const int lane = threadIdx.x % 32;
    T c[(N + 31) / 32];   // the lane's columns, all computed before the first store
#pragma unroll
    for (int j = 0; j < (N + 31) / 32; j++) {
        const int n = min(j * 32 + lane, N - 1);   // (a column past N: computed again, not stored)
        T acc = 0;
#pragma unroll
        for (int k = 0; k < K; k++) acc += a[k] * (TB ? B[(int64_t)n * K + k] : B[(int64_t)k * N + n]);
        c[j] = ep(0, row, n, acc);
    }
#pragma unroll
    for (int j = 0; j < (N + 31) / 32; j++)
        if (j * 32 + lane < N) C[(int64_t)row * N + j * 32 + lane] = c[j];
}

// ---- a chain's B held in registers (lower.py's chain_registers) ------------------------------------------------
// At a row a block, a B (K x N) that one GEMM stage reads as B and a later one as B^T (the MLP's W2: h2 = h1 W2,
// dh1 = dh2 W2^T) is read once from its copy in shared memory into registers and kept there for both: warp w,
// lane l hold rows w KW .. w KW + KW - 1 (KW = K / 8, rounded up; at most 32) at columns 4 l .. 4 l + 3 (N a
// multiple of 4, at most 128). Each stage would otherwise read the whole B from shared memory for one row.
template <int N, int K>
struct gc_reg_row_gemm_shape {
    static constexpr int WARPS = GC_BLOCK / 32, KW = (K + WARPS - 1) / WARPS;
    static constexpr int AROW = (K + 3) / 4 * 4;   // A's row, then the warps' partials (stored as float4: 16-byte aligned)
    static_assert(N % 4 == 0 && N <= 128 && KW <= 32, "gc_reg_row_gemm: N a multiple of 4 up to 128, K up to 8 x 32");
    static constexpr size_t bytes = (size_t)(AROW + WARPS * N) * sizeof(float);
};

// Row `row` of C = ep(A @ B) from B's copy `B` in shared memory, loading the registers `w` on the way: A's row
// is staged in shared memory (STAGED: it is there already, at the start of `smem`), warp w sums its KW rows (k in order) for the lane's 4 columns, and the warps'
// sums are added in warp order (the same order as gc_row_gemm's 8 K groups of KW rows).
template <int N, int K, bool STAGED, typename AL, typename Ep>
__device__ __forceinline__ void gc_reg_row_gemm(AL a, const float* __restrict__ B, float* C, const Ep& ep, int row,
                                                void* smem, float4 (&w)[gc_reg_row_gemm_shape<N, K>::KW]) {
    constexpr int WARPS = gc_reg_row_gemm_shape<N, K>::WARPS, KW = gc_reg_row_gemm_shape<N, K>::KW;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    float* const arow = (float*)smem;
    float* const partial = arow + gc_reg_row_gemm_shape<N, K>::AROW;
    static_assert(N <= GC_BLOCK, "gc_reg_row_gemm: a column a thread");
    gc_row_packs<Ep, 1> packs;   // thread t's column t
    if (threadIdx.x < N) packs.load(ep, row, [](int) { return (int)threadIdx.x; });
#pragma unroll
    for (int kk = 0; kk < KW; kk++) {   // (before A's row is stored: after the store they would wait for its load)
        const int k = warp * KW + kk;
        w[kk] = lane < N / 4 && k < K ? *(const float4*)(B + (int64_t)k * N + 4 * lane) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    if (!STAGED)   // (else the block's split sums stored it there: gc_chain_sum_partials' rows)
        for (int t = threadIdx.x; t < K; t += GC_BLOCK) arow[t] = a(row, t);
    if (threadIdx.x < N) packs.anchor(partial + threadIdx.x);   // (the warps' sums go there after the barrier)
    __syncthreads();
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int kk = 0; kk < KW; kk++) {
        const int k = warp * KW + kk;
        const float x = k < K ? arow[k] : 0.f;
        acc.x += x * w[kk].x;
        acc.y += x * w[kk].y;
        acc.z += x * w[kk].z;
        acc.w += x * w[kk].w;
    }
    if (lane < N / 4) *(float4*)(partial + warp * N + 4 * lane) = acc;
    __syncthreads();
    if (const int t = threadIdx.x; t < N) {
        float v = 0;
        for (int h = 0; h < WARPS; h++) v += partial[h * N + t];
        C[(int64_t)row * N + t] = packs.apply(ep, row, 0, t, v);
    }
}

// A warp's reduce-scatter: each lane holds 32 values; lane l ends with p[0] = the sum of every lane's value l
// (a fixed tree: at each level a lane keeps the half its bit names and adds its partner's of it).
template <int H>
__device__ __forceinline__ void gc_scatter_sum(float* p, int lane) {
    const bool up = lane & H;
#pragma unroll
    for (int i = 0; i < H; i++) {
        const float send = up ? p[i] : p[i + H];
        const float keep = up ? p[i + H] : p[i];
        p[i] = keep + __shfl_xor_sync(0xffffffffu, send, H);
    }
    if constexpr (H > 1) gc_scatter_sum<H / 2>(p, lane);
}

// Row `row` of C = ep(A @ B^T) (N = B's K rows, K = B's N columns) from the registers gc_reg_row_gemm loaded:
// each lane the 4-term dot of its columns of A's row with each of its KW rows of B, then the lanes' terms
// added by a reduce-scatter, so lane l of warp w ends with column w KW + l.
template <int N, int K, typename AL, typename Ep>
__device__ __forceinline__ void gc_reg_row_gemm_t(AL a, float* C, const Ep& ep, int row,
                                                  const float4 (&w)[gc_reg_row_gemm_shape<K, N>::KW]) {
    constexpr int KW = gc_reg_row_gemm_shape<K, N>::KW;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    float4 d = make_float4(0.f, 0.f, 0.f, 0.f);
    if (lane < K / 4) d = make_float4(a(row, 4 * lane), a(row, 4 * lane + 1), a(row, 4 * lane + 2), a(row, 4 * lane + 3));
    float p[32];
#pragma unroll
    for (int kk = 0; kk < KW; kk++) p[kk] = d.x * w[kk].x + d.y * w[kk].y + d.z * w[kk].z + d.w * w[kk].w;
#pragma unroll
    for (int kk = KW; kk < 32; kk++) p[kk] = 0.f;
    gc_scatter_sum<16>(p, lane);
    const int n = warp * KW + lane;
    if (lane < KW && n < N) C[(int64_t)row * N + n] = ep(0, row, n, p[0]);
}

// ---- a chain's Bs staged in shared memory (lower.py's chain_staged) -----------------------------------------
// The B operands of a chain's GEMM stages (the MLP's W2 and W3) copied once into the block's dynamic shared
// memory when the block starts, by the TMA unit: thread 0 sets an mbarrier to expect `bytes` (gc_stage_expect:
// at most 1 MB, its transaction count) and issues bulk copies (cp.async.bulk, sm_90) of each B (a multiple of
// 16 bytes from a 16-byte aligned address) that complete on it (gc_stage_copy); after a __syncthreads every
// thread waits on it (gc_stage_wait) before the first stage that reads a copy, so the copies run behind what
// comes before (the split partials' sum). Before sm_90 the block's threads copy them. Called after
// gc_wait_prior: the bytes are those the earlier kernels left.
constexpr unsigned GC_STAGE_CHUNK = 32768;   // bytes a bulk copy
__device__ __forceinline__ void gc_stage_expect(unsigned long long* bar, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (threadIdx.x == 0) {
        gc_mbar_init_published(bar, 1);
        gc_mbar_expect(bar, bytes);
    }
#else
    (void)bar, (void)bytes;
#endif
}
__device__ __forceinline__ void gc_stage_copy(void* dst, const void* src, unsigned bytes, unsigned long long* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (threadIdx.x == 0) {
        const unsigned b = (unsigned)__cvta_generic_to_shared(bar), d = (unsigned)__cvta_generic_to_shared(dst);
        for (unsigned at = 0; at < bytes; at += GC_STAGE_CHUNK)
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                         :: "r"(d + at), "l"((const char*)src + at), "r"(min(GC_STAGE_CHUNK, bytes - at)), "r"(b)
                         : "memory");
    }
#else
    for (unsigned at = threadIdx.x * 16; at < bytes; at += GC_BLOCK * 16)
        *(uint4*)((char*)dst + at) = *(const uint4*)((const char*)src + at);
    (void)bar;
#endif
}
__device__ __forceinline__ void gc_stage_wait(unsigned long long* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    gc_mbar_wait(bar, 0);
#else
    (void)bar;
#endif
}

// ---- a chain's post stages (lower.py's Lowering.post) ------------------------------------------------------
// The shared memory gc_col_gemm<T, M, N, K, RB> needs: the warps' partial sums of a block's outputs.
template <typename T, int M, int N, int K, int RB>
struct gc_col_gemm_shape {
    static constexpr int WARPS = GC_BLOCK / 32;
    static constexpr int OUT = RB * N;                      // a block's outputs: RB rows of C
    static constexpr bool WIDE = N > 32;                    // a lane's columns of all RB rows (else outputs)
    static constexpr int JT = WIDE ? (N + 31) / 32 : (OUT + 31) / 32;   // a lane's columns (outputs)
    static constexpr int KW = (K + WARPS - 1) / WARPS;      // a warp's share of K
    static constexpr size_t bytes = (size_t)WARPS * OUT * sizeof(T);
};

// Block `block` computes rows block * RB .. block * RB + RB - 1 of C = ep(A^T @ B) (M x N): A is stored K x M
// (read as a(k, i): the batch's rows, e.g. the image input in place), B is K x N (row-major). A weight gradient
// over the batch, in the launch after a chain's stages, which wrote the batch's rows of B. Warp w sums k in
// its share w * KW .. for all of the block's outputs at once (their loads go out together), the warps' sums
// are added in warp order (shared memory), the epilogue applied and C stored. N <= 32: the block's RB x N
// outputs are spread over the lanes (lane, lane + 32, ...), as many as fill them; N > 32 (WIDE): lane l owns
// columns l, l + 32, ... of the RB rows, and a k's loads are B's row once and A's value once a row (not one
// a lane's output, nor the outputs of a row past the block's that fill the last lanes), all of them ahead of
// the multiply-adds. H100, the MLP's dW2 at batch 128 (256 x 100, K 128, a row a block), library step, one
// run: 21.60 -> 19.84 us (2 rows a block 21.35, 4 rows 20.76). Fixed order: the same results either way.
template <typename T, int M, int N, int K, int RB, typename AL, typename Ep>
__device__ void gc_col_gemm(AL a, const T* B, T* C, Ep ep, int block, void* smem) {
    using Sh = gc_col_gemm_shape<T, M, N, K, RB>;
    constexpr int OUT = Sh::OUT, JT = Sh::JT, KW = Sh::KW;
    T* const partial = (T*)smem;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int i0 = block * RB;
    const int k0 = warp * KW, k1 = min(K, k0 + KW);
    if constexpr (Sh::WIDE) {
        int col[JT], row[RB];
        T acc[RB][JT];
#pragma unroll
        for (int t = 0; t < JT; t++) col[t] = min(lane + 32 * t, N - 1);   // columns past N: not stored
#pragma unroll
        for (int r = 0; r < RB; r++) {
            row[r] = min(i0 + r, M - 1);                                   // rows past M: not stored
#pragma unroll
            for (int t = 0; t < JT; t++) acc[r][t] = 0;
        }
#pragma unroll 8
        for (int k = k0; k < k1; k++) {
            T b[JT], x[RB];
#pragma unroll
            for (int t = 0; t < JT; t++) b[t] = B[(int64_t)k * N + col[t]];
#pragma unroll
            for (int r = 0; r < RB; r++) x[r] = a(k, row[r]);
#pragma unroll
            for (int r = 0; r < RB; r++)
#pragma unroll
                for (int t = 0; t < JT; t++) acc[r][t] += x[r] * b[t];
        }
#pragma unroll
        for (int r = 0; r < RB; r++)
#pragma unroll
            for (int t = 0; t < JT; t++)
                if (lane + 32 * t < N) partial[warp * OUT + r * N + lane + 32 * t] = acc[r][t];
    } else {
        int col[JT], row[JT];
        T acc[JT];
#pragma unroll
        for (int t = 0; t < JT; t++) {
            const int j = min(lane + 32 * t, OUT - 1);   // outputs past the block's or past M: computed, not stored
            row[t] = min(i0 + j / N, M - 1);
            col[t] = j % N;
            acc[t] = 0;
        }
#pragma unroll 16
        for (int k = k0; k < k1; k++) {
#pragma unroll
            for (int t = 0; t < JT; t++) acc[t] += a(k, row[t]) * B[(int64_t)k * N + col[t]];
        }
#pragma unroll
        for (int t = 0; t < JT; t++)
            if (lane + 32 * t < OUT) partial[warp * OUT + lane + 32 * t] = acc[t];
    }
    __syncthreads();
    for (int j = threadIdx.x; j < OUT; j += GC_BLOCK) {
        const int i = i0 + j / N, n = j % N;
        T v = 0;
#pragma unroll
        for (int w = 0; w < Sh::WARPS; w++) v += partial[w * OUT + j];
        if (i < M) C[(int64_t)i * N + n] = ep(0, i, n, v);
    }
}

// A chain's post kernel's weight gradient C = ep(A^T B) (A K x M, B K x N, float32, one matrix, no split) on
// this tile (lowering.post: its THREADS are the post kernel's GC_BLOCK), tile `tile` of it by this block, in
// the post kernel's dynamic shared memory.
template <class Tile, class Ep>
__device__ __forceinline__ void gc_gemm_sk_post(const float* A, const float* B, float* C, int M, int N, int K,
                                                Ep ep, int tile, float4* smem) {
    static_assert(Tile::SPLIT == 1 && Tile::THREADS == GC_BLOCK, "gc_gemm_sk_post: a post kernel's block, no split");
    const gc_gemm_params<float, Ep> p = {A, B, C, M, N, K, 0, 0, 0, ep, gc_rows{}, gc_gemm_vectors(A, M, 0, 4, 1),
                                         gc_gemm_vectors(B, N, 0, 4, 1), gc_gemm_vectors(C, N, 0, 4, 1)};
    gc_gemm_sk_tile<float, true, false, Tile, Ep, false>(p, tile, 0, smem);
}

// Rows row0 .. row0 + R - 1 of a split GEMM's C (M x N) = ep(the sum of its S splits' partial tiles), which the
// GEMM stored at part + q * M * N (gc_ep_partial) instead of summing them over a cluster: added in split order
// from 0, as the cluster's sum does (the same bits), read from L2 (the GEMM wrote them in the launch before:
// this SM's L1 may hold the last step's), stored where the chain's first stage reads them (lower.py's
// fold_split_sums), then a barrier.
template <typename T, int S, int M, int N, int R, class Ep>
__device__ __forceinline__ void gc_chain_sum_partials(const T* __restrict__ part, T* C, const Ep& ep, int row0,
                                                      T* rows = nullptr) {
    for (int t = threadIdx.x; t < R * N; t += GC_BLOCK) {
        const int r = t / N, n = t % N;
        if (row0 + r >= M) break;
        const int64_t at = (int64_t)(row0 + r) * N + n;
        T s = 0;
#pragma unroll
        for (int q = 0; q < S; q++) s += __ldcg(part + (int64_t)q * M * N + at);
        const T e = ep(0, row0 + r, n, s);
        C[at] = e;
        if (rows) rows[t] = e;   // (the first stage's A rows, staged there: gc_reg_row_gemm's STAGED)
    }
    __syncthreads();
}

// ---- a chain's GEMM stage on tensor cores (lower.py's chain_mma) -------------------------------------------------
// R = 8 or 16 rows of a block, transposed onto mma.sync m16n8k8 (tf32: the operands' top 19 bits, as the tf32
// GEMM tiles take them; X3, precision="fp32": each operand as two tf32 parts, gc_tf32_parts (the block's rows'
// high parts rounded to nearest), and a k step's three products low x high, high x low, high x high summed from
// zero, then into the fp32 sums, as the short-K tf32-parts tile does: the error stays at fp32's): C^T = op(B)^T
// A^T, so a step's 16 x 8 A fragment is 16 of C's columns of B (read as B lies, K x N or N x K with TB, from the
// chain's copy in shared memory, chain_staged, or global memory; its k past K read as zeros) and its 8 x 8 B
// fragment 8 of the block's rows of A, staged in shared memory (k padded to KP = 8 KT with zeros; the row stride
// LDA = 4 mod 8, so a fragment's 32 loads fall on 32 banks): no part of a product is padding where R is 8 or 16.
// The block's warps take WN of the MT 16-column tiles side by side and WK shares of the KT k steps: as many
// shares as leave each warp 2 k steps or more, 16 accumulators or fewer and the stage's shared memory 40 KB or
// less (a warp waits on the mma's latency, not its rate: its tiles are its independent sums); WK > 1 adds the
// shares' partial sums in share order (shared memory). Every sum has a fixed order: results are the same run to
// run.
template <bool TB, int N, int K, int R>
struct gc_row_mma_shape {
    static_assert(R == 16 || R == 8, "gc_row_mma: 8 or 16 rows a block");
    static constexpr int WARPS = GC_BLOCK / 32, RT = R / 8;
    // Column i of 16-column tile j: 16 j + i, or, SWZ, the j-th 16 of 32 columns interleaved (i = 0..3, 4..7,
    // 8..11, 12..15 at 0, 16, 4, 20 of the 32 from 32 (j / 2) + 8 (j % 2)) where that puts a fragment's loads of
    // B (K x N: lanes t k apart, g columns) on more banks: N = 4 mod 32 (the MLP's W2, N = 100)
    __host__ __device__ static constexpr int col(bool swz, int j, int i) {
        return swz ? 32 * (j / 2) + 8 * (j % 2) + (i & 3) + 4 * ((i >> 3) & 1) + 16 * ((i >> 2) & 1) : 16 * j + i;
    }
    static constexpr int conflicts(bool swz) {   // the most lanes of a fragment's load on one bank
        int most = 0;
        for (int bank = 0; bank < 32; bank++) {
            int n = 0;
            for (int lane = 0; lane < 32; lane++)
                n += (TB ? col(swz, 0, lane / 4) * (K % 32) + lane % 4 : (lane % 4) * (N % 32) + col(swz, 0, lane / 4)) % 32 == bank;
            most = n > most ? n : most;
        }
        return most;
    }
    static constexpr bool SWZ = !TB && conflicts(true) < conflicts(false);
    static constexpr int MT = SWZ ? N / 32 * 2 + (N % 32 == 0 ? 0 : N % 32 <= 8 ? 1 : 2) : (N + 15) / 16;
    static constexpr int KT = (K + 7) / 8, KP = KT * 8, LDA = KP + 4;
    // the partial sums' row stride: a fragment's (rows 2 t, 2 t + 1; its columns) on 32 banks
    static constexpr int LDP = (N + 15) / 16 * 16 + (SWZ ? 2 : 4);
    static constexpr bool fits(int wk) {
        return wk == 1 || ((KT + wk - 1) / wk >= 2 && (MT + WARPS / wk - 1) / (WARPS / wk) * RT <= 16 &&
                           (R * LDA + wk * R * LDP + GC_BLOCK) * 4 <= 40960);
    }
    static constexpr int WK = fits(8) ? 8 : fits(4) ? 4 : fits(2) ? 2 : 1, WN = WARPS / WK;
    static constexpr int TW = (MT + WN - 1) / WN, KW = (KT + WK - 1) / WK;   // a warp's tiles and k steps
    // (WK > 1: the shares' partial sums, then a word a thread: gc_row_mma's anchor)
    static constexpr int PARTIAL = WK > 1 ? WK * R * LDP + GC_BLOCK : 0;
    static constexpr size_t bytes = (size_t)(R * LDA + PARTIAL) * sizeof(float);
    static constexpr bool covers() {   // every column below N in one tile's 16, once (one pass over the tiles:
        bool seen[N] = {};              // a loop over N for each column went past nvcc's constexpr budget at N ~ 700)
        int below = 0;
        for (int j = 0; j < MT; j++)
            for (int i = 0; i < 16; i++) {
                const int n = col(SWZ, j, i);
                if (n < N) {
                    if (seen[n]) return false;
                    seen[n] = true;
                    below++;
                }
            }
        return below == N;
    }
    static_assert(covers(), "gc_row_mma: the tiles' columns cover C's");
};

// An epilogue's operands of one output (m, n), loaded before the sums where the functor says `ones` (lower.py's
// chain_ones: its pack1 load1 / run1), else nothing: the functor loads them after.
template <class Ep, bool = gc_ep_ones<Ep>::value> struct gc_ep_one {
    __device__ __forceinline__ void load(const Ep&, int, int) {}
    __device__ __forceinline__ uint32_t bits() const { return 0; }
    __device__ __forceinline__ float apply(const Ep& ep, int m, int n, float acc) const { return ep(0, m, n, acc); }
};
template <class Ep> struct gc_ep_one<Ep, true> {
    typename Ep::pack1 pk;
    __device__ __forceinline__ void load(const Ep& ep, int m, int n) { pk = ep.load1(0, m, n); }
    __device__ __forceinline__ uint32_t bits() const { return gc_pack_bits(pk); }
    __device__ __forceinline__ float apply(const Ep& ep, int m, int n, float acc) const { return ep.run1(pk, 0, m, n, acc); }
};

// Rows row0 .. row0 + R - 1 of C = ep(A @ op(B)) (M x N, K, float32) by the block on tensor cores (X3: as tf32
// parts, above). `smem`: the block's gc_row_mma_shape::bytes of shared memory. `bar`: where B is a copy still on
// its way (gc_stage_copy), its mbarrier, waited on once A's rows are staged (else null).
template <bool TB, int M, int N, int K, int R, bool X3 = false, typename AL, typename Ep>
__device__ void gc_row_mma(AL a, const float* __restrict__ B, float* C, Ep ep, int row0, void* smem,
                           unsigned long long* bar = nullptr) {
    using Sh = gc_row_mma_shape<TB, N, K, R>;
    constexpr int LDA = Sh::LDA, KP = Sh::KP, WN = Sh::WN, TW = Sh::TW, KW = Sh::KW, RT = Sh::RT;
    float* const arow = (float*)smem;
    float* const partial = arow + R * LDA;
    {   // (every load before the first store: the stores would otherwise wait for each load in turn)
        constexpr int IT = (R * KP + GC_BLOCK - 1) / GC_BLOCK;
        float x[IT];
#pragma unroll
        for (int q = 0; q < IT; q++) {
            const int i = threadIdx.x + q * GC_BLOCK, r = i / KP, k = i % KP;
            x[q] = i < R * KP && k < K ? a(min(row0 + r, M - 1), k) : 0.f;   // (rows past M: computed, not stored)
        }
#pragma unroll
        for (int q = 0; q < IT; q++) {
            const int i = threadIdx.x + q * GC_BLOCK;
            if (i < R * KP) arow[i / KP * LDA + i % KP] = x[q];
        }
    }
    if (bar) gc_stage_wait(bar);
    __syncthreads();
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
    const int wn = warp % WN, wk = warp / WN;
    // accumulator element o = (i RT + h) 4 + e: tile i, rows 8 h ..: row 8 h + 2 t + e % 2, column
    // 16 (wn + i WN) + g + 8 (e / 2); the epilogue's operands of the outputs this thread ends with, loaded now
    auto row_of = [&](int o) { return o / 4 % RT * 8 + 2 * t + o % 2; };
    auto col_of = [&](int o) { return Sh::col(Sh::SWZ, wn + o / (4 * RT) * WN, g + 8 * (o % 4 / 2)); };
    constexpr int IT = (R * N + GC_BLOCK - 1) / GC_BLOCK, NO = Sh::WK == 1 ? TW * RT * 4 : IT;
    gc_ep_one<Ep> ops[NO];
#pragma unroll
    for (int o = 0; o < NO; o++) {
        const int i = min((int)threadIdx.x + o * GC_BLOCK, R * N - 1);   // (WK > 1: output i of the rows)
        const int r = Sh::WK == 1 ? row_of(o) : i / N, n = Sh::WK == 1 ? col_of(o) : i % N;
        ops[o].load(ep, min(row0 + r, M - 1), min(n, N - 1));
    }
    float acc[TW * RT][4];
#pragma unroll
    for (int i = 0; i < TW * RT; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[i][e] = 0.f;
    auto w = [&](int k, int n) -> uint32_t {   // op(B)(k, n) (a column past N reads N - 1's)
        n = min(n, N - 1);
        return k < K ? __float_as_uint(TB ? B[(int64_t)n * K + k] : B[(int64_t)k * N + n]) : 0u;
    };
#pragma unroll
    for (int s = 0; s < KW; s++) {
        const int ks = wk * KW + s;
        if (ks >= Sh::KT) break;
        const int k = ks * 8 + t;
        uint32_t bf[RT][2], bl[X3 ? RT : 1][2];
#pragma unroll
        for (int h = 0; h < RT; h++) {
            bf[h][0] = __float_as_uint(arow[(h * 8 + g) * LDA + k]);
            bf[h][1] = __float_as_uint(arow[(h * 8 + g) * LDA + k + 4]);
            if constexpr (X3) {
                gc_tf32_parts<true>(bf[h][0], bf[h][0], bl[h][0]);
                gc_tf32_parts<true>(bf[h][1], bf[h][1], bl[h][1]);
            }
        }
#pragma unroll
        for (int i = 0; i < TW; i++) {
            const int j = wn + i * WN;
            if (j < Sh::MT) {
                const int n0 = Sh::col(Sh::SWZ, j, g), n1 = Sh::col(Sh::SWZ, j, g + 8);
                uint32_t af[4] = {w(k, n0), w(k, n1), w(k + 4, n0), w(k + 4, n1)};
                if constexpr (X3) {   // the k step's small terms first, from zero, then its sum into the fp32 one
                    uint32_t al[4];
#pragma unroll
                    for (int r = 0; r < 4; r++) gc_tf32_parts(af[r], af[r], al[r]);
#pragma unroll
                    for (int h = 0; h < RT; h++) {
                        float part[4];
                        gc_mma_tf32(part, al, bf[h], true);
                        gc_mma_tf32(part, af, bl[h]);
                        gc_mma_tf32(part, af, bf[h]);
#pragma unroll
                        for (int e = 0; e < 4; e++) acc[i * RT + h][e] += part[e];
                    }
                } else {
#pragma unroll
                    for (int h = 0; h < RT; h++) gc_mma_tf32(acc[i * RT + h], af, bf[h]);
                }
            }
        }
    }
    if constexpr (Sh::WK == 1) {   // (the epilogue's values all made before the first store)
#pragma unroll
        for (int o = 0; o < NO; o++)
            acc[o / 4][o % 4] = ops[o].apply(ep, min(row0 + row_of(o), M - 1), min(col_of(o), N - 1), acc[o / 4][o % 4]);
#pragma unroll
        for (int o = 0; o < NO; o++) {
            const int r = row_of(o), n = col_of(o);
            if (n < N && row0 + r < M) C[(int64_t)(row0 + r) * N + n] = acc[o / 4][o % 4];
        }
    } else {
#pragma unroll
        for (int o = 0; o < TW * RT * 4; o++)
            if (wn + o / (4 * RT) * WN < Sh::MT && col_of(o) < N) partial[(wk * R + row_of(o)) * Sh::LDP + col_of(o)] = acc[o / 4][o % 4];
        uint32_t anchor = 0;   // the epilogue's operands in registers before the barrier (gc_row_packs::anchor)
#pragma unroll
        for (int q = 0; q < IT; q++) anchor ^= ops[q].bits();
        if constexpr (gc_ep_ones<Ep>::value) ((uint32_t*)partial)[Sh::WK * R * Sh::LDP + threadIdx.x] = anchor;
        __syncthreads();
        float v[IT];
#pragma unroll
        for (int q = 0; q < IT; q++) {
            const int i = min((int)threadIdx.x + q * GC_BLOCK, R * N - 1), r = i / N, n = i % N;
            float sum = 0.f;
#pragma unroll
            for (int h = 0; h < Sh::WK; h++) sum += partial[(h * R + r) * Sh::LDP + n];
            v[q] = ops[q].apply(ep, min(row0 + r, M - 1), n, sum);
        }
#pragma unroll
        for (int q = 0; q < IT; q++) {
            const int i = threadIdx.x + q * GC_BLOCK, r = i / N, n = i % N;
            if (i < R * N && row0 + r < M) C[(int64_t)(row0 + r) * N + n] = v[q];
        }
    }
}

// The largest of a chain's stages' gc_row_gemm_shape::bytes (or gc_row_mma_shape's, gc_reg_row_gemm_shape's),
// rounded up to 16 bytes: the size of the chain kernel's work buffer (at least 16: an array has a size, where no
// stage needs any).
__host__ __device__ constexpr size_t gc_chain_work() { return 16; }
template <typename... More>
__host__ __device__ constexpr size_t gc_chain_work(size_t bytes, More... more) {
    return ((bytes > gc_chain_work(more...) ? bytes : gc_chain_work(more...)) + 15) & ~(size_t)15;
}

// Row b of a batch gathered by the block (gc_gather_kernel; a post kernel's blocks, gc_next_rows): x[b, :] and y[b]
// (y NULL: the values only), and the previous step's loss recorded by row 0's thread 0 where sums is given.
template <typename IMG, int V>
__device__ __forceinline__ void gc_gather_row(const IMG* __restrict__ images, const int32_t* __restrict__ labels,
                                              const gc_cursor* __restrict__ cursor, int64_t first, int count, int row,
                                              float scale, float* __restrict__ x, int32_t* __restrict__ y, int batch,
                                              const float* __restrict__ loss, double* __restrict__ sums, int b) {
    const uint32_t src = gc_batch_source(cursor, first, count, batch, b);
    const IMG* in = images + (int64_t)src * row;
    float* out = x + (int64_t)b * row;
    for (int e = threadIdx.x * V; e < row; e += blockDim.x * V) {
        float v[V];
        if constexpr (V == 4 && sizeof(IMG) == 1) {
            uchar4 u = *(const uchar4*)(in + e);
            v[0] = gc_pixel(u.x, scale); v[1] = gc_pixel(u.y, scale);
            v[2] = gc_pixel(u.z, scale); v[3] = gc_pixel(u.w, scale);
        } else if constexpr (V == 4) {
            float4 f = *(const float4*)(in + e);
            v[0] = f.x; v[1] = f.y; v[2] = f.z; v[3] = f.w;
        } else if constexpr (sizeof(IMG) == 1) {
            v[0] = gc_pixel(in[e], scale);
        } else {
            v[0] = (float)in[e];
        }
        if (V == 4) *(float4*)(out + e) = make_float4(v[0], v[1], v[2], v[3]);
        else out[e] = v[0];
    }
    if (y && threadIdx.x == 0) y[b] = labels[src];
    if (sums && b == 0 && threadIdx.x == 0) {
        gc_record_loss(sums, *loss);
    }
}
// Row b of the batch `next` names (a post kernel's own blocks; nothing where next.x is NULL), rows of ROW
// elements (a multiple of 4), BATCH of them.
template <int ROW, int BATCH>
__device__ __forceinline__ void gc_gather_next_row(const gc_next_rows& next, int b) {
    if (!next.x) return;
    if (next.u8)
        gc_gather_row<uint8_t, 4>((const uint8_t*)next.images, next.labels, next.cursor, next.first, next.count, ROW,
                                  next.scale, next.x, next.y, BATCH, next.loss, next.sums, b);
    else
        gc_gather_row<float, 4>((const float*)next.images, next.labels, next.cursor, next.first, next.count, ROW,
                                next.scale, next.x, next.y, BATCH, next.loss, next.sums, b);
}

#endif   // GC_KERNELS

#if GC_KERNELS0   // kernels part 0 (a non-template kernel is defined once); the host part sees the declarations
// ---- the trainer's kernels -------------------------------------------------------------------------
// A training step in the trainer's graph is gather -> the step's kernels; a replayed chunk of steps ends
// with gc_steps_done. The batch position comes from the device-side cursor, so a graph replays unchanged.
//
// Row b of the batch is example gc_batch_source(cursor, first, count, batch, b): position first + b, plus
// cursor->step * batch when training, through the epoch's permutation when shuffling. Rows past `count`
// (the last partial eval batch) repeat the last valid example and are ignored by the caller.
// x[b, :] = images[src, :] * scale for uint8 images, a copy for float images.
// When `sums` is given, the kernel also records the previous step's loss (gc_record_loss): folded in here
// it costs no launch of its own.
//
// One block per batch row; every thread computes the row's source (a few dozen integer operations,
// identical across the block) instead of synchronizing on a shared value. Rows move V elements at a time.
template <typename IMG, int V>
__global__ void gc_gather_kernel(const IMG* __restrict__ images, const int32_t* __restrict__ labels,
                                 const gc_cursor* __restrict__ cursor, int64_t first, int count, int row,
                                 float scale, float* __restrict__ x, int32_t* __restrict__ y, int batch,
                                 const float* __restrict__ loss, double* __restrict__ sums) {
#if GC_BODIES
    gc_wait_prior();
    gc_gather_row<IMG, V>(images, labels, cursor, first, count, row, scale, x, y, batch, loss, sums, blockIdx.x);
#endif
}

template <typename IMG>
GC_SHARED int gc_gather(const IMG* images, const int32_t* labels, const gc_cursor* cursor, int64_t first, int count,
                        int row, float scale, float* x, int32_t* y, int batch, const float* loss, double* sums) {
    // vector moves need rows that keep 16-byte alignment of the float output: images and x start 256-aligned
    const int vectors = row % 4 == 0 ? row / 4 : row;
    const int threads = vectors < 256 ? (vectors + 31) / 32 * 32 : 256;
    return gc_launch(row % 4 == 0 ? gc_gather_kernel<IMG, 4> : gc_gather_kernel<IMG, 1>, batch, threads, images, labels,
                     cursor, first, count, row, scale, x, y, batch, loss, sums);
}

// A program whose GEMMs read x in place (gc_rows) gets the batch's row indices instead: thread b writes row
// b's example (the same gc_batch_source as the gather) and its label, and brings the example's bytes into
// L2, so that the first GEMM's loads find them there instead of waiting for device memory at every K
// step; thread 0 records the previous step's loss. Where the rows are (the split's dataset) is the GEMMs' launch
// parameter (gc_batch_input).
__global__ void gc_batch_rows_kernel(const unsigned char* __restrict__ images, int row_bytes,
                                     const int32_t* __restrict__ labels, const gc_cursor* __restrict__ cursor,
                                     int64_t first, int count, uint32_t* __restrict__ rows, int32_t* __restrict__ y,
                                     int batch, const float* __restrict__ loss, double* __restrict__ sums) {
#if GC_BODIES
    gc_wait_prior();
    const int b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b < batch) {
        const uint32_t src = gc_batch_source(cursor, first, count, batch, b);
        rows[b] = src;
        y[b] = labels[src];
        // one byte of every 128-byte line the row touches (the last one's too), loaded together; the kernel
        // ends when they have arrived (gc_wait_value), so the lines are in L2 when the GEMMs start
        const unsigned char* p = images + (int64_t)src * row_bytes;
        unsigned touch = p[row_bytes - 1];
        for (int o = 0; o < row_bytes; o += 128) touch += p[o];
        gc_wait_value(__uint_as_float(touch));
    }
    if (sums && b == 0) gc_record_loss(sums, *loss);
#endif
}

GC_SHARED int gc_batch_rows(const void* images, int row_bytes, const int32_t* labels, const gc_cursor* cursor,
                            int64_t first, int count, uint32_t* rows, int32_t* y, int batch, const float* loss,
                            double* sums) {
    return gc_launch(gc_batch_rows_kernel, (batch + GC_BLOCK - 1) / GC_BLOCK, GC_BLOCK,
                     (const unsigned char*)images, row_bytes, labels, cursor, first, count, rows, y, batch, loss, sums);
}

// The cursor lives on the device: one thread runs gc_cursor_start / gc_cursor_advance (gc_runtime.h).
__global__ void gc_set_cursor_kernel(gc_cursor* cursor, int64_t step, gc_perm order, int shuffle, double* sums) {
#if GC_BODIES
    gc_wait_prior();
    gc_cursor_start(cursor, step, order, shuffle, sums);
#endif
}

GC_SHARED int gc_set_cursor(gc_cursor* cursor, int64_t step, gc_perm order, int shuffle, double* sums) {
    return gc_launch(gc_set_cursor_kernel, 1, 1, cursor, step, order, shuffle, sums);
}

__global__ void gc_steps_done_kernel(gc_cursor* cursor, int64_t steps, const float* loss, double* sums) {
#if GC_BODIES
    gc_wait_prior();
    gc_cursor_advance(cursor, steps, loss, sums);
#endif
}

GC_SHARED int gc_steps_done(gc_cursor* cursor, int64_t steps, const float* loss, double* sums) {
    return gc_launch(gc_steps_done_kernel, 1, 1, cursor, steps, loss, sums);
}

// correct (+)= number of rows b < count whose argmax(logits[b]) equals y[b] (first maximum wins, as numpy);
// the first batch of an evaluation sets it (no separate zeroing launch).
__global__ void gc_count_correct_kernel(const float* __restrict__ logits, const int32_t* __restrict__ y,
                                        int count, int classes, int64_t* correct, int first) {
#if GC_BODIES
    __shared__ int64_t shared[GC_BLOCK];
    gc_wait_prior();
    int64_t hits = 0;
    for (int b = threadIdx.x; b < count; b += GC_BLOCK)
        hits += gc_argmax(logits + (size_t)b * classes, classes) == y[b];
    hits = gc_block_reduce<int64_t, false>(hits, shared);
    if (threadIdx.x == 0) *correct = (first ? 0 : *correct) + hits;
#endif
}

GC_SHARED int gc_count_correct(const float* logits, const int32_t* y, int count, int classes, int64_t* correct,
                               int first) {
    return gc_launch(gc_count_correct_kernel, 1, GC_BLOCK, logits, y, count, classes, correct, first);
}

// dst (cols x rows) = src (rows x cols)^T, float: a variable's mirror (lower.py's mirror_variables), refreshed
// after the host writes the variable (gc_refresh_mirrors). 32 x 32 tiles through shared memory (a column of
// 33 words: the tile's reads and writes both hit 32 banks), coalesced both ways.
__global__ void gc_transpose_kernel(const float* __restrict__ src, float* __restrict__ dst, int rows, int cols) {
#if GC_BODIES
    __shared__ float tile[32][33];
    gc_wait_prior();
    const int r0 = blockIdx.y * 32, c0 = blockIdx.x * 32;
    for (int i = threadIdx.y; i < 32; i += blockDim.y)
        if (r0 + i < rows && c0 + threadIdx.x < cols) tile[i][threadIdx.x] = src[(size_t)(r0 + i) * cols + c0 + threadIdx.x];
    __syncthreads();
    for (int i = threadIdx.y; i < 32; i += blockDim.y)
        if (c0 + i < cols && r0 + threadIdx.x < rows) dst[(size_t)(c0 + i) * rows + r0 + threadIdx.x] = tile[threadIdx.x][i];
#endif
}

GC_SHARED int gc_transpose(const float* src, float* dst, int rows, int cols) {
    if (rows <= 0 || cols <= 0) return GC_OK;
    return gc_launch(gc_transpose_kernel, dim3((cols + 31) / 32, (rows + 31) / 32), dim3(32, 8), src, dst, rows, cols);
}

// Floats [first, first + count) of n uint8 values widened where they lie (gc_widen_pixels): value i's byte at
// at[3n + i], its float gc_pixel(byte, scale) at ((float*)at)[i].
__global__ void gc_widen_pixels_kernel(unsigned char* at, int64_t n, int64_t first, int64_t count, float scale) {
#if GC_BODIES
    gc_wait_prior();   // the launch before read the bytes this one's floats overwrite
    const unsigned char* bytes = at + 3 * n;
    float* out = (float*)at;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = first + (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < first + count; i += stride)
        out[i] = gc_pixel(bytes[i], scale);
#endif
}

// The trainer's uint8 images as floats on the device (gc_main.h, gc_upload_split): the n bytes at at + 3n become n
// floats at at, in place. With d values done, a launch widens p = 3 (n - d) / 4 more (the last alone when one is
// left): their floats end at 4 (d + p) <= 3n + d, before the first byte still to be read, and each launch waits for
// the one before. ~log4(n) launches (MNIST's 47M bytes: 13).
GC_SHARED int gc_widen_pixels(unsigned char* at, int64_t n, float scale) {
    for (int64_t done = 0; done < n;) {
        const int64_t left = n - done, part = left > 1 ? 3 * left / 4 : 1;
        const int64_t blocks = (part + GC_BLOCK - 1) / GC_BLOCK;
        GC_TRY(gc_launch(gc_widen_pixels_kernel, (unsigned)(blocks < 4096 ? blocks : 4096), GC_BLOCK, at, n, done, part,
                         scale));
        done += part;
    }
    return GC_OK;
}

#if defined(GC_PART_KERNELS) || defined(GC_PART_LAUNCH)   // the gathers the host part's trainer calls (gc_main.h: gc_gather_batch)
template int gc_gather<uint8_t>(const uint8_t*, const int32_t*, const gc_cursor*, int64_t, int, int, float, float*,
                                int32_t*, int, const float*, double*);
template int gc_gather<float>(const float*, const int32_t*, const gc_cursor*, int64_t, int, int, float, float*,
                              int32_t*, int, const float*, double*);
#endif
#else   // the host part: the trainer's launchers above, defined in kernels part 0
template <typename IMG>
GC_SHARED int gc_gather(const IMG* images, const int32_t* labels, const gc_cursor* cursor, int64_t first, int count,
                        int row, float scale, float* x, int32_t* y, int batch, const float* loss, double* sums);
GC_SHARED int gc_batch_rows(const void* images, int row_bytes, const int32_t* labels, const gc_cursor* cursor,
                            int64_t first, int count, uint32_t* rows, int32_t* y, int batch, const float* loss,
                            double* sums);
GC_SHARED int gc_set_cursor(gc_cursor* cursor, int64_t step, gc_perm order, int shuffle, double* sums);
GC_SHARED int gc_steps_done(gc_cursor* cursor, int64_t steps, const float* loss, double* sums);
GC_SHARED int gc_count_correct(const float* logits, const int32_t* y, int count, int classes, int64_t* correct,
                               int first);
GC_SHARED int gc_widen_pixels(unsigned char* at, int64_t n, float scale);
#endif   // GC_KERNELS0
