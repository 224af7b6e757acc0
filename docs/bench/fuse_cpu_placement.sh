#!/bin/bash
# Where the FUSE round trip goes (issue 18, fifth session): a Python create / stat / unlink
# loop (3,000 files of 100 bytes, one process) through a mount at its defaults, with the mount
# daemon and the loop free or pinned with taskset. Ad hoc: not a `tierstack bench` command.
set -u
T=${T:-target/release/tierstack}
cat > /tmp/meta.py <<'P'
import os, sys, time
d = sys.argv[1]; n = 3000
os.makedirs(d, exist_ok=True)
t = time.time()
for i in range(n):
    with open(f"{d}/f{i}", "wb") as f: f.write(b"x" * 100)
c = n / (time.time() - t); t = time.time()
for i in range(n): os.stat(f"{d}/f{i}")
st = n / (time.time() - t); t = time.time()
for i in range(n): os.unlink(f"{d}/f{i}")
u = n / (time.time() - t)
print(f"create {c:.0f}/s stat {st:.0f}/s unlink {u:.0f}/s")
P
run() {
  rm -rf /tmp/xb /tmp/xf; mkdir -p /tmp/xb /tmp/xm
  $1 $T mount /tmp/xb /tmp/xm --dir /tmp/xf >/dev/null
  for r in 1 2; do echo -n "daemon [$1] loop [$2]: "; $2 python3 /tmp/meta.py /tmp/xm/d$r; done
  $T umount /tmp/xm >/dev/null
}
run "" ""
run "taskset -c 1" ""
run "taskset -c 1" "taskset -c 1"
run "taskset -c 1" "taskset -c 0"
run "" "taskset -c 0"
