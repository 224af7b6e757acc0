/* Memory-semantics battery for `tierstack run` (issue 19): each case works on blocks several
 * times the budget the test gives and prints one line that must be the same natively and
 * under tierstack run. Usage: semantics CASE MIB */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

static size_t MB;

static uint64_t sum(const unsigned char *p, size_t n) {
    uint64_t s = 0;
    for (size_t i = 0; i < n; i += 4096) s = s * 31 + p[i] + p[i + 4095];
    return s;
}

/* MADV_DONTNEED on a private anonymous block: the range reads as zeros afterwards, also
 * for a range that does not start or end on a 64 KiB boundary. */
static int dontneed(void) {
    size_t n = MB << 20;
    unsigned char *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return 2;
    memset(p, 0xAB, n);
    size_t off = (n / 3) & ~(size_t)4095, len = (n / 4) & ~(size_t)4095;
    if (madvise(p + off + 4096, len, MADV_DONTNEED) != 0) return 3;
    size_t zeros = 0, ab = 0;
    for (size_t i = 0; i < n; i += 512) {
        if (p[i] == 0) zeros++;
        else if (p[i] == 0xAB) ab++;
    }
    /* then memset all of it and unmap a part in the middle, and use the rest */
    memset(p, 7, n);
    size_t cut = (n / 2) & ~(size_t)4095;
    if (munmap(p + cut, 8 << 20) != 0) return 4;
    uint64_t s = sum(p, cut) + sum(p + cut + (8 << 20), n - cut - (8 << 20));
    printf("dontneed zeros=%zu ab=%zu sum=%llu\n", zeros, ab, (unsigned long long)s);
    return 0;
}

static sigjmp_buf jb;
static volatile int caught;
static void on_segv(int sig) {
    (void)sig;
    caught++;
    siglongjmp(jb, 1);
}

/* mprotect(PROT_READ) on part of a block, a write to it, the program's own SIGSEGV handler
 * with siglongjmp (guard pages, garbage collectors, JITs). */
static int guard(void) {
    size_t n = MB << 20;
    /* page-aligned natively too, so the output does not depend on malloc's alignment */
    unsigned char *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return 2;
    memset(p, 1, n);
    unsigned char *g = (unsigned char *)(((uintptr_t)p + (n / 2)) & ~(uintptr_t)4095);
    if (mprotect(g, 1 << 20, PROT_READ) != 0) return 3;
    signal(SIGSEGV, on_segv);
    for (int k = 0; k < 3; k++) {
        if (sigsetjmp(jb, 1) == 0) {
            g[k * 4096] = 9; /* faults */
        }
    }
    mprotect(g, 1 << 20, PROT_READ | PROT_WRITE);
    g[0] = 5;
    printf("guard caught=%d first=%d mid=%d sum=%llu\n", caught, p[0], g[0],
           (unsigned long long)sum(p, n & ~(size_t)4095));
    return 0;
}

/* mmap(MAP_FIXED) over part of a large block (how runtimes commit reserved space). */
static int fixed(void) {
    size_t n = MB << 20;
    unsigned char *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return 2;
    memset(p, 3, n);
    size_t off = ((n / 4) & ~(size_t)4095) + 8192, len = 16 << 20;
    unsigned char *q = mmap(p + off, len, PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (q != p + off) return 3;
    int fresh = q[0] == 0 && q[len - 1] == 0;
    memset(q, 4, len);
    /* touch everything again, twice the budget's worth, so evictions run over it */
    volatile unsigned char x = 0;
    for (int r = 0; r < 2; r++)
        for (size_t i = 0; i < n; i += 4096) x += p[i];
    printf("fixed fresh=%d sum=%llu inner=%d\n", fresh, (unsigned long long)sum(p, n),
           q[len / 2]);
    return 0;
}

/* realloc growth, calloc zeros, read()/write() through paged memory. */
static int grow(void) {
    size_t n = MB << 20;
    unsigned char *p = calloc(1, n / 2);
    if (!p) return 2;
    size_t nz = 0;
    for (size_t i = 0; i < n / 2; i += 4096) nz += p[i] != 0;
    memset(p, 2, n / 2);
    p = realloc(p, n);
    if (!p) return 3;
    memset(p + n / 2, 6, n / 2);
    int fd[2];
    if (pipe(fd) != 0) return 4;
    if (write(fd[1], p + n / 2 - 2, 4) != 4) return 5;
    unsigned char b[4];
    if (read(fd[0], b, 4) != 4) return 6;
    printf("grow nonzero=%zu pipe=%d%d%d%d sum=%llu\n", nz, b[0], b[1], b[2], b[3],
           (unsigned long long)sum(p, n));
    return 0;
}

/* Fills each 4 KiB page of a block with one byte: f(page number). */
static void fill_pages(unsigned char *p, size_t n, unsigned (*f)(size_t)) {
    for (size_t pg = 0; pg < n / 4096; pg++) memset(p + pg * 4096, (int)(f(pg) & 0xff), 4096);
}

/* Pages whose first and last bytes are not f(page number). */
static size_t wrong_pages(const unsigned char *p, size_t n, unsigned (*f)(size_t)) {
    size_t bad = 0;
    for (size_t pg = 0; pg < n / 4096; pg++) {
        unsigned char want = (unsigned char)(f(pg) & 0xff);
        bad += p[pg * 4096] != want || p[pg * 4096 + 4095] != want;
    }
    return bad;
}

static unsigned at_fork(size_t pg) { return (unsigned)(pg * 7 + 3); }
static unsigned parent_after(size_t pg) { return (unsigned)(pg + 1); }
static unsigned child_own(size_t pg) { return (unsigned)(pg * 3); }

/* fork: the child sees the block as it was at the fork while the parent rewrites it, its own
 * writes stay private (also once paged out and back), and a grandchild sees the child's. */
static int forked(void) {
    size_t n = MB << 20;
    unsigned char *p = malloc(n);
    if (!p) return 2;
    fill_pages(p, n, at_fork);
    fflush(stdout);
    pid_t c = fork();
    if (c == 0) {
        size_t seen = wrong_pages(p, n, at_fork);
        fill_pages(p, n, child_own);
        size_t own = wrong_pages(p, n, child_own);
        pid_t g = fork();
        if (g == 0) {
            size_t gseen = wrong_pages(p, n, child_own);
            printf("grandchild wrong=%zu\n", gseen);
            fflush(stdout);
            _exit(0);
        }
        int gst = 0;
        waitpid(g, &gst, 0);
        printf("child wrong_at_fork=%zu wrong_own=%zu grandchild_status=%d\n", seen, own,
               WIFEXITED(gst) ? WEXITSTATUS(gst) : 100 + WTERMSIG(gst));
        fflush(stdout);
        _exit(0);
    }
    fill_pages(p, n, parent_after);
    int st = 0;
    waitpid(c, &st, 0);
    printf("fork child_status=%s parent_wrong=%zu\n",
           WIFEXITED(st) ? "exit" : (WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV ? "SIGSEGV" : "other"),
           wrong_pages(p, n, parent_after));
    return 0;
}

/* A runtime's reserve-then-commit heap (the JVM commits with mmap(MAP_FIXED), V8 with
 * mprotect): reserved inaccessible, committed in pieces and written; a piece uncommitted (a
 * touch is caught by the program's SIGSEGV handler) and committed again (zeros); a written
 * piece made inaccessible while the rest is read twice (evictions run meanwhile), then
 * accessible again with its data. */
static int reserve(void) {
    size_t n = MB << 20;
    unsigned char *r = mmap(NULL, n, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (r == MAP_FAILED) return 2;
    size_t half = (n / 2) & ~(size_t)4095;
    if (mmap(r, half, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != r)
        return 3;
    if (mprotect(r + half, n - half, PROT_READ | PROT_WRITE) != 0) return 4;
    fill_pages(r, n, at_fork);
    size_t off = (n / 3) & ~(size_t)4095, len = 8 << 20;
    if (mmap(r + off, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1,
             0) != r + off)
        return 5;
    signal(SIGSEGV, on_segv);
    if (sigsetjmp(jb, 1) == 0) {
        volatile unsigned char x = r[off + 100];
        (void)x;
    }
    if (mmap(r + off, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1,
             0) != r + off)
        return 6;
    size_t zeros = 0;
    for (size_t i = 0; i < len; i += 4096) zeros += r[off + i] == 0 && r[off + i + 4095] == 0;
    size_t off2 = (2 * n / 3) & ~(size_t)4095;
    if (mprotect(r + off2, len, PROT_NONE) != 0) return 7;
    volatile unsigned char x = 0;
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; i < n; i += 4096)
            if (i < off2 || i >= off2 + len) x += r[i];
    if (mprotect(r + off2, len, PROT_READ | PROT_WRITE) != 0) return 8;
    size_t wrong = 0;
    for (size_t pg = 0; pg < n / 4096; pg++) {
        size_t i = pg * 4096;
        if (i >= off && i < off + len) continue;
        unsigned char want = (unsigned char)(at_fork(pg) & 0xff);
        wrong += r[i] != want || r[i + 4095] != want;
    }
    printf("reserve caught=%d zeros=%zu/%zu wrong=%zu\n", caught, zeros, len / 4096, wrong);
    return 0;
}

/* mlock of part of a block and mlockall: the program's view is unchanged (the pager keeps
 * the pages it can within the budget) and nothing hangs while the rest is paged. */
static int locked(void) {
    size_t n = MB << 20;
    unsigned char *p = malloc(n);
    if (!p) return 2;
    fill_pages(p, n, at_fork);
    size_t off = (n / 2) & ~(size_t)4095, len = 32 << 20;
    int rc1 = mlock(p + off, len);
    int rc2 = mlockall(MCL_CURRENT | MCL_FUTURE);
    unsigned char *q = malloc(n / 4);
    if (!q) return 3;
    memset(q, 9, n / 4);
    volatile unsigned char x = 0;
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; i < n; i += 4096) x += p[i];
    munlockall();
    munlock(p + off, len);
    printf("mlock rc=%d,%d wrong=%zu q=%llu\n", rc1 == 0 || errno == ENOMEM || errno == EPERM,
           rc2 == 0 || errno == ENOMEM || errno == EPERM, wrong_pages(p, n, at_fork),
           (unsigned long long)sum(q, (n / 4) & ~(size_t)4095));
    return 0;
}

/* fork while other threads fault on the block; the child checks it with threads of its own,
 * then runs a program (fork + exec) and waits for it. Three rounds. */
static unsigned char *TB;
static size_t TN;
static volatile int stop_readers;
static void *reader(void *arg) {
    size_t seed = (size_t)arg * 2654435761u + 1;
    volatile unsigned char x = 0;
    while (!stop_readers) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        x += TB[(seed >> 20) % TN];
    }
    return NULL;
}
struct part { size_t from, to, wrong; };
static void *checker(void *arg) {
    struct part *pt = arg;
    for (size_t pg = pt->from; pg < pt->to; pg++) {
        unsigned char want = (unsigned char)(at_fork(pg) & 0xff);
        pt->wrong += TB[pg * 4096] != want || TB[pg * 4096 + 4095] != want;
    }
    return NULL;
}
static int threads(void) {
    TN = MB << 20;
    TB = malloc(TN);
    if (!TB) return 2;
    fill_pages(TB, TN, at_fork);
    pthread_t r[2];
    for (long i = 0; i < 2; i++) pthread_create(&r[i], NULL, reader, (void *)i);
    int ok = 0;
    for (int round = 0; round < 3; round++) {
        fflush(stdout);
        pid_t c = fork();
        if (c == 0) {
            size_t pages = TN / 4096;
            struct part pt[2] = {{0, pages / 2, 0}, {pages / 2, pages, 0}};
            pthread_t t[2];
            for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, checker, &pt[i]);
            for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
            pid_t e = fork();
            if (e == 0) {
                execl("/bin/true", "true", (char *)NULL);
                _exit(127);
            }
            int est = 0;
            waitpid(e, &est, 0);
            _exit(pt[0].wrong + pt[1].wrong == 0 && WIFEXITED(est) && WEXITSTATUS(est) == 0 ? 0 : 1);
        }
        int st = 0;
        waitpid(c, &st, 0);
        ok += WIFEXITED(st) && WEXITSTATUS(st) == 0;
    }
    stop_readers = 1;
    for (int i = 0; i < 2; i++) pthread_join(r[i], NULL);
    printf("threads rounds_ok=%d wrong=%zu\n", ok, wrong_pages(TB, TN, at_fork));
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) return 1;
    MB = strtoull(argv[2], 0, 10);
    const char *c = argv[1];
    if (!strcmp(c, "dontneed")) return dontneed();
    if (!strcmp(c, "guard")) return guard();
    if (!strcmp(c, "fixed")) return fixed();
    if (!strcmp(c, "grow")) return grow();
    if (!strcmp(c, "fork")) return forked();
    if (!strcmp(c, "reserve")) return reserve();
    if (!strcmp(c, "mlock")) return locked();
    if (!strcmp(c, "threads")) return threads();
    return 1;
}
