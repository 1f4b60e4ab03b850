// What a phase of a training step cannot go below on this GPU (bench/floors.py builds and runs it; needs
// sm_90: programmatic launch, TMA bulk copies). Two measurements, one JSON line each (the first line names
// the GPU):
//
// boundary: PHASES phases, each block reading the word its neighbour block wrote in the phase before (a true
//   dependency between phases), pulling KB of its own L2-resident bytes, writing its own word — as PHASES
//   kernels captured in one CUDA graph (plain, or programmatic: griddepcontrol.wait first, launch_dependents
//   after the bytes), or as one persistent kernel whose blocks meet at a grid-wide barrier after each phase
//   (one thread a block: a release add on a counter, acquire loads until every block has arrived). us: per
//   phase, the median of REPS replays.
// pull: every block of a grid pulls its own KB of L2-resident bytes, LAUNCHES launches in one graph
//   (programmatic); us: per launch beyond an empty launch of the same grid; form: 16-byte loads into
//   registers (8 in flight a thread), cp.async 16-byte copies into shared memory, TMA bulk copies of 16 KB,
//   or TMA bulk copies of 256 / 128 bytes (a gathered row a copy) — the async forms STAGES x 16 KB in flight.
// operands: x @ W1's K steps pulled as its warp-specialized kernel pulls them (the H100 b1000 tf32 record: 64 x 64
//   tiles, split 2, 128 blocks; OP_STEPS steps a block): B one TMA tensor copy a step (a box of 64 rows x 32 k of
//   W1's mirror, 256 x 784 floats, 128-byte swizzle), A the block's 64 gathered rows x 32 k by 16-byte cp.async
//   (float rows, or uint8 rows: a quarter of the bytes), each alone and together, OP_STAGES steps in flight; us:
//   per launch beyond an empty launch, and ns a step.
#include <cuda.h>           // CUtensorMap (the encoder comes through the runtime: no libcuda link)
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define FL_CHECK(x)                                                                                  \
    do {                                                                                             \
        cudaError_t e_ = (x);                                                                        \
        if (e_ != cudaSuccess) {                                                                     \
            printf("{\"error\": \"%s (line %d): %s\"}\n", #x, __LINE__, cudaGetErrorString(e_));     \
            exit(1);                                                                                 \
        }                                                                                            \
    } while (0)

constexpr int PHASES = 300, LAUNCHES = 200, REPS = 25, WARM = 5;
constexpr int CHUNK = 16384, STAGES = 4;   // the async forms' bytes in flight: STAGES x CHUNK
constexpr int FLAG_WORDS = 1024;           // a phase's flags (one word a block), two sets alternating

__device__ __forceinline__ void fl_wait_prior() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void fl_release_next() { asm volatile("griddepcontrol.launch_dependents;"); }

// mbarriers of one arrival each (by the calling thread, with their init fence); an arrival expecting `bytes` of
// TMA copies; waiting for a phase's completion.
__device__ __forceinline__ void fl_bars_init(unsigned long long* bar, int n) {
    for (int s = 0; s < n; s++)
        asm volatile("mbarrier.init.shared.b64 [%0], 1;" ::"r"((unsigned)__cvta_generic_to_shared(&bar[s])));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void fl_bar_expect(unsigned long long* bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;"
                 ::"r"((unsigned)__cvta_generic_to_shared(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void fl_bar_wait(unsigned long long* bar, unsigned parity) {
    unsigned done = 0;
    while (!done)
        asm volatile("{ .reg .pred q; mbarrier.try_wait.parity.shared.b64 q, [%1], %2; selp.u32 %0, 1, 0, q; }"
                     : "=r"(done) : "r"((unsigned)__cvta_generic_to_shared(bar)), "r"(parity) : "memory");
}

// A block's pass over its `words` 16-byte words at p: 8 loads in flight a thread; the sum keeps them live.
__device__ __forceinline__ float fl_touch(const float4* p, int words) {
    float s = 0.f;
    int i = threadIdx.x;
    for (; i + 7 * (int)blockDim.x < words; i += 8 * blockDim.x) {
        float4 v[8];
#pragma unroll
        for (int u = 0; u < 8; u++) v[u] = __ldcg(p + i + u * blockDim.x);
#pragma unroll
        for (int u = 0; u < 8; u++) s += v[u].x + v[u].w;
    }
    for (; i < words; i += blockDim.x) s += __ldcg(p + i).x;
    return s;
}

// ---- boundary ----
template <bool PDL>
__global__ void fl_phase(float* flags, const float4* data, int words, int k, float* sink) {
    if (PDL) fl_wait_prior();
    const int n = gridDim.x;
    const float v = __ldcg(flags + ((k - 1) & 1) * FLAG_WORDS + (blockIdx.x + 1) % n);
    const float s = fl_touch(data + (size_t)blockIdx.x * words, words);
    __syncthreads();
    if (PDL) fl_release_next();
    if (threadIdx.x == 0) __stcg(flags + (k & 1) * FLAG_WORDS + blockIdx.x, v + 1.f);
    if (s == 12345.f) sink[0] = s;   // never true: the bytes are zeros
}

__global__ void fl_persistent(float* flags, const float4* data, int words, unsigned* counter, unsigned base,
                              float* sink) {
    const int n = gridDim.x;
    float acc = 0.f;
    for (int k = 1; k <= PHASES; k++) {
        const float v = __ldcg(flags + ((k - 1) & 1) * FLAG_WORDS + (blockIdx.x + 1) % n);
        acc += fl_touch(data + (size_t)blockIdx.x * words, words);
        __syncthreads();
        if (threadIdx.x == 0) {
            __stcg(flags + (k & 1) * FLAG_WORDS + blockIdx.x, v + 1.f);
            const unsigned target = base + (unsigned)k * n;
            asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(counter) : "memory");
            unsigned c;
            do {
                asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(c) : "l"(counter) : "memory");
            } while ((int)(c - target) < 0);
        }
        __syncthreads();
    }
    if (acc == 12345.f) sink[0] = acc;
}

// ---- pull ----
__global__ void fl_pull_registers(const float4* data, int words, float* sink) {
    fl_wait_prior();
    const float s = fl_touch(data + (size_t)blockIdx.x * words, words);
    fl_release_next();
    if (s == 12345.f) sink[0] = s;
}

__global__ void fl_pull_cp_async(const float4* data, int words, float* sink) {
    extern __shared__ __align__(128) unsigned char fl_smem[];
    fl_wait_prior();
    const float4* p = data + (size_t)blockIdx.x * words;
    constexpr int PER = CHUNK / 16;
    const int chunks = words / PER;
    auto issue = [&](int c) {   // chunk c into stage c % STAGES, a commit group (empty past the end)
        if (c < chunks) {
            for (int i = threadIdx.x; i < PER; i += blockDim.x) {
                const unsigned d = (unsigned)__cvta_generic_to_shared(fl_smem + (c % STAGES) * CHUNK + i * 16);
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(p + (size_t)c * PER + i)
                             : "memory");
            }
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
    };
    for (int c = 0; c < STAGES; c++) issue(c);
    for (int c = 0; c < chunks; c++) {
        asm volatile("cp.async.wait_group %0;" ::"n"(STAGES - 1) : "memory");
        issue(c + STAGES);
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    __syncthreads();
    fl_release_next();
    if (threadIdx.x == 0 && fl_smem[5] == 77) sink[0] = 1.f;
}

// TMA bulk copies of PIECE bytes, a chunk's pieces issued by the block's first warp, STAGES chunks in flight,
// each stage's mbarrier expecting its chunk's bytes.
template <int PIECE>
__global__ void fl_pull_bulk(const float4* data, int words, float* sink) {
    extern __shared__ __align__(128) unsigned char fl_smem[];
    __shared__ __align__(8) unsigned long long bar[STAGES];
    fl_wait_prior();
    const char* p = reinterpret_cast<const char*>(data + (size_t)blockIdx.x * words);
    const int chunks = words * 16 / CHUNK, lane = threadIdx.x;
    if (threadIdx.x < 32) {
        if (lane == 0) fl_bars_init(bar, STAGES);
        __syncwarp();
        auto issue = [&](int c) {
            const unsigned b = (unsigned)__cvta_generic_to_shared(&bar[c % STAGES]);
            if (lane == 0) fl_bar_expect(&bar[c % STAGES], CHUNK);
            __syncwarp();
            for (int i = lane; i < CHUNK / PIECE; i += 32) {
                const unsigned d = (unsigned)__cvta_generic_to_shared(fl_smem + (c % STAGES) * CHUNK + i * PIECE);
                asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                             ::"r"(d), "l"(p + (size_t)c * CHUNK + i * PIECE), "r"(PIECE), "r"(b) : "memory");
            }
        };
        for (int c = 0; c < STAGES && c < chunks; c++) issue(c);
        for (int c = 0; c < chunks; c++) {
            fl_bar_wait(&bar[c % STAGES], (c / STAGES) & 1);
            __syncwarp();
            if (c + STAGES < chunks) issue(c + STAGES);
        }
    }
    __syncthreads();
    fl_release_next();
    if (threadIdx.x == 0 && fl_smem[5] == 77) sink[0] = 1.f;
}

// ---- operands ----
constexpr int OP_STEPS = 12, OP_ROWS = 8192, OP_K = 784, OP_N = 256;   // the dataset's rows; W1's mirror: N x K
constexpr int OP_STAGES = 4, OP_STEP = 16384;   // a stage: B's box (8 KB), then A's rows (8 KB of floats or 2 KB)

// Block b's steps: W1's mirror rows 64 (b % 4) .., k from OP_STEPS 32 (b / 4 % 2) (its split), its 64 gathered rows
// (indices 64 (b / 8) ..; staged in shared memory first, as the kernel does). BOX: B by thread 0's tensor copy,
// counted on the stage's mbarrier; E: A's element (float or uint8 rows), none without AROWS; a stage's cp.async
// copies are one commit group.
template <bool BOX, bool AROWS, typename E>
__global__ void fl_operands(const __grid_constant__ CUtensorMap w1, const E* x, const unsigned* idx, int steps,
                            float* sink) {
    extern __shared__ __align__(128) unsigned char fl_smem[];
    __shared__ __align__(8) unsigned long long bar[OP_STAGES];
    __shared__ unsigned rows[64];
    unsigned char* const stages = fl_smem + (-(uintptr_t)fl_smem & 1023);   // (the swizzle's 1024-byte rows)
    fl_wait_prior();
    const int n0 = blockIdx.x % 4 * 64, k0 = blockIdx.x / 4 % 2 * OP_STEPS * 32;
    if (threadIdx.x < 64) rows[threadIdx.x] = idx[blockIdx.x / 8 * 64 + threadIdx.x];
    if (threadIdx.x == 0) fl_bars_init(bar, OP_STAGES);
    __syncthreads();
    constexpr int CPR = 32 * (int)sizeof(E) / 16;   // a row's 16-byte chunks a step
    auto issue = [&](int s) {
        unsigned char* d = stages + (s % OP_STAGES) * OP_STEP;
        if (s < steps) {
            if (BOX && threadIdx.x == 0) {
                fl_bar_expect(&bar[s % OP_STAGES], 64 * 128);
                asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                             " [%0], [%1, {%2, %3}], [%4];"
                             ::"r"((unsigned)__cvta_generic_to_shared(d)), "l"(reinterpret_cast<uint64_t>(&w1)),
                               "r"(k0 + 32 * s), "r"(n0), "r"((unsigned)__cvta_generic_to_shared(&bar[s % OP_STAGES]))
                             : "memory");
            }
            if (AROWS)
                for (int i = threadIdx.x; i < 64 * CPR; i += blockDim.x) {
                    const int r = i / CPR, c = i % CPR;
                    const unsigned a = (unsigned)__cvta_generic_to_shared(d + 8192 + r * 32 * sizeof(E) + c * 16);
                    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;"
                                 ::"r"(a), "l"(x + (size_t)rows[r] * OP_K + k0 + 32 * s + c * 16 / sizeof(E)) : "memory");
                }
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
    };
    for (int s = 0; s < OP_STAGES; s++) issue(s);
    for (int s = 0; s < steps; s++) {
        asm volatile("cp.async.wait_group %0;" ::"n"(OP_STAGES - 1) : "memory");
        if (BOX) fl_bar_wait(&bar[s % OP_STAGES], (s / OP_STAGES) & 1);
        __syncthreads();   // every thread's copies of step s have landed: its stage is free again
        issue(s + OP_STAGES);
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    __syncthreads();
    fl_release_next();
    if (threadIdx.x == 0 && stages[5] == 77) sink[0] = 1.f;
}

// ---- the driver ----
static cudaStream_t stream;
static cudaEvent_t ev0, ev1;

static float median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// Microseconds a unit (of `units` in one replay) takes: median over REPS replays after WARM.
template <class Replay>
static float time_units(Replay&& replay, int units) {
    std::vector<float> t;
    for (int r = 0; r < WARM + REPS; r++) {
        FL_CHECK(cudaEventRecord(ev0, stream));
        replay(r);
        FL_CHECK(cudaEventRecord(ev1, stream));
        FL_CHECK(cudaEventSynchronize(ev1));
        FL_CHECK(cudaGetLastError());
        float ms;
        FL_CHECK(cudaEventElapsedTime(&ms, ev0, ev1));
        if (r >= WARM) t.push_back(ms * 1000.f / units);
    }
    return median(t);
}

// A graph of `count` launches (grid x block, smem bytes), programmatic or not: launch(cfg, k) launches the
// k-th (from 1).
template <class Launch>
static cudaGraphExec_t graph_of(int count, int grid, int block, int smem, bool pdl, Launch&& launch) {
    cudaGraph_t g;
    cudaGraphExec_t exec;
    FL_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    for (int k = 1; k <= count; k++) {
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.gridDim = grid;
        cfg.blockDim = block;
        cfg.dynamicSmemBytes = smem;
        cfg.stream = stream;
        cfg.attrs = attr;
        cfg.numAttrs = pdl ? 1 : 0;
        FL_CHECK(launch(cfg, k));
    }
    FL_CHECK(cudaStreamEndCapture(stream, &g));
    FL_CHECK(cudaGraphInstantiate(&exec, g, 0));
    FL_CHECK(cudaGraphDestroy(g));
    return exec;
}

static float* g_flags;
static float4* g_data;
static int g_words;
static float* g_sink;
static unsigned* g_counter;

// One measurement's JSON line: what was measured, then `rest` (its figures, or why it was skipped).
static void emit(const char* kind, const char* form, int blocks, int threads, int kb, const char* rest) {
    printf("{\"kind\": \"%s\", \"form\": \"%s\", \"blocks\": %d, \"threads\": %d, \"kb\": %d, %s}\n", kind, form,
           blocks, threads, kb, rest);
    fflush(stdout);
}

static float replay_graph(cudaGraphExec_t exec, int units) {
    const float us = time_units([&](int) { FL_CHECK(cudaGraphLaunch(exec, stream)); }, units);
    FL_CHECK(cudaGraphExecDestroy(exec));
    return us;
}

static void boundary(int blocks, int threads, int kb) {
    g_words = kb * 1024 / 16;
    const char* forms[] = {"plain", "programmatic"};
    char rest[160];
    for (int pdl = 0; pdl < 2; pdl++) {
        auto kernel = pdl ? fl_phase<true> : fl_phase<false>;
        auto launch = [&](const cudaLaunchConfig_t& cfg, int k) {
            return cudaLaunchKernelEx(&cfg, kernel, g_flags, (const float4*)g_data, g_words, k, g_sink);
        };
        const float us = replay_graph(graph_of(PHASES, blocks, threads, 0, pdl, launch), PHASES);
        snprintf(rest, sizeof rest, "\"us\": %.4f", us);
        emit("boundary", forms[pdl], blocks, threads, kb, rest);
    }
    int per_sm = 0, sms = 0;
    FL_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fl_persistent, threads, 0));
    FL_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    if (per_sm * sms < blocks) {   // a grid-wide barrier needs every block resident at once
        snprintf(rest, sizeof rest, "\"skipped\": \"%d blocks are not resident at once (%d an SM)\"", blocks, per_sm);
        emit("boundary", "persistent", blocks, threads, kb, rest);
        return;
    }
    unsigned base = 0;
    FL_CHECK(cudaMemset(g_counter, 0, sizeof(unsigned)));
    const float us = time_units([&](int) {
        fl_persistent<<<blocks, threads, 0, stream>>>(g_flags, g_data, g_words, g_counter, base, g_sink);
        base += (unsigned)PHASES * blocks;
    }, PHASES);
    snprintf(rest, sizeof rest, "\"us\": %.4f", us);
    emit("boundary", "persistent", blocks, threads, kb, rest);
}

static void pull(int blocks, int threads, int kb) {
    struct Form { const char* name; void (*kernel)(const float4*, int, float*); int smem; };
    const Form forms[] = {{"registers", fl_pull_registers, 0},
                          {"cp.async", fl_pull_cp_async, STAGES * CHUNK},
                          {"tma bulk 16KB", fl_pull_bulk<CHUNK>, STAGES * CHUNK},
                          {"tma bulk 256B", fl_pull_bulk<256>, STAGES * CHUNK},
                          {"tma bulk 128B", fl_pull_bulk<128>, STAGES * CHUNK}};
    for (const Form& f : forms) {
        FL_CHECK(cudaFuncSetAttribute(f.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, f.smem));
        float us[2];
        for (int full = 0; full < 2; full++) {
            g_words = full ? kb * 1024 / 16 : 0;
            auto launch = [&](const cudaLaunchConfig_t& cfg, int) {
                return cudaLaunchKernelEx(&cfg, f.kernel, (const float4*)g_data, g_words, g_sink);
            };
            us[full] = replay_graph(graph_of(LAUNCHES, blocks, threads, f.smem, true, launch), LAUNCHES);
        }
        const double bytes = (double)blocks * kb * 1024;
        char rest[160];
        const float beyond = us[1] - us[0];
        snprintf(rest, sizeof rest, "\"us\": %.4f, \"empty_us\": %.4f, \"bytes\": %.0f, \"tb_per_s\": %.3f", beyond,
                 us[0], bytes, bytes / (beyond * 1e-6) / 1e12);
        emit("pull", f.name, blocks, threads, kb, rest);
    }
}

static float* g_w1;
static void* g_x[2];   // the dataset's rows: floats, bytes
static unsigned* g_idx;

// One operands form: BOX / AROWS / E as fl_operands's; a launch of OP_STEPS steps against an empty one.
template <bool BOX, bool AROWS, typename E>
static void operand_form(const char* name, const CUtensorMap& map, int blocks, int threads) {
    auto kernel = fl_operands<BOX, AROWS, E>;
    const int smem = OP_STAGES * OP_STEP + 1024;
    FL_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    const E* x = static_cast<const E*>(g_x[sizeof(E) == 1]);
    float us[2];
    for (int full = 0; full < 2; full++) {
        const int steps = full ? OP_STEPS : 0;
        auto launch = [&](const cudaLaunchConfig_t& cfg, int) {
            return cudaLaunchKernelEx(&cfg, kernel, map, x, (const unsigned*)g_idx, steps, g_sink);
        };
        us[full] = replay_graph(graph_of(LAUNCHES, blocks, threads, smem, true, launch), LAUNCHES);
    }
    const int step_bytes = (BOX ? 64 * 128 : 0) + (AROWS ? 64 * 32 * (int)sizeof(E) : 0);
    const double bytes = (double)blocks * OP_STEPS * step_bytes;
    const float beyond = us[1] - us[0];
    char rest[200];
    snprintf(rest, sizeof rest, "\"steps\": %d, \"us\": %.4f, \"empty_us\": %.4f, \"ns_per_step\": %.1f, \"bytes\": %.0f, "
             "\"tb_per_s\": %.3f", OP_STEPS, beyond, us[0], beyond * 1e3f / OP_STEPS, bytes, bytes / (beyond * 1e-6) / 1e12);
    emit("operands", name, blocks, threads, (int)(bytes / blocks / 1024), rest);
}

static void operands(int blocks, int threads) {
    static const char* forms[] = {"B box", "A float rows", "A uint8 rows", "A float rows + B box",
                                  "A uint8 rows + B box"};
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found;
    CUtensorMap map;
    const cuuint64_t dims[2] = {OP_K, OP_N}, strides[1] = {OP_K * 4};
    const cuuint32_t box[2] = {32, 64}, unit[2] = {1, 1};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) !=
            cudaSuccess || found != cudaDriverEntryPointSuccess ||
        ((PFN_cuTensorMapEncodeTiled_v12000)fn)(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, g_w1, dims, strides, box,
            unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
        for (const char* f : forms)
            emit("operands", f, blocks, threads, 0, "\"skipped\": \"the driver gives no tensor-map encoder\"");
        return;
    }
    operand_form<true, false, float>(forms[0], map, blocks, threads);
    operand_form<false, true, float>(forms[1], map, blocks, threads);
    operand_form<false, true, uint8_t>(forms[2], map, blocks, threads);
    operand_form<true, true, float>(forms[3], map, blocks, threads);
    operand_form<true, true, uint8_t>(forms[4], map, blocks, threads);
}

int main() {
    cudaDeviceProp prop;
    FL_CHECK(cudaGetDeviceProperties(&prop, 0));
    if (prop.major < 9) {
        printf("{\"error\": \"%s is of compute capability %d.%d: these kernels need 9.0 (programmatic launch, "
               "TMA)\"}\n", prop.name, prop.major, prop.minor);
        return 1;
    }
    const int sms = prop.multiProcessorCount;
    if (2 * sms > FLAG_WORDS) {   // a phase's flags: one word a block of the largest grid
        printf("{\"error\": \"%d SMs: the boundary grids need more than %d flags\"}\n", sms, FLAG_WORDS);
        return 1;
    }
    printf("{\"gpu\": \"%s\", \"sms\": %d}\n", prop.name, sms);
    const size_t data_bytes = (size_t)2 * sms * 256 * 1024;   // the largest grid's bytes: 2 blocks an SM x 256 KB
    FL_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    FL_CHECK(cudaEventCreate(&ev0));
    FL_CHECK(cudaEventCreate(&ev1));
    FL_CHECK(cudaMalloc(&g_flags, 2 * FLAG_WORDS * sizeof(float)));
    FL_CHECK(cudaMemset(g_flags, 0, 2 * FLAG_WORDS * sizeof(float)));
    FL_CHECK(cudaMalloc(&g_data, data_bytes));
    FL_CHECK(cudaMemset(g_data, 0, data_bytes));
    FL_CHECK(cudaMalloc(&g_sink, sizeof(float)));
    FL_CHECK(cudaMalloc(&g_counter, sizeof(unsigned)));
    for (int blocks : {sms, 2 * sms})
        for (int kb : {0, 16, 64}) boundary(blocks, 256, kb);
    // the H100 b1000 tf32 step's x @ W1 (64 x 64 split 2: 128 blocks, 13 K steps of 16 KB) and dW1 (64 x 64 split 4:
    // 208 blocks, 8 K steps of 16 KB)
    pull(128, 384, 208);
    pull(208, 256, 128);
    // x @ W1's operands: its record's grid, the producers' 256 threads issuing (W1's mirror and the rows zeros; the
    // gathered rows' indices spread over OP_ROWS, fixed)
    FL_CHECK(cudaMalloc(&g_w1, (size_t)OP_N * OP_K * 4));
    FL_CHECK(cudaMemset(g_w1, 0, (size_t)OP_N * OP_K * 4));
    for (int e = 0; e < 2; e++) {
        const size_t bytes = (size_t)OP_ROWS * OP_K * (e ? 1 : 4);
        FL_CHECK(cudaMalloc(&g_x[e], bytes));
        FL_CHECK(cudaMemset(g_x[e], 0, bytes));
    }
    std::vector<unsigned> idx(16 * 64);
    for (size_t i = 0; i < idx.size(); i++) idx[i] = (unsigned)((i * 2654435761u) % OP_ROWS);
    FL_CHECK(cudaMalloc(&g_idx, idx.size() * 4));
    FL_CHECK(cudaMemcpy(g_idx, idx.data(), idx.size() * 4, cudaMemcpyHostToDevice));
    operands(128, 256);
    return 0;
}
