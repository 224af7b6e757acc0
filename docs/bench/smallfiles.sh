#!/bin/bash
# Small files through the mount at its defaults against a plain folder on the same disk (issue
# 39): unpack a source tree with tar, then git init + add + commit; then, with the kernel's
# caches dropped, walk it again (git status, ls -lR, find -type f | xargs cat). One run each,
# in the order plain, mount, mount without READDIRPLUS (TIERSTACK_FUSE_NO_READDIRPLUS=1).
# Usage: docs/bench/smallfiles.sh TREE.tar [WORKDIR]   (T: the tierstack binary)
set -eu
TAR=$1
W=${2:-/tmp/ts-smallfiles}
T=${T:-target/release/tierstack}
export GIT_AUTHOR_NAME=b GIT_AUTHOR_EMAIL=b@b GIT_COMMITTER_NAME=b GIT_COMMITTER_EMAIL=b@b
now() { date +%s.%N; }
work() {  # $1: folder to work in; prints "unpack+git walk" seconds
  local d=$1 t0 t1 t2
  t0=$(now)
  tar xf "$TAR" -C "$d"
  (cd "$d" && git init -q && git add -A && git commit -qm tree)
  t1=$(now)
  sync; echo 2 >/proc/sys/vm/drop_caches
  (cd "$d" && git status --porcelain >/dev/null && ls -lR >/dev/null && find . -type f -print0 | xargs -0 cat >/dev/null)
  t2=$(now)
  echo "$(echo "$t1 - $t0" | bc) $(echo "$t2 - $t1" | bc)"
}
rm -rf "$W"; mkdir -p "$W/plain"
echo "plain: $(work "$W/plain")"
for v in "" 1; do
  rm -rf "$W/b" "$W/m" "$W/fast"; mkdir -p "$W/b" "$W/m"
  env ${v:+TIERSTACK_FUSE_NO_READDIRPLUS=1} $T mount "$W/b" "$W/m" --dir "$W/fast" >/dev/null
  r=$(work "$W/m")
  $T umount "$W/m" --timeout 10m >/dev/null
  echo "mount${v:+ (no READDIRPLUS)}: $r"
done
rm -rf "$W"
