#!/usr/bin/env bash
# Small I/O through a tierstack mount at its defaults vs a plain folder on the same disk
# (issue 18's workloads): fio 4 KiB random writes (2 jobs x 128 MiB, without and with an
# fsync every 64 writes) and 5,000 x (create + 100-byte write + close), stat, unlink from one
# Python process. Needs root, fio and python3. Usage: smallio.sh [WORKDIR]
# FAST=DIR puts the mount's fast tier elsewhere (e.g. WORKDIR on a slow file system, FAST on
# the local disk: the mount then fronts a slow backing, the plain folder is that slow one).
# MOUNT_ARGS="..." adds flags to `tierstack mount` (e.g. --transport dev); they are printed.
set -euo pipefail
T=${TIERSTACK:-$(dirname "$0")/../../target/release/tierstack}
W=${1:-/tmp/ts-smallio}
rm -rf "$W"; mkdir -p "$W/plain" "$W/back" "$W/mnt"
fio4k() { # DIR [EXTRA]
  fio --name=rw --directory="$1" --rw=randwrite --bs=4k --size=128M --numjobs=2 \
      --ioengine=psync --group_reporting ${2:-} --output-format=terse --terse-version=3 \
    | awk -F';' '{printf "%.1f", $48/1024}'
  rm -f "$1"/rw.*
}
meta() { # DIR: the Python loop of meta_loop.py, 5,000 files
  python3 "$(dirname "$0")/meta_loop.py" "$1" 5000
}
fsync64() { # DIR: p50 of fsync after a 64 KiB write (ms), 200 of them
  python3 - "$1" <<'PY'
import os, sys, time
fd = os.open(sys.argv[1] + "/fsync.bin", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
buf = os.urandom(65536); lat = []
for i in range(200):
    os.pwrite(fd, buf, (i % 64) * 65536)
    t = time.perf_counter(); os.fsync(fd); lat.append(time.perf_counter() - t)
os.close(fd); os.unlink(sys.argv[1] + "/fsync.bin")
print(f"{sorted(lat)[100] * 1e3:.3f}")
PY
}
# The metadata loop runs first on each side: this disk's ext4 is mounted with `discard`, and
# for some seconds after fio's files are deleted its creates run at a tenth of their rate.
read -r pc ps pu < <(meta "$W/plain/m"); p1=$(fio4k "$W/plain"); p2=$(fio4k "$W/plain" --fsync=64); pf=$(fsync64 "$W/plain")
F=${FAST:-$W/fast}
"$T" mount "$W/back" "$W/mnt" --dir "$F" ${MOUNT_ARGS:-} >/dev/null
echo "mount flags: ${MOUNT_ARGS:-(defaults)}; transport: $("$T" status "$W/mnt" --json | python3 -c 'import json,sys; print(json.load(sys.stdin).get("transport","?"))')"
# A new mount conditions its fast tier's drives while idle (a few seconds): wait, so that it
# does not share the disk with the measurements.
for _ in $(seq 600); do
  "$T" status "$W/mnt" --json | grep -q '"conditioned":true' && break
  sleep 0.1
done
read -r mc ms mu < <(meta "$W/mnt/m"); m1=$(fio4k "$W/mnt"); m2=$(fio4k "$W/mnt" --fsync=64); mf=$(fsync64 "$W/mnt")
"$T" umount "$W/mnt" >/dev/null
printf "%-40s %12s %12s %7s\n" workload plain mount ratio
r() { awk -v a="$2" -v b="$3" -v n="$1" 'BEGIN{printf "%-40s %12s %12s %7.2f\n", n, a, b, b/a}'; }
r "fio 4K randwrite 2 jobs (MiB/s)" "$p1" "$m1"
r "fio 4K randwrite, fsync/64 (MiB/s)" "$p2" "$m2"
r "create+100B write+close (/s)" "$pc" "$mc"
r "stat (/s)" "$ps" "$ms"
r "unlink (/s)" "$pu" "$mu"
r "fsync of a 64 KiB write, p50 (ms)" "$pf" "$mf"
rm -rf "$W"; [ -z "${FAST:-}" ] || rm -rf "$FAST"
