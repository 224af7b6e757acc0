# Makes a 1.6 GB numpy array, sums it, checks the exact result.
import numpy as np

n = 200_000_000
a = np.arange(n, dtype=np.int64)  # 1.6 GB
s = int(a.sum())
assert s == n * (n - 1) // 2, s
a[::7] += 3  # write again, through evicted pages
s2 = int(a.sum())
assert s2 == s + 3 * len(range(0, n, 7)), s2
print("ok", a.nbytes)
