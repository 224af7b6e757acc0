/* mlockall and munlockall again and again beside the pager: a 768 MiB block (three times
 * `run --dram 256M`) is filled, then each round locks everything present and future, makes
 * and writes a 64-160 MiB allocation, reads 2,000 random pages of the block back and unlocks.
 * Usage: mlock_rounds MIB ROUNDS. Prints every tenth round's count of wrong pages. A hang
 * or a wrong page is the failure. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

int main(int argc, char **argv) {
    if (argc < 3) return 1;
    size_t n = (size_t)atoi(argv[1]) << 20;
    int rounds = atoi(argv[2]);
    unsigned char *p = malloc(n);
    if (!p) return 2;
    for (size_t i = 0; i < n; i += 4096) p[i] = (unsigned char)(i >> 12);
    uint64_t seed = 1;
    unsigned long wrong = 0;
    for (int r = 0; r < rounds; r++) {
        mlockall(MCL_CURRENT | MCL_FUTURE);
        size_t qn = (size_t)(64 + (r % 4) * 32) << 20;
        unsigned char *q = malloc(qn);
        if (!q) return 3;
        memset(q, r, qn);
        for (int k = 0; k < 2000; k++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            size_t pg = (seed >> 20) % (n / 4096);
            wrong += p[pg * 4096] != (unsigned char)pg;
        }
        wrong += q[qn - 1] != (unsigned char)r;
        munlockall();
        free(q);
        if (r % 10 == 0) printf("round %d wrong %lu\n", r, wrong);
    }
    printf("done wrong %lu\n", wrong);
    return 0;
}
