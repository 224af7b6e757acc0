#!/bin/bash
# Issue 39, the interception client against FUSE and a plain folder on the same disk, one
# mount at its defaults: (1) stat of one file in a loop (docs/bench/stat_loop.c), (2) `bench
# meta --mount --client` at 1 and 4 processes, (3) tar xf + git init/add/commit of TREE.tar.
# Usage: docs/bench/client_s21.sh TREE.tar [WORKDIR]   (T: the tierstack binary)
set -u
TAR=$1
W=${2:-/var/tmp/ts-client}
T=${T:-target/release/tierstack}
export GIT_AUTHOR_NAME=b GIT_AUTHOR_EMAIL=b@b GIT_COMMITTER_NAME=b GIT_COMMITTER_EMAIL=b@b
now() { date +%s.%N; }
rm -rf "$W"; mkdir -p "$W/plain" "$W/b" "$W/m" "$W/meta"
gcc -O2 -include stdlib.h "$(dirname "$0")/stat_loop.c" -o "$W/stat_loop"
$T mount "$W/b" "$W/m" --dir "$W/fast" >/dev/null
echo "machine: $(nproc) CPUs, $(uname -r), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "stat loop, 200000 stats of one file (us per stat):"
echo "  plain:  $("$W/stat_loop" "$W/plain/s" 200000)"
echo "  fuse:   $("$W/stat_loop" "$W/m/s1" 200000)"
echo "  client: $($T exec "$W/m" -- "$W/stat_loop" "$W/m/s2" 200000)"
work() {  # $1 folder, $2.. launcher
  local d=$1; shift
  local t0 t1
  t0=$(now)
  "$@" sh -c "tar xf '$TAR' -C '$d' && cd '$d' && git init -q && git add -A && git commit -qm tree"
  t1=$(now)
  echo "$t1 - $t0" | bc
}
echo "tar xf + git init/add/commit of $TAR (s):"
echo "  plain:  $(work "$W/plain" env)"
mkdir -p "$W/m/fuse" "$W/m/client"
echo "  fuse:   $(work "$W/m/fuse" env)"
echo "  client: $(work "$W/m/client" $T exec "$W/m" --)"
$T status "$W/m" | grep "io client"
$T umount "$W/m" --timeout 20m >/dev/null
for p in 1 4; do
  echo "bench meta --procs $p --files 5000 --mount --client:"
  $T bench meta --target "$W/meta" --procs $p --files 5000 --mount --client --dir "$W"
done
rm -rf "$W"
