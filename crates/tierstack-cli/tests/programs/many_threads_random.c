/* Twelve threads add 1 to their own word of random 4 KiB pages of one 128 MiB calloc block
 * (four times the paging budget the test gives), reading another random page in between;
 * then every word is checked against the counts each thread kept in ordinary memory.
 * Prints "ok" and exits 0 when every increment is there. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define THREADS 12
#define STEPS 20000

static uint64_t *mem;
static size_t pages;
static uint32_t *counts[THREADS];

static void *work(void *arg) {
    int t = (int)(uintptr_t)arg;
    uint64_t x = 0x9e3779b97f4a7c15ULL ^ (uint64_t)(t + 1);
    for (int i = 0; i < STEPS; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        size_t p = x % pages;
        __atomic_fetch_add(&mem[p * 512 + t], 1, __ATOMIC_RELAXED);
        counts[t][p]++;
        (void)*(volatile uint64_t *)&mem[((x >> 20) % pages) * 512 + 100];
    }
    return NULL;
}

int main(void) {
    pages = (128UL << 20) / 4096;
    mem = calloc(pages * 512, sizeof(uint64_t));
    if (!mem) {
        perror("calloc");
        return 2;
    }
    for (int t = 0; t < THREADS; t++) {
        counts[t] = calloc(pages, sizeof(uint32_t));
        if (!counts[t]) {
            perror("calloc");
            return 2;
        }
    }
    pthread_t th[THREADS];
    for (int t = 0; t < THREADS; t++)
        if (pthread_create(&th[t], NULL, work, (void *)(uintptr_t)t) != 0) {
            fprintf(stderr, "pthread_create failed\n");
            return 2;
        }
    for (int t = 0; t < THREADS; t++)
        pthread_join(th[t], NULL);
    long bad = 0;
    for (size_t p = 0; p < pages; p++)
        for (int t = 0; t < THREADS; t++)
            if (mem[p * 512 + t] != counts[t][p])
                bad++;
    if (bad) {
        printf("bad %ld words\n", bad);
        return 1;
    }
    printf("ok\n");
    return 0;
}
