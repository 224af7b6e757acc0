/* Fills a 1.5 GiB posix_memalign block from two threads, verifies it, then calloc's,
 * realloc's and frees. Exit 0 only if every word read back is exact. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t *block;
static size_t words;

static uint64_t pattern(size_t i) { return (uint64_t)i * 0x9E3779B97F4A7C15ull + 7; }

static void *fill(void *arg) {
    size_t t = (size_t)arg;
    for (size_t i = t; i < words; i += 2) block[i] = pattern(i);
    return NULL;
}

static void *check(void *arg) {
    size_t t = (size_t)arg, bad = 0;
    for (size_t i = t; i < words; i += 2) bad += block[i] != pattern(i);
    return (void *)bad;
}

int main(int argc, char **argv) {
    size_t bytes = (argc > 1 ? strtoull(argv[1], NULL, 10) : 1536ull) << 20;
    words = bytes / 8;
    if (posix_memalign((void **)&block, 4096, bytes) != 0) { perror("posix_memalign"); return 2; }
    pthread_t th[2];
    for (size_t t = 0; t < 2; t++) pthread_create(&th[t], NULL, fill, (void *)t);
    for (int t = 0; t < 2; t++) pthread_join(th[t], NULL);
    size_t bad = 0;
    for (size_t t = 0; t < 2; t++) pthread_create(&th[t], NULL, check, (void *)t);
    for (int t = 0; t < 2; t++) { void *r; pthread_join(th[t], &r); bad += (size_t)r; }
    if (bad) { fprintf(stderr, "posix_memalign block: %zu bad words\n", bad); return 1; }
    free(block);

    /* calloc: zeros; then realloc (grow): old contents kept, then free. */
    size_t n = (256ull << 20) / 8;
    uint64_t *c = calloc(n, 8);
    if (!c) { perror("calloc"); return 2; }
    for (size_t i = 0; i < n; i += 511) if (c[i] != 0) { fprintf(stderr, "calloc not zero at %zu\n", i); return 1; }
    for (size_t i = 0; i < n; i++) c[i] = pattern(i);
    uint64_t *r = realloc(c, 2 * n * 8);
    if (!r) { perror("realloc"); return 2; }
    for (size_t i = 0; i < n; i++) if (r[i] != pattern(i)) { fprintf(stderr, "realloc lost word %zu\n", i); return 1; }
    for (size_t i = n; i < 2 * n; i++) r[i] = pattern(i);
    for (size_t i = 0; i < 2 * n; i += 97) if (r[i] != pattern(i)) { fprintf(stderr, "realloc'd block bad at %zu\n", i); return 1; }
    free(r);
    printf("ok %zu MiB\n", bytes >> 20);
    return 0;
}
