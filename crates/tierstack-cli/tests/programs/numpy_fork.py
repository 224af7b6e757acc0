"""Issue 19: a child forked after a 640 MB numpy array reads it as it was at the fork, its
writes stay private, the parent's later writes are not seen by it; then a multiprocessing
pool (fork start method) sums parts of the array. Prints lines that must be the same natively
and under `tierstack run`."""
import multiprocessing as mp
import os

import numpy as np

N = 640 * 2**20 // 8
a = np.arange(N, dtype=np.float64)
TOTAL = N * (N - 1) / 2

pid = os.fork()
if pid == 0:
    seen = a.sum() == TOTAL
    a[:] = -1.0
    own = a.sum() == -N
    print(f"child sum_ok={seen} own_ok={own}", flush=True)
    os._exit(0)
a += 1.0
_, status = os.waitpid(pid, 0)
print(f"parent status={os.waitstatus_to_exitcode(status)} sum_ok={a.sum() == TOTAL + N}", flush=True)


def part(i):
    return float(a[i::4].sum())


with mp.get_context("fork").Pool(2) as pool:
    parts = pool.map(part, range(4))
print(f"pool sum_ok={sum(parts) == TOTAL + N}", flush=True)
