/* footprint.c MIB PASSES [random|smooth]: one allocation of MIB MiB (paged under `tierstack run`
 * when it is at least run's threshold), written page by page (eight words a page, which compress
 * well; every other word with pseudo-random bits, which do not, with `random`; a smooth field of
 * doubles, which compresses about 2:1 with the compressed tier's smooth codec only, with
 * `smooth`), then PASSES passes
 * that read and rewrite every page; checks the sums and prints "ok". With MIB 0 it allocates nothing: its peak RSS
 * is then the program's own unpaged memory (libc, stack, code). Used by the footprint test
 * (peak RSS under run against --dram plus that unpaged memory). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc != 3 && argc != 4) {
        fprintf(stderr, "usage: footprint MIB PASSES [random|smooth]\n");
        return 2;
    }
    size_t mib = strtoull(argv[1], 0, 10);
    int passes = atoi(argv[2]);
    if (mib == 0) {
        puts("ok");
        return 0;
    }
    size_t n = mib << 20, pages = n / 4096;
    uint64_t *a = malloc(n);
    if (!a) {
        perror("malloc");
        return 1;
    }
    int random = argc == 4 && strcmp(argv[3], "random") == 0;
    int smooth = argc == 4 && strcmp(argv[3], "smooth") == 0;
    uint64_t x = 88172645463325252ull;
    for (size_t p = 0; p < pages; p++)
        for (size_t w = 0; w < 512; w++) {
            if (w % 64 == 0)
                a[p * 512 + w] = p * 7 + w;
            else if (random) {
                x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                a[p * 512 + w] = x;
            } else if (smooth) {
                double t = (double)(p * 512 + w) * 1e-4;
                double v = sin(t) * 0.5 + cos(3 * t);
                memcpy(&a[p * 512 + w], &v, 8);
            }
        }
    for (int k = 0; k < passes; k++) {
        uint64_t sum = 0, want = 0;
        for (size_t p = 0; p < pages; p++)
            for (size_t w = 0; w < 512; w += 64) {
                sum += a[p * 512 + w];
                want += p * 7 + w + (uint64_t)k;
                a[p * 512 + w] += 1;
            }
        if (sum != want) {
            fprintf(stderr, "pass %d: sum %llu, want %llu\n", k, (unsigned long long)sum,
                    (unsigned long long)want);
            return 1;
        }
    }
    free(a);
    puts("ok");
    return 0;
}
