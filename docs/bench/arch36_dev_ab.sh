#!/bin/bash
# A/B of bench meta and bench io at the mount's defaults: fuser's request loop (before,
# f2d3fa4) against the mount's own /dev/fuse readers decoding with ops/wire.rs (after).
# Usage: docs/bench/arch36_dev_ab.sh BEFORE_BINARY AFTER_BINARY OUT_DIR [ROUNDS]
B=$1; A=$2; O=$3; R=${4:-3}
mkdir -p "$O"; W=$(mktemp -d /var/tmp/ab.XXXX)
for r in $(seq 1 "$R"); do
  for v in before after; do
    T=$B; [ $v = after ] && T=$A
    rm -rf $W/t $W/bio; mkdir -p $W/t $W/bio
    $T bench meta --target $W/t --files 5000 --mount --dir $W --json > $O/meta_${v}_$r.json 2>$O/meta_${v}_$r.err
    rm -rf $W/t $W/bio; mkdir -p $W/t $W/bio
    $T bench io --ranks 4 --block 1M --size-per-rank 128M --fsync --reps 3 --target $W/bio --mount --dir $W --json > $O/io_${v}_$r.json 2>$O/io_${v}_$r.err
    echo "round $r $v done $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)" >> $O/progress
  done
done
rm -rf "$W"
