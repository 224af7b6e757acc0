/* Under `tierstack run --store 64M`: an allocation the store cannot back fails with
 * NULL/ENOMEM (malloc, calloc, mmap), a smaller one works; a forked child can allocate and
 * reads the parent's paged memory as it was at the fork; a child that execs works
 * normally. */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

int main(void) {
    errno = 0;
    void *big = malloc(4ull << 30);
    if (big != NULL || errno != ENOMEM) { fprintf(stderr, "malloc 4G: %p errno %d\n", big, errno); return 1; }
    errno = 0;
    void *bigc = calloc(1, 4ull << 30);
    if (bigc != NULL || errno != ENOMEM) { fprintf(stderr, "calloc 4G: %p errno %d\n", bigc, errno); return 1; }
    errno = 0;
    void *m = mmap(NULL, 4ull << 30, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m != MAP_FAILED || errno != ENOMEM) { fprintf(stderr, "mmap 4G: %p errno %d\n", m, errno); return 1; }

    size_t n = (80ull << 20) / 8;
    uint64_t *p = malloc(n * 8);
    if (!p) { perror("malloc 80M"); return 1; }
    for (size_t i = 0; i < n; i++) p[i] = i ^ 0x5555;

    /* mmap'd region: write, partial munmap of its tail, full munmap. */
    uint64_t *q = mmap(NULL, 72ull << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (q == MAP_FAILED) { perror("mmap 72M"); return 1; }
    for (size_t i = 0; i < (72ull << 20) / 8; i += 512) q[i] = i;
    if (munmap((char *)q + (64ull << 20), 8ull << 20) != 0) { perror("munmap tail"); return 1; }
    for (size_t i = 0; i < (64ull << 20) / 8; i += 512) if (q[i] != i) { fprintf(stderr, "mmap region word %zu\n", i); return 1; }
    if (munmap(q, 72ull << 20) != 0) { perror("munmap"); return 1; }

    pid_t c = fork();
    if (c == 0) {
        char *s = malloc(100 << 20); /* the child's own allocations work */
        if (!s) _exit(3);
        memset(s, 1, 100 << 20);
        free(s);
        _exit(0);
    }
    int st;
    waitpid(c, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) { fprintf(stderr, "fork child without touching: %d\n", st); return 1; }

    c = fork();
    if (c == 0) {
        for (size_t i = 0; i < n; i += 511) if (p[i] != (i ^ 0x5555)) _exit(4);
        _exit(0);
    }
    waitpid(c, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) { fprintf(stderr, "fork child reading paged memory: status %d\n", st); return 1; }

    if (system("exec true") != 0) { fprintf(stderr, "system() failed\n"); return 1; }

    for (size_t i = 0; i < n; i++) if (p[i] != (i ^ 0x5555)) { fprintf(stderr, "word %zu\n", i); return 1; }
    free(p);
    printf("ok\n");
    return 0;
}
