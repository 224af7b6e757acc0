"""Random page reads and writes over a buffer of random (incompressible) bytes.

usage: random_pages.py MIB [ACCESSES]
Fills MIB MiB with random bytes (one large allocation), then reads or writes one 8-byte word
of a random 4 KiB page ACCESSES times (half writes), and prints a checksum of what it read;
the seed is fixed, so every run prints the same. `tierstack bench mem --compare --dram 128M
-- python3 docs/bench/random_pages.py 768` times it under run and kernel swap.
"""
import random
import sys

import numpy as np

mib = int(sys.argv[1])
accesses = int(sys.argv[2]) if len(sys.argv) > 2 else 200_000
words = np.random.default_rng(7).integers(0, 1 << 62, size=(mib << 20) // 8, dtype=np.int64)
pages = len(words) // 512
rng = random.Random(7)
total = 0
for i in range(accesses):
    w = rng.randrange(pages) * 512 + rng.randrange(512)
    if i & 1:
        words[w] = i
    else:
        total = (total + int(words[w])) % (1 << 61)
print("checksum", total)
