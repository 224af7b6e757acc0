#!/bin/bash
# Issue 39 figures of the twenty-second session (docs/BENCHMARKS.md "Issue 39: the interception
# client, twenty-second session"), at the mount's defaults, from the repository's root.
# bench meta: 3 runs of 1 process, 2 of 4 processes; bench workloads: the client, then FUSE
# alone (the `a` client run was taken an hour earlier, before the kernel_refs and journal-row
# changes, with the same command).
set -e
T=${T:-tierstack}
mkdir -p /var/tmp/bm
for i in 1 2 3; do
  $T bench meta --target /var/tmp/bm --mount --client --dir /var/tmp/bm --json > docs/bench/meta_client_s22_meta1_$i.json
done
for i in 1 2; do
  $T bench meta --target /var/tmp/bm --mount --client --dir /var/tmp/bm --procs 4 --json > docs/bench/meta_client_s22_meta4_$i.json
done
$T bench workloads --dir /var/tmp/wl22c --only tree,pip --client --json > docs/bench/workloads_s22_client_b.json
$T bench workloads --dir /var/tmp/wl22f --only tree,pip --json > docs/bench/workloads_s22_fuse.json
