# Writes one 8-byte value into every 4 KiB page of a zeroed buffer of argv[1] MiB (768 by
# default; pages that are almost all zeros compress 100-fold), then reads every value back
# twice in a shuffled order and checks it. Prints "ok" and the number of pages.
import random
import struct
import sys

n = (int(sys.argv[1]) if len(sys.argv) > 1 else 768) << 20
pages = n // 4096
buf = bytearray(n)  # calloc: a paged region under `tierstack run`
for p in range(pages):
    struct.pack_into("<Q", buf, p * 4096 + (p % 500) * 8, p * 2654435761 % (1 << 61))
order = list(range(pages))
for _ in range(2):
    random.shuffle(order)
    for p in order:
        (v,) = struct.unpack_from("<Q", buf, p * 4096 + (p % 500) * 8)
        assert v == p * 2654435761 % (1 << 61), (p, v)
print("ok", pages)
