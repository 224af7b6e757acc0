#!/usr/bin/env bash
# Repeated lookups of missing names (an interpreter's module search, a build's header search):
# 5,000 os.stat of names that do not exist, twice, in a plain folder and through a tierstack
# mount at its defaults over a folder on the same disk. Needs root and python3.
# Usage: negative_lookup.sh [WORKDIR]
set -euo pipefail
T=${TIERSTACK:-$(dirname "$0")/../../target/release/tierstack}
W=${1:-/tmp/ts-neglookup}
rm -rf "$W"; mkdir -p "$W/plain" "$W/back" "$W/mnt"
probe() { # DIR: "first second" rates of missing-name stats per second
  python3 - "$1" <<'PY'
import os, sys, time
d = sys.argv[1] + "/m"; os.makedirs(d, exist_ok=True); n = 5000; out = []
for r in range(2):
    t = time.time()
    for i in range(n):
        try: os.stat(f"{d}/missing{i}.py")
        except FileNotFoundError: pass
    out.append(n / (time.time() - t))
print(f"{out[0]:.0f} {out[1]:.0f}")
PY
}
read -r p1 p2 < <(probe "$W/plain")
"$T" mount "$W/back" "$W/mnt" --dir "$W/fast" >/dev/null
read -r m1 m2 < <(probe "$W/mnt")
"$T" umount "$W/mnt" >/dev/null
printf "%-32s %12s %12s %7s\n" "stat of a missing name (/s)" plain mount ratio
awk -v a="$p1" -v b="$m1" 'BEGIN{printf "%-32s %12s %12s %7.2f\n", "first round", a, b, b/a}'
awk -v a="$p2" -v b="$m2" 'BEGIN{printf "%-32s %12s %12s %7.2f\n", "second round (same names)", a, b, b/a}'
rm -rf "$W"
