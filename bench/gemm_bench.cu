// gemm_bench.cu — the GEMM micro-benchmark's driver (bench/gemm_bench.py writes gemm_cases.h and the case
// functions, builds this with nvcc --default-stream per-thread and links cuBLAS).
//
// For each case: random operands; the own kernel once, checked against cuBLAS in pedantic fp32 (the
// epilogue applied on the host); then the own kernel and cuBLAS timed the same way: 20 launches (2 for
// large problems) captured in one CUDA graph, replayed until a trial lasts about a millisecond,
// GC_BENCH_TRIALS trials, per-launch time = trial time / launches (median, min, max). cuBLAS modes: default math (fp32 SGEMM), pedantic, and
// tf32 tensor-op math. One JSON object per line on stdout.
#include <cublas_v2.h>
#include <algorithm>
#include <functional>
#include <random>
#include <vector>
#include "gemm_bench.h"
#include "gemm_cases.h"      // GC_BENCH_CASES[] (generated), GC_BENCH_TRIALS

#define CHECK(call) do { int rc_ = (call); if (rc_ != GC_OK) { \
    fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, gc_error_message); exit(1); } } while (0)
#define CUDA(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); exit(1); } } while (0)
#define CUBLAS(call) do { cublasStatus_t st_ = (call); if (st_ != CUBLAS_STATUS_SUCCESS) { \
    fprintf(stderr, "%s:%d: %s failed: %d\n", __FILE__, __LINE__, #call, (int)st_); exit(1); } } while (0)

static cudaStream_t stream = cudaStreamPerThread;   // what the own kernels' default-stream launches use

struct timing { double median, lo, hi; };

// Per-launch microseconds of `launch`, run `per_graph` times in one captured graph.
static timing time_launches(const std::function<void()>& launch, int per_graph) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < per_graph; i++) launch();
    CUDA(cudaStreamEndCapture(stream, &graph));
    CUDA(cudaGraphInstantiate(&exec, graph, 0));
    cudaEvent_t start, stop;
    CUDA(cudaEventCreate(&start));
    CUDA(cudaEventCreate(&stop));
    float ms = 0;
    int replays = 1;
    for (int warm = 0; warm < 3; warm++) {   // warm up, and find how many replays make a ~1 ms trial
        CUDA(cudaEventRecord(start, stream));
        for (int r = 0; r < replays; r++) CUDA(cudaGraphLaunch(exec, stream));
        CUDA(cudaEventRecord(stop, stream));
        CUDA(cudaEventSynchronize(stop));
        CUDA(cudaEventElapsedTime(&ms, start, stop));
        replays = std::max(1, std::min(1000, (int)(replays * 1.0 / std::max(ms, 1e-3f))));
    }
    std::vector<double> us;
    for (int t = 0; t < GC_BENCH_TRIALS; t++) {
        CUDA(cudaEventRecord(start, stream));
        for (int r = 0; r < replays; r++) CUDA(cudaGraphLaunch(exec, stream));
        CUDA(cudaEventRecord(stop, stream));
        CUDA(cudaEventSynchronize(stop));
        CUDA(cudaEventElapsedTime(&ms, start, stop));
        us.push_back(ms * 1000.0 / replays / per_graph);
    }
    std::sort(us.begin(), us.end());
    CUDA(cudaGraphExecDestroy(exec));
    CUDA(cudaGraphDestroy(graph));
    CUDA(cudaEventDestroy(start));
    CUDA(cudaEventDestroy(stop));
    return {us[us.size() / 2], us.front(), us.back()};
}

// C (M, N) row-major = op(A) op(B) through column-major cuBLAS: C^T = op(B)^T op(A)^T.
static void cublas_gemm(cublasHandle_t h, const gc_bench_case& c, const float* A, const float* B, float* C) {
    const float one = 1, zero = 0;
    CUBLAS(cublasSgemm(h, c.tb ? CUBLAS_OP_T : CUBLAS_OP_N, c.ta ? CUBLAS_OP_T : CUBLAS_OP_N, c.n, c.m, c.k, &one,
                       B, c.tb ? c.k : c.n, A, c.ta ? c.m : c.k, &zero, C, c.n));
}

static void json_timing(const char* key, timing t) {
    printf(", \"%s_us\": %.4f, \"%s_us_min\": %.4f, \"%s_us_max\": %.4f", key, t.median, key, t.lo, key, t.hi);
}

int main() {
    cudaDeviceProp prop;
    CUDA(cudaGetDeviceProperties(&prop, 0));
    printf("{\"gpu\": \"%s\", \"sms\": %d}\n", prop.name, prop.multiProcessorCount);
    fflush(stdout);
    cublasHandle_t h;
    CUBLAS(cublasCreate(&h));
    CUBLAS(cublasSetStream(h, stream));
    void* workspace;
    CUDA(cudaMalloc(&workspace, 64 << 20));
    CUBLAS(cublasSetWorkspace(h, workspace, 64 << 20));
    std::mt19937 rng(1234);
    std::uniform_real_distribution<float> uniform(-1.f, 1.f);

    // cuBLAS timings are per shape and mode: measured once, reused by the cases sharing them.
    struct cached { int m, n, k, ta, tb; cublasMath_t mode; timing t; };
    std::vector<cached> cache;
    auto cublas_time = [&](const gc_bench_case& c, cublasMath_t mode, const float* A, const float* B, float* C) {
        for (auto& e : cache)
            if (e.m == c.m && e.n == c.n && e.k == c.k && e.ta == c.ta && e.tb == c.tb && e.mode == mode) return e.t;
        CUBLAS(cublasSetMathMode(h, mode));
        timing t = time_launches([&] { cublas_gemm(h, c, A, B, C); }, c.m * (double)c.n * c.k > 1e10 ? 2 : 20);
        cache.push_back({c.m, c.n, c.k, c.ta, c.tb, mode, t});
        return t;
    };

    for (const gc_bench_case& c : GC_BENCH_CASES) {
        const size_t na = (size_t)c.m * c.k, nb = (size_t)c.k * c.n, nc = (size_t)c.m * c.n;
        std::vector<float> ha(na), hb(nb), haux(nc), hc(nc), href(nc);
        for (auto& x : ha) x = uniform(rng);
        for (auto& x : hb) x = uniform(rng);
        for (auto& x : haux) x = uniform(rng);
        float *A, *B, *C, *ref, *aux;
        CUDA(cudaMalloc(&A, na * 4));
        CUDA(cudaMalloc(&B, nb * 4));
        CUDA(cudaMalloc(&C, nc * 4));
        CUDA(cudaMalloc(&ref, nc * 4));
        CUDA(cudaMalloc(&aux, nc * 4));
        CUDA(cudaMemcpy(A, ha.data(), na * 4, cudaMemcpyHostToDevice));
        CUDA(cudaMemcpy(B, hb.data(), nb * 4, cudaMemcpyHostToDevice));
        CUDA(cudaMemcpy(aux, haux.data(), nc * 4, cudaMemcpyHostToDevice));
        CUDA(cudaMemset(C, 0xff, nc * 4));   // NaN: an output the kernel does not write fails the check

        // correctness: own kernel vs cuBLAS pedantic fp32, the epilogue applied on the host
        if (c.fn(A, B, C, aux) != GC_OK || cudaDeviceSynchronize() != cudaSuccess) {   // report, go on
            printf("{\"name\": \"%s\", \"tile\": \"%s\", \"error\": \"%s %s\"}\n", c.name, c.tile,
                   gc_error_message, cudaGetErrorString(cudaGetLastError()));
            fflush(stdout);
            continue;
        }
        CUBLAS(cublasSetMathMode(h, CUBLAS_PEDANTIC_MATH));
        cublas_gemm(h, c, A, B, ref);
        CUDA(cudaStreamSynchronize(stream));
        CUDA(cudaDeviceSynchronize());
        CUDA(cudaMemcpy(hc.data(), C, nc * 4, cudaMemcpyDeviceToHost));
        CUDA(cudaMemcpy(href.data(), ref, nc * 4, cudaMemcpyDeviceToHost));
        double err = 0, norm = 0;
        for (size_t i = 0; i < nc; i++) {
            double r = href[i];
            const int n = (int)(i % c.n);
            if (!strcmp(c.epilogue, "bias_relu")) r = std::max(r + haux[n], 0.0);
            else if (!strcmp(c.epilogue, "bias")) r = r + haux[n];
            else if (!strcmp(c.epilogue, "relu_mask")) r = haux[i] > 0.f ? r : 0.0;
            const double d = hc[i] - r;
            err += d == d ? d * d : INFINITY;
            norm += r * r;
        }
        const double rel = sqrt(err / std::max(norm, 1e-300));

        const int per_graph = c.m * (double)c.n * c.k > 1e10 ? 2 : 20;
        timing own = time_launches([&] { CHECK(c.fn(A, B, C, aux)); }, per_graph);
        printf("{\"name\": \"%s\", \"m\": %d, \"n\": %d, \"k\": %d, \"ta\": %d, \"tb\": %d, \"precision\": \"%s\", "
               "\"epilogue\": \"%s\", \"tile\": \"%s\", \"rel_err\": %.3e", c.name, c.m, c.n, c.k, c.ta, c.tb,
               c.precision, c.epilogue, c.tile, rel);
        json_timing("own", own);
        if (!strcmp(c.precision, "fp32")) {
            json_timing("cublas", cublas_time(c, CUBLAS_DEFAULT_MATH, A, B, ref));
            json_timing("cublas_pedantic", cublas_time(c, CUBLAS_PEDANTIC_MATH, A, B, ref));
        } else {
            json_timing("cublas_tf32", cublas_time(c, CUBLAS_TF32_TENSOR_OP_MATH, A, B, ref));
        }
        printf("}\n");
        fflush(stdout);
        CUDA(cudaFree(A));
        CUDA(cudaFree(B));
        CUDA(cudaFree(C));
        CUDA(cudaFree(ref));
        CUDA(cudaFree(aux));
    }
    CUBLAS(cublasDestroy(h));
    return 0;
}
