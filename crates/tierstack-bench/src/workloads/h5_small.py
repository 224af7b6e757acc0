"""tierstack bench workloads, h5py: many small datasets in one HDF5 file.

  h5_small.py write FILE DATASETS   DATASETS datasets of 1-4 KiB in groups of 100, closed
  h5_small.py read FILE DATASETS    every dataset read back and checked

Prints "TIME <seconds>" of the file's I/O (open to close), without Python's and h5py's start.
"""
import sys
import time

import h5py
import numpy as np


def size(i):
    return 1024 + (i * 2654435761 % 3073)


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in ("write", "read"):
        sys.exit("usage: h5_small.py write|read FILE DATASETS")
    op, path, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    t0 = time.monotonic()
    if op == "write":
        with h5py.File(path, "w") as f:
            for i in range(n):
                g = f.require_group(f"g{i // 100:04d}")
                data = (np.arange(size(i), dtype=np.uint32) * (i + 1) % 251).astype(np.uint8)
                g.create_dataset(f"d{i:06d}", data=data)
    else:
        with h5py.File(path, "r") as f:
            for i in range(n):
                data = f[f"g{i // 100:04d}/d{i:06d}"][()]
                want = (np.arange(size(i), dtype=np.uint32) * (i + 1) % 251).astype(np.uint8)
                if not np.array_equal(data, want):
                    sys.exit(f"dataset {i} of {path} differs from what was written")
    print(f"TIME {time.monotonic() - t0:.6f}")


main()
