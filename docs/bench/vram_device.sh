#!/bin/bash
# The VRAM tier's checks on a lent GPU machine, as one bounded script: the tier's tests on the
# GPU, then docs/bench/vram_h100.sh's figures (each pair the same command with and without
# --vram), most important first, each under its own time limit. Stripped release binaries
# travel in .dev/ (tierstack, libtierstack_preload.so, libtierstack_io.so, t_vram = the
# tierstack-store test binary tests/vram.rs, t_cli_vram = tierstack-cli's tests/cli_vram.rs);
# output goes to $OUT (or /tmp/vram_out).
set -u
OUT=${OUT:-/tmp/vram_out}
mkdir -p "$OUT"
# The CLI tests run the binary at the path cargo baked in (this repository's target/release).
B=/work/main/target/release
mkdir -p "$B" && cp .dev/tierstack .dev/libtierstack_preload.so .dev/libtierstack_io.so "$B"/
T=$B/tierstack
log() { echo "== $*" | tee -a "$OUT/run.txt"; }
step() { local lim=$1; shift; log "$*"; timeout "$lim" "$@" 2>&1 | tee -a "$OUT/run.txt"; echo "rc=${PIPESTATUS[0]}" | tee -a "$OUT/run.txt"; }
{ uname -r; nproc; free -g | head -2; nvidia-smi -L; df -h /tmp | tail -1; } 2>&1 | tee "$OUT/machine.txt"
$T doctor > "$OUT/doctor.txt" 2>&1
grep -E "gpu|userfaultfd|fuse_device" "$OUT/doctor.txt"
step 120 .dev/t_vram --test-threads 2
step 120 .dev/t_cli_vram --test-threads 1
cat > /tmp/np.py <<'P'
import numpy as np, time
t=time.time()
a=np.arange(384*1024*1024, dtype=np.float64)
s=a.sum(); a*=2; s2=a.sum()
print("numpy 3 GiB:", "ok" if s2==2*s else "BAD", round(time.time()-t,2), "s")
P
for v in "" "--vram 8G"; do step 90 $T run --dram 512M --stats $v -- python3 /tmp/np.py; done
step 90 $T bench vram --threads 1
for fill in random one-word; do for v in "" "--vram 8G"; do
  step 100 $T bench mem --compare --no-zswap --json --dir /tmp --map 4G --dram 1G --threads 1 \
    --read-ratio 0.5 --seconds 10 --pattern uniform --fill $fill $v
done; done
mkdir -p /tmp/bk
for v in "" "--vram 8G"; do
  rm -rf /tmp/bk/*
  step 90 $T bench checkpoint --procs 8 --file-size 512M --backing /tmp/bk --dir /tmp --dram 512M $v
done
log done
