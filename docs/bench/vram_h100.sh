#!/bin/bash
# The VRAM tier's figures in docs/BENCHMARKS.md ("The VRAM tier"), as run on a machine with
# an NVIDIA GPU (an H100 here). Needs the release build: T points at the tierstack binary
# (libtierstack_preload.so beside it). Each pair is the same command with and without --vram.
set -u
T=${T:-target/release/tierstack}
$T doctor | grep gpu
$T bench vram --threads 1
# A 3 GiB numpy stream (write, read, scale, read) under a 512 MiB budget.
cat > /tmp/np.py <<'P'
import numpy as np, time
t=time.time()
a=np.arange(384*1024*1024, dtype=np.float64)
s=a.sum(); a*=2; s2=a.sum()
print("numpy 3 GiB:", "ok" if s2==2*s else "BAD", round(time.time()-t,2), "s")
P
for v in "" "--vram 8G"; do $T run --dram 512M --stats $v -- python3 /tmp/np.py; done
# Uniform page access, 4 GiB over a 1 GiB budget, against kernel swap on the same disk.
for v in "" "--vram 8G"; do
  $T bench mem --compare --no-zswap --repeat 2 --dir /tmp --map 4G --dram 1G --threads 1 \
    --read-ratio 0.5 --seconds 10 --pattern uniform $v
done
# Seed 004's checkpoint: 8 writers x 512 MiB, mount with a 512 MiB DRAM tier.
mkdir -p /tmp/bk
for v in "" "--vram 8G"; do
  $T bench checkpoint --procs 8 --file-size 512M --backing /tmp/bk --dir /tmp --dram 512M $v --repeat 2
done
