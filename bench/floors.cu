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
        if (lane == 0) {
            for (int s = 0; s < STAGES; s++)
                asm volatile("mbarrier.init.shared.b64 [%0], 1;" ::"r"((unsigned)__cvta_generic_to_shared(&bar[s])));
            asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        }
        __syncwarp();
        auto issue = [&](int c) {
            const unsigned b = (unsigned)__cvta_generic_to_shared(&bar[c % STAGES]);
            if (lane == 0) asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" ::"r"(b), "r"(CHUNK));
            __syncwarp();
            for (int i = lane; i < CHUNK / PIECE; i += 32) {
                const unsigned d = (unsigned)__cvta_generic_to_shared(fl_smem + (c % STAGES) * CHUNK + i * PIECE);
                asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                             ::"r"(d), "l"(p + (size_t)c * CHUNK + i * PIECE), "r"(PIECE), "r"(b) : "memory");
            }
        };
        for (int c = 0; c < STAGES && c < chunks; c++) issue(c);
        for (int c = 0; c < chunks; c++) {
            const unsigned b = (unsigned)__cvta_generic_to_shared(&bar[c % STAGES]), parity = (c / STAGES) & 1;
            unsigned done = 0;
            while (!done)
                asm volatile("{ .reg .pred q; mbarrier.try_wait.parity.shared.b64 q, [%1], %2; selp.u32 %0, 1, 0, q; }"
                             : "=r"(done) : "r"(b), "r"(parity) : "memory");
            __syncwarp();
            if (c + STAGES < chunks) issue(c + STAGES);
        }
    }
    __syncthreads();
    fl_release_next();
    if (threadIdx.x == 0 && fl_smem[5] == 77) sink[0] = 1.f;
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
    return 0;
}
