# The smallio loop: N files (create + 100-byte write + close), stat each, unlink each; prints the three rates.
# Usage: python3 meta_loop.py DIR [N]
import os, sys, time
d = sys.argv[1]; n = int(sys.argv[2]) if len(sys.argv)>2 else 5000
os.makedirs(d, exist_ok=True)
t = time.time()
for i in range(n):
    fd = os.open(f"{d}/f{i}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, b"x" * 100); os.close(fd)
c = n / (time.time() - t); t = time.time()
for i in range(n): os.stat(f"{d}/f{i}")
s = n / (time.time() - t); t = time.time()
for i in range(n): os.unlink(f"{d}/f{i}")
u = n / (time.time() - t)
print(f"{c:.0f} {s:.0f} {u:.0f}")
