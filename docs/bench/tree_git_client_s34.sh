#!/bin/bash
# Tar then git under the interception client on a fresh mount (thirty-fourth session): times,
# the daemon's CPU and the machine's idle time over the git phase, per-thread context switches.
# TREE_TAR: the tar of `bench workloads --only tree` (8,000 entries of /usr/lib/python3*,
# /usr/share/perl*); TG_DIR: a scratch folder on the disk under test; TBIN: the binary.
T=$(realpath ${TBIN:-target/release/tierstack}); export TIERSTACK_RUN_DIR=/tmp/u/run
B=${TG_DIR:-/mnt/abfs/tg}; rm -rf $B; mkdir -p $B/bk $B/mnt $B/fast
$T mount $B/bk $B/mnt --dir $B/fast >/dev/null; D=$B/mnt; X="$T exec $B/mnt --"
PID=$($T status $B/mnt --json | python3 -c "import json,sys;print(json.load(sys.stdin)['pid'])")
sync; echo 3 > /proc/sys/vm/drop_caches
/usr/bin/time -f "tar wall %e" $X tar xf ${TREE_TAR:-/tmp/w/tree.tar} -C $D
snap(){ for t in /proc/$PID/task/*; do echo "$(cat $t/comm) $(grep -E '^(voluntary|nonvoluntary)_ctxt' $t/status | awk '{print $2}' | tr '\n' ' ') $(awk '{print $14+$15}' $t/stat)"; done | sort; }
snap > /tmp/w/ctx0 2>/dev/null
D0=$(awk '{print $14+$15}' /proc/$PID/stat); I0=$(awk '/^cpu /{print $5+$6}' /proc/stat)
cd $D && /usr/bin/time -f "git wall %e user %U sys %S" $X sh -c 'git init -q && git add -A && git -c user.name=a -c user.email=a@b commit -q -m x'
snap > /tmp/w/ctx1 2>/dev/null
D1=$(awk '{print $14+$15}' /proc/$PID/stat); I1=$(awk '/^cpu /{print $5+$6}' /proc/stat)
echo "daemon cpu $(( (D1-D0) )) cs, idle+iowait $(( I1-I0 )) cs"
python3 - <<'P'
a={};b={}
for f,d in (('/tmp/w/ctx0',a),('/tmp/w/ctx1',b)):
    for l in open(f):
        p=l.split(); 
        if len(p)<4: continue
        k=p[0]; v=(int(p[1]),int(p[2]),int(p[3]))
        if k in d: d[k]=tuple(x+y for x,y in zip(d[k],v))
        else: d[k]=v
for k in sorted(b, key=lambda k: -(b[k][0]-a.get(k,(0,0,0))[0])):
    o=a.get(k,(0,0,0)); dv=b[k][0]-o[0]; dn=b[k][1]-o[1]; dt=b[k][2]-o[2]
    if dv+dn+dt>0: print("%-16s vol %7d invol %6d cpu %5.2f s"%(k,dv,dn,dt/100))
P
cd /; $T umount $B/mnt >/dev/null
