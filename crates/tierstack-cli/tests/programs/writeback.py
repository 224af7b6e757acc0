"""What the kernel's writeback cache must not change: run in a folder (a plain one and a
tierstack mount), prints one line per case with the file's size and a hash of its bytes, so
that the two runs can be compared line by line. Usage: writeback.py DIR"""
import hashlib
import mmap
import os
import sys
import threading

d = sys.argv[1]


def report(case, path):
    with open(path, "rb") as f:
        data = f.read()
    st = os.stat(path)
    print(f"{case} size={st.st_size} read={len(data)} sha={hashlib.sha256(data).hexdigest()[:16]}")


# Two writers appending records with O_APPEND at once (two processes): nothing lost or torn.
p = f"{d}/append.log"
open(p, "wb").close()
pids = []
for w in range(2):
    pid = os.fork()
    if pid == 0:
        fd = os.open(p, os.O_WRONLY | os.O_APPEND)
        for i in range(500):
            os.write(fd, (f"{w}:{i:05d}:" + "x" * 90 + "\n").encode())
        os.close(fd)
        os._exit(0)
    pids.append(pid)
for pid in pids:
    os.waitpid(pid, 0)
with open(p, "rb") as f:
    lines = f.read().split(b"\n")[:-1]
ok = len(lines) == 1000 and all(len(x) == 98 for x in lines)
mine = sorted(x for x in lines if x.startswith(b"0:"))
print(f"append records={len(lines)} intact={ok} ordered={mine == [(f'0:{i:05d}:' + 'x' * 90).encode() for i in range(500)]} size={os.stat(p).st_size}")

# Many threads writing disjoint 4 KiB blocks of one file at once.
p = f"{d}/threads.bin"
fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)


def writer(t):
    for i in range(t, 256, 8):
        os.pwrite(fd, bytes([i % 251]) * 4096, i * 4096)


ts = [threading.Thread(target=writer, args=(t,)) for t in range(8)]
for t in ts:
    t.start()
for t in ts:
    t.join()
os.close(fd)
report("threads", p)

# Shared mmap writes, then read back through read(2) after msync and close.
p = f"{d}/mmap.bin"
with open(p, "wb") as f:
    f.truncate(1 << 20)
with open(p, "r+b") as f:
    m = mmap.mmap(f.fileno(), 1 << 20)
    for i in range(0, 1 << 20, 4096):
        m[i : i + 16] = (b"%016d" % i)
    m[12345:12350] = b"hello"
    m.flush()
    m.close()
report("mmap", p)

# Partial pages: small writes at odd offsets over existing data (read-modify-write).
p = f"{d}/partial.bin"
with open(p, "wb") as f:
    f.write(bytes(range(256)) * 64)
fd = os.open(p, os.O_WRONLY)
os.pwrite(fd, b"A" * 100, 4090)
os.pwrite(fd, b"B" * 3, 16383)
os.pwrite(fd, b"C" * 7, 20000)
os.close(fd)
report("partial", p)

# Truncate through another descriptor while one holds cached pages; then extend with a hole.
p = f"{d}/trunc.bin"
a = os.open(p, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
os.write(a, b"z" * 65536)
b = os.open(p, os.O_WRONLY)
os.ftruncate(b, 10)
os.close(b)
print(f"trunc-seen size={os.fstat(a).st_size} read={len(os.pread(a, 65536, 0))}")
os.pwrite(a, b"end", 5000)
os.close(a)
report("trunc", p)

# open(O_TRUNC) of a written file, then a write: the old bytes are gone.
p = f"{d}/otrunc.bin"
with open(p, "wb") as f:
    f.write(b"q" * 100000)
fd = os.open(p, os.O_WRONLY | os.O_TRUNC)
os.write(fd, b"new")
os.close(fd)
report("otrunc", p)

# Size right after close, written in odd-sized pieces.
p = f"{d}/odd.bin"
with open(p, "wb") as f:
    for i in range(1, 200):
        f.write(bytes([i]) * (i * 7))
report("odd", p)

# A file removed while open (a temporary file): its descriptor still changes mode, times,
# size and data.
p = f"{d}/unlinked.bin"
fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
os.write(fd, b"abc")
os.unlink(p)
res = []
for name, f in [
    ("fchmod", lambda: os.fchmod(fd, 0o600)),
    ("futimes", lambda: os.utime(fd, (1, 2))),
    ("ftruncate", lambda: os.ftruncate(fd, 1)),
    ("pwrite", lambda: os.pwrite(fd, b"xyz", 10)),
]:
    try:
        f()
        res.append(f"{name}=ok")
    except OSError as e:
        res.append(f"{name}={e.errno}")
st = os.fstat(fd)
print(f"unlinked {' '.join(res)} mode={oct(st.st_mode)} size={st.st_size} data={os.pread(fd, 20, 0)!r}")
os.close(fd)
