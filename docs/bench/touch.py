"""A numpy array of MIB MiB with one value per 4 KiB page, three strided passes (pages that
compress). usage: touch.py MIB. `tierstack bench mem --compare --dram 64M -- python3
docs/bench/touch.py 512` times it under run and kernel swap.
"""
import sys
import numpy as np
n = int(sys.argv[1]) << 20
a = np.zeros(n // 8, dtype=np.float64)
for r in range(3):
    a[::512] += np.arange(len(a[::512]))
print(float(a.sum()))
