#!/bin/bash
# The drain of many small files (twenty-third session): a fresh mount at its defaults over a
# BACKING folder on the same disk, `tar xf TREE.tar` into it, then `tierstack drain --wait`.
# Prints: tar seconds, drain seconds after the tar ended (until `drain --wait` returned),
# regular files, files/s over the drain, and whether BACKING equals a plain `tar xf`.
# Usage: docs/bench/drain_small_s23.sh TREE.tar [WORKDIR] [EXTRA MOUNT FLAGS...]
# (T: the tierstack binary; STRACE=1: strace -c -f the daemon during the drain; PERF=1: perf
# record -g of it; LOOP=IMG: BACKING is a fresh ext4 made in the file IMG, loop-mounted)
set -eu
TAR=$1
W=${2:-/var/tmp/ts-drain-small}
shift; shift || true
T=${T:-target/release/tierstack}
now() { date +%s.%N; }
rm -rf "$W"; mkdir -p "$W/b" "$W/m" "$W/plain"
export TIERSTACK_RUN_DIR=$W/run
mkdir -p "$TIERSTACK_RUN_DIR"
if [ -n "${LOOP:-}" ]; then  # BACKING: a fresh ext4 in the image file LOOP (no aged inode tables)
  truncate -s 3G "$LOOP"; mkfs.ext4 -q -F "$LOOP"; mount -o loop "$LOOP" "$W/b"
fi
tar xf "$TAR" -C "$W/plain"
files=$(find "$W/plain" -type f | wc -l)
$T mount "$W/b" "$W/m" --dir "$W/fast" "$@" >/dev/null
sync
t0=$(now)
tar xf "$TAR" -C "$W/m"
t1=$(now)
rows=$($T status "$W/m" --json | python3 -c 'import json,sys; print(json.load(sys.stdin).get("pending_ops","?"))' 2>/dev/null || echo "?")
pid=$($T status "$W/m" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["pid"])')
cpu0=$(awk '{print $14+$15}' /proc/$pid/stat)
if [ -n "${PERF:-}" ]; then
  perf record -F 499 -g -p "$pid" -o "$W/../perf_drain.data" 2>/dev/null & pp=$!
fi
if [ -n "${SAMPLER:-}" ]; then rm -f /tmp/stop-sampler; $SAMPLER "$pid" "$W/../samples.txt" & smp=$!; fi
if [ -n "${STRACE:-}" ]; then
  strace -c -w -f -p "$pid" -o "$W/../strace_drain.txt" & sp=$!
fi
$T drain "$W/m" --wait --timeout 20m >/dev/null
t2=$(now)
if [ -n "${STRACE:-}" ]; then kill -INT $sp; wait $sp || true; fi
if [ -n "${SAMPLER:-}" ]; then touch /tmp/stop-sampler; wait $smp || true; fi
if [ -n "${PERF:-}" ]; then kill -INT $pp; wait $pp || true; fi
cpu=$(( $(awk '{print $14+$15}' /proc/$pid/stat) - cpu0 ))
$T umount "$W/m" --timeout 10m >/dev/null
same=yes
diff -r -x lost+found "$W/plain" "$W/b" >/dev/null || same=NO
meta() { (cd "$1" && find . -path ./lost+found -prune -o -type d -printf '%p d %m %T@\n' -o -printf '%p %y %m %s %T@\n' | sort); }
meta "$W/plain" >"$W/../meta_plain.txt"; meta "$W/b" >"$W/../meta_b.txt"
cmp -s "$W/../meta_plain.txt" "$W/../meta_b.txt" || same="$same,metadata_differs($(diff "$W/../meta_plain.txt" "$W/../meta_b.txt" | grep -c "^<") entries)"
[ -n "${LOOP:-}" ] && umount "$W/b"
tar_s=$(echo "$t1 - $t0" | bc); drain_s=$(echo "$t2 - $t1" | bc)
echo "tar_s=$tar_s rows_after_tar=$rows drain_s=$drain_s files=$files files_per_s=$(echo "$files / $drain_s" | bc) daemon_cpu_s=$(echo "scale=1; $cpu / $(getconf CLK_TCK)" | bc) backing_equal=$same"
rm -rf "$W"
