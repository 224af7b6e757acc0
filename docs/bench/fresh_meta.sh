#!/bin/bash
# Usage: bash docs/bench/fresh_meta.sh (root; needs mkfs.ext4 and a loop device). Issue 18, eleventh session.
# Fresh ext4 image per round (no recently deleted inodes), plain Python loop then the mount's
# (auto = io_uring with the switch on, and --transport dev), 5000 files each.
set -u
T=${TIERSTACK:-$(dirname "$0")/../../target/release/tierstack}
LOOP=$(dirname "$0")/meta_loop.py
for r in 1 2 3; do
  IMG=/var/tmp/plainfs.img; rm -f $IMG; truncate -s 8G $IMG; mkfs.ext4 -q -F $IMG; mkdir -p /mnt/plainfs; mount -o loop $IMG /mnt/plainfs
  echo "round $r plain $(python3 "$LOOP" /mnt/plainfs/m 5000)"
  for v in auto dev; do
    W=/srv/fm-$v-$r-$RANDOM; mkdir -p $W/back $W/mnt
    $T mount $W/back $W/mnt --dir $W/fast --transport $v >/dev/null
    for _ in $(seq 600); do $T status $W/mnt --json | grep -q '"conditioned":true' && break; sleep 0.1; done
    echo "round $r $v $($T status $W/mnt --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["transport"])') $(python3 "$LOOP" $W/mnt/m 5000)"
    $T umount $W/mnt >/dev/null; rm -rf $W
  done
  umount /mnt/plainfs; rm -f $IMG
done
