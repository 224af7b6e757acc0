#!/bin/bash
# A/B of cold metadata walks: the mount with and without READDIRPLUS
# (TIERSTACK_FUSE_NO_READDIRPLUS=1) over the same tree, and the plain folder, each walked cold
# (ls -lR, find -size, du) in alternation, 7 rounds. As root (drop_caches).
# Usage: docs/bench/readdirplus_ab.sh TREE.tar   (T: the tierstack binary)
set -eu
TAR=$1
T=${T:-target/release/tierstack}
W=/tmp/ts-ab; rm -rf $W; mkdir -p $W/{b1,m1,b2,m2}
$T mount $W/b1 $W/m1 --dir $W/f1 >/dev/null
TIERSTACK_FUSE_NO_READDIRPLUS=1 $T mount $W/b2 $W/m2 --dir $W/f2 >/dev/null
mkdir -p $W/plain; tar xf $TAR -C $W/plain; tar xf $TAR -C $W/m1; tar xf $TAR -C $W/m2
$T drain $W/m1 --wait --timeout 10m >/dev/null; $T drain $W/m2 --wait --timeout 10m >/dev/null
walk() { sync; echo 2 >/proc/sys/vm/drop_caches; local t0=$(date +%s.%N); (cd $1 && ls -lR >/dev/null && find . -type f -size +1k | wc -l >/dev/null && du -s . >/dev/null); echo "$(date +%s.%N) - $t0" | bc; }
for i in 1 2 3 4 5 6 7; do echo "round $i plain $(walk $W/plain) plus $(walk $W/m1) noplus $(walk $W/m2)"; done
$T umount $W/m1 >/dev/null; $T umount $W/m2 >/dev/null; rm -rf $W
