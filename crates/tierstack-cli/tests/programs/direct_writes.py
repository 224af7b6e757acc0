"""What direct writes (a write-only handle of a new or truncated file bypasses the kernel's page
cache in a tierstack mount) must not change: run in a folder (a plain one and a tierstack
mount), prints one line per case, so that the two runs can be compared line by line.
Usage: direct_writes.py DIR"""
import hashlib
import mmap
import os
import subprocess
import sys
import time

d = sys.argv[1]


def sha(path):
    with open(path, "rb") as f:
        data = f.read()
    return f"size={os.stat(path).st_size} read={len(data)} sha={hashlib.sha256(data).hexdigest()[:16]}"


def settles(check, seconds=2.0):
    """Whether check() holds now or within `seconds` (a mount drops the kernel's cached
    entry of a direct-written file just after its close, not before close returns)."""
    end = time.monotonic() + seconds
    while True:
        if check():
            return True
        if time.monotonic() > end:
            return False
        time.sleep(0.01)


# A checkpoint writer: create write-only, write for a while, fsync, close. The size reads right
# while the handle is open; after the close the mtime is the last write's, not the open's.
p = f"{d}/ckpt.bin"
opened = time.time_ns()
fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
for i in range(16):
    os.write(fd, bytes([i]) * 65536)
size_open = os.fstat(fd).st_size
time.sleep(0.3)
os.write(fd, b"tail" * 1000)
os.fsync(fd)
os.close(fd)
late = settles(lambda: os.stat(p).st_mtime_ns - opened > 200_000_000)
print(f"ckpt size_while_open={size_open} {sha(p)} mtime_is_last_write={late}")

# The same file truncated and rewritten by a write-only handle while a reader holds it open:
# the reader sees the new bytes, and the mtime moves on again.
r = os.open(p, os.O_RDONLY)
before = os.pread(r, 8, 0)
first = os.stat(p).st_mtime_ns
time.sleep(0.05)
fd = os.open(p, os.O_WRONLY | os.O_TRUNC)
time.sleep(0.3)
os.write(fd, b"NEW!" * 4096)
os.close(fd)
after = os.pread(r, 8, 0)
os.close(r)
moved = settles(lambda: os.stat(p).st_mtime_ns - first > 200_000_000)
print(f"rewrite before={before.hex()} after={after.hex()} {sha(p)} mtime_moved={moved}")

def slow_writer(path, block):
    """A write-only handle of a new file, written at once and again 0.3 s later; returns
    (the handle, the time of its open in ns)."""
    opened = time.time_ns()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, b"t" * block)
    time.sleep(0.3)
    os.write(fd, b"u" * block)
    return fd, opened


# The checkpoint pattern: write a temporary name, close, rename it at once. The final name
# shows the last write's mtime.
p = f"{d}/tmp.bin"
fd, opened = slow_writer(p, 65536)
os.close(fd)
os.rename(p, f"{d}/final.bin")
late = settles(lambda: os.stat(f"{d}/final.bin").st_mtime_ns - opened > 200_000_000)
print(f"renamed {sha(d + '/final.bin')} mtime_is_last_write={late}")

# A handle shared with a child (fork): the parent's close leaves the child's copy open; after
# the child's exit the mtime is the last write's.
p = f"{d}/forked.bin"
fd, opened = slow_writer(p, 4096)
child = os.fork()
if child == 0:
    time.sleep(0.2)
    os._exit(0)
os.close(fd)
os.waitpid(child, 0)
late = settles(lambda: os.stat(p).st_mtime_ns - opened > 200_000_000)
print(f"forked {sha(p)} mtime_is_last_write={late}")

# A read-write handle opened while a write-only one writes, closed after it: the kernel writes
# back its cached (older) times through the read-write handle; they do not win.
p = f"{d}/mixed.bin"
w, opened = slow_writer(p, 4096)
rw = os.open(p, os.O_RDWR)
os.close(w)
os.close(rw)
late = settles(lambda: os.stat(p).st_mtime_ns - opened > 200_000_000)
print(f"mixed {sha(p)} mtime_is_last_write={late}")

# A read-only handle opened while a write-only one writes, closed after it: the kernel keeps the
# inode (and its cached mtime) for the reader; once the reader closes too, the mtime is the
# last write's.
p = f"{d}/held.bin"
w, opened = slow_writer(p, 4096)
r = os.open(p, os.O_RDONLY)
os.close(w)
time.sleep(0.1)
os.stat(p)  # a lookup while the reader holds the inode
os.close(r)
late = settles(lambda: os.stat(p).st_mtime_ns - opened > 200_000_000)
print(f"held {sha(p)} mtime_is_last_write={late}")

# An explicit mtime alone (touch -m: the atime is left as it is) after a direct write, then a
# rename: the program's time is kept.
p = f"{d}/touched.bin"
w, opened = slow_writer(p, 4096)
os.close(w)
subprocess.run(["touch", "-m", "-d", "@1000000000", p], check=True)
os.rename(p, f"{d}/touched2.bin")
print(f"touched mtime={os.stat(d + '/touched2.bin').st_mtime_ns} {sha(d + '/touched2.bin')}")

# A shared mapping of a file that a write-only handle then writes: the mapping sees the write.
p = f"{d}/mapped.bin"
with open(p, "wb") as f:
    f.write(b"a" * 8192)
fd = os.open(p, os.O_RDWR)
m = mmap.mmap(fd, 8192)
w = os.open(p, os.O_WRONLY | os.O_TRUNC)
os.write(w, b"b" * 8192)
os.close(w)
print(f"mapped sees={m[:4]!r} {sha(p)}")
m.close()
os.close(fd)

# One file written by four processes at once through write-only handles, disjoint 1 MiB blocks
# (the first creates it, the others open it as it is: a mix of direct and cached handles).
p = f"{d}/shared.bin"
os.close(os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))
pids = []
for rank in range(4):
    pid = os.fork()
    if pid == 0:
        fd = os.open(p, os.O_WRONLY)
        for i in range(rank, 16, 4):
            os.pwrite(fd, bytes([65 + i]) * (1 << 20), i << 20)
        os.fsync(fd)
        os.close(fd)
        os._exit(0)
    pids.append(pid)
for pid in pids:
    os.waitpid(pid, 0)
print(f"shared {sha(p)}")

# Holes, odd sizes and small writes through a write-only handle; then an in-place overwrite
# through a write-only handle of the existing file (which keeps the page cache).
p = f"{d}/odd.bin"
fd = os.open(p, os.O_WRONLY | os.O_CREAT, 0o644)
os.pwrite(fd, b"x" * 5, 3 << 20)
for i in range(100):
    os.write(fd, b"%d," % i)
os.pwrite(fd, b"y" * 70000, 12345)
os.close(fd)
fd = os.open(p, os.O_WRONLY)
os.pwrite(fd, b"z" * 100, 50)
os.close(fd)
print(f"odd {sha(p)}")

# Times set through a write-only handle are kept, not replaced by the write's.
p = f"{d}/stamped.bin"
fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
os.write(fd, b"s" * 100000)
os.utime(fd, ns=(1_000_000_000_000_000_000, 1_000_000_000_000_000_000))
os.close(fd)
print(f"stamped mtime={os.stat(p).st_mtime_ns} {sha(p)}")

# A time set through a write-only handle before its writes (an NFS server's create, `cp -p`
# with fdutimens before the data): the writes after it move the mtime to their own time.
p = f"{d}/stamped_first.bin"
fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
os.utime(fd, ns=(4_260_000_000_000_000_000, 4_260_000_000_000_000_000))
t0 = time.time_ns()
os.write(fd, b"w" * 3000)
os.close(fd)
recent = settles(lambda: abs(os.stat(p).st_mtime_ns - t0) < 5_000_000_000)
print(f"stamped_first mtime_is_the_write={recent} {sha(p)}")
