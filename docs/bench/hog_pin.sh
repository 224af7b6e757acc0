#!/bin/bash
# Usage: bash docs/bench/hog_pin.sh (root). Issue 18, eleventh session.
# meta loop (5000 files) through a fresh mount per transport: pinned caller, and unpinned under 3 CPU-bound processes per CPU
T=${TIERSTACK:-$(dirname "$0")/../../target/release/tierstack}
LOOP=$(dirname "$0")/meta_loop.py
one() { # transport label prefix...
  v=$1; shift; W=/srv/hp-$v-$RANDOM; mkdir -p $W/back $W/mnt
  $T mount $W/back $W/mnt --dir $W/fast --transport $v >/dev/null
  for _ in $(seq 600); do $T status $W/mnt --json | grep -q '"conditioned":true' && break; sleep 0.1; done
  echo "$LABEL $v $("$@" python3 "$LOOP" $W/mnt/m 5000)"
  $T umount $W/mnt >/dev/null; rm -rf $W
}
for r in 1 2; do LABEL="pinned(taskset -c 1)"; one auto taskset -c 1; one dev taskset -c 1; done
for c in 0 1 0 1 0 1; do taskset -c $c bash -c 'while :; do :; done' & done
for r in 1 2; do LABEL="3-hogs-per-cpu"; one auto env; one dev env; done
kill $(jobs -p) 2>/dev/null
