#!/bin/bash
# A/B of bench meta and bench io at the defaults: before issue 36 (5d7f56b) and now.
B=/work/before-target/release/tierstack
A=/work/main/target/release/tierstack.ab
cp /work/main/target/release/tierstack $A
for r in 1 2 3; do
  for v in before after; do
    T=$B; [ $v = after ] && T=$A
    rm -rf /work/pg/t /work/pg/bio; mkdir -p /work/pg/t /work/pg/bio
    $T bench meta --target /work/pg/t --files 5000 --mount --dir /work/pg --json > /work/pg/meta_${v}_$r.json 2>/work/pg/meta_${v}_$r.err
    rm -rf /work/pg/t /work/pg/bio; mkdir -p /work/pg/t /work/pg/bio
    $T bench io --ranks 4 --block 1M --size-per-rank 128M --fsync --reps 3 --target /work/pg/bio --mount --dir /work/pg --json > /work/pg/io_${v}_$r.json 2>/work/pg/io_${v}_$r.err
    echo "round $r $v done $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)" >> /work/pg/progress
  done
done
