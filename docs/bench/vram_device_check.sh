#!/bin/bash
# The VRAM tier's check on a lent GPU machine, as one call (seventeenth session: about 190 s
# of a 15-minute device budget, the machine's start included): the tier's tests (store and
# CLI), bench vram, and the user-facing pairs with and without --vram. Prepare on the dev VM:
#   cargo build --release
#   cargo test --release -p tierstack-store --test vram --no-run   (and -p tierstack-cli --test cli_vram)
#   mkdir .devbin; strip -o .devbin/NAME each of target/release/tierstack,
#   target/release/libtierstack_preload.so and the two test binaries (target/release/deps/vram-*,
#   cli_vram-*); copy this script there; echo /.devbin/ >> .git/info/exclude
# then run `bash .devbin/vram_device_check.sh` with carry [".devbin"]. The test binaries'
# names carry cargo's hash: adjust the two lines below. Results land in $OUT.
set -u
R=$PWD
mkdir -p /work/main/target/release
cp .devbin/tierstack .devbin/libtierstack_preload.so /work/main/target/release/
T=/work/main/target/release/tierstack
export TIERSTACK_SYSCONFDIR=/nonexistent XDG_CONFIG_HOME=/nonexistent
( nvidia-smi -L; uname -r; nproc; free -g; df -h /tmp; ls -la /dev/fuse; cat /sys/module/fuse/parameters/enable_uring 2>&1 ) > $OUT/machine.txt 2>&1
$T doctor > $OUT/doctor.txt 2>&1
cd /work/main
timeout 120 $R/.devbin/vram-3d2af695e2cbdf4b --test-threads 1 > $OUT/store_vram.txt 2>&1; echo "store vram rc=$?"
timeout 120 $R/.devbin/cli_vram-816c51ceebeb9d81 --test-threads 1 --nocapture > $OUT/cli_vram.txt 2>&1; echo "cli vram rc=$?"
grep 'test result' $OUT/store_vram.txt $OUT/cli_vram.txt
{
timeout 90 $T bench vram --threads 1
timeout 90 $T bench vram --threads 4

cat > /tmp/np.py <<'P'
import numpy as np, time
t=time.time()
a=np.arange(384*1024*1024, dtype=np.float64)
s=a.sum(); a*=2; s2=a.sum()
print("numpy 3 GiB:", "ok" if s2==2*s else "BAD", round(time.time()-t,2), "s")
P
for i in 1 2; do for v in "" "--vram 8G"; do echo "== run $v"; timeout 120 $T run --dram 512M --stats $v -- python3 /tmp/np.py; done; done
for v in "" "--vram 8G"; do echo "== bench mem $v"
  timeout 120 $T bench mem --compare --no-zswap --repeat 1 --dir /tmp --map 4G --dram 1G --threads 1 \
    --read-ratio 0.5 --seconds 10 --pattern uniform $v
done
mkdir -p /tmp/bk
for v in "" "--vram 8G"; do echo "== checkpoint $v"
  timeout 120 $T bench checkpoint --procs 8 --file-size 512M --backing /tmp/bk --dir /tmp --dram 512M $v --repeat 1
done
} > $OUT/bench.txt 2>&1
cat $OUT/bench.txt | tail -80
