/* A program whose 1.5 GiB (argv[1] MiB) of doubles are the same smooth field as `bench mem --fill floats` (argv[3]=1; 0: random bytes), then argv[2] seconds of uniform random accesses, half reads, half writes of one word: the synthetic comparison under `tierstack run`. Build: cc -O2 -o floats_access floats_access.c -lm */
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <math.h>
#include <time.h>
#include <string.h>
int main(int argc, char **argv) {
    size_t mib = argc > 1 ? atol(argv[1]) : 1536;
    double secs = argc > 2 ? atof(argv[2]) : 10;
    int fill = argc > 3 ? atoi(argv[3]) : 1;
    size_t n = mib << 17; /* doubles */
    double *a = malloc(n * sizeof(double));
    if (!a) return 1;
    if (fill == 1) for (size_t i = 0; i < n; i++) { double t = i * 1e-4; a[i] = sin(t) * 0.5 + cos(3 * t); }
    else { uint64_t x = 88172645463325252ull; for (size_t i = 0; i < n; i++) { x ^= x << 13; x ^= x >> 7; x ^= x << 17; memcpy(&a[i], &x, 8); } }
    struct timespec t0, t1; clock_gettime(CLOCK_MONOTONIC, &t0);
    uint64_t r = 12345, acc = 0; size_t pages = n / 512; double sum = 0;
    for (;;) {
        for (int k = 0; k < 256; k++) {
            r ^= r << 13; r ^= r >> 7; r ^= r << 17;
            size_t p = r % pages, w = (r >> 32) % 512;
            if (r & (1ull << 20)) sum += a[p * 512 + w]; else a[p * 512 + w] = (double)acc;
            acc++;
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        if ((t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9 > secs) break;
    }
    printf("accesses/s %.0f (sum %g)\n", acc / secs, sum);
    return 0;
}
