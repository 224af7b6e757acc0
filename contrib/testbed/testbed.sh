#!/usr/bin/env bash
# A multi-node test bed on one host (issue 40): a real MooseFS (master + K chunkservers on
# throttled loop devices) as the shared "parallel file system", N simulated compute nodes (each a
# network, UTS and mount namespace of its own with private /run, /tmp, /var/tmp, /var/log, /mnt
# and /dev/shm, MooseFS mounted at /mnt/pfs) and optionally a SLURM (slurmctld + one slurmd per node).
# Everything it makes lives under --root DIR, in network namespaces named after DIR, in one blkio
# cgroup, on loop devices backed by files under DIR; `down` removes all of it. See README.md.
#
#   testbed.sh up --root DIR [--nodes N] [--chunkservers K] [--throttle MBPS]
#                 [--disk-size SIZE] [--slurm] [--slurm-extra FILE] [--quiet]
#   testbed.sh down --root DIR [--quiet]
#   testbed.sh exec --root DIR TARGET -- CMD...   (TARGET: nodeI, ctl, master, csK, all,
#                                                  or a list: node1,node3)
#   testbed.sh status --root DIR
#   testbed.sh drop-caches --root DIR
#   testbed.sh io-stats --root DIR
set -euo pipefail

SELF=$(readlink -f "${BASH_SOURCE[0]}")
NET=10.77.0
MASTER_ADDR=$NET.1
CTL_ADDR=$NET.2
PFS=/mnt/pfs
MAX_NODES=8
MAX_CS=7
QUIET=0

cs_addr() { echo "$NET.$((2 + $1))"; }
node_addr() { echo "$NET.$((10 + $1))"; }

usage() { # the comment at the top of this file
  awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$SELF"
}

die() {
  echo "testbed: error: $*" >&2
  exit 1
}

say() {
  [ "$QUIET" = 1 ] || echo "testbed: $*"
}

now_ms() { date +%s%3N; }

since() { # seconds (one decimal) since the time in ms $1
  local d=$(($(now_ms) - $1))
  printf '%d.%d' $((d / 1000)) $((d % 1000 / 100))
}

# wait_for SECS CMD...: runs CMD every 0.1 s until it succeeds; returns 1 after SECS seconds.
wait_for() {
  local secs=$1
  shift
  local end=$(($(now_ms) + secs * 1000))
  until "$@" >/dev/null 2>&1; do
    [ "$(now_ms)" -lt "$end" ] || return 1
    sleep 0.1
  done
}

# alive PID...: whether one of the processes still runs (a zombie does not).
alive() {
  local p st
  for p in "$@"; do
    st=$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null) || continue
    [ -n "$st" ] && [ "$st" != Z ] && [ "$st" != X ] && return 0
  done
  return 1
}

# stop_pids SECS PID...: SIGTERM, up to SECS seconds for them to end, then SIGKILL and up to
# 5 s more; says which ones survived. (Nothing of a test bed needs a graceful end: mfsmount
# and mfsmaster take 2-4 s for one, and all their data is thrown away.)
stop_pids() {
  local secs=$1
  shift
  [ $# -gt 0 ] || return 0
  kill -TERM "$@" 2>/dev/null || true
  wait_for "$secs" eval '! alive' "$@" || true
  if alive "$@"; then
    kill -KILL "$@" 2>/dev/null || true
    wait_for 5 eval '! alive' "$@" || true
  fi
  local p
  for p in "$@"; do
    if alive "$p"; then
      echo "testbed: warning: process $p ($(cat "/proc/$p/comm" 2>/dev/null)) survives SIGKILL" >&2
    fi
  done
}

# set_root DIR: ROOT (absolute, resolved) and what is named after it.
set_root() {
  [ -n "${1:-}" ] || die "--root DIR is required"
  local r=$1
  case $r in /*) ;; *) r=$PWD/$r ;; esac
  ROOT=$(realpath -m -- "$r")
  [[ $ROOT =~ ^/[A-Za-z0-9._/-]+$ ]] || die "--root: use letters, digits and ._-/ only ($ROOT)"
  [[ $ROOT =~ ^/[^/]+/[^/]+ ]] || die "--root: $ROOT is too close to / (use a folder of its own, e.g. /var/tmp/testbed)"
  P=tb$(printf %s "$ROOT" | sha1sum | cut -c1-8)
  STATE=$ROOT/testbed.env
  LOG=$ROOT/log
  CG=/sys/fs/cgroup/blkio/testbed-$P
  CONF=$ROOT/slurm/etc/slurm.conf
}

# The things of this test bed that exist now (each prints one per line).
our_netns() { ip netns list 2>/dev/null | awk -v p="$P-" 'index($1, p) == 1 {print $1}'; }
our_loops() {
  losetup -n -l -O NAME,BACK-FILE 2>/dev/null | awk -v r="$ROOT/" 'index($2, r) == 1 {print $1}'
}
our_mounts() { # deepest first
  awk -v r="$ROOT/" 'index($5 "/", r) == 1 {print length($5), $5}' /proc/self/mountinfo |
    sort -rn | cut -d' ' -f2-
}
no_loops() { [ -z "$(our_loops)" ]; }
our_cgroup() { if [ -d "$CG" ]; then echo "$CG"; fi; }

# The processes of this test bed: in its network namespaces, in its cgroup, or in the mount
# namespaces of its nodes (recorded in the state file).
our_pids() {
  local ns
  for ns in $(our_netns); do ip netns pids "$ns" 2>/dev/null || true; done
  if [ -f "$CG/cgroup.procs" ]; then cat "$CG/cgroup.procs" 2>/dev/null || true; fi
  node_mnt_pids
}

# The processes in the mount namespace of a node (or ctl) of this test bed, whatever their
# network namespace: the ones whose /run is that node's run folder.
node_mnt_pids() {
  [ -d "$ROOT" ] || return 0
  # In mountinfo a bind mount's source is its path inside its file system.
  local target fsroot rel
  read -r target fsroot < <(findmnt -n -o TARGET,FSROOT -T "$ROOT") || return 0
  rel=${fsroot%/}/${ROOT#"${target%/}"/}
  rel=${rel//./\\.}
  grep -l -s -E "^[0-9]+ [0-9]+ [0-9:]+ $rel/nodes/[a-z0-9]+/run /run " /proc/[0-9]*/mountinfo |
    cut -d/ -f3 || true
}

# The state file's variables (written by up): NODES CS SLURM THROTTLE LOOPS CSk_LOOP
# NODEk_PID CTL_PID SLURM_CONF UP.
NODES=0 CS=0 SLURM=0 THROTTLE=0 LOOPS="" UP=0
load_state() {
  # shellcheck disable=SC1090
  if [ -f "$STATE" ]; then . "$STATE"; fi
}

state_set() { # KEY VALUE: appended to the state file (the last one wins when it is read)
  printf '%s=%q\n' "$1" "$2" >>"$STATE"
}

# ---------------------------------------------------------------------------------------------
# up

STEP=""
STEP_LOG=""
UP_OK=0
FAIL_SAID=0

step() { # NAME LOGFILE
  STEP=$1
  STEP_LOG=$2
  echo "=== $(date '+%F %T') step $STEP" >>"$STEP_LOG"
}

fail() { # one line naming the step and its log; the EXIT trap runs down
  echo "testbed: error: up failed at step '$STEP': $* (log: $STEP_LOG)" >&3
  FAIL_SAID=1
  exit 1
}

up_exit() {
  local rc=$?
  [ "$UP_OK" = 1 ] && return 0
  trap - EXIT INT TERM HUP
  # The trap may run while a function's output goes to a log: back to up's own stderr (fd 3).
  exec 2>&3
  if [ "$FAIL_SAID" = 0 ]; then
    case $rc in
    129 | 130 | 143) echo "testbed: error: up interrupted (signal $((rc - 128))) at step '$STEP' (log: $STEP_LOG)" >&2 ;;
    *) echo "testbed: error: up failed at step '$STEP' (exit status $rc; log: $STEP_LOG)" >&2 ;;
    esac
  fi
  if ! (QUIET=1 down_all) >>"$LOG/down-after-failed-up.log" 2>&1; then
    echo "testbed: error: the down after the failed up left things behind (log: $LOG/down-after-failed-up.log)" >&2
  fi
  exit 1
}

# add_member NAME ADDR: a network namespace $P-NAME with eth0 (ADDR/24) on the hub's bridge.
add_member() {
  local ns=$P-$1
  ip netns add "$ns"
  ip -n "$ns" link set lo up
  ip -n "$P-hub" link add "v-$1" type veth peer name eth0 netns "$ns"
  ip -n "$P-hub" link set "v-$1" master br0
  ip -n "$P-hub" link set "v-$1" up
  ip -n "$ns" addr add "$2/24" dev eth0
  ip -n "$ns" link set eth0 up
}

# make_network SLURM CS NODES: the hub with its bridge, and every member (any failure stops up).
make_network() {
  local k i
  ip netns add "$P-hub"
  ip -n "$P-hub" link set lo up
  ip -n "$P-hub" link add br0 type bridge
  ip -n "$P-hub" link set br0 up
  add_member master "$MASTER_ADDR"
  add_member ctl "$CTL_ADDR"
  for k in $(seq 1 "$2"); do add_member "cs$k" "$(cs_addr "$k")"; done
  for i in $(seq 1 "$3"); do add_member "node$i" "$(node_addr "$i")"; done
}

in_net() { # NAME CMD...: CMD in the network namespace of member NAME (this mount namespace)
  local ns=$P-$1
  shift
  nsenter --net="/run/netns/$ns" -- "$@"
}

listening() { # NAME PORT
  [ -n "$(in_net "$1" ss -Hltn "sport = :$2")" ]
}

cs_connected() { # how many chunkservers the master has a connection from
  in_net master ss -Htn state established "sport = :9420" | wc -l
}

all_cs_connected() { [ "$(cs_connected)" -ge "$CS" ]; }

# in_node NAME CMD...: CMD inside node NAME (or ctl): its network, UTS and mount namespaces.
in_node() {
  local name=$1 pid
  shift
  pid=$(holder_pid "$name") || return 1
  nsenter -t "$pid" -n -u -m -- "$@"
}

holder_pid() { # the holder of NAME, checked to be alive and in NAME's network namespace
  local name=$1 pid
  pid=$(cat "$ROOT/nodes/$name/holder.pid" 2>/dev/null) || {
    echo "testbed: error: $name has no holder (is the test bed up?)" >&2
    return 1
  }
  if ! alive "$pid" || [ "$(stat -L -c %i "/proc/$pid/ns/net" 2>/dev/null)" != \
    "$(stat -L -c %i "/run/netns/$P-$name" 2>/dev/null)" ]; then
    echo "testbed: error: the holder of $name ($pid) is gone" >&2
    return 1
  fi
  echo "$pid"
}

# start_holder NAME: the long-lived process whose namespaces are node NAME.
start_holder() {
  local name=$1 dir=$ROOT/nodes/$1
  mkdir -p "$dir/run" "$dir/tmp" "$dir/vartmp" "$dir/mnt${PFS#/mnt}" "$LOG/nodes/$name"
  chmod 1777 "$dir/tmp" "$dir/vartmp"
  rm -f "$dir/holder.pid"
  setsid -w nsenter --net="/run/netns/$P-$name" -- \
    unshare --uts --mount --propagation private --fork -- \
    bash "$SELF" __holder "$ROOT" "$name" </dev/null 3>&- >>"$LOG/$name.log" 2>&1 &
  local launcher=$!
  disown "$launcher"
  local end=$(($(now_ms) + 10000))
  until [ -s "$dir/holder.pid" ]; do
    alive "$launcher" || fail "the holder of $name exited during its set-up"
    [ "$(now_ms)" -lt "$end" ] || fail "the holder of $name not ready within 10 s"
    sleep 0.05
  done
  local pid
  pid=$(cat "$dir/holder.pid")
  state_set "$(echo "$name" | tr '[:lower:]' '[:upper:]')_PID" "$pid"
}

# Runs inside the new UTS and mount namespaces (and the node's network namespace): makes them
# the node's, writes the holder's pid, then holds them.
holder_main() {
  set_root "$1"
  local name=$2 dir
  dir=$ROOT/nodes/$name
  echo "$name" >/proc/sys/kernel/hostname
  # Copies of mounts this node must not hold: the chunkservers' disks (under ROOT) and the
  # other network namespaces (their /run/netns files).
  awk -v r="$ROOT/" 'index($5, r) == 1 || index($5, "/run/netns/") == 1 {print length($5), $5}' \
    /proc/self/mountinfo | sort -rn | cut -d' ' -f2- | while read -r m; do
    umount -l "$m" 2>/dev/null || true
  done
  private_dir /run "$dir/run"
  private_dir /tmp "$dir/tmp"
  private_dir /var/tmp "$dir/vartmp"
  private_dir /mnt "$dir/mnt"
  private_dir /var/log "$LOG/nodes/$name"
  mkdir -p /run/lock
  mount -t tmpfs -o mode=1777,size=25% tmpfs /dev/shm
  mount --bind "$ROOT/etc/hosts" /etc/hosts
  echo $$ >"$dir/holder.pid.new"
  mv "$dir/holder.pid.new" "$dir/holder.pid"
  exec sleep infinity
}

# private_dir D SRC: SRC over D in this mount namespace; where ROOT is under D, ROOT stays
# reachable at its own path (bound at the same place inside SRC first).
private_dir() {
  local d=$1 src=$2 rel
  case "$ROOT/" in
  "$d"/*)
    rel=${ROOT#"$d"/}
    mkdir -p "$src/$rel"
    mount --bind "$ROOT" "$src/$rel"
    ;;
  esac
  mount --rbind "$src" "$d"
}

# The SLURM configuration: one function, so a caller can add lines (--slurm-extra FILE is
# appended as it is: BurstBufferType, Prolog, Epilog...).
slurm_conf() {
  local i cpus
  cpus=$(nproc)
  cat <<EOF
# Written by testbed.sh for the test bed at $ROOT.
ClusterName=testbed
SlurmctldHost=ctl($CTL_ADDR)
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
StateSaveLocation=$ROOT/slurm/state
SlurmdSpoolDir=$ROOT/slurm/spool/%n
SlurmctldPidFile=$ROOT/slurm/run/slurmctld.pid
SlurmdPidFile=$ROOT/slurm/run/slurmd-%n.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MailProg=/bin/true
MpiDefault=none
EOF
  for i in $(seq 1 "$NODES"); do
    echo "NodeName=node$i NodeHostname=node$i NodeAddr=$(node_addr "$i") CPUs=$cpus RealMemory=1000 State=UNKNOWN"
  done
  echo "PartitionName=all Nodes=node[1-$NODES] Default=YES MaxTime=INFINITE State=UP"
  if [ -n "$SLURM_EXTRA" ]; then
    echo "# --slurm-extra $SLURM_EXTRA"
    cat "$SLURM_EXTRA"
  fi
}

slurm_idle_nodes() {
  in_node ctl env SLURM_CONF="$CONF" sinfo -h -N -o '%N %T' 2>/dev/null | awk '$2 == "idle"' | wc -l
}
slurm_all_idle() { [ "$(slurm_idle_nodes)" -ge "$NODES" ]; }
slurm_ping() { in_node ctl env SLURM_CONF="$CONF" scontrol ping | grep -q 'is UP'; }

mfs_mounted() { # NAME
  in_node "$1" findmnt -n -o FSTYPE "$PFS" | grep -q '^fuse'
}

probe_write() {
  in_node node1 timeout 20 dd if=/dev/zero of="$PFS/.testbed-probe" bs=64k count=16 conv=fsync status=none
}

cmd_up() {
  local root="" nodes=4 cs=2 throttle=200 size=4G slurm=0 extra=""
  while [ $# -gt 0 ]; do
    case $1 in
    --root) root=${2:?--root DIR}; shift 2 ;;
    --nodes) nodes=${2:?--nodes N}; shift 2 ;;
    --chunkservers) cs=${2:?--chunkservers K}; shift 2 ;;
    --throttle) throttle=${2:?--throttle MBPS}; shift 2 ;;
    --disk-size) size=${2:?--disk-size SIZE}; shift 2 ;;
    --slurm) slurm=1; shift ;;
    --slurm-extra) extra=${2:?--slurm-extra FILE}; slurm=1; shift 2 ;;
    --quiet) QUIET=1; shift ;;
    *) die "up: unknown argument '$1' (see testbed.sh --help)" ;;
    esac
  done
  set_root "$root"
  if ! [[ $nodes =~ ^[1-9][0-9]*$ ]] || [ "$nodes" -gt $MAX_NODES ]; then die "--nodes: 1 to $MAX_NODES"; fi
  if ! [[ $cs =~ ^[1-9][0-9]*$ ]] || [ "$cs" -gt $MAX_CS ]; then die "--chunkservers: 1 to $MAX_CS"; fi
  [[ $throttle =~ ^[0-9]+$ ]] || die "--throttle: MB/s, a whole number (0: none)"
  [[ $size =~ ^[1-9][0-9]*[KMGT]?$ ]] || die "--disk-size: e.g. 4G"
  if [ -n "$extra" ]; then
    [ -f "$extra" ] || die "--slurm-extra: no file $extra"
    extra=$(realpath -- "$extra")
  fi
  [ "$(id -u)" = 0 ] || die "up needs root (namespaces, loop devices, mounts)"
  [ -e /dev/fuse ] || die "no /dev/fuse"
  local c
  for c in mfsmaster mfschunkserver mfsmount; do
    command -v "$c" >/dev/null 2>&1 ||
      die "$c missing: apt-get install -y moosefs-master moosefs-chunkserver moosefs-client"
  done
  for c in ip tc nsenter unshare setsid losetup mkfs.ext4 ss findmnt truncate lsblk; do
    command -v "$c" >/dev/null 2>&1 || die "$c missing"
  done
  if [ "$slurm" = 1 ]; then
    for c in slurmctld slurmd sinfo scontrol; do
      command -v "$c" >/dev/null 2>&1 ||
        die "$c missing: apt-get install -y --no-install-recommends slurmctld slurmd slurm-client slurm-wlm-basic-plugins"
    done
  fi
  local blkio=1
  if [ ! -f /sys/fs/cgroup/blkio/blkio.throttle.write_bps_device ]; then
    blkio=0
    if [ "$throttle" != 0 ]; then
      echo "testbed: warning: no cgroup v1 blkio controller at /sys/fs/cgroup/blkio: only the chunkservers' links are throttled (cold reads from their disks are not)" >&2
    fi
  fi
  # Leftovers of an earlier run at this root.
  local left
  left=$(
    our_netns | sed 's/^/netns /'
    our_loops | sed 's/^/loop device /'
    our_mounts | sed 's/^/mount /'
    our_cgroup | sed 's/^/cgroup /'
  )
  if [ -n "$left" ] || [ -e "$ROOT/.testbed" ]; then
    die "a test bed is up (or was left) at $ROOT: run 'testbed.sh down --root $ROOT' first ($(echo "$left" | head -3 | paste -sd, -))"
  fi

  NODES=$nodes CS=$cs SLURM_EXTRA=$extra
  local t0 t
  t0=$(now_ms)
  # Fresh logs for this run (the previous run's stay in log.prev).
  if [ -d "$LOG" ]; then
    rm -rf "$LOG.prev"
    mv "$LOG" "$LOG.prev"
  fi
  mkdir -p "$ROOT" "$LOG"
  chmod 755 "$ROOT"
  echo "$P" >"$ROOT/.testbed"
  : >"$STATE"
  # fd 3: up's stderr, for the error line (daemons are started with it closed, so none keeps a
  # caller's pipe open).
  exec 3>&2
  trap up_exit EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  trap 'exit 129' HUP
  state_set ROOT "$ROOT"
  state_set PREFIX "$P"
  state_set NODES "$nodes"
  state_set CS "$cs"
  state_set SLURM "$slurm"
  state_set THROTTLE "$throttle"

  # Network: a bridge in a hub namespace, one namespace per member on it.
  t=$(now_ms)
  step network "$LOG/network.log"
  make_network "$slurm" "$cs" "$nodes" >>"$STEP_LOG" 2>&1
  local k i
  mkdir -p "$ROOT/etc"
  {
    cat /etc/hosts
    echo "# testbed $P"
    echo "$MASTER_ADDR master mfsmaster"
    echo "$CTL_ADDR ctl"
    for k in $(seq 1 "$cs"); do echo "$(cs_addr "$k") cs$k"; done
    for i in $(seq 1 "$nodes"); do echo "$(node_addr "$i") node$i"; done
  } >"$ROOT/etc/hosts"
  say "network: bridge + $((1 + slurm + cs + nodes)) namespaces ($(since "$t") s)"

  # MooseFS master.
  t=$(now_ms)
  step master "$LOG/master.log"
  local m=$ROOT/mfs/master
  mkdir -p "$m/data"
  echo "MFSM NEW" >"$m/data/metadata.mfs"
  echo "* / rw,alldirs,maproot=0" >"$m/mfsexports.cfg"
  : >"$m/mfstopology.cfg"
  cat >"$m/mfsmaster.cfg" <<EOF
WORKING_USER = root
WORKING_GROUP = root
SYSLOG_IDENT = $P-master
DATA_PATH = $m/data
EXPORTS_FILENAME = $m/mfsexports.cfg
TOPOLOGY_FILENAME = $m/mfstopology.cfg
MATOML_LISTEN_HOST = $MASTER_ADDR
MATOCS_LISTEN_HOST = $MASTER_ADDR
MATOCL_LISTEN_HOST = $MASTER_ADDR
EOF
  setsid -w nsenter --net="/run/netns/$P-master" -- mfsmaster -c "$m/mfsmaster.cfg" -f \
    </dev/null 3>&- >>"$STEP_LOG" 2>&1 &
  local mpid=$!
  disown "$mpid"
  wait_for 20 listening master 9421 || {
    alive "$mpid" || fail "mfsmaster exited"
    fail "mfsmaster not listening on $MASTER_ADDR:9421 within 20 s"
  }
  say "mfsmaster at $MASTER_ADDR ($(since "$t") s)"

  # Chunkservers: a loop device each (sparse file, ext4), in one blkio cgroup.
  t=$(now_ms)
  step disks "$LOG/disks.log"
  if [ "$blkio" = 1 ]; then
    mkdir "$CG" 2>>"$STEP_LOG" || fail "cannot make the cgroup $CG"
    state_set CGROUP "$CG"
  fi
  local loops=""
  for k in $(seq 1 "$cs"); do
    local d=$ROOT/mfs/cs$k loop majmin
    mkdir -p "$d/data" "$d/hdd"
    truncate -s "$size" "$d/disk.img"
    loop=$(losetup -f --show "$d/disk.img" 2>>"$STEP_LOG") || fail "losetup of $d/disk.img"
    state_set "CS${k}_LOOP" "$loop"
    loops="$loops $loop"
    mkfs.ext4 -q -F -m 0 -E nodiscard,lazy_itable_init=1,lazy_journal_init=1 -L "$P-cs$k" "$loop" \
      >>"$STEP_LOG" 2>&1 || fail "mkfs.ext4 on $loop"
    mount -o noinit_itable "$loop" "$d/hdd" >>"$STEP_LOG" 2>&1 || fail "mount of $loop"
    if [ "$throttle" != 0 ] && [ "$blkio" = 1 ]; then
      majmin=$(lsblk -dn -o MAJ:MIN "$loop" | tr -d ' ')
      echo "$majmin $((throttle * 1000000))" >"$CG/blkio.throttle.write_bps_device"
      echo "$majmin $((throttle * 1000000))" >"$CG/blkio.throttle.read_bps_device"
    fi
  done
  state_set LOOPS "${loops# }"
  say "disks: $cs x $size on${loops}, throttle $throttle MB/s each ($(since "$t") s)"

  t=$(now_ms)
  step chunkservers "$LOG/chunkservers.log"
  for k in $(seq 1 "$cs"); do
    local d=$ROOT/mfs/cs$k a
    a=$(cs_addr "$k")
    echo "$d/hdd" >"$d/mfshdd.cfg"
    cat >"$d/mfschunkserver.cfg" <<EOF
WORKING_USER = root
WORKING_GROUP = root
SYSLOG_IDENT = $P-cs$k
DATA_PATH = $d/data
HDD_CONF_FILENAME = $d/mfshdd.cfg
MASTER_HOST = $MASTER_ADDR
BIND_HOST = $a
CSSERV_LISTEN_HOST = $a
HDD_FSYNC_BEFORE_CLOSE = 1
HDD_LEAVE_SPACE_DEFAULT = 64MiB
EOF
    # The launcher joins the cgroup (where there is one), then becomes the chunkserver: all its
    # threads are in it.
    # shellcheck disable=SC2016 # expanded by the inner bash
    setsid -w bash -c '{ [ ! -d "$1" ] || echo $$ >"$1/cgroup.procs"; } && exec nsenter --net="$2" -- mfschunkserver -c "$3" -f' \
      _ "$CG" "/run/netns/$P-cs$k" "$d/mfschunkserver.cfg" </dev/null 3>&- >>"$LOG/cs$k.log" 2>&1 &
    disown $!
  done
  if [ "$throttle" != 0 ]; then
    # The chunkservers' links too: a chunkserver acknowledges a write once the data is in its
    # page cache (it is written to the loop device later, by the kernel's flusher outside the
    # cgroup), so the blkio limit alone does not slow writes down. A token bucket on each
    # direction of its veth does (hub side: data to it; its eth0: data from it).
    local burst=$((throttle * 10000))
    [ "$burst" -ge 1048576 ] || burst=1048576
    for k in $(seq 1 "$cs"); do
      tc -n "$P-hub" qdisc add dev "v-cs$k" root tbf rate "$((throttle * 8))mbit" burst "$burst" latency 100ms \
        >>"$STEP_LOG" 2>&1 || fail "tc tbf on v-cs$k"
      tc -n "$P-cs$k" qdisc add dev eth0 root tbf rate "$((throttle * 8))mbit" burst "$burst" latency 100ms \
        >>"$STEP_LOG" 2>&1 || fail "tc tbf on eth0 of cs$k"
    done
  fi
  wait_for 30 all_cs_connected ||
    fail "$(cs_connected) of $cs chunkservers connected to the master within 30 s (logs: $LOG/cs*.log)"
  say "$cs chunkservers connected ($(since "$t") s)"

  # Nodes (and the SLURM controller's host): holders, then MooseFS mounted in each.
  t=$(now_ms)
  step nodes "$LOG/nodes.log"
  local names=""
  for i in $(seq 1 "$nodes"); do names="$names node$i"; done
  names="$names ctl"
  local n
  for n in $names; do
    STEP_LOG=$LOG/$n.log
    start_holder "$n"
  done
  say "nodes:$names ($(since "$t") s)"

  t=$(now_ms)
  step mfsmount "$LOG/mfsmount.log"
  : >"$ROOT/mfs/mfsmount.cfg"
  for n in $names; do
    STEP_LOG=$LOG/mfsmount-$n.log
    in_node "$n" timeout 30 mfsmount "$PFS" -H "$MASTER_ADDR" -o "mfscfgfile=$ROOT/mfs/mfsmount.cfg" \
      </dev/null 3>&- >>"$STEP_LOG" 2>&1 || fail "mfsmount in $n"
    wait_for 10 mfs_mounted "$n" || fail "$PFS not mounted in $n"
  done
  STEP_LOG=$LOG/mfsmount-node1.log
  # One copy per chunk (no doubled bandwidth), deleted files freed at once (no trash).
  in_node node1 mfssetgoal -r 1 "$PFS" >>"$STEP_LOG" 2>&1 || fail "mfssetgoal -r 1 $PFS"
  in_node node1 mfssettrashtime -r 0 "$PFS" >>"$STEP_LOG" 2>&1 || fail "mfssettrashtime -r 0 $PFS"
  wait_for 40 probe_write || fail "a 1 MiB write with fsync to $PFS did not succeed within 40 s"
  in_node node1 rm -f "$PFS/.testbed-probe"
  say "MooseFS mounted at $PFS in:$names ($(since "$t") s)"

  if [ "$slurm" = 1 ]; then
    t=$(now_ms)
    step slurm "$LOG/slurm-up.log"
    mkdir -p "$ROOT/slurm/etc" "$ROOT/slurm/state" "$ROOT/slurm/run"
    for i in $(seq 1 "$nodes"); do mkdir -p "$ROOT/slurm/spool/node$i"; done
    slurm_conf >"$CONF"
    state_set SLURM_CONF "$CONF"
    in_node ctl slurmctld -f "$CONF" </dev/null 3>&- >>"$STEP_LOG" 2>&1 ||
      fail "slurmctld did not start (see also $LOG/slurmctld.log)"
    wait_for 20 slurm_ping || fail "slurmctld not UP within 20 s (see also $LOG/slurmctld.log)"
    for i in $(seq 1 "$nodes"); do
      in_node "node$i" slurmd -f "$CONF" </dev/null 3>&- >>"$STEP_LOG" 2>&1 ||
        fail "slurmd of node$i did not start (see also $LOG/slurmd-node$i.log)"
    done
    wait_for 40 slurm_all_idle ||
      fail "$(slurm_idle_nodes) of $nodes nodes idle in sinfo within 40 s (see $LOG/slurmd-node*.log)"
    say "SLURM: slurmctld at $CTL_ADDR, $nodes nodes idle ($(since "$t") s)"
  fi

  # io-stats counts from here (a loop device's counters live as long as the device).
  k=0
  for loop in $loops; do
    k=$((k + 1))
    local rs ws
    read -r _ _ rs _ _ _ ws _ <"/sys/block/${loop#/dev/}/stat"
    state_set "CS${k}_BASE_READ" "$rs"
    state_set "CS${k}_BASE_WRITE" "$ws"
  done
  UP_OK=1
  trap - EXIT INT TERM HUP
  state_set UP 1
  say "up in $(since "$t0") s (root $ROOT, prefix $P)"
}

# ---------------------------------------------------------------------------------------------
# down

down_all() {
  local t0 left pids ns
  t0=$(now_ms)
  load_state
  # 1. Clients: everything in the nodes and the controller's host (FUSE mounts end with their
  #    mount namespaces), then the chunkservers and the master, then anything left.
  pids=$(
    for ns in $(our_netns | grep -E -- "-(node[0-9]+|ctl)$"); do ip netns pids "$ns" 2>/dev/null || true; done
    node_mnt_pids
  )
  local list=()
  mapfile -t list < <(echo "$pids" | grep -E '^[0-9]+$' | sort -un)
  stop_pids 1 "${list[@]}"
  mapfile -t list < <(our_pids | grep -E '^[0-9]+$' | sort -un)
  stop_pids 1 "${list[@]}"
  # 2. Network namespaces (the hub last).
  for ns in $(our_netns | grep -v -- "-hub$") $(our_netns | grep -- "-hub$"); do
    ip netns del "$ns" 2>/dev/null || echo "testbed: warning: ip netns del $ns failed" >&2
  done
  # 3. The cgroup.
  if [ -d "$CG" ]; then
    wait_for 5 rmdir "$CG" || echo "testbed: warning: cannot remove $CG" >&2
  fi
  # 4. Mounts under the root (the chunkservers' disks), then their loop devices.
  local m l
  for m in $(our_mounts); do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || echo "testbed: warning: cannot unmount $m" >&2
  done
  for l in $(our_loops); do
    losetup -d "$l" 2>/dev/null || true
  done
  wait_for 10 no_loops || true
  # 5. Files (the logs stay), only when nothing is mounted under the root any more, and only
  #    where the marker of up is (a root that is not a test bed's keeps its files).
  if [ -z "$(our_mounts)" ] && [ -f "$ROOT/.testbed" ]; then
    rm -rf --one-file-system "${ROOT:?}/mfs" "${ROOT:?}/nodes" "${ROOT:?}/slurm" "${ROOT:?}/etc" \
      "$STATE" "${ROOT:?}/.testbed"
  fi
  left=$(
    our_netns | sed 's/^/netns /'
    our_loops | sed 's/^/loop device /'
    our_mounts | sed 's/^/mount /'
    our_cgroup | sed 's/^/cgroup /'
    our_pids | sort -un | sed 's/^/process /'
  )
  if [ -n "$left" ]; then
    echo "testbed: error: down left: $(echo "$left" | paste -sd, -)" >&2
    return 1
  fi
  say "down in $(since "$t0") s (root $ROOT)"
}

cmd_down() {
  local root=""
  while [ $# -gt 0 ]; do
    case $1 in
    --root) root=${2:?--root DIR}; shift 2 ;;
    --quiet) QUIET=1; shift ;;
    *) die "down: unknown argument '$1'" ;;
    esac
  done
  set_root "$root"
  [ "$(id -u)" = 0 ] || die "down needs root"
  down_all
}

# ---------------------------------------------------------------------------------------------
# exec, status, drop-caches, io-stats

need_up() {
  load_state
  [ "${UP:-0}" = 1 ] || die "no test bed is up at $ROOT (testbed.sh up --root $ROOT)"
}

cmd_exec() {
  local root="" target=""
  while [ $# -gt 0 ]; do
    case $1 in
    --root) root=${2:?--root DIR}; shift 2 ;;
    --) shift; break ;;
    -*) die "exec: unknown option '$1'" ;;
    *)
      [ -z "$target" ] || die "exec: one target, then -- CMD..."
      target=$1
      shift
      ;;
    esac
  done
  set_root "$root"
  if [ -z "$target" ] || [ $# = 0 ]; then die "usage: testbed.sh exec --root DIR TARGET -- CMD..."; fi
  need_up
  local envs=()
  if [ "${SLURM:-0}" = 1 ]; then envs=(SLURM_CONF="$CONF"); fi
  case $target in
  all | *,*)
    # Several nodes at once (all, or a list such as node1,node3): output lines (stdout and
    # stderr) prefixed "NAME: ", then one "NAME: exit N" line each on stderr; exit status 0
    # only when all exited 0.
    local targets=() n pids=() rc=0 r i
    if [ "$target" = all ]; then
      for i in $(seq 1 "$NODES"); do targets+=("node$i"); done
    else
      IFS=, read -r -a targets <<<"$target"
    fi
    for n in "${targets[@]}"; do
      [ -d "$ROOT/nodes/$n" ] || die "exec: no $n in this test bed"
    done
    for n in "${targets[@]}"; do
      (
        set +e
        "$SELF" exec --root "$ROOT" "$n" -- "$@" </dev/null 2>&1 | sed -u "s/^/$n: /"
        exit "${PIPESTATUS[0]}"
      ) &
      pids+=($!)
    done
    for i in "${!targets[@]}"; do
      r=0
      wait "${pids[$i]}" || r=$?
      echo "${targets[$i]}: exit $r" >&2
      [ "$r" = 0 ] || rc=1
    done
    return "$rc"
    ;;
  node[0-9]* | ctl)
    [ -d "$ROOT/nodes/$target" ] || die "exec: no $target in this test bed"
    local pid
    pid=$(holder_pid "$target") || exit 1
    cd /
    exec nsenter -t "$pid" -n -u -m -- env "${envs[@]}" "$@"
    ;;
  master | cs[0-9]*)
    [ -e "/run/netns/$P-$target" ] || die "exec: no $target in this test bed"
    exec nsenter --net="/run/netns/$P-$target" -- env "${envs[@]}" "$@"
    ;;
  *) die "exec: TARGET is nodeI, ctl, master, csK, all or a list node1,node2 (not '$target')" ;;
  esac
}

cmd_status() {
  local root=""
  while [ $# -gt 0 ]; do
    case $1 in
    --root) root=${2:?--root DIR}; shift 2 ;;
    *) die "status: unknown argument '$1'" ;;
    esac
  done
  set_root "$root"
  load_state
  if [ "${UP:-0}" != 1 ]; then
    echo "# testbed at $ROOT: not up"
    local left
    left=$(our_netns; our_loops; our_mounts; our_cgroup)
    if [ -n "$left" ]; then echo "# leftovers: $(echo "$left" | paste -sd' ' -) (testbed.sh down --root $ROOT)"; fi
    echo "TESTBED_UP=0"
    return 1
  fi
  local bad=0 i n pid k
  echo "# testbed at $ROOT (prefix $P): $NODES nodes, $CS chunkservers, throttle $THROTTLE MB/s, slurm $SLURM"
  if [ -z "$(ip netns pids "$P-master" 2>/dev/null)" ]; then
    echo "# problem: no mfsmaster"
    bad=1
  fi
  for k in $(seq 1 "$CS"); do
    local lv="CS${k}_LOOP"
    if [ -z "$(ip netns pids "$P-cs$k" 2>/dev/null)" ]; then
      echo "# problem: no chunkserver cs$k"
      bad=1
    fi
    echo "# cs$k $(cs_addr "$k") on ${!lv}"
  done
  echo "TESTBED_ROOT=$ROOT"
  echo "TESTBED_PREFIX=$P"
  echo "TESTBED_PFS=$PFS"
  echo "TESTBED_MASTER_ADDR=$MASTER_ADDR"
  echo "TESTBED_MASTER_NETNS=$P-master"
  echo "TESTBED_CHUNKSERVERS=$CS"
  echo "TESTBED_LOOPS=\"$LOOPS\""
  echo "TESTBED_THROTTLE_MBPS=$THROTTLE"
  echo "TESTBED_NODES=$NODES"
  local names=""
  for i in $(seq 1 "$NODES"); do names="$names node$i"; done
  echo "TESTBED_NODE_NAMES=\"${names# }\""
  names="$names ctl"
  for n in $names; do
    local up=N
    if pid=$(holder_pid "$n" 2>/dev/null); then
      if mfs_mounted "$n" 2>/dev/null; then up=Y; else
        echo "# problem: $PFS not mounted in $n"
        bad=1
      fi
    else
      pid=""
      echo "# problem: $n's holder is gone"
      bad=1
    fi
    local u
    u=$(echo "$n" | tr '[:lower:]' '[:upper:]')
    echo "TESTBED_${u}_PID=$pid"
    if [ "$n" = ctl ]; then echo "TESTBED_CTL_ADDR=$CTL_ADDR"; else
      echo "TESTBED_${u}_ADDR=$(node_addr "${n#node}")"
    fi
    echo "TESTBED_${u}_NETNS=$P-$n"
    echo "TESTBED_${u}_PFS_MOUNTED=$up"
  done
  if [ "$SLURM" = 1 ]; then
    echo "TESTBED_SLURM=1"
    echo "TESTBED_SLURM_CONF=$CONF"
    if ! slurm_ping 2>/dev/null; then
      echo "# problem: slurmctld not UP"
      bad=1
    else
      echo "# slurm: $(slurm_idle_nodes) of $NODES nodes idle"
    fi
  else
    echo "TESTBED_SLURM=0"
  fi
  echo "TESTBED_UP=$((1 - bad))"
  return "$bad"
}

cmd_drop_caches() {
  local root=""
  while [ $# -gt 0 ]; do
    case $1 in
    --root) root=${2:?--root DIR}; shift 2 ;;
    *) die "drop-caches: unknown argument '$1'" ;;
    esac
  done
  set_root "$root"
  need_up
  timeout 60 sync || die "sync did not end within 60 s"
  echo 3 >/proc/sys/vm/drop_caches
}

cmd_io_stats() {
  local root=""
  while [ $# -gt 0 ]; do
    case $1 in
    --root) root=${2:?--root DIR}; shift 2 ;;
    *) die "io-stats: unknown argument '$1'" ;;
    esac
  done
  set_root "$root"
  need_up
  # /sys/block/loopX/stat: field 3 sectors read, field 7 sectors written (512 bytes each),
  # counted from the end of up.
  local k lv br bw dev rs ws tx tr=0 tw=0 ts=0
  for k in $(seq 1 "$CS"); do
    lv="CS${k}_LOOP" br="CS${k}_BASE_READ" bw="CS${k}_BASE_WRITE"
    dev=${!lv#/dev/}
    read -r _ _ rs _ _ _ ws _ <"/sys/block/$dev/stat"
    rs=$((rs - ${!br:-0}))
    ws=$((ws - ${!bw:-0}))
    echo "TESTBED_IO_CS${k}_DEV=$dev"
    echo "TESTBED_IO_CS${k}_READ_BYTES=$((rs * 512))"
    echo "TESTBED_IO_CS${k}_WRITE_BYTES=$((ws * 512))"
    # What the chunkserver sent over its link (reads served to clients, page cache hits
    # included, plus TCP/IP headers): counted since its namespace was made.
    tx=$(ip netns exec "$P-cs$k" cat /sys/class/net/eth0/statistics/tx_bytes 2>/dev/null || echo 0)
    echo "TESTBED_IO_CS${k}_SENT_BYTES=$tx"
    tr=$((tr + rs * 512))
    tw=$((tw + ws * 512))
    ts=$((ts + tx))
  done
  echo "TESTBED_IO_READ_BYTES=$tr"
  echo "TESTBED_IO_WRITE_BYTES=$tw"
  echo "TESTBED_IO_SENT_BYTES=$ts"
}

main() {
  local cmd=${1:-}
  [ $# -gt 0 ] && shift
  case $cmd in
  up) cmd_up "$@" ;;
  down) cmd_down "$@" ;;
  exec) cmd_exec "$@" ;;
  status) cmd_status "$@" ;;
  drop-caches) cmd_drop_caches "$@" ;;
  io-stats) cmd_io_stats "$@" ;;
  __holder) holder_main "$@" ;;
  -h | --help | help) usage ;;
  *)
    usage >&2
    exit 2
    ;;
  esac
}

main "$@"
