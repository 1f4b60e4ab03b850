// gc_runtime.h — error handling, the device abstraction (CUDA or host), the training order (a keyed
// permutation), CUDA graph capture and replay, timers.
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
// A cuda build compiles this file several times, side by side (gcompile/build.py): nvcc twice per kernels part
// p: to device code only with GC_PART_KERNELS=p (part p's kernels; part 0 also the runtime's own), and to an
// object with GC_PART_LAUNCH=p (the launch part: those kernels' launchers and host stubs, the bodies left out
// (GC_BODIES); launch part 0 also the steps, the streams and the lookup of the kernels in the parts' device
// code, gc_kernel_of); and the host C++ compiler once with GC_PART_HOST (the rest: error messages, data,
// checkpoints, CUDA graphs, the C ABI, the trainer). The objects and the parts' device code (gc_device_code)
// are linked together. Without any (the cpu target, or nvcc run by hand on the file) one compile holds
// everything. GC_KERNELS and GC_HOST say whether this compile holds each side, GC_PART(p) whether it holds
// kernels part p (GC_KERNELS0: part 0); GC_SHARED marks what one part defines and another calls (hidden: the
// library exports only the ABI).
#if defined(GC_PART_KERNELS) || defined(GC_PART_LAUNCH) || defined(GC_PART_HOST)
#define GC_SHARED __attribute__((visibility("hidden")))
#else
#define GC_SHARED static
#endif
#ifdef GC_PART_HOST
#define GC_KERNELS 0
#else
#define GC_KERNELS 1
#endif
#if defined(GC_PART_KERNELS) || defined(GC_PART_LAUNCH)
#define GC_HOST 0
#else
#define GC_HOST 1
#endif
#if defined(GC_PART_KERNELS)
#define GC_PART(p) (GC_PART_KERNELS == (p))
#elif defined(GC_PART_LAUNCH)
#define GC_PART(p) (GC_PART_LAUNCH == (p))
#else
#define GC_PART(p) GC_KERNELS
#endif
// Whether this compile has the kernels' bodies: not a launch part (its kernels are host stubs; the device code
// it launches is the kernels parts').
#ifdef GC_PART_LAUNCH
#define GC_BODIES 0
#else
#define GC_BODIES 1
#endif
#define GC_KERNELS0 GC_PART(0)
#if defined(__CUDACC__) || defined(GC_PART_HOST)
#define GC_CUDA 1
#include <cuda_runtime.h>
#endif
// Functions that kernels of both targets call (the permutation, conv gathers, GEMM epilogues): host and
// device code on cuda, plain functions on the cpu.
#ifndef GC_HD
#ifdef __CUDACC__
#define GC_HD __host__ __device__
#else
#define GC_HD
#endif
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

#if GC_HOST
static thread_local char gc_error_message[1024];  // per thread: Python may call from several

GC_SHARED int gc_fail(int code, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(gc_error_message, sizeof gc_error_message, fmt, ap);
    va_end(ap);
    return code;
}
#else
GC_SHARED int gc_fail(int code, const char* fmt, ...);   // the kernels part's messages go to the host part's
#endif

#define GC_STR_(...) #__VA_ARGS__
#define GC_STR(...) GC_STR_(__VA_ARGS__)

// Return early with the code of a failing call (its message is already recorded).
#define GC_TRY(expr) do { int gc_rc_ = (expr); if (gc_rc_ != GC_OK) return gc_rc_; } while (0)

#ifdef GC_CUDA
// Every CUDA call goes through this (on failure it records file:line and the CUDA message), but those whose
// failure must be cleaned up after first — the arena's allocation, a capture's end and instantiation, the
// timer's events — which check their result by hand and say what they were doing.
#define GC_CUDA_TRY(call) do { cudaError_t gc_e_ = (call); if (gc_e_ != cudaSuccess) \
    return gc_fail(GC_ERR_DEVICE, "%s:%d: %s failed: %s", __FILE__, __LINE__, #call, cudaGetErrorString(gc_e_)); \
    } while (0)
// After each kernel launch: launch-configuration errors are reported where they happen.
#define GC_LAUNCH_CHECK() GC_CUDA_TRY(cudaGetLastError())
#else
#define GC_LAUNCH_CHECK() do {} while (0)
#endif

// A step's hook: what its caller runs beside the step's later kernels (gc_hook_run, below); or, where the step
// gathers the next batch in its post kernel (emit.py's next_batch_hook, in_post) and the caller says what to
// gather (`next`), that instead.
typedef struct gc_next_rows gc_next_rows;
typedef struct {
    int (*fn)(void* ctx);   // enqueues work (gc_launch: on gc_current_stream, the hook's stream)
    void* ctx;
    const gc_next_rows* next;   // NULL: the step runs fn
} gc_step_hook;

#if defined(GC_CUDA) && GC_KERNELS
// Programmatic dependent launch (sm_90): a step is a chain of small kernels, and the gap between one
// kernel's end and the next one's first instruction sits on its critical path. Kernels are launched with
// the programmatic-serialization attribute, so the next kernel's launch is prepared while this one runs.
// Every kernel starts with gc_wait_prior(): it returns once the previous kernel has completed and its writes
// are visible, so nothing is read or written early (and the wait is transitive: the previous kernel itself
// waited for its predecessor). Kernels do not trigger their dependents at their start
// (griddepcontrol.launch_dependents): measured on an H100, triggering right after the wait made the MLP's
// batch-1000 step 28% slower (the next kernel's waiting blocks hold SM resources), while the implicit trigger
// at each block's exit gave 2-7% over plain launches (MLP 43.4 -> 40.9 us at batch 128, 87.4 -> 85.2 at 1000;
// logreg 14.9 -> 13.8). Before sm_90 the wait is a no-op and the attribute is not set: launches serialize as
// usual.
__device__ __forceinline__ void gc_wait_prior() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// The one early trigger: a GEMM whose next kernel on its stream has work to do before its gc_wait_prior (a
// chain copying Bs this GEMM does not write: streams.early_copies) lets that kernel's blocks start once its own
// main loop is done (`release`, gc_gemm_params), so that work runs beside the GEMM's end (the split's sum, the
// epilogue). One thread a block; the next kernel launches when every block has triggered or ended.
__device__ __forceinline__ void gc_release_dependents(bool release) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (release && threadIdx.x == 0) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#else
    (void)release;
#endif
}

// ---- a step's branches on several streams (gcompile/passes/streams.py) --------------------------------
// The generated step runs gc_fork(n): streams 1..n-1 wait for what this thread enqueued before on stream 0
// (the per-thread default stream, where the runtime's own kernels run); gc_on(s) sends the next launches to
// stream s; gc_record(e) / gc_wait(e) order kernels across streams through event e; gc_join(n): stream 0
// waits for streams 1..n-1, and launches go to stream 0 again. Inside a graph capture the forked streams
// join the capture through the fork's event, so the graph gets the branches. Streams and events belong to
// the calling thread (as the per-thread default stream does), made once by gc_streams_ready — before a
// capture begins, since a capture must not create them.
// gc_current_stream is part 0's (the steps pick the stream; every part's launchers launch on it).
//
// A step may also run its caller's hook beside its own later kernels (the trainer's next batch, gc_main.h):
// gc_hook_mark(hook, mask), right after the last kernel that reads the labels or writes the loss, records an
// event on each stream in `mask` (those kernels' streams); gc_hook_run(hook, mask), with the same mask, after
// every kernel of the step is launched, enqueues the hook on a stream of its own that waits for those events;
// gc_join waits for it too. (Launched where it is marked, the hook's kernel went ahead of the step's side
// kernels, which then started later: H100, MLP b1000 tf32 trainer, 25.90 / 25.95 -> 25.70 / 25.62 us, 12
// interleaved rounds.)
#if GC_KERNELS0
GC_SHARED thread_local cudaStream_t gc_current_stream = cudaStreamPerThread;
#else
extern GC_SHARED thread_local cudaStream_t gc_current_stream;
#endif
#if GC_KERNELS0
#define GC_MAX_STREAMS 4
#define GC_MAX_EVENTS 256
#define GC_HOOK_STREAM GC_MAX_STREAMS   // the hook's stream, after the step's own
// events: the kernels' (GC_MAX_EVENTS), the fork, the joins of streams 1..GC_MAX_STREAMS (the last: the hook's
// stream), and the hook's waits on streams 0..GC_MAX_STREAMS-1
#define GC_EVENT_SLOTS (GC_MAX_EVENTS + 1 + GC_MAX_STREAMS + GC_MAX_STREAMS)
static thread_local cudaStream_t gc_stream_table[GC_MAX_STREAMS + 1];
static thread_local cudaEvent_t gc_event_table[GC_EVENT_SLOTS];
static thread_local bool gc_streams_made = false;
static thread_local bool gc_hook_ran = false;   // the step's hook stream has work for gc_join to wait for

GC_SHARED int gc_streams_ready(void) {
    if (gc_streams_made) return GC_OK;
    gc_stream_table[0] = cudaStreamPerThread;
    int streams = 1, events = 0;   // made so far: a failure destroys them (the next call makes them all again)
    cudaError_t err = cudaSuccess;
    for (; err == cudaSuccess && streams <= GC_HOOK_STREAM; streams += err == cudaSuccess)
        err = cudaStreamCreateWithFlags(&gc_stream_table[streams], cudaStreamNonBlocking);
    for (; err == cudaSuccess && events < GC_EVENT_SLOTS; events += err == cudaSuccess)
        err = cudaEventCreateWithFlags(&gc_event_table[events], cudaEventDisableTiming);
    if (err != cudaSuccess) {
        while (events > 0) cudaEventDestroy(gc_event_table[--events]);
        while (streams > 1) cudaStreamDestroy(gc_stream_table[--streams]);
        return gc_fail(GC_ERR_DEVICE, "making the step's streams and events failed: %s", cudaGetErrorString(err));
    }
    gc_streams_made = true;
    return GC_OK;
}
static int gc_fork(int streams) {
    gc_current_stream = cudaStreamPerThread;
    if (streams <= 1) return GC_OK;
    GC_TRY(gc_streams_ready());
    cudaEvent_t fork = gc_event_table[GC_MAX_EVENTS];
    GC_CUDA_TRY(cudaEventRecord(fork, cudaStreamPerThread));
    for (int s = 1; s < streams; s++) GC_CUDA_TRY(cudaStreamWaitEvent(gc_stream_table[s], fork, 0));
    return GC_OK;
}
static int gc_on(int s) {
    gc_current_stream = gc_stream_table[s];
    return GC_OK;
}
static int gc_record(int e) {
    GC_CUDA_TRY(cudaEventRecord(gc_event_table[e], gc_current_stream));
    return GC_OK;
}
static int gc_wait(int e) {
    GC_CUDA_TRY(cudaStreamWaitEvent(gc_current_stream, gc_event_table[e], 0));
    return GC_OK;
}
// the event gc_hook_mark records on stream s, which gc_hook_run's stream waits for
static cudaEvent_t gc_hook_event(int s) { return gc_event_table[GC_MAX_EVENTS + 1 + GC_MAX_STREAMS + s]; }
static int gc_hook_mark(const gc_step_hook* hook, unsigned mask) {
    if (!hook) return GC_OK;
    GC_TRY(gc_streams_ready());
    for (int s = 0; s < GC_MAX_STREAMS; s++)
        if (mask >> s & 1) GC_CUDA_TRY(cudaEventRecord(gc_hook_event(s), gc_stream_table[s]));
    return GC_OK;
}
static int gc_hook_run(const gc_step_hook* hook, unsigned mask) {
    if (!hook) return GC_OK;
    cudaStream_t side = gc_stream_table[GC_HOOK_STREAM];
    for (int s = 0; s < GC_MAX_STREAMS; s++)
        if (mask >> s & 1)
            GC_CUDA_TRY(cudaStreamWaitEvent(side, gc_hook_event(s), 0));
    gc_current_stream = side;
    gc_hook_ran = true;
    return hook->fn(hook->ctx);   // (gc_join sends launches to stream 0 again)
}
// Also the way out of a step that failed half-way (rc != GC_OK): launches go to stream 0 again.
static int gc_join(int streams, int rc) {
    gc_current_stream = cudaStreamPerThread;
    const bool hooked = gc_hook_ran;
    gc_hook_ran = false;
    for (int s = 1; rc == GC_OK && s <= GC_HOOK_STREAM; s++) {
        if (s >= streams && !(s == GC_HOOK_STREAM && hooked)) continue;
        cudaEvent_t join = gc_event_table[GC_MAX_EVENTS + s];
        GC_CUDA_TRY(cudaEventRecord(join, gc_stream_table[s]));
        GC_CUDA_TRY(cudaStreamWaitEvent(cudaStreamPerThread, join, 0));
    }
    return rc;
}
#endif   // GC_KERNELS0

// The current device's compute capability as 10 x major + minor (90: the H100, H200), asked once; 0 when the
// runtime cannot say (no device), which every caller treats as "not supported".
static int gc_compute_capability() {
    static int cc = -1;
    if (cc < 0) {
        int dev = 0, major = 0, minor = 0;
        cc = cudaGetDevice(&dev) == cudaSuccess &&
                     cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                     cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess
                 ? 10 * major + minor
                 : 0;
        cudaGetLastError();
    }
    return cc;
}

// Whether kernels of this device may launch early (asked once; GC_NO_PDL=1 turns it off, for comparisons).
static bool gc_pdl_supported() {
    static int supported = -1;
    if (supported < 0) {
        const char* off = getenv("GC_NO_PDL");
        supported = !(off && *off && strcmp(off, "0") != 0) && gc_compute_capability() >= 90;
    }
    return supported == 1;
}

// The device function a launch names. In a launch part (GC_PART_LAUNCH) a kernel is a host stub whose device
// code was left out: the kernels parts' device code (one fatbin each, gc_device_code; build.py links them in)
// holds it, under the name the stub is registered with (cudaFuncGetName). The parts' code is loaded once
// (cudaLibraryLoadData) and its kernels listed by name (so that no lookup fails: compute-sanitizer reports
// every failing call); a kernel's handle (a cudaKernel_t) stands for it in cudaLaunchKernelExC,
// cudaFuncSetAttribute and cudaFuncGetAttributes. Elsewhere the stub is the kernel.
// *error: the CUDA error of a failure (its message is recorded), cudaSuccess otherwise.
#if defined(GC_PART_LAUNCH) && GC_KERNELS0
#include <pthread.h>
GC_SHARED extern const unsigned char* const gc_device_code[];   // the steps' section: one entry a kernels part
GC_SHARED extern const int gc_device_code_parts;
static pthread_mutex_t gc_kernels_lock = PTHREAD_MUTEX_INITIALIZER;
typedef struct { const char* name; const void* kernel; const void* stub; } gc_device_kernel;
static gc_device_kernel* gc_device_kernels = NULL;   // every kernels part's kernels, once loaded
static int gc_device_kernel_count = 0;

#define GC_LOAD_TRY(call, what, part) do { *error = (call); if (*error != cudaSuccess) { cudaGetLastError(); \
    return gc_fail(GC_ERR_DEVICE, "%s of kernels part %d of %d (the program's device code) failed: %s", what, part, \
                   gc_device_code_parts, cudaGetErrorString(*error)); } } while (0)

// Kernels part p's kernels (count of them), by name, into table.
static int gc_device_list(cudaLibrary_t library, int p, cudaKernel_t* kernels, unsigned count,
                          gc_device_kernel* table, cudaError_t* error) {
    GC_LOAD_TRY(cudaLibraryEnumerateKernels(kernels, count, library), "listing the kernels", p);
    for (unsigned i = 0; i < count; i++) {
        table[i].kernel = (const void*)kernels[i];
        GC_LOAD_TRY(cudaFuncGetName(&table[i].name, table[i].kernel), "a kernel's name", p);
    }
    return GC_OK;
}

// Kernels part p loaded (cudaLibraryLoadData) and its kernels counted; nothing left loaded on failure.
static int gc_device_open(int p, cudaLibrary_t* library, unsigned* count, cudaError_t* error) {
    GC_LOAD_TRY(cudaLibraryLoadData(library, gc_device_code[p], NULL, NULL, 0, NULL, NULL, 0), "loading", p);
    *error = cudaLibraryGetKernelCount(count, *library);
    if (*error != cudaSuccess) cudaLibraryUnload(*library);
    GC_LOAD_TRY(*error, "counting the kernels", p);
    return GC_OK;
}

static int gc_device_load(cudaError_t* error) {
    enum { MOST = 8 };   // kernels parts (emit.py's MAX_PARTS: 4)
    cudaLibrary_t libraries[MOST];
    unsigned counts[MOST], total = 0;
    if (gc_device_code_parts > MOST) {
        *error = cudaErrorInvalidValue;
        return gc_fail(GC_ERR_DEVICE, "%d kernels parts: gc_device_load loads at most %d", gc_device_code_parts, MOST);
    }
    int loaded = 0, rc = GC_OK;   // (a part that fails to open leaves nothing loaded)
    while (loaded < gc_device_code_parts &&
           (rc = gc_device_open(loaded, &libraries[loaded], &counts[loaded], error)) == GC_OK)
        total += counts[loaded++];
    gc_device_kernel* table = NULL;
    cudaKernel_t* kernels = NULL;
    if (rc == GC_OK) {
        table = (gc_device_kernel*)calloc(total ? total : 1, sizeof(gc_device_kernel));
        kernels = (cudaKernel_t*)calloc(total ? total : 1, sizeof(cudaKernel_t));
        if (!table || !kernels) {
            *error = cudaErrorMemoryAllocation;
            rc = gc_fail(GC_ERR_MEMORY, "no memory for the table of the program's %u kernels", total);
        }
    }
    for (int p = 0, first = 0; p < gc_device_code_parts && rc == GC_OK; first += counts[p], p++)
        rc = gc_device_list(libraries[p], p, kernels + first, counts[p], table + first, error);
    free(kernels);
    if (rc != GC_OK) {
        free(table);
        for (int p = 0; p < loaded; p++) cudaLibraryUnload(libraries[p]);
        cudaGetLastError();
        return rc;
    }
    gc_device_kernels = table;
    gc_device_kernel_count = (int)total;
    return GC_OK;
}

static int gc_kernel_find(const void* stub, const void** kernel, cudaError_t* error) {
    if (!gc_device_kernels) GC_TRY(gc_device_load(error));
    for (int i = 0; i < gc_device_kernel_count; i++)
        if (gc_device_kernels[i].stub == stub) {
            *kernel = gc_device_kernels[i].kernel;
            return GC_OK;
        }
    const char* name = NULL;
    *error = cudaFuncGetName(&name, stub);
    if (*error != cudaSuccess) {
        cudaGetLastError();
        return gc_fail(GC_ERR_DEVICE, "a kernel's name: cudaFuncGetName failed: %s", cudaGetErrorString(*error));
    }
    for (int i = 0; i < gc_device_kernel_count; i++)
        if (strcmp(gc_device_kernels[i].name, name) == 0) {
            gc_device_kernels[i].stub = stub;
            *kernel = gc_device_kernels[i].kernel;
            return GC_OK;
        }
    *error = cudaErrorInvalidDeviceFunction;
    return gc_fail(GC_ERR_DEVICE, "kernel %s is in none of the program's %d kernels parts (its device code)", name,
                   gc_device_code_parts);
}
GC_SHARED int gc_kernel_of(const void* stub, const void** kernel, cudaError_t* error) {
    *error = cudaSuccess;
    pthread_mutex_lock(&gc_kernels_lock);
    int rc = gc_kernel_find(stub, kernel, error);
    pthread_mutex_unlock(&gc_kernels_lock);
    return rc;
}
#elif defined(GC_PART_LAUNCH)
GC_SHARED int gc_kernel_of(const void* stub, const void** kernel, cudaError_t* error);   // launch part 0's
#else
static int gc_kernel_of(const void* stub, const void** kernel, cudaError_t* error) {
    *error = cudaSuccess;
    *kernel = stub;
    return GC_OK;
}
#endif

// A kernel that takes dynamic shared memory (the pipelined GEMMs, a chain's staged Bs): its limit raised to smem
// bytes (without asking a kernel gets 48 KB less its static shared memory: logistic regression's b1000 tf32
// chain, 33 KB static and W's 31 KB copy, failed to launch with the limit raised only past 48 KB), and its
// preferred carveout the largest shared memory (228 KB an SM, the L1 cache what is left): once per process
// (each kernel launches with one size). An SM's split of L1 and shared memory is set by the blocks it runs;
// left to the driver, a kernel of two 79 KB blocks an SM (the wgmma tf32-parts dW1) got SMs configured for them
// alone (164 KB), and the GEMMs launched beside it waited for its blocks to end (H100, MLP b1000 fp32: 45.7 us a
// step, 39.0 with the largest carveout; unchanged where nothing waited so: 41.1 -> 41.0 with the record's
// tiles, batch 128 16.48 -> 16.47).
template <auto Kernel>
static int gc_raise_smem(size_t smem) {
    static bool raised = false;
    if (!raised) {
        const void* kernel;
        cudaError_t error;
        GC_TRY(gc_kernel_of((const void*)Kernel, &kernel, &error));
        if (smem > 0)
            GC_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        GC_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                         (int)cudaSharedmemCarveoutMaxShared));
        raised = true;
    }
    return GC_OK;
}

// Launch kernel<<<grid, block, smem>>>(args...) on the current stream (gc_on; the per-thread default stream
// outside a step's branches), with the attributes in `extra` (at most 3) and, where supported, programmatic
// serialization against the previous kernel. smem: bytes of dynamic shared memory (past 48 KB less the kernel's
// static shared memory only once the caller has raised the kernel's limit, gc_raise_smem).
template <typename... Params, typename... Args>
static int gc_launch_smem(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaLaunchAttribute* extra,
                          int n_extra, Args... args) {
    cudaLaunchAttribute attrs[4];
    if (n_extra > 3) return gc_fail(GC_ERR_ARG, "gc_launch_smem: %d extra launch attributes, at most 3", n_extra);
    int n = 0;
    for (int i = 0; i < n_extra; i++) attrs[n++] = extra[i];
    if (gc_pdl_supported()) {
        attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attrs[n].val.programmaticStreamSerializationAllowed = 1;
        n++;
    }
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = smem;
    config.stream = gc_current_stream;
    config.attrs = attrs;
    config.numAttrs = n;
    const void* device;
    cudaError_t error;
    GC_TRY(gc_kernel_of((const void*)kernel, &device, &error));
    // (the C++ cudaLaunchKernelEx passes the function as a pointer to cudaLaunchKernelExC, a handle included)
    GC_CUDA_TRY(cudaLaunchKernelEx(&config, reinterpret_cast<void (*)(Params...)>(const_cast<void*>(device)),
                                   ((Params)args)...));
    return GC_OK;
}
template <typename... Params, typename... Args>
static int gc_launch_ex(void (*kernel)(Params...), dim3 grid, dim3 block, cudaLaunchAttribute* extra, int n_extra,
                        Args... args) {
    return gc_launch_smem(kernel, grid, block, 0, extra, n_extra, args...);
}
template <typename... Params, typename... Args>
static int gc_launch(void (*kernel)(Params...), dim3 grid, dim3 block, Args... args) {
    return gc_launch_ex(kernel, grid, block, (cudaLaunchAttribute*)0, 0, args...);
}
#elif defined(GC_CUDA)
GC_SHARED int gc_streams_ready(void);   // the host part's gc_capture makes them before a capture begins
#else
// The cpu target runs a step's kernels one after another in schedule order.
static int gc_fork(int) { return GC_OK; }
static int gc_on(int) { return GC_OK; }
static int gc_record(int) { return GC_OK; }
static int gc_wait(int) { return GC_OK; }
static int gc_hook_mark(const gc_step_hook*, unsigned) { return GC_OK; }
static int gc_hook_run(const gc_step_hook* hook, unsigned) { return hook ? hook->fn(hook->ctx) : GC_OK; }
static int gc_join(int, int rc) { return rc; }
#endif

// ---- the device: present, able to run this program's kernels, memory ----------------------------------
#if defined(GC_CUDA) && !GC_KERNELS0
GC_SHARED int gc_device_check(void);   // it asks about a kernel: in kernels part 0
#elif defined(GC_CUDA)
static __global__ void gc_probe_kernel() {}

// Before anything else: is there a device, and does this program hold kernels it can run (machine code for
// its architecture, or PTX its driver can compile)? Both failures otherwise surface later as puzzles.
GC_SHARED int gc_device_check(void) {
    int count = 0, device = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        cudaGetLastError();
        return gc_fail(GC_ERR_DEVICE, "no usable CUDA device (%s); this program was built for the cuda target: "
                       "build it with target='cpu' (gcompile build --target cpu) to run without a GPU",
                       e != cudaSuccess ? cudaGetErrorString(e) : "the runtime found 0 devices");
    }
    cudaFuncAttributes attr;
    const void* probe = NULL;
    if (gc_kernel_of((const void*)gc_probe_kernel, &probe, &e) == GC_OK) e = cudaFuncGetAttributes(&attr, probe);
    // an error other than the kernels' architecture: the context itself is unusable
    if (e != cudaSuccess && e != cudaErrorNoKernelImageForDevice && e != cudaErrorInvalidDeviceFunction &&
        e != cudaErrorUnsupportedPtxVersion && e != cudaErrorInvalidKernelImage) {
        cudaGetLastError();
        return gc_fail(GC_ERR_DEVICE, "the GPU cannot run this program's kernels: %s (after an error such as a "
                       "misaligned address or an illegal memory access in an earlier kernel, the CUDA context of "
                       "this process stays unusable: start a new process)", cudaGetErrorString(e));
    }
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

#if GC_HOST   // memory and the clock: the host part
// The only place the program allocates on the device.
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
#endif   // GC_HOST

// ---- the training order: a keyed bijection of [0, n), a pure function of (seed, epoch) --------------
// The trainer's gather kernel evaluates it for every batch row, so there is no index array and no host
// shuffle. A 4-round balanced Feistel network over [0, 4^h) (4^h the smallest power of four >= n), cycle
// walking back into [0, n); round keys from splitmix64 of (seed, epoch). gcompile/permutation.py is the
// same function in numpy (it documents the construction); the two must agree bit for bit.
typedef struct {
    uint32_t key[4];   // round keys of this (seed, epoch)
    uint32_t half;     // bits in each Feistel half
    uint32_t n;        // the permutation is of [0, n)
} gc_perm;

#if GC_HOST   // the host makes the keys, the kernels apply the permutation
static uint64_t gc_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Epochs count from 0; n is in [1, 2^32 - 1] (the caller checks).
static gc_perm gc_perm_make(uint64_t seed, uint64_t epoch, uint32_t n) {
    const uint64_t golden = 0x9E3779B97F4A7C15ull, s = gc_mix64(seed + golden);
    gc_perm p;
    for (int r = 0; r < 4; r++) p.key[r] = (uint32_t)gc_mix64(s + golden * (4 * epoch + r + 1));
    p.half = 1;
    while (p.half < 16 && (1ull << (2 * p.half)) < n) p.half++;
    p.n = n;
    return p;
}
#endif   // GC_HOST

// Integer division as the numpy executor's `div` defines it: truncated toward zero (C's), x / 0 = 0 (numpy's
// floor_divide gives 0; C's traps on the cpu) and INT32_MIN / -1 = INT32_MIN (wrapped; C's traps).
GC_HD static inline int32_t gc_idiv(int32_t a, int32_t b) {
    return b == 0 ? 0 : b == -1 ? (int32_t)(0u - (uint32_t)a) : a / b;
}

GC_HD static inline uint32_t gc_hash32(uint32_t x) {   // lowbias32
    x ^= x >> 16; x *= 0x7FEB352Du;
    x ^= x >> 15; x *= 0x846CA68Bu;
    return x ^ (x >> 16);
}

// The example read at position i (< p.n) of the epoch.
GC_HD static inline uint32_t gc_perm_apply(const gc_perm& p, uint32_t i) {
    const uint32_t mask = (1u << p.half) - 1;
    uint32_t x = i;
    do {
        uint32_t l = x >> p.half, r = x & mask;
        for (int k = 0; k < 4; k++) {
            uint32_t t = l ^ (gc_hash32(r ^ p.key[k]) & mask);
            l = r;
            r = t;
        }
        x = (l << p.half) | r;
    } while (x >= p.n);
    return x;
}

// Where the training loop stands, kept on the device so a replayed graph needs no new parameters: the
// gather kernels read it, the last kernel of each replayed chunk advances it (gc_kernels_*: trainer section).
typedef struct {
    int64_t step;      // the epoch's step run by the first step of the next replayed chunk
    gc_perm order;     // this epoch's order of examples
    int32_t shuffle;   // 0: file order (--no-shuffle)
} gc_cursor;

// The example that row b of a batch reads: position first + min(b, count - 1) (rows past `count` repeat the
// last valid one), shifted by the cursor's step and permuted by its order when there is a cursor.
GC_HD static inline uint32_t gc_batch_source(const gc_cursor* cursor, int64_t first, int count, int batch, int b) {
    int64_t p = first + (b < count ? b : count - 1);
    if (!cursor) return (uint32_t)p;
    p += cursor->step * batch;
    return cursor->shuffle ? gc_perm_apply(cursor->order, (uint32_t)p) : (uint32_t)p;
}

// The image input x of a program whose GEMMs read it in place (docs/compiler.md, "The batch gather fused into
// the GEMMs"): row b of x is row index[b] of `source` (row b when index is NULL), uint8 (x = u8 * scale, as
// the trainer's gather converts) or float32. The indices live in the arena where x's buffer would be (the
// trainer's gc_batch_rows writes them each step); all of it is the same for every step of a captured graph,
// so it is a launch parameter: whoever enqueues steps sets gc_batch_input() first (the library: its input
// buffer, no indices; the trainer: the split's dataset and the arena's indices), and the GEMMs' launchers
// pass it as they are launched or captured.
typedef struct {
    const void* source;       // rows of the program's row length (GC_ROW) elements
    const uint32_t* index;    // in the arena: the batch's rows; NULL: rows 0..batch-1
    float scale;              // uint8 sources: x = (float)u8 * scale
    int32_t u8;               // 1: uint8 source, 0: float32
    int32_t exact;            // 1: every value is a tf32 value (float rows of uint8 data times a scale that keeps
                              // them so, gc_scale_keeps_tf32): the short-K tensor-core tiles take them as one part
} gc_rows;

// A float cast to an integer type (gc.cast) as the numpy executor's astype gives it on x86-64: truncated toward zero
// where it fits an int32, else INT32_MIN (NaN and the infinities too); a uint8 takes that int32's low byte. A plain
// C cast is undefined there, and the GPU's conversion saturates instead.
GC_HD static inline int32_t gc_float_to_int32(double x) {
    return x > -2147483649.0 && x < 2147483648.0 ? (int32_t)x : INT32_MIN;
}

// A uint8 image value as the steps see it: (float)u * scale, in float. The trainer's gather and the GEMMs'
// row loaders (both targets) convert with it, so that rows read in place are the values a gather gives.
GC_HD static inline float gc_pixel(unsigned u, float scale) { return (float)u * scale; }

// Element c of batch row r as the steps see it: row index[r] (r without indices) of a source of `ld`
// elements a row, uint8 converted by gc_pixel. The element-wise readers of rows read in place use it (a
// chain's row GEMM, the cpu GEMM); the tiled GEMMs' loader moves runs of 4 and converts them as it stores.
GC_HD static inline float gc_rows_at(const gc_rows& rows, int64_t r, int64_t ld, int64_t c) {
    const int64_t at = (int64_t)(rows.index ? rows.index[r] : (uint32_t)r) * ld + c;
    return rows.u8 ? gc_pixel(((const uint8_t*)rows.source)[at], rows.scale) : ((const float*)rows.source)[at];
}

#if GC_KERNELS0
GC_SHARED gc_rows* gc_batch_input(void) {
    static thread_local gc_rows now = {NULL, NULL, 1, 0};
    return &now;
}
#else
GC_SHARED gc_rows* gc_batch_input(void);
#endif

// A batch to gather: gc_gather's arguments (row: GC_ROW elements, batch: GC_BATCH). The next step's, as a
// train step's post kernel gathers it, a row a block of its own (emit.py's next_batch_hook, in_post;
// gc_gather_next_row), takes it from its hook's `next` (gc_run_train sets gc_next_input() before its
// launches, which pass it). x NULL: nothing to gather (the library's steps, a chunk's last step).
struct gc_next_rows {
    const void* images;       // the split's dataset: uint8 (u8) or float32 rows
    const int32_t* labels;
    const gc_cursor* cursor;
    int64_t first;
    int32_t count;
    int32_t u8;
    float scale;
    float* x;                 // the batch's values (the other half of x's slot)
    int32_t* y;
    const float* loss;        // this step's loss, recorded into sums
    double* sums;
};
#if GC_KERNELS0
GC_SHARED gc_next_rows* gc_next_input(void) {
    static thread_local gc_next_rows now = {};
    return &now;
}
#else
GC_SHARED gc_next_rows* gc_next_input(void);
#endif

// A step's loss into the epoch's sums on the device: sums[0] += loss when it is finite (a step the numerical
// guard skipped adds nothing), sums[1] = loss (the last one).
GC_HD static inline void gc_record_loss(double* sums, float loss) {
    if (isfinite(loss)) sums[0] += loss;
    sums[1] = loss;
}

// Start a chunk of steps: the cursor's position and order; the epoch's loss sums restart when given.
GC_HD static inline void gc_cursor_start(gc_cursor* cursor, int64_t step, gc_perm order, int shuffle, double* sums) {
    cursor->step = step;
    cursor->order = order;
    cursor->shuffle = shuffle;
    if (sums) sums[0] = sums[1] = 0;
}

// End a chunk of `steps` steps: record its last loss and advance the cursor past it.
GC_HD static inline void gc_cursor_advance(gc_cursor* cursor, int64_t steps, const float* loss, double* sums) {
    gc_record_loss(sums, *loss);
    cursor->step += steps;
}

#if GC_KERNELS0   // the accuracy count's (gc_count_correct)
// The index of the largest of row[0..classes) (the first one wins, as numpy's argmax).
GC_HD static inline int gc_argmax(const float* row, int classes) {
    int best = 0;
    for (int c = 1; c < classes; c++) if (row[c] > row[best]) best = c;
    return best;
}
#endif

#if GC_HOST   // from here to the end: the host part only
// ---- CUDA graphs: capture a piece of work once, replay it ---------------------------------------------
// Work is described by an enqueue function that launches `length` units of it (training steps, eval
// batches). With graphs on, the first request for a (kind, tag, length) captures what the function
// launches into a graph and instantiates it; later requests launch the instance. With graphs off (the cpu
// target, the trainer's --no-graph, GC_NO_GRAPH=1 in the environment) the function is simply called: the
// same kernels in the same order either way, so results are identical.
// Capture needs every kernel launch on the per-thread default stream: the build passes nvcc
// `--default-stream per-thread`; a program compiled without it runs without graphs.
typedef int (*gc_enqueue_fn)(void* ctx, int64_t length);

#if defined(GC_CUDA) && defined(CUDA_API_PER_THREAD_DEFAULT_STREAM)
#define GC_GRAPHS 1
typedef cudaGraphExec_t gc_graph_exec;
#else
#define GC_GRAPHS 0
typedef void* gc_graph_exec;
#endif
#define GC_GRAPH_SLOTS 8
#define GC_MAX_STEPS_PER_GRAPH 64

typedef struct {
    int kind;              // the caller's name for the work (0: free slot)
    const void* tag;       // which data the work reads, part of the key
    int64_t length;
    gc_graph_exec exec;
} gc_graph;

typedef struct {
    int enabled;
    int next;              // the slot taken over when all are in use
    gc_graph slot[GC_GRAPH_SLOTS];
} gc_graphs;

static int gc_graphs_default(void) {
    const char* off = getenv("GC_NO_GRAPH");
    return GC_GRAPHS && !(off && *off && strcmp(off, "0"));
}

static void gc_graphs_free(gc_graphs* g) {
#if GC_GRAPHS
    for (int i = 0; i < GC_GRAPH_SLOTS; i++)
        if (g->slot[i].exec) cudaGraphExecDestroy(g->slot[i].exec);
#endif
    memset(g->slot, 0, sizeof g->slot);
    g->next = 0;
}

#if GC_GRAPHS
// Capture enqueue(ctx, length) on the per-thread default stream and instantiate it. Whatever fails, the
// capture is ended (the stream stays usable) and the message says what was being captured.
static int gc_capture(gc_graph_exec* out, gc_enqueue_fn enqueue, void* ctx, int64_t length, const char* what) {
    cudaGraph_t graph = NULL;
    *out = NULL;
    GC_TRY(gc_streams_ready());   // a step's branches need them, and the capture must not make them
    GC_CUDA_TRY(cudaStreamBeginCapture(cudaStreamPerThread, cudaStreamCaptureModeThreadLocal));
    int rc = enqueue(ctx, length);
    cudaError_t e = cudaStreamEndCapture(cudaStreamPerThread, &graph);
    if (rc == GC_OK && e != cudaSuccess)
        rc = gc_fail(GC_ERR_DEVICE, "%s (a call that is not allowed during capture?)", cudaGetErrorString(e));
    if (rc == GC_OK) {
        e = cudaGraphInstantiate(out, graph, 0);
        if (e == cudaSuccess) e = cudaGraphUpload(*out, cudaStreamPerThread);
        if (e != cudaSuccess) rc = gc_fail(GC_ERR_DEVICE, "instantiating the graph failed: %s", cudaGetErrorString(e));
    }
    if (graph) cudaGraphDestroy(graph);
    if (rc == GC_OK) return GC_OK;
    if (*out) cudaGraphExecDestroy(*out);
    *out = NULL;
    cudaGetLastError();   // clear the capture's error so later calls start clean
    char inner[sizeof gc_error_message];
    memcpy(inner, gc_error_message, sizeof inner);
    return gc_fail(rc, "capturing %s (%lld per launch) into a CUDA graph: %s", what, (long long)length, inner);
}
#endif

// The graph for (kind, tag, length), captured on first use; *out is NULL when graphs are off.
static int gc_graph_get(gc_graphs* g, int kind, const void* tag, int64_t length, gc_enqueue_fn enqueue, void* ctx,
                        const char* what, gc_graph** out) {
    *out = NULL;
    if (!g->enabled) return GC_OK;
    for (int i = 0; i < GC_GRAPH_SLOTS; i++)
        if (g->slot[i].kind == kind && g->slot[i].tag == tag && g->slot[i].length == length) {
            *out = &g->slot[i];
            return GC_OK;
        }
#if GC_GRAPHS
    gc_graph* s = &g->slot[g->next];
    g->next = (g->next + 1) % GC_GRAPH_SLOTS;
    if (s->exec) cudaGraphExecDestroy(s->exec);
    memset(s, 0, sizeof *s);
    GC_TRY(gc_capture(&s->exec, enqueue, ctx, length, what));
    s->kind = kind; s->tag = tag; s->length = length;
    *out = s;
#else
    (void)enqueue; (void)ctx; (void)what;
#endif
    return GC_OK;
}

// Enqueue `length` units of work: one graph launch, or the plain calls when graphs are off.
static int gc_replay(gc_graphs* g, int kind, const void* tag, int64_t length, gc_enqueue_fn enqueue, void* ctx,
                     const char* what) {
    gc_graph* graph;
    GC_TRY(gc_graph_get(g, kind, tag, length, enqueue, ctx, what, &graph));
    if (!graph) return enqueue(ctx, length);
#if GC_GRAPHS
    GC_CUDA_TRY(cudaGraphLaunch(graph->exec, cudaStreamPerThread));
#endif
    return GC_OK;
}

// Steps per graph launch for runs of `steps`: all of them up to GC_MAX_STEPS_PER_GRAPH, else the largest
// divisor of `steps` in [GC_MAX_STEPS_PER_GRAPH / 2, GC_MAX_STEPS_PER_GRAPH] (an epoch is then whole
// launches), else GC_MAX_STEPS_PER_GRAPH and a remainder graph.
static int64_t gc_steps_per_graph(int64_t steps) {
    if (steps <= GC_MAX_STEPS_PER_GRAPH) return steps > 0 ? steps : 1;
    for (int64_t k = GC_MAX_STEPS_PER_GRAPH; k >= GC_MAX_STEPS_PER_GRAPH / 2; k--)
        if (steps % k == 0) return k;
    return GC_MAX_STEPS_PER_GRAPH;
}

// `steps` units as launches of the `per_graph` graph, then one of the remainder's.
static int gc_replay_steps(gc_graphs* g, int kind, const void* tag, int64_t steps, int64_t per_graph,
                           gc_enqueue_fn enqueue, void* ctx, const char* what) {
    for (int64_t done = 0; done + per_graph <= steps; done += per_graph)
        GC_TRY(gc_replay(g, kind, tag, per_graph, enqueue, ctx, what));
    if (steps % per_graph) GC_TRY(gc_replay(g, kind, tag, steps % per_graph, enqueue, ctx, what));
    return GC_OK;
}

// Wait until the device has done everything enqueued so far (by this thread).
static int gc_device_sync(void) {
#ifdef GC_CUDA
    GC_CUDA_TRY(cudaStreamSynchronize(cudaStreamPerThread));
#endif
    return GC_OK;
}

// Seconds of device time between gc_timer_start and gc_timer_stop (CUDA events; the wall clock on cpu).
typedef struct {
    double start;
#ifdef GC_CUDA
    cudaEvent_t begin, end;
#endif
} gc_timer;

// A timer's events, made by gc_timer_start, are destroyed by gc_timer_stop or, where the timed work failed,
// by gc_timer_discard.
static void gc_timer_discard(gc_timer* t) {
#ifdef GC_CUDA
    if (t->begin) cudaEventDestroy(t->begin);
    if (t->end) cudaEventDestroy(t->end);
    t->begin = t->end = NULL;
#else
    (void)t;
#endif
}

static int gc_timer_start(gc_timer* t) {
    memset(t, 0, sizeof *t);
#ifdef GC_CUDA
    cudaError_t e = cudaEventCreate(&t->begin);
    if (e == cudaSuccess) e = cudaEventCreate(&t->end);
    if (e == cudaSuccess) e = cudaEventRecord(t->begin, cudaStreamPerThread);
    if (e != cudaSuccess) {
        gc_timer_discard(t);
        return gc_fail(GC_ERR_DEVICE, "timing on the device failed: %s", cudaGetErrorString(e));
    }
#else
    t->start = gc_now();
#endif
    return GC_OK;
}

static int gc_timer_stop(gc_timer* t, double* seconds) {
#ifdef GC_CUDA
    float ms = 0;
    cudaError_t e = cudaEventRecord(t->end, cudaStreamPerThread);
    if (e == cudaSuccess) e = cudaEventSynchronize(t->end);
    if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, t->begin, t->end);
    gc_timer_discard(t);
    if (e != cudaSuccess) return gc_fail(GC_ERR_DEVICE, "timing on the device failed: %s", cudaGetErrorString(e));
    *seconds = ms * 1e-3;
#else
    *seconds = gc_now() - t->start;
#endif
    return GC_OK;
}
#endif   // GC_HOST
