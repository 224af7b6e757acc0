/* The rank program of `tierstack bench io` (IOR's method, POSIX API).
 *
 * Built at run time with mpicc into a temporary folder and launched with mpirun, so that the
 * tierstack build never needs MPI. Each repetition: barrier; every rank opens (creates) its
 * file (or the shared file), writes --size bytes in transfers of --xfer bytes (sequential or,
 * with --random, a random permutation of the transfer offsets), optionally fsyncs, closes;
 * barrier; then reads back the data written by rank (rank + shift) % n, so that a rank does not
 * read what it wrote itself (IOR's -C). Every rank's timestamps (CLOCK_MONOTONIC, corrected to
 * rank 0's clock) are gathered to rank 0, which prints one line per phase:
 *
 *   IORANK {"rep":R,"op":"write","ranks":[[open_start,open_end,xfer_end,close_end,bytes,errors],...]}
 *
 * The bandwidth arithmetic (bytes / (slowest end - earliest start)) is done by the caller.
 * A watchdog (alarm) ends a rank that hangs. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <mpi.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void on_alarm(int sig) {
    (void)sig;
    static const char m[] = "tierstack-ior-rank: watchdog: no progress before the timeout, rank ends\n";
    ssize_t w = write(2, m, sizeof m - 1);
    (void)w;
    _exit(3);
}

static void die(int rank, const char *what, const char *path) {
    fprintf(stderr, "tierstack-ior-rank: rank %d: cannot %s %s: %s\n", rank, what, path, strerror(errno));
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 2);
    _exit(2);
}

/* Waits for every rank without spinning: a rank that finished its phase early sleeps in
 * 50 us steps instead of busy-polling in MPI_Barrier/MPI_Gather, which on an oversubscribed
 * node (more ranks than cores) takes CPU from the ranks still working and from the storage
 * daemon serving them. */
static void quiet_barrier(void) {
    MPI_Request req;
    MPI_Ibarrier(MPI_COMM_WORLD, &req);
    int done = 0;
    struct timespec nap = {0, 50000};
    for (;;) {
        MPI_Test(&req, &done, MPI_STATUS_IGNORE);
        if (done) break;
        nanosleep(&nap, NULL);
    }
}

/* xorshift64* */
static uint64_t rnd(uint64_t *s) {
    uint64_t x = *s;
    x ^= x >> 12; x ^= x << 25; x ^= x >> 27;
    *s = x;
    return x * 2685821657736338717ULL;
}

/* The contents of one transfer: a pattern of the owner rank, stamped with the offset. */
static void fill(unsigned char *buf, uint64_t xfer, int owner, uint64_t off) {
    uint64_t w = 0x5449455253544B00ULL ^ ((uint64_t)owner << 32);
    for (uint64_t i = 0; i + 8 <= xfer; i += 8) {
        uint64_t v = w + i;
        memcpy(buf + i, &v, 8);
    }
    if (xfer >= 8) memcpy(buf, &off, 8);
}

int main(int argc, char **argv) {
    const char *dir = NULL;
    uint64_t xfer = 1 << 20, size = 1 << 20;
    int do_fsync = 0, shared = 0, random_off = 0, reps = 1, verify = 0, drop = 0, keep_last = 1;
    unsigned timeout = 600;
    uint64_t seed = 1;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--dir")) dir = v;
        else if (!strcmp(k, "--xfer")) xfer = strtoull(v, NULL, 10);
        else if (!strcmp(k, "--size")) size = strtoull(v, NULL, 10);
        else if (!strcmp(k, "--fsync")) do_fsync = atoi(v);
        else if (!strcmp(k, "--shared")) shared = atoi(v);
        else if (!strcmp(k, "--random")) random_off = atoi(v);
        else if (!strcmp(k, "--reps")) reps = atoi(v);
        else if (!strcmp(k, "--verify")) verify = atoi(v);
        else if (!strcmp(k, "--drop-cache")) drop = atoi(v);
        else if (!strcmp(k, "--keep-last")) keep_last = atoi(v);
        else if (!strcmp(k, "--timeout")) timeout = (unsigned)strtoul(v, NULL, 10);
        else if (!strcmp(k, "--seed")) seed = strtoull(v, NULL, 10);
    }
    signal(SIGALRM, on_alarm);
    alarm(timeout + 30);
    MPI_Init(&argc, &argv);
    int rank = 0, n = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    if (!dir || xfer == 0 || size == 0 || size % xfer != 0 || reps < 1) {
        if (rank == 0)
            fprintf(stderr, "tierstack-ior-rank: bad arguments: need --dir, --xfer > 0 and --size a multiple of --xfer\n");
        MPI_Finalize();
        return 2;
    }
    /* Rank 0's clock: every rank's times are shifted onto it (IOR's wall-clock delta). */
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = now(), t_root = t0;
    MPI_Bcast(&t_root, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    double delta = t0 - t_root;

    unsigned char *buf = NULL, *want = NULL;
    if (posix_memalign((void **)&buf, 4096, xfer) || posix_memalign((void **)&want, 4096, xfer)) {
        fprintf(stderr, "tierstack-ior-rank: rank %d: cannot allocate %llu bytes\n", rank, (unsigned long long)xfer);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    uint64_t count = size / xfer;
    uint64_t *order = malloc(count * sizeof(uint64_t));
    if (!order) {
        fprintf(stderr, "tierstack-ior-rank: rank %d: cannot allocate the offset list\n", rank);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    int shift = n > 1 ? 1 : 0;
    double *all = rank == 0 ? malloc(sizeof(double) * 6 * (size_t)n) : NULL;
    char path[4096];
    for (int rep = 0; rep < reps; rep++) {
        for (int op = 0; op < 2; op++) {
            int owner = op == 0 ? rank : (rank + shift) % n;
            if (shared)
                snprintf(path, sizeof path, "%s/ior.shared", dir);
            else
                snprintf(path, sizeof path, "%s/ior.%08d", dir, owner);
            uint64_t base = shared ? (uint64_t)owner * size : 0;
            for (uint64_t i = 0; i < count; i++) order[i] = i;
            if (random_off) {
                uint64_t s = seed * 0x9E3779B97F4A7C15ULL + (uint64_t)owner * 7919 + (uint64_t)rep * 104729 + (uint64_t)op + 1;
                for (uint64_t i = count; i > 1; i--) {
                    uint64_t j = rnd(&s) % i, t = order[i - 1];
                    order[i - 1] = order[j];
                    order[j] = t;
                }
            }
            if (op == 1 && drop) {
                int fd = open(path, O_RDONLY);
                if (fd >= 0) {
                    posix_fadvise(fd, (off_t)base, (off_t)size, POSIX_FADV_DONTNEED);
                    close(fd);
                }
            }
            fill(buf, xfer, owner, 0);
            double errors = 0;
            MPI_Barrier(MPI_COMM_WORLD);
            alarm(timeout + 30);
            double open_start = now();
            int fd = op == 0 ? open(path, O_CREAT | O_WRONLY, 0644) : open(path, O_RDONLY);
            if (fd < 0) die(rank, op == 0 ? "create" : "open", path);
            double open_end = now();
            for (uint64_t i = 0; i < count; i++) {
                uint64_t off = base + order[i] * xfer;
                if (op == 0) {
                    if (xfer >= 8) memcpy(buf, &off, 8);
                    uint64_t done = 0;
                    while (done < xfer) {
                        ssize_t w = pwrite(fd, buf + done, xfer - done, (off_t)(off + done));
                        if (w < 0 && errno == EINTR) continue;
                        if (w <= 0) die(rank, "write", path);
                        done += (uint64_t)w;
                    }
                } else {
                    uint64_t done = 0;
                    while (done < xfer) {
                        ssize_t r = pread(fd, buf + done, xfer - done, (off_t)(off + done));
                        if (r < 0 && errno == EINTR) continue;
                        if (r < 0) die(rank, "read", path);
                        if (r == 0) break;
                        done += (uint64_t)r;
                    }
                    if (done < xfer) errors += 1;
                    else if (verify) {
                        fill(want, xfer, owner, off);
                        if (memcmp(want, buf, xfer) != 0) errors += 1;
                    }
                }
            }
            double xfer_end = now();
            if (op == 0 && do_fsync && fsync(fd) != 0) die(rank, "fsync", path);
            if (close(fd) != 0) die(rank, "close", path);
            double close_end = now();
            double mine[6] = {open_start - delta, open_end - delta, xfer_end - delta, close_end - delta, (double)size, errors};
            quiet_barrier();
            MPI_Gather(mine, 6, MPI_DOUBLE, all, 6, MPI_DOUBLE, 0, MPI_COMM_WORLD);
            if (rank == 0) {
                printf("IORANK {\"rep\":%d,\"op\":\"%s\",\"ranks\":[", rep, op == 0 ? "write" : "read");
                for (int r = 0; r < n; r++) {
                    double *a = all + 6 * r;
                    printf("%s[%.9f,%.9f,%.9f,%.9f,%.0f,%.0f]", r ? "," : "", a[0], a[1], a[2], a[3], a[4], a[5]);
                }
                printf("]}\n");
                fflush(stdout);
            }
        }
        /* IOR removes the files after each repetition; the last one's are kept for the drain
         * (the caller removes them). */
        MPI_Barrier(MPI_COMM_WORLD);
        if (!(keep_last && rep == reps - 1)) {
            if (shared) {
                if (rank == 0) {
                    snprintf(path, sizeof path, "%s/ior.shared", dir);
                    unlink(path);
                }
            } else {
                snprintf(path, sizeof path, "%s/ior.%08d", dir, rank);
                unlink(path);
            }
            MPI_Barrier(MPI_COMM_WORLD);
        }
    }
    alarm(0);
    free(order);
    free(buf);
    free(want);
    free(all);
    MPI_Finalize();
    return 0;
}
