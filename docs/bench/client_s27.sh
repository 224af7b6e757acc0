#!/bin/bash
# Issue 39 figures of the twenty-seventh session (docs/BENCHMARKS.md "Issue 39: the channel
# and the drain under many small files, twenty-seventh session"), at the mount's defaults,
# from the repository's root, nothing else running. bench meta: 2 runs of 1 process, 2 of 4
# processes, with FUSE and the client; bench workloads: tree and pip under the client.
set -e
T=${T:-tierstack}
mkdir -p /var/tmp/bm
for i in 1 2; do
  $T bench meta --target /var/tmp/bm --mount --client --dir /var/tmp/bm --json > docs/bench/meta_client_s27_meta1_$i.json
done
for i in 1 2; do
  $T bench meta --target /var/tmp/bm --mount --client --dir /var/tmp/bm --procs 4 --json > docs/bench/meta_client_s27_meta4_$i.json
done
rm -rf /var/tmp/wl27c
$T bench workloads --dir /var/tmp/wl27c --only tree,pip --client --json > docs/bench/workloads_s27_client.json
rm -rf /var/tmp/wl27c
