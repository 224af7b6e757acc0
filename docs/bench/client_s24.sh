#!/bin/bash
# Issue 39 figures of the twenty-fourth session (docs/BENCHMARKS.md "Issue 39: the client keeps
# stat answers, twenty-fourth session"), at the mount's defaults, from the repository's root,
# nothing else running. bench meta: 2 runs of 1 process, 2 of 4 processes; bench workloads:
# tree and pip under the client (FUSE alone is unchanged by this session's work).
set -e
T=${T:-tierstack}
mkdir -p /var/tmp/bm
for i in 1 2; do
  $T bench meta --target /var/tmp/bm --mount --client --dir /var/tmp/bm --json > docs/bench/meta_client_s24_meta1_$i.json
done
for i in 1 2; do
  $T bench meta --target /var/tmp/bm --mount --client --dir /var/tmp/bm --procs 4 --json > docs/bench/meta_client_s24_meta4_$i.json
done
rm -rf /var/tmp/wl24c
$T bench workloads --dir /var/tmp/wl24c --only tree,pip --client --json > docs/bench/workloads_s24_client.json
