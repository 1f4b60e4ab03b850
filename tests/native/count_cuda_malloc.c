/* LD_PRELOAD shim: counts the process's cudaMalloc calls (the program must link the CUDA runtime shared)
 * and prints the count and total bytes at exit, for the test that device allocations do not grow with
 * the number of epochs. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

typedef int (*cuda_malloc_fn)(void**, size_t);
static int calls;
static size_t bytes;

static void report(void) { fprintf(stderr, "[count_cuda_malloc] calls=%d bytes=%zu\n", calls, bytes); }

int cudaMalloc(void** ptr, size_t size) {
    static cuda_malloc_fn real;
    if (!real) {
        real = (cuda_malloc_fn)dlsym(RTLD_NEXT, "cudaMalloc");
        atexit(report);
    }
    calls++;
    bytes += size;
    return real(ptr, size);
}
