#!/bin/bash
# A create+unlink storm longer than the drain's 5 s delay: 40,000 files created, then removed;
# rates, then how long `drain --wait` takes. Fresh mount per run.
T=${TIERSTACK:-$(dirname "$0")/../../target/release/tierstack}
W=/srv/st-$RANDOM; mkdir -p $W/back $W/mnt
$T mount $W/back $W/mnt --dir $W/fast >/dev/null
for _ in $(seq 600); do $T status $W/mnt --json | grep -q '"conditioned":true' && break; sleep 0.1; done
python3 - $W/mnt/s <<'PY'
import os, sys, time
d=sys.argv[1]; os.makedirs(d); n=40000
t=time.time()
for i in range(n):
    fd=os.open(f"{d}/f{i}", os.O_WRONLY|os.O_CREAT|os.O_TRUNC, 0o644); os.write(fd, b"x"*100); os.close(fd)
c=n/(time.time()-t); t=time.time()
for i in range(n): os.unlink(f"{d}/f{i}")
u=n/(time.time()-t)
print(f"create {c:.0f}/s unlink {u:.0f}/s", end=" ")
PY
t0=$(date +%s.%N); $T drain $W/mnt --wait >/dev/null; t1=$(date +%s.%N)
echo "drain $(echo "$t1 - $t0" | bc) s cancelled_ops $($T status $W/mnt --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["cancelled_ops"])')"
$T umount $W/mnt >/dev/null; rm -rf $W
