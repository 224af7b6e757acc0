#!/usr/bin/env python3
"""A fixed sequence of POSIX file-system operations, run in the folder given as argv[1].

Prints one JSON object: {"ops": [[name, result], ...], "tree": {path: entry}};
`posix_ops.py --tree DIR` prints only the tree of DIR. A result is
["ok", value] or ["err", "ERRNO"]; after most operations the lstat summary of the paths it
touched is recorded as its own entry, so that modes, owners, sizes, link counts and the times
set explicitly are compared too. Run it as root: the part of the sequence that needs an
unprivileged user runs in a child that takes uid/gid 1000 (argv[2], argv[3] change them).

The same script runs in a plain ext4 folder (the reference) and in a tierstack mount; the test
compares the two outputs, then the backing tree after `umount` with the reference tree.
"""
import ctypes
import errno
import json
import os
import socket
import stat
import sys

TREE_ONLY = len(sys.argv) > 2 and sys.argv[1] == "--tree"
UID = int(sys.argv[2]) if len(sys.argv) > 2 and not TREE_ONLY else 1000
GID = int(sys.argv[3]) if len(sys.argv) > 3 and not TREE_ONLY else 1000
OPS = []
LIBC = ctypes.CDLL(None, use_errno=True)
AT_FDCWD = -100
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2


def ename(e):
    return errno.errorcode.get(e, str(e))


def summary(p):
    """The lstat of a path, as the test compares it."""
    try:
        s = os.lstat(p)
    except OSError as e:
        return ["err", ename(e.errno)]
    kind = stat.S_IFMT(s.st_mode)
    out = {"type": oct(kind), "mode": oct(stat.S_IMODE(s.st_mode)), "uid": s.st_uid, "gid": s.st_gid,
           "nlink": s.st_nlink}
    if stat.S_ISREG(kind) or stat.S_ISLNK(kind):
        out["size"] = s.st_size
    if stat.S_ISCHR(kind) or stat.S_ISBLK(kind):
        out["rdev"] = s.st_rdev
    # Times are compared only where the sequence set them to fixed values (below 2^31).
    if s.st_mtime < 1_000_000_000:
        out["mtime"] = s.st_mtime_ns
    if s.st_atime < 1_000_000_000:
        out["atime"] = s.st_atime_ns
    return out


def op(name, fn, *paths):
    try:
        r = fn()
        if not isinstance(r, (int, str, bool, type(None))):
            r = None
        res = ["ok", r]
    except OSError as e:
        res = ["err", ename(e.errno)]
    OPS.append([name, res])
    for p in paths:
        OPS.append([name + " -> lstat " + p, summary(p)])
    return res


def write(p, data, flags=os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode=0o644):
    fd = os.open(p, flags, mode)
    try:
        return os.write(fd, data)
    finally:
        os.close(fd)


def read(p):
    with open(p, "rb") as f:
        return f.read().hex()


def renameat2(a, b, flags):
    r = LIBC.renameat2(AT_FDCWD, a.encode(), AT_FDCWD, b.encode(), flags)
    if r != 0:
        raise OSError(ctypes.get_errno(), "renameat2")
    return 0


def truncate_open(p, n):
    fd = os.open(p, os.O_WRONLY)
    try:
        os.ftruncate(fd, n)
    finally:
        os.close(fd)


def root_part():
    # Directories.
    op("mkdir d", lambda: os.mkdir("d", 0o755), "d")
    op("mkdir d again", lambda: os.mkdir("d"), "d")
    op("mkdir d/e", lambda: os.mkdir("d/e", 0o700), "d", "d/e")
    op("mkdir missing/x", lambda: os.mkdir("missing/x"))
    op("rmdir d (not empty)", lambda: os.rmdir("d"))
    op("rmdir .", lambda: os.rmdir("."))
    op("rmdir d/e/..", lambda: os.rmdir("d/e/.."))
    op("mkdir mode 2775", lambda: os.mkdir("sg", 0o2775), "sg")
    op("mkdir sg/in (inherits set-GID)", lambda: os.mkdir("sg/in", 0o755), "sg/in")
    # Files.
    op("create f", lambda: write("f", b"hello"), "f")
    op("create f O_EXCL", lambda: write("f", b"x", os.O_WRONLY | os.O_CREAT | os.O_EXCL))
    op("open d for writing", lambda: os.open("d", os.O_WRONLY))
    op("open missing", lambda: os.open("nope", os.O_RDONLY))
    op("open f/ (trailing slash)", lambda: os.open("f/", os.O_RDONLY))
    op("mkdir f/x (under a file)", lambda: os.mkdir("f/x"))
    op("read f", lambda: read("f"))
    op("append f", lambda: write("f", b" world", os.O_WRONLY | os.O_APPEND), "f")
    op("read f after append", lambda: read("f"))
    op("truncate f to 3", lambda: os.truncate("f", 3), "f")
    op("truncate f to 10 (grow)", lambda: os.truncate("f", 10), "f")
    op("read grown f", lambda: read("f"))
    op("ftruncate f to 2", lambda: truncate_open("f", 2), "f")
    op("pwrite past the end", lambda: (lambda fd: (os.pwrite(fd, b"Z", 100), os.close(fd))[0])(os.open("f", os.O_WRONLY)), "f")
    op("unlink d (a directory)", lambda: os.unlink("d"))
    op("unlink missing", lambda: os.unlink("nope"))
    op("rmdir f (a file)", lambda: os.rmdir("f"))
    # Names.
    op("create 255-byte name", lambda: write("n" * 255, b"1"), "n" * 255)
    op("create 256-byte name", lambda: write("n" * 256, b"1"))
    op("mkdir 256-byte name", lambda: os.mkdir("m" * 256))
    op("stat 256-byte name", lambda: os.stat("m" * 256) and None)
    op("unlink 256-byte name", lambda: os.unlink("m" * 256))
    # Symlinks.
    op("symlink s -> f", lambda: os.symlink("f", "s"), "s")
    op("symlink s again", lambda: os.symlink("g", "s"))
    op("readlink s", lambda: os.readlink("s"))
    op("readlink f (not a link)", lambda: os.readlink("f"))
    op("symlink loop a -> b", lambda: os.symlink("b", "la"), "la")
    op("symlink loop b -> a", lambda: os.symlink("la", "b"), "b")
    op("open through a loop", lambda: os.open("la", os.O_RDONLY))
    op("dangling symlink", lambda: os.symlink("nowhere", "dang"), "dang")
    op("open a dangling link", lambda: os.open("dang", os.O_RDONLY))
    op("create through a dangling link", lambda: write("dang", b"made"), "dang", "nowhere")
    op("lchown a symlink", lambda: os.lchown("s", 5, 6), "s", "f")
    # Hard links.
    op("link f g", lambda: os.link("f", "g"), "f", "g")
    op("link f g again", lambda: os.link("f", "g"))
    op("link d (a directory)", lambda: os.link("d", "dl"))
    op("link missing", lambda: os.link("nope", "x"))
    op("write through g", lambda: write("g", b"via g", os.O_WRONLY), "f", "g")
    op("read f after writing g", lambda: read("f"))
    op("unlink g", lambda: os.unlink("g"), "f", "g")
    # Renames.
    op("mkdir r1, r2", lambda: (os.mkdir("r1"), os.mkdir("r2"), write("r2/x", b"x")) and None, "r1", "r2")
    op("rename f over dir r1", lambda: os.rename("f", "r1"))
    op("rename dir r1 over file f", lambda: os.rename("r1", "f"))
    op("rename r1 over non-empty r2", lambda: os.rename("r1", "r2"))
    op("rename r2 into its own subtree", lambda: os.rename("r2", "r2/sub"))
    op("rename r1 over empty dir r3", lambda: (os.mkdir("r3"), os.rename("r1", "r3"))[1], "r1", "r3")
    op("rename missing", lambda: os.rename("nope", "x"))
    op("rename f to itself", lambda: os.rename("f", "f"), "f")
    op("rename f to h", lambda: os.rename("f", "h"), "f", "h")
    op("write o", lambda: write("o", b"other"), "o")
    op("rename h over o", lambda: os.rename("h", "o"), "h", "o")
    op("read o", lambda: read("o"))
    op("renameat2 NOREPLACE onto existing", lambda: renameat2("s", "o", RENAME_NOREPLACE))
    op("renameat2 NOREPLACE to new", lambda: renameat2("s", "s2", RENAME_NOREPLACE), "s", "s2")
    op("rename r2 to r2/.. ", lambda: os.rename("r2", "r2/.."))
    op("rename a dir deep", lambda: (os.makedirs("t1/t2/t3"), os.rename("t1/t2", "t2moved"))[1], "t2moved", "t2moved/t3")
    # Modes, owners, times.
    op("chmod o 4755", lambda: os.chmod("o", 0o4755), "o")
    op("chmod o 2644", lambda: os.chmod("o", 0o2644), "o")
    op("chmod d 1777", lambda: os.chmod("d", 0o1777), "d")
    op("chown o 1000:1000", lambda: os.chown("o", 1000, 1000), "o")
    op("chmod o 6755", lambda: os.chmod("o", 0o6755), "o")
    op("chown o -1:1000 (root keeps set-ID?)", lambda: os.chown("o", -1, 1000), "o")
    op("utime o to fixed", lambda: os.utime("o", ns=(111_000_000_123, 222_000_000_456)), "o")
    op("utime d to fixed", lambda: os.utime("d", ns=(333_000_000_000, 444_000_000_000)), "d")
    op("utime symlink s2 (no follow)", lambda: os.utime("s2", ns=(5_000_000_000, 6_000_000_000), follow_symlinks=False), "s2")
    op("utime missing", lambda: os.utime("nope", ns=(1, 1)))
    # Special files.
    op("mkfifo p 0640", lambda: os.mkfifo("p", 0o640), "p")
    op("mkfifo p again", lambda: os.mkfifo("p"))
    op("mknod char 1:3", lambda: os.mknod("cdev", 0o600 | stat.S_IFCHR, os.makedev(1, 3)), "cdev")
    op("mknod block 7:99", lambda: os.mknod("bdev", 0o600 | stat.S_IFBLK, os.makedev(7, 99)), "bdev")

    def mksock():
        s = socket.socket(socket.AF_UNIX)
        try:
            s.bind("sock")
        finally:
            s.close()
    op("bind a socket", mksock, "sock")
    op("chmod p 0600", lambda: os.chmod("p", 0o600), "p")
    op("unlink cdev", lambda: os.unlink("cdev"), "cdev")
    # A shared tree for the unprivileged part.
    op("mkdir pub 0777", lambda: (os.mkdir("pub"), os.chmod("pub", 0o777))[1], "pub")
    op("mkdir sticky 1777", lambda: (os.mkdir("sticky"), os.chmod("sticky", 0o1777))[1], "sticky")
    op("root file in sticky", lambda: (write("sticky/rootf", b"r"), os.chmod("sticky/rootf", 0o666))[1], "sticky/rootf")
    op("root file in pub", lambda: (write("pub/rootf", b"r"), os.chmod("pub/rootf", 0o666))[1], "pub/rootf")
    op("mkdir closed 0755", lambda: os.mkdir("closed", 0o755), "closed")
    op("root file 0644", lambda: write("ro", b"read only"), "ro")
    op("mkdir groupdir 2777 gid 1000", lambda: (os.mkdir("gd"), os.chown("gd", 0, 1000), os.chmod("gd", 0o2777))[2], "gd")
    op("mkdir other-group dir", lambda: (os.mkdir("og"), os.chown("og", UID, 4242), os.chmod("og", 0o777))[2], "og")


def user_part():
    # As an unprivileged user, in a child process.
    op("user: create in a 0755 root dir", lambda: write("closed/u", b"u"))
    op("user: create in pub", lambda: write("pub/u", b"u", mode=0o644), "pub/u")
    op("user: write a root 0644 file", lambda: write("ro", b"x", os.O_WRONLY))
    op("user: truncate a root 0644 file", lambda: os.truncate("ro", 0))
    op("user: chmod a root file", lambda: os.chmod("ro", 0o777))
    op("user: chown own file to root", lambda: os.chown("pub/u", 0, -1))
    op("user: chgrp own file to a foreign group", lambda: os.chown("pub/u", -1, 4242))
    op("user: chown own file to itself", lambda: os.chown("pub/u", UID, GID), "pub/u")
    op("user: chmod own file 4755", lambda: os.chmod("pub/u", 0o4755), "pub/u")
    op("user: write own set-UID file (clears it)", lambda: write("pub/u", b"more", os.O_WRONLY | os.O_APPEND), "pub/u")
    op("user: chmod own file 6755", lambda: os.chmod("pub/u", 0o6755), "pub/u")
    op("user: truncate own set-ID file", lambda: os.truncate("pub/u", 1), "pub/u")
    op("user: chmod own file 2755 (own group)", lambda: os.chmod("pub/u", 0o2755), "pub/u")
    op("user: file in a foreign-group dir", lambda: write("og/u", b"u"), "og/u")
    op("user: chmod g+s with a foreign group", lambda: (os.chown("og/u", UID, GID), os.chmod("og/u", 0o2755))[1], "og/u")
    op("user: create in the set-GID dir", lambda: write("gd/u", b"u"), "gd/u")
    op("user: mkdir in the set-GID dir", lambda: os.mkdir("gd/ud", 0o755), "gd/ud")
    op("user: unlink root file in sticky", lambda: os.unlink("sticky/rootf"))
    op("user: rename root file in sticky", lambda: os.rename("sticky/rootf", "sticky/mine"))
    op("user: own file in sticky", lambda: write("sticky/uf", b"u"), "sticky/uf")
    op("user: rename own file in sticky", lambda: os.rename("sticky/uf", "sticky/uf2"), "sticky/uf2")
    op("user: unlink own file in sticky", lambda: os.unlink("sticky/uf2"), "sticky/uf2")
    op("user: unlink root file in pub (not sticky)", lambda: os.unlink("pub/rootf"), "pub/rootf")
    op("user: utime now on a root 0666 file", lambda: (write("pub/w", b"w"), os.chmod("pub/w", 0o666)) and None)
    op("user: utime fixed on own file", lambda: os.utime("pub/u", ns=(7_000_000_000, 8_000_000_000)), "pub/u")
    op("user: utime fixed on a root file", lambda: os.utime("ro", ns=(1, 1)))
    op("user: utime now on a root 0644 file", lambda: os.utime("ro"))
    op("user: mknod a char device", lambda: os.mknod("pub/c", 0o600 | stat.S_IFCHR, os.makedev(1, 3)))
    op("user: mkfifo in pub", lambda: os.mkfifo("pub/fifo", 0o644), "pub/fifo")
    op("user: link a root file (protected_hardlinks)", lambda: os.link("ro", "pub/rolink"))
    op("user: rmdir closed", lambda: os.rmdir("closed"))
    op("user: listdir closed", lambda: len(os.listdir("closed")))


def run_as_user():
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            os.setgroups([])
            os.setgid(GID)
            os.setuid(UID)
            user_part()
            data = json.dumps(OPS).encode()
        except BaseException as e:  # noqa: BLE001 - report anything to the parent
            data = json.dumps([["user part crashed", ["err", repr(e)]]]).encode()
        with os.fdopen(w, "wb") as f:
            f.write(data)
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    OPS[:] = json.loads(data)


def tree(root):
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            rel = os.path.relpath(p, root)
            e = summary(p)
            if isinstance(e, dict) and e["type"] == oct(stat.S_IFREG):
                with open(p, "rb") as f:
                    e["data"] = f.read().hex()
            if isinstance(e, dict):
                # Directory link counts and access times of the walk are not the drain's.
                if e["type"] == oct(stat.S_IFDIR):
                    e.pop("nlink", None)
                e.pop("atime", None)
            out[rel] = e
    return out


if __name__ == "__main__":
    if TREE_ONLY:
        print(json.dumps(tree(sys.argv[2]), sort_keys=True))
        sys.exit(0)
    os.chdir(sys.argv[1])
    os.umask(0o022)
    root_part()
    run_as_user()
    print(json.dumps({"ops": OPS, "tree": tree(".")}, sort_keys=True))
