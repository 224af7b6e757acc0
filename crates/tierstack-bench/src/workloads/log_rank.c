/* tierstack bench workloads, mpi-logs: every MPI rank appends LINES log records of 100-200
 * bytes to a file of its own (DIR/rank.N.log, stdio, append mode), with fflush + fsync every
 * SYNC_EVERY records and at the end, as a simulation's per-rank log does. Rank 0 prints
 * "TIME <seconds>": from a barrier before the first record to a barrier after every rank's
 * fclose. Usage: log_rank DIR LINES SYNC_EVERY */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (argc != 4) {
        if (rank == 0) fprintf(stderr, "tierstack-log-rank: usage: log_rank DIR LINES SYNC_EVERY\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    long lines = atol(argv[2]), every = atol(argv[3]);
    if (every < 1) every = 1;
    char path[4096];
    snprintf(path, sizeof path, "%s/rank.%d.log", argv[1], rank);
    char pad[200];
    memset(pad, 'x', sizeof pad);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    FILE *f = fopen(path, "a");
    if (!f) {
        fprintf(stderr, "tierstack-log-rank: cannot open %s: ", path);
        perror("");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    unsigned long x = 0x9e3779b97f4a7c15UL ^ (unsigned long)rank;
    for (long i = 0; i < lines; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        /* A header of about 60 bytes and a payload that makes the record 100-200 bytes. */
        int n = 40 + (int)(x % 100);
        if (fprintf(f, "step %08ld rank %04d t=%.6f residual=%.6e %.*s\n", i, rank,
                    MPI_Wtime() - t0, (double)(x % 100000) * 1e-9, n, pad) < 0) {
            fprintf(stderr, "tierstack-log-rank: cannot write %s\n", path);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        if ((i + 1) % every == 0) {
            if (fflush(f) != 0 || fsync(fileno(f)) != 0) {
                fprintf(stderr, "tierstack-log-rank: cannot flush %s\n", path);
                MPI_Abort(MPI_COMM_WORLD, 1);
            }
        }
    }
    if (fflush(f) != 0 || fsync(fileno(f)) != 0 || fclose(f) != 0) {
        fprintf(stderr, "tierstack-log-rank: cannot close %s\n", path);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    double t1 = MPI_Wtime();
    if (rank == 0) printf("TIME %.6f\n", t1 - t0);
    MPI_Finalize();
    return 0;
}
