#!/bin/bash
# Usage: bash docs/bench/placement.sh (root). Issue 18, twelfth session.
# Where /dev/fuse readers should run: the null server of examples/fuse_transport.rs answering
# the mount's request sequence (FUSE_TRANSPORT_LIKE_MOUNT=1), the smallio loop through it
# (5,000 files; 2,000 under load), readers free (classic), one spinning (poll), or placed
# (pinned one per CPU, SCHED_IDLE or normal priority, FT_* knobs in the example); then the
# same under three CPU-bound processes per CPU. The null server runs its caller as a child (one
# session, one autogroup); a mount's daemon runs under setsid: start the server with setsid to
# see what a mount would get (docs/BENCHMARKS.md, twelfth session).
cd "$(dirname "$0")/../.." || exit 1
cargo build --release -q -p tierstack-fs --example fuse_transport || exit 1
EX=target/release/examples/fuse_transport
mkdir -p /tmp/fx /tmp/fxref; echo hi > /tmp/fxref/f1
run() { # mode label n env...
  m=$1; l=$2; n=$3; shift 3
  echo "$l $(env FUSE_TRANSPORT_LIKE_MOUNT=1 "$@" timeout 300 $EX $m /tmp/fx 100 /tmp/fxref/f1 \
    python3 docs/bench/meta_loop.py /tmp/fx $n 2>&1 | sed -n 1p)"
}
for r in 1 2; do
  run classic classic 5000 X=1
  run poll poll 5000 X=1
  run placed "pinned SCHED_IDLE x1" 5000 X=1
  run placed "pinned normal x1" 5000 FT_IDLE=0
  run placed "pinned normal x2" 5000 FT_IDLE=0 FT_PER_CPU=2
  run placed "unpinned normal x1" 5000 FT_IDLE=0 FT_PIN=0
  run placed "pinned SCHED_IDLE x1 + 1 normal" 5000 FT_NORMAL=1
done
for c in 0 1 0 1 0 1; do taskset -c $c bash -c 'while :; do :; done' & done
for r in 1 2; do
  run classic "3 hogs/CPU: classic" 2000 X=1
  run poll "3 hogs/CPU: poll" 2000 X=1
  run placed "3 hogs/CPU: pinned SCHED_IDLE x1" 2000 X=1
  run placed "3 hogs/CPU: pinned normal x1" 2000 FT_IDLE=0
  run placed "3 hogs/CPU: pinned SCHED_IDLE x1 + 1 normal" 2000 FT_NORMAL=1
done
kill $(jobs -p) 2>/dev/null
