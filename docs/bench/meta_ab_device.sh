#!/bin/bash
# bench meta A/B on a lent device machine: two builds' stripped binaries carried in .dev/
# (.dev/tierstack.base: the build before, .dev/tierstack: the build after, with the client
# libraries of the build after), 1 and 4 processes, three rounds alternated. Raw JSON under
# $OUT/raw. Thirty-second session: written for the final A/B of the journal queue, not run
# (no device machine was lent for it).
set -u
B=/work/main/target/release
mkdir -p "$B" /tmp/base && cp .dev/libtierstack_preload.so .dev/libtierstack_io.so .dev/tierstack "$B"/
cp .dev/tierstack.base /tmp/base/tierstack && cp .dev/libtierstack_io.so .dev/libtierstack_preload.so /tmp/base/
mkdir -p "$OUT/raw"
for r in 1 2 3; do for b in /tmp/base/tierstack $B/tierstack; do for p in 1 4; do
  rm -rf /tmp/meta_ab; mkdir -p /tmp/meta_ab
  n=$(basename "$(dirname "$b")")
  f="$OUT/raw/meta_${n}_p${p}_r${r}.json"
  timeout 100 "$b" bench meta --target /tmp/meta_ab --mount --client --procs $p --json 2>/dev/null > "$f"
  python3 -c "import json; j=json.load(open('$f')); print('$n p=$p plain/fuse/client k/s', [[round(r[k]/1000,1) for k in ('create_per_s','stat_per_s','read_per_s','unlink_per_s')] for r in j['results']], 'client', [round(x,2) for x in j['client_ratios']])"
done; done; done
