// Prints the runtime's training order for (seed, epoch, n) as n raw little-endian uint32 values, so that
// tests/test_permutation.py can compare the C permutation (runtime/gc_runtime.h, cpu build) with numpy's.
//   perm_order SEED EPOCH N > order.bin
#include "gc_runtime.h"

int main(int argc, char** argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s SEED EPOCH N\n", argv[0]);
        return 2;
    }
    uint64_t seed = strtoull(argv[1], NULL, 10), epoch = strtoull(argv[2], NULL, 10);
    uint32_t n = (uint32_t)strtoul(argv[3], NULL, 10);
    gc_perm p = gc_perm_make(seed, epoch, n);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t v = gc_perm_apply(p, i);
        fwrite(&v, sizeof v, 1, stdout);
    }
    return 0;
}
