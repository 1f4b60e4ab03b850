// gc_runtime.h — error handling, the device abstraction (CUDA or host), allocation counting, timers.
// Inlined into every generated program. Compiled by nvcc (GC_CUDA) or by a C++ compiler (cpu target).
//
// Error style: every fallible function returns an int code (GC_OK = 0) and leaves a message in
// gc_last_error(); nothing here aborts the process, so a library loaded into Python can never take it down.
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <time.h>
#include <errno.h>
#include <unistd.h>
#ifdef __CUDACC__
#define GC_CUDA 1
#include <cuda_runtime.h>
#endif

enum {
    GC_OK = 0,
    GC_ERR_ARG = 1,      // a caller passed a bad argument (null pointer, wrong size, unknown name)
    GC_ERR_DEVICE = 2,   // the CUDA runtime reported an error
    GC_ERR_IO = 3,       // a file could not be opened, read or written
    GC_ERR_FORMAT = 4,   // a file's content is not what it must be
    GC_ERR_MEMORY = 5,   // an allocation failed
    GC_ERR_NUMERIC = 6,  // a non-finite loss
};

static thread_local char gc_error_message[1024];  // per thread: Python may call from several

static int gc_fail(int code, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(gc_error_message, sizeof gc_error_message, fmt, ap);
    va_end(ap);
    return code;
}

#define GC_STR_(...) #__VA_ARGS__
#define GC_STR(...) GC_STR_(__VA_ARGS__)

// Return early with the code of a failing call (its message is already recorded).
#define GC_TRY(expr) do { int gc_rc_ = (expr); if (gc_rc_ != GC_OK) return gc_rc_; } while (0)

#ifdef GC_CUDA
// Every CUDA call goes through this: on failure it records file:line and the CUDA message.
#define GC_CUDA_TRY(call) do { cudaError_t gc_e_ = (call); if (gc_e_ != cudaSuccess) \
    return gc_fail(GC_ERR_DEVICE, "%s:%d: %s failed: %s", __FILE__, __LINE__, #call, cudaGetErrorString(gc_e_)); \
    } while (0)
// After each kernel launch: launch-configuration errors are reported where they happen.
#define GC_LAUNCH_CHECK() GC_CUDA_TRY(cudaGetLastError())
#else
#define GC_LAUNCH_CHECK() do {} while (0)
#endif

// ---- the device: present, able to run this program's kernels, memory ----------------------------------
#ifdef GC_CUDA
__global__ void gc_probe_kernel() {}

// Before anything else: is there a device, and does this program hold kernels it can run (machine code for
// its architecture, or PTX its driver can compile)? Both failures otherwise surface later as puzzles.
static int gc_device_check(void) {
    int count = 0, device = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        cudaGetLastError();
        return gc_fail(GC_ERR_DEVICE, "no usable CUDA device (%s); this program was built for the cuda target: "
                       "build it with target='cpu' (gcompile build --target cpu) to run without a GPU",
                       e != cudaSuccess ? cudaGetErrorString(e) : "the runtime found 0 devices");
    }
    cudaFuncAttributes attr;
    e = cudaFuncGetAttributes(&attr, gc_probe_kernel);
    if (e != cudaSuccess) {
        cudaDeviceProp p;
        memset(&p, 0, sizeof p);
        cudaGetLastError();
        if (cudaGetDevice(&device) == cudaSuccess) cudaGetDeviceProperties(&p, device);
        cudaGetLastError();
        return gc_fail(GC_ERR_DEVICE, "the GPU %s is sm_%d%d, but this program's kernels were built for compute "
                       "architecture(s) %s and cannot run on it (%s); rebuild with --arch sm_%d%d",
                       p.name, p.major, p.minor, GC_STR(__CUDA_ARCH_LIST__), cudaGetErrorString(e), p.major, p.minor);
    }
    return GC_OK;
}
#else
static int gc_device_check(void) { return GC_OK; }
#endif

static int gc_device_alloc(void** out, size_t bytes, const char* what) {
#ifdef GC_CUDA
    cudaError_t e = cudaMalloc(out, bytes);
    if (e != cudaSuccess) {
        size_t free_bytes = 0, total_bytes = 0;
        cudaGetLastError();
        cudaMemGetInfo(&free_bytes, &total_bytes);
        cudaGetLastError();
        *out = NULL;
        return gc_fail(GC_ERR_MEMORY, "could not allocate %zu bytes (%.2f GiB) of device memory for the %s: %s "
                       "(the device has %.2f GiB free of %.2f GiB)", bytes, bytes / 1073741824.0, what,
                       cudaGetErrorString(e), free_bytes / 1073741824.0, total_bytes / 1073741824.0);
    }
    return GC_OK;
#else
    *out = NULL;
    if (bytes == 0) bytes = 256;
    if (posix_memalign(out, 256, bytes) != 0) {
        *out = NULL;
        return gc_fail(GC_ERR_MEMORY, "could not allocate %zu bytes (%.2f GiB) of memory for the %s", bytes,
                       bytes / 1073741824.0, what);
    }
    return GC_OK;
#endif
}

static void gc_device_free(void* p) {
#ifdef GC_CUDA
    if (p) cudaFree(p);
#else
    free(p);
#endif
}

static int gc_copy_to_device(void* dst, const void* src, size_t bytes) {
#ifdef GC_CUDA
    GC_CUDA_TRY(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
#else
    memcpy(dst, src, bytes);
#endif
    return GC_OK;
}

static int gc_copy_to_host(void* dst, const void* src, size_t bytes) {
#ifdef GC_CUDA
    GC_CUDA_TRY(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
#else
    memcpy(dst, src, bytes);
#endif
    return GC_OK;
}

static int gc_device_zero(void* dst, size_t bytes) {
#ifdef GC_CUDA
    GC_CUDA_TRY(cudaMemset(dst, 0, bytes));
#else
    memset(dst, 0, bytes);
#endif
    return GC_OK;
}

static double gc_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// ---- a small seeded RNG (splitmix64) for shuffling; its whole state is one uint64 ---------------------
static uint64_t gc_rng_next(uint64_t* state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// The seed of an epoch's data order: a function of (seed, epoch) alone, so a run resumed at any epoch
// shuffles exactly as the uninterrupted run did.
static uint64_t gc_epoch_seed(uint64_t seed, uint64_t epoch) {
    uint64_t state = seed ^ (epoch * 0xD1B54A32D192ED03ull);
    return gc_rng_next(&state);
}

// Fisher-Yates shuffle of idx[0..n) driven by the RNG (unbiased: rejection on the modulo range).
static void gc_shuffle(int32_t* idx, int64_t n, uint64_t* state) {
    for (int64_t i = n - 1; i > 0; i--) {
        uint64_t bound = (uint64_t)(i + 1), limit = UINT64_MAX - UINT64_MAX % bound, r;
        do { r = gc_rng_next(state); } while (r >= limit);
        int64_t j = (int64_t)(r % bound);
        int32_t t = idx[i]; idx[i] = idx[j]; idx[j] = t;
    }
}

