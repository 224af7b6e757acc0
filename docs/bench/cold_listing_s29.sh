#!/bin/bash
# cold.sh: a tree (python3.11 lib, git repo) in the mount and in a plain folder; cold ls -lR and git status timed, the daemon's op counts for them
set -e
T=/var/tmp/c29; TS=/work/main/target/release/tierstack
if ! mountpoint -q $T/m 2>/dev/null; then
  rm -rf $T; mkdir -p $T/b $T/m $T/f $T/plain
  [ -f /tmp/py.tar ] || tar cf /tmp/py.tar -C /usr/lib python3.11
  $TS mount $T/b $T/m --dir $T/f >/dev/null
  for d in $T/m $T/plain; do (cd $d && tar xf /tmp/py.tar && cd python3.11 && git init -q && git add -A && git -c user.email=a@b -c user.name=n commit -qm x); done
  $TS drain $T/m --wait >/dev/null
fi
ops(){ $TS status $T/m --json | python3 -c "
import json,sys; d=json.load(sys.stdin)
print(' '.join('%s=%d'%(o['op'],o['count']) for o in sorted(d['ops'],key=lambda o:-o['count'])[:10]))"; }
for what in "ls -lR" "git status"; do
 for side in plain m; do
  sync; echo 3 > /proc/sys/vm/drop_caches; sleep 1
  [ $side = m ] && b=$(ops)
  s=$(date +%s.%N); (cd $T/$side/python3.11 && $what > /dev/null); e=$(date +%s.%N)
  echo "$what $side: $(python3 -c "print(round($e-$s,3))") s"
  [ $side = m ] && { echo " before: $b"; echo " after:  $(ops)"; }
 done
done
