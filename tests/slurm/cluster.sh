#!/usr/bin/env bash
# A real multi-node Slurm cluster (Debian 12's Slurm 22.05) on one machine, for
# the tests of muster's Slurm backend. Needs root and `scripts/setup.sh`
# (packages slurm-wlm munge iproute2 util-linux).
#
#   cluster.sh up            start it; returns once sinfo shows every node idle
#   cluster.sh exec CMD...   run CMD on the login node (sbatch, squeue, srun, the
#                            controller under test...): stdin, stdout, stderr,
#                            environment and exit status pass through
#   cluster.sh status        namespaces, daemons and node states; 0 when all up
#   cluster.sh ctld stop|start
#                            stop slurmctld (Slurm unreachable), or start it
#                            again from its saved state; returns once it is
#                            gone, or answers with every node's state known
#   cluster.sh down          stop and remove everything `up` made; 0 when there
#                            is nothing to remove
#
# Layout. Every host is a network namespace with its own address on a /24 that
# exists only between these namespaces (nothing is added to the root one):
#   PREFIX-ctl  hostname ctl, NET.1: slurmctld, the bridge br0, the login node
#   PREFIX-nI   hostname nI,  NET.(10+I): slurmd, one veth into br0
# Where the cgroup v1 memory controller is mounted, each node's slurmd runs in
# a memory cgroup of its own, /sys/fs/cgroup/memory/PREFIX-nI (its root, as
# the node sees it), and Slurm confines every task's memory (task/cgroup,
# ConstrainRAMSpace): a step past its memory is killed as on a real cluster.
# Accounting (sacct): where slurmdbd and MariaDB are installed, slurmdbd runs
# on the login node on a MariaDB of the cluster's own (data in DIR/db, reached
# through a unix socket only), both stopped by `down`.
# Each node declares two GPUs backed by empty files (no device): a job that
# asks for GPUs is placed, or refused, as on a GPU cluster.
# munged runs in the root namespace: a unix socket is a path, reachable from
# every network namespace, and Slurm finds it through AuthInfo=socket=PATH.
# The root namespace cannot reach NET at all, so whatever a job must connect
# back to (muster's controller) runs on the login node through `exec` and
# listens on 0.0.0.0 or NET.1 (a node's 127.0.0.1 is its own loopback).
#
# Environment (all optional):
#   MUSTER_SLURM_PREFIX  namespace name prefix (default mst)
#   MUSTER_SLURM_DIR     config, key, state, spool, logs
#                        (default /tmp/muster-slurm-UID-PREFIX)
#   MUSTER_SLURM_NET     first three octets of the /24 (default 10.78.0)
#   MUSTER_SLURM_NODES   number of slurmd nodes, 1..20 (default 3)
#   MUSTER_SLURM_CPUS, MUSTER_SLURM_MEM  per node (default 2 CPUs, 2000 MB)
#   MUSTER_SLURM_WAIT    seconds `up` waits for each daemon (default 60)
# Two clusters with different prefixes run side by side; they may even share
# NET, since neither network is visible outside its own namespaces. Every
# command must see the same PREFIX and DIR as the `up` did.
set -euo pipefail

prefix=${MUSTER_SLURM_PREFIX:-mst}
# The default directory follows the prefix, so that setting the prefix alone
# gives a second cluster of its own.
dir=${MUSTER_SLURM_DIR:-/tmp/muster-slurm-$(id -u)-$prefix}
net=${MUSTER_SLURM_NET:-10.78.0}
nodes=${MUSTER_SLURM_NODES:-3}
cpus=${MUSTER_SLURM_CPUS:-2}
mem=${MUSTER_SLURM_MEM:-2000}
wait_s=${MUSTER_SLURM_WAIT:-60}
me=$0
conf=$dir/etc/slurm/slurm.conf
ctl_ns=$prefix-ctl
ctl_ip=$net.1
# `up` writes this file first; `down` deletes a directory only when it is there,
# so a mistyped MUSTER_SLURM_DIR never costs anyone their files.
marker=$dir/.muster-slurm-cluster
t0=$(date +%s%N)

say() { printf '[%s] %s\n' "$(elapsed)" "$*" >&2; }
die() { echo "cluster.sh: $*" >&2; exit 1; }
elapsed() { local n; n=$(date +%s%N); printf '%d.%02ds' $(((n - t0) / 1000000000)) $(((n - t0) / 10000000 % 100)); }

check_settings() {
  [[ $prefix =~ ^[A-Za-z0-9_]{1,32}$ ]] || die "MUSTER_SLURM_PREFIX must be 1-32 of [A-Za-z0-9_], not '$prefix'"
  [[ $net =~ ^[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}$ ]] || die "MUSTER_SLURM_NET must look like 10.78.0, not '$net'"
  [[ $nodes =~ ^[0-9]+$ ]] && [ "$nodes" -ge 1 ] && [ "$nodes" -le 20 ] || die "MUSTER_SLURM_NODES must be 1..20"
  [[ $dir == /* ]] || die "MUSTER_SLURM_DIR must be an absolute path (daemons and bind mounts use it)"
  [ "$(id -u)" -eq 0 ] || die "needs root (network namespaces, bind mounts, munged as the munge user)"
}

need_tools() {
  local t missing=()
  for t in ip nsenter unshare setsid runuser munged slurmctld slurmd sbatch sinfo; do
    command -v "$t" >/dev/null 2>&1 || missing+=("$t")
  done
  [ ${#missing[@]} -eq 0 ] || die "missing ${missing[*]}: run scripts/setup.sh (packages slurm-wlm munge)"
}

# in_ns NS HOST DAEMON CMD...: exec CMD inside network namespace NS, in a fresh
# UTS namespace named HOST and a private copy of the mount namespace in which
# our hosts file covers /etc/hosts and our config dir covers /etc/slurm.
# Not `ip netns exec`: it remounts /sys, which hides /sys/fs/cgroup, and
# slurmd 22.05 then exits ("Unable to initialize cgroup plugin") even with
# proctrack/linuxproc. nsenter and unshare exec (neither forks without --pid
# or --fork), so `in_ns ... &` leaves $! equal to the pid of CMD itself.
# DAEMON=1 also detaches /run/netns inside: a long-lived daemon would otherwise
# hold copies of every namespace file there, other clusters' ones included,
# and keep those namespaces alive after their owners delete them. Not for
# `exec`: a test that runs `cluster.sh down` from the login node needs them.
in_ns() {
  local ns=$1 host=$2 daemon=$3 cg=
  shift 3
  if [ -f "$dir/etc/slurm/cgroup.conf" ] && [[ $host =~ ^n[0-9]+$ ]]; then cg=$(node_cgroup "$host"); fi
  cg=$cg exec nsenter --net="/run/netns/$ns" unshare --uts --mount --propagation private \
    sh -ec '
      host=$1 dir=$2 daemon=$3; shift 3
      hostname "$host"
      mount --bind "$dir/etc/hosts" /etc/hosts
      # slurm-client creates /etc/slurm; SLURM_CONF alone would do for the
      # commands, the bind also covers tools that read /etc/slurm directly.
      if [ -d /etc/slurm ]; then mount --bind "$dir/etc/slurm" /etc/slurm; fi
      if [ "$daemon" = 1 ]; then umount -l /run/netns 2>/dev/null || true; fi
      export SLURM_CONF="$dir/etc/slurm/slurm.conf"
      # A node daemon with memory enforcement: its own memory cgroup, seen
      # as the root of the hierarchy (a bind mount over the mount point,
      # and a cgroup namespace rooted there), so the slurmd of each node
      # keeps its jobs in a tree of its own.
      if [ "$daemon" = 1 ] && [ -n "$cg" ]; then
        mkdir -p "$cg"
        echo $$ >"$cg/cgroup.procs"
        mount --bind "$cg" /sys/fs/cgroup/memory
        exec unshare --cgroup "$@"
      fi
      exec "$@"' sh "$host" "$dir" "$daemon" "$@"
}

# start_daemon NAME NS HOST CMD...: CMD in the background as a daemon of NS,
# stdio to log/NAME.out, pid to run/NAME.pid. setsid gives it its own session
# so neither a terminal's signals nor a timeout wrapped around `up` reach it.
start_daemon() {
  local name=$1 ns=$2 host=$3
  shift 3
  (in_ns "$ns" "$host" 1 setsid "$@") </dev/null >"$dir/log/$name.out" 2>&1 &
  echo $! >"$dir/run/$name.pid"
}

# A Slurm client in the ctl network namespace, without the UTS/mount dance:
# enough for the polling in `up` and `status`, and several times cheaper.
ctl_client() { nsenter --net="/run/netns/$ctl_ns" env SLURM_CONF="$conf" timeout 5 "$@"; }

alive() { [ -n "${1:-}" ] && [ -e "/proc/$1" ] && [ "$(state_of "$1")" != Z ]; }
state_of() { local s; s=$(cat "/proc/$1/stat" 2>/dev/null) || return 0; s=${s##*) }; echo "${s%% *}"; }
ppid_of() { local s; s=$(cat "/proc/$1/stat" 2>/dev/null) || return 0; s=${s##*) }; s=${s#* }; echo "${s%% *}"; }
pid_of() { cat "$dir/run/$1.pid" 2>/dev/null || true; }

# Our namespaces: the names, not the ids, since iproute2 lists "NAME (id: N)".
our_ns() { ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$prefix-(ctl|n[0-9]+)\$" || true; }

# node_states: "n1 idle" lines, one per node (sinfo lists n1 once per partition).
node_states() { ctl_client sinfo -h -N -o '%N %T' 2>/dev/null | sort -u; }

# A node that answers: idle, or running jobs. Not "idle*" (the trailing * is
# Slurm's "not responding"), down, drained or unknown.
nodes_answering() {
  local s
  s=$(node_states) || return 1
  [ "$(grep -cE ' (idle|mixed|allocated|completing)$' <<<"$s")" -eq "$nodes" ]
}

is_up() {
  [ -f "$marker" ] && [ -e "/run/netns/$ctl_ns" ] && alive "$(cat "$dir/munge/munged.pid" 2>/dev/null)" \
    && ctld_up && nodes_answering
}

log_tail() { [ -f "$1" ] && { echo "--- last lines of $1:"; tail -n 8 "$1"; } >&2 || true; }

# wait_until WHAT PID LOG CHECK...: poll CHECK every 50 ms for up to $wait_s s;
# give up early, with the daemon's log, when PID dies.
wait_until() {
  local what=$1 pid=$2 logf=$3
  shift 3
  local end=$(($(date +%s%N) + wait_s * 1000000000))
  until "$@" >/dev/null 2>&1; do
    if [ -n "$pid" ] && ! alive "$pid"; then
      log_tail "$logf"
      die "$what: the process exited (log $logf); '$me down' cleans up"
    fi
    if [ "$(date +%s%N)" -ge "$end" ]; then
      log_tail "$logf"
      die "$what after $wait_s s (log $logf); '$me down' cleans up"
    fi
    sleep 0.05
  done
}

write_files() {
  mkdir -p "$dir"/{etc/slurm,munge,state,log,run,spool}
  # munged runs as munge and must reach its socket; Slurm's daemons run as root.
  chmod 755 "$dir" "$dir"/{etc,etc/slurm,state,log,run,spool}
  local i
  for i in $(seq 1 "$nodes"); do mkdir -p "$dir/spool/n$i"; done

  # The machine's own hosts file plus our names, bind-mounted over /etc/hosts in
  # every namespace: jobs reach each other and the login node by name ("ctl").
  {
    cat /etc/hosts
    echo "# muster test cluster $prefix"
    echo "$ctl_ip ctl"
    for i in $(seq 1 "$nodes"); do echo "$net.$((10 + i)) n$i"; done
  } >"$dir/etc/hosts"

  cat >"$conf" <<EOF
# Written by tests/slurm/cluster.sh for the test cluster "$prefix".
ClusterName=muster
# slurmctld starts only where hostname equals this name: its UTS namespace says ctl.
SlurmctldHost=ctl($ctl_ip)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# Our own munged; without this every daemon and client asks /run/munge/munge.socket.2.
AuthInfo=socket=$dir/munge/munge.socket
StateSaveLocation=$dir/state
# %n: each slurmd (node name) gets its own spool, pid and log.
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
SlurmctldPort=6817
SlurmdPort=6818
# The processes of a job are tracked through /proc; a task's memory is
# confined (task/cgroup) where the cgroup v1 memory controller is mounted.
ProctrackType=proctrack/linuxproc
TaskPlugin=$(memory_v1 && echo task/cgroup || echo task/none)
JobAcctGatherType=jobacct_gather/none
$(if accounting; then
    echo "# Accounting through slurmdbd on the login node (sacct)."
    echo "AccountingStorageType=accounting_storage/slurmdbd"
    echo "AccountingStorageHost=$ctl_ip"
    echo "# Clients reach slurmdbd through our munged, named here (not AuthInfo)."
    echo "AccountingStoragePass=$dir/munge/munge.socket"
  else
    echo "AccountingStorageType=accounting_storage/none"
  fi)
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
MailProg=/bin/true
# CPUs and memory are both consumed, so --cpus-per-task and --mem decide where
# (and whether) a job fits.
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
# Without a default, a job that asks no memory is given all of its node's, and
# every job would need a node of its own.
DefMemPerCPU=100
SchedulerType=sched/backfill
# By default batch jobs wait up to 3 s more (batch_sched_delay), and jobs only
# backfill starts (heterogeneous ones) up to 30 s (bf_interval). Even so sbatch
# never starts a job itself: the next once-a-second pass does, 0-1 s later
# (srun and salloc are allocated at once).
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0,bf_interval=1
# The node sizes below are what a node is, whatever the machine has (every
# node shares the same cores and memory): no node is drained as "Low RealMemory".
SlurmdParameters=config_overrides
ReturnToService=2
SlurmdTimeout=30
InactiveLimit=0
# Refuse at submission a job that no partition it names could ever hold (64
# CPUs on 2-CPU nodes): by default it would be accepted and pend for ever with
# reason PartitionConfig.
EnforcePartLimits=ALL
# Seconds between SIGTERM and SIGKILL when a job is cancelled or times out.
KillWait=2
# Finished jobs stay visible in squeue this long (seconds).
MinJobAge=300
# Two GPUs per node, backed by empty files (gres.conf): jobs that ask for GPUs
# are scheduled and refused as on a GPU cluster; nothing can run on them.
GresTypes=gpu
NodeName=n[1-$nodes] NodeHostname=n[1-$nodes] NodeAddr=$net.[11-$((10 + nodes))] CPUs=$cpus RealMemory=$mem Gres=gpu:2 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
PartitionName=small Nodes=n1 MaxTime=INFINITE State=UP
EOF
  if accounting; then
    cat >"$dir/etc/slurm/slurmdbd.conf" <<EOF
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
DbdHost=ctl
DbdAddr=$ctl_ip
SlurmUser=root
PidFile=$dir/run/slurmdbd.pid
LogFile=$dir/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=root
StorageLoc=slurm_acct_db
EOF
    chmod 600 "$dir/etc/slurm/slurmdbd.conf"
  fi
  mkdir -p "$dir/dev"
  touch "$dir/dev/nvidia0" "$dir/dev/nvidia1"
  cat >"$dir/etc/slurm/gres.conf" <<EOF
AutoDetect=off
NodeName=n[1-$nodes] Name=gpu File=$dir/dev/nvidia[0-1]
EOF
  if memory_v1; then
    cat >"$dir/etc/slurm/cgroup.conf" <<EOF
CgroupPlugin=cgroup/v1
CgroupAutomount=no
ConstrainRAMSpace=yes
# On a host with swap, a step past its memory would swap rather than be killed.
MemorySwappiness=0
EOF
  fi
}

# Our own munged: own key, own socket and pid file under $dir. It never touches
# the system's /etc/munge/munge.key or /run/munge.
# Accounting (sacct): slurmdbd on the login node, on a MariaDB of the
# cluster's own (its data in $dir/db, reached only through a unix socket,
# root authenticated by the socket). Where slurmdbd or MariaDB is missing
# (MUSTER_SLURM_ACCOUNTING=0 forces it), the cluster has no accounting.
accounting() {
  [ "${MUSTER_SLURM_ACCOUNTING:-1}" != 0 ] && command -v slurmdbd >/dev/null &&
    command -v mariadbd >/dev/null && command -v mariadb-install-db >/dev/null
}
db_socket() { echo "$dir/run/mariadb.sock"; }

start_accounting() {
  mkdir -p "$dir/db"
  # Both in the login node's network namespace (MariaDB uses none: it only
  # listens on its unix socket, a path every namespace reaches), so that
  # `down` finds them there with everything else, even after an `up` that
  # was killed half-way.
  nsenter --net="/run/netns/$ctl_ns" mariadb-install-db --no-defaults --user=root --datadir="$dir/db" \
    --auth-root-authentication-method=socket --skip-test-db >"$dir/log/mariadb-install.log" 2>&1 ||
    { log_tail "$dir/log/mariadb-install.log"; die "mariadb-install-db failed"; }
  nsenter --net="/run/netns/$ctl_ns" setsid mariadbd --no-defaults --user=root --datadir="$dir/db" --socket="$(db_socket)" \
    --skip-networking --pid-file="$dir/run/mariadbd.pid" --log-error="$dir/log/mariadb.log" \
    </dev/null >/dev/null 2>&1 &
  wait_until "MariaDB not answering on $(db_socket)" "$!" "$dir/log/mariadb.log" \
    mariadb-admin --no-defaults --socket="$(db_socket)" ping
  say "MariaDB up (socket $(db_socket))"
  # slurmdbd's MySQL client finds the socket through MYSQL_UNIX_PORT.
  MYSQL_UNIX_PORT=$(db_socket) start_daemon slurmdbd "$ctl_ns" ctl slurmdbd -D
  wait_until "slurmdbd not answering 'sacctmgr show cluster'" "$(pid_of slurmdbd)" "$dir/log/slurmdbd.log" \
    ctl_client sacctmgr -n show cluster
  ctl_client sacctmgr -i add cluster muster >/dev/null ||
    die "sacctmgr could not add the cluster (log $dir/log/slurmdbd.log)"
  say "slurmdbd up"
}

# Our MariaDB: the pid in its pid file, if it is ours (its datadir).
our_mariadbd() {
  local p
  p=$(cat "$dir/run/mariadbd.pid" 2>/dev/null) || return 0
  [ -n "$p" ] && alive "$p" && tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -qF -- "--datadir=$dir/db" \
    && echo "$p" || true
}

start_munged() {
  dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
  chown -R munge:munge "$dir/munge"
  # munged refuses a socket directory that others may write; reading is fine.
  chmod 755 "$dir/munge"
  chmod 400 "$dir/munge/munge.key"
  # --force: carry on where munged finds the directories above $dir "insecure"
  # (group-writable, say), which it otherwise refuses. --origin: the address
  # munged writes into each credential; Slurm names the submitting host after
  # it (AllocNode). Left alone it is the machine's, 127.0.0.1 here, which the
  # login node knows as "localhost". munged forks into the background; its
  # pid file is written before runuser returns.
  runuser -u munge -- munged --force \
    --socket="$dir/munge/munge.socket" --key-file="$dir/munge/munge.key" \
    --pid-file="$dir/munge/munged.pid" --log-file="$dir/munge/munged.log" \
    --seed-file="$dir/munge/munged.seed" --origin="$ctl_ip" \
    || { log_tail "$dir/munge/munged.log"; die "munged did not start"; }
  say "munged up (pid $(cat "$dir/munge/munged.pid"), socket $dir/munge/munge.socket)"
}

# The network: a bridge inside ctl and one veth per node, both ends created
# straight inside the namespaces (ip -n), so the root namespace gains no link.
make_network() {
  local i ns
  # iproute2 makes /run/netns a shared bind mount of itself the first time it
  # is used; if that is us, `down` undoes it once no namespace is left in it.
  mountpoint -q /run/netns 2>/dev/null || touch "$dir/run/made-run-netns"
  ip netns add "$ctl_ns"
  ip -n "$ctl_ns" link set lo up
  ip -n "$ctl_ns" link add br0 type bridge
  ip -n "$ctl_ns" addr add "$ctl_ip/24" dev br0
  ip -n "$ctl_ns" link set br0 up
  for i in $(seq 1 "$nodes"); do
    ns=$prefix-n$i
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip -n "$ctl_ns" link add "vn$i" type veth peer name eth0 netns "$ns"
    ip -n "$ctl_ns" link set "vn$i" master br0 up
    # Slurm needs a non-loopback IPv4 address in every namespace: a node's own
    # address, and the one slurmctld is reached at, are both on this /24.
    ip -n "$ns" addr add "$net.$((10 + i))/24" dev eth0
    ip -n "$ns" link set eth0 up
  done
  say "network up: ctl $ctl_ip, nodes $net.11-$((10 + nodes))"
}

up() {
  check_settings
  need_tools
  if is_up; then
    # Up and answering, maybe running jobs: leave it as it is.
    echo "cluster $prefix is already up ($nodes nodes answering, dir $dir)"
    return 0
  fi
  if [ -n "$(our_ns)" ] || [ -e "$dir" ]; then
    if [ -e "$dir" ] && [ ! -f "$marker" ] && [ -n "$(ls -A "$dir" 2>/dev/null)" ]; then
      die "$dir exists and was not made by cluster.sh; choose another MUSTER_SLURM_DIR"
    fi
    say "leftovers of an earlier run of cluster $prefix: tearing them down first"
    down
  fi

  mkdir -p "$dir"
  touch "$marker"
  write_files
  start_munged
  make_network
  if accounting; then start_accounting; fi

  # slurmd first registers the moment it starts and, if slurmctld does not
  # answer yet, only retries some seconds later: start the nodes after it.
  # -c: the state directory is new, there is nothing to recover (it still logs
  # harmless "Could not open job state file" errors).
  start_daemon slurmctld "$ctl_ns" ctl slurmctld -D -c -f "$conf"
  wait_until "slurmctld not answering 'scontrol ping'" "$(pid_of slurmctld)" "$dir/log/slurmctld.log" ctld_up
  say "slurmctld up"
  local i
  for i in $(seq 1 "$nodes"); do
    start_daemon "slurmd-n$i" "$prefix-n$i" "n$i" slurmd -D -N "n$i" -f "$conf"
  done
  wait_nodes
  say "cluster $prefix up: $nodes nodes idle"
  cat <<EOF
Slurm test cluster "$prefix" is up: login node ctl ($ctl_ip), nodes n1..n$nodes ($net.11..$net.$((10 + nodes))),
partitions debug (all nodes, default) and small (n1); files in $dir.
Run commands on the login node (keep MUSTER_SLURM_DIR/PREFIX as they are now):
  $me exec sinfo
  $me exec sbatch --wrap 'srun hostname -I'
  $me exec bash        # a shell on the login node
Stop it: $me down
EOF
}

ctld_up() { ctl_client scontrol ping 2>/dev/null | grep -q 'is UP'; }

nodes_known() {
  local s
  s=$(node_states) && [ -n "$s" ] && ! grep -q ' unknown' <<<"$s"
}

# Memory enforcement (OUT_OF_MEMORY, a step's limit): Slurm's task/cgroup on
# the cgroup v1 memory controller, where it is mounted. Each node's slurmd gets
# the cgroup PREFIX-nI under it (node_cgroup), made at start and removed by
# `down`. Elsewhere (a cgroup v2 host) tasks are unconfined.
memory_v1() { [ -f /sys/fs/cgroup/memory/memory.usage_in_bytes ]; }
node_cgroup() { echo "/sys/fs/cgroup/memory/$prefix-$1"; }

# ctld stop|start: slurmctld alone, for tests of Slurm being unreachable.
ctld() {
  check_settings
  [ -e "/run/netns/$ctl_ns" ] && [ -f "$conf" ] || die "cluster $prefix is not up: run '$me up'"
  local pid end
  pid=$(pid_of slurmctld)
  case ${1:-} in
    stop)
      alive "$pid" || return 0
      kill "$pid"
      end=$(($(date +%s%N) + wait_s * 1000000000))
      while alive "$pid"; do
        [ "$(date +%s%N)" -lt "$end" ] || die "slurmctld (pid $pid) still runs $wait_s s after SIGTERM"
        sleep 0.05
      done
      say "slurmctld stopped"
      ;;
    start)
      if alive "$pid"; then
        # running already: once it answers, there is nothing to start
        wait_until "slurmctld (pid $pid) not answering 'scontrol ping'" "$pid" "$dir/log/slurmctld.log" ctld_up
        return 0
      fi
      # Without -c: it recovers its jobs and nodes from its state directory.
      start_daemon slurmctld "$ctl_ns" ctl slurmctld -D -f "$conf"
      wait_until "slurmctld not answering 'scontrol ping'" "$(pid_of slurmctld)" "$dir/log/slurmctld.log" ctld_up
      # Its nodes are "unknown" until each slurmd answers again (a few
      # seconds); a node that is down stays down.
      wait_until "nodes still unknown to the restarted slurmctld" "$(pid_of slurmctld)" "$dir/log/slurmctld.log" nodes_known
      say "slurmctld up"
      ;;
    *) die "usage: $me ctld stop|start" ;;
  esac
}

# wait_nodes: until sinfo shows every node idle, for up to $wait_s s; a slurmd
# that exits, or a node still not idle at the end, is named with its log.
wait_nodes() {
  local end=$(($(date +%s%N) + wait_s * 1000000000)) i states st bad=
  while :; do
    states=$(node_states || true)
    [ "$(grep -c ' idle$' <<<"$states")" -eq "$nodes" ] && return 0
    for i in $(seq 1 "$nodes"); do
      if ! alive "$(pid_of "slurmd-n$i")"; then
        log_tail "$dir/log/slurmd-n$i.log"
        log_tail "$dir/log/slurmd-n$i.out"
        die "slurmd n$i exited (log $dir/log/slurmd-n$i.log); '$me down' cleans up"
      fi
    done
    alive "$(pid_of slurmctld)" || { log_tail "$dir/log/slurmctld.log"; die "slurmctld exited; '$me down' cleans up"; }
    [ "$(date +%s%N)" -lt "$end" ] || break
    sleep 0.05
  done
  for i in $(seq 1 "$nodes"); do
    st=$(awk -v n="n$i" '$1 == n {print $2}' <<<"$states")
    if [ "$st" != idle ]; then
      echo "cluster.sh: slurmd n$i not responding after $wait_s s (sinfo state: ${st:-none})" >&2
      log_tail "$dir/log/slurmd-n$i.log"
      bad+=" n$i"
    fi
  done
  die "nodes not idle:$bad; logs in $dir/log; '$me down' cleans up"
}

# Pids of the processes in our namespaces, less this script's ancestors (a
# runner started through `exec` may itself call `down`) and its descendants
# (its own helpers, when it runs inside the login node's namespace).
victims() {
  local ns p q ancestors=" "
  q=$$
  while [ -n "$q" ] && [ "$q" -gt 1 ]; do ancestors+="$q "; q=$(ppid_of "$q"); done
  for ns in $(our_ns); do
    for p in $(ip netns pids "$ns" 2>/dev/null || true); do
      case $ancestors in *" $p "*) continue ;; esac
      # Gone already (one of our own short-lived helpers, say): skip it.
      q=$(ppid_of "$p")
      [ -n "$q" ] || continue
      while [ -n "$q" ] && [ "$q" -gt 1 ] && [ "$q" != $$ ]; do q=$(ppid_of "$q"); done
      [ "$q" = $$ ] || echo "$p"
    done
  done
}

# Our munged, by its pid file, and only if that pid is still a munged serving
# our socket (the pid may have been reused since).
our_munged() {
  local p
  p=$(cat "$dir/munge/munged.pid" 2>/dev/null) || return 0
  [ -n "$p" ] && alive "$p" && tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -qF -- "--socket=$dir/munge/munge.socket" \
    && echo "$p" || true
}

down() {
  check_settings
  local pids munged left ns i deadline failed=0
  munged=$(echo $(our_munged) $(our_mariadbd))
  pids=$(victims)
  # SIGTERM first, to everything at once; munged goes with the rest since
  # nothing will authenticate any more. Then SIGKILL what is left after a
  # second: slurmstepd ignores SIGTERM and outlives its slurmd, and munged
  # takes almost 2 s to act on it while its key is about to be deleted anyway.
  if [ -n "$pids$munged" ]; then
    # shellcheck disable=SC2086 # word splitting of the pid lists is wanted
    kill -TERM $pids $munged 2>/dev/null || true
    deadline=$(($(date +%s%N) + 1000000000))
    while [ -n "$(victims)" ] && [ "$(date +%s%N)" -lt "$deadline" ]; do sleep 0.05; done
    deadline=$(($(date +%s%N) + 3000000000))
    while :; do
      left="$(victims) $(our_munged) $(our_mariadbd)"
      [ -n "${left// /}" ] && [ "$(date +%s%N)" -lt "$deadline" ] || break
      # shellcheck disable=SC2086
      kill -KILL $left 2>/dev/null || true
      sleep 0.05
    done
    left="$(victims) $(our_munged) $(our_mariadbd)"
    if [ -n "${left// /}" ]; then
      echo "cluster.sh: still running after SIGKILL: $(echo $left)" >&2
      failed=1
    fi
  fi
  # Each veth dies with its namespace; deleting them first makes sure of it
  # even when something outside still holds a namespace open.
  for ns in $(our_ns); do
    if [ "$ns" = "$ctl_ns" ]; then
      for i in $(ip -n "$ns" -o link show type veth 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1); do
        ip -n "$ns" link delete "$i" 2>/dev/null || true
      done
    fi
    ip netns delete "$ns" || failed=1
  done
  # The nodes' memory cgroups, innermost first (Slurm's job and step
  # cgroups inside them are empty now).
  local cg
  for cg in /sys/fs/cgroup/memory/"$prefix"-n*; do
    [[ -d $cg && ${cg##*/} =~ ^$prefix-n[0-9]+$ ]] || continue
    find "$cg" -depth -type d -exec rmdir {} + 2>/dev/null || true
    if [ -d "$cg" ]; then
      echo "cluster.sh: could not remove the cgroup $cg: $(cat "$cg/cgroup.procs" 2>/dev/null | wc -l) processes in it" >&2
      failed=1
    fi
  done
  if [ -f "$dir/run/made-run-netns" ] && [ -z "$(ls -A /run/netns 2>/dev/null)" ]; then
    umount /run/netns 2>/dev/null && rmdir /run/netns 2>/dev/null || true
  fi
  if [ -f "$marker" ]; then
    rm -rf "$dir"
  elif [ -e "$dir" ]; then
    echo "cluster.sh: left $dir in place: it has no $(basename "$marker"), so cluster.sh did not make it" >&2
  fi
  [ "$failed" -eq 0 ] || die "down did not remove everything (see above)"
  say "cluster $prefix down"
}

status() {
  check_settings
  local ns i p name ok=0 states
  echo "cluster $prefix, dir $dir, network $net.0/24"
  p=$(our_munged)
  if [ -n "$p" ]; then echo "  munged     running (pid $p)"; else echo "  munged     not running"; ok=1; fi
  for name in ctl $(seq -f 'n%g' 1 "$nodes"); do
    ns=$prefix-$name
    if [ ! -e "/run/netns/$ns" ]; then echo "  $ns  no namespace"; ok=1; continue; fi
    p=
    for i in $(ip netns pids "$ns" 2>/dev/null); do
      case $(cat "/proc/$i/comm" 2>/dev/null) in slurmctld | slurmd) p+="$(cat "/proc/$i/comm") (pid $i) " ;; esac
    done
    [ -n "$p" ] || { p="no slurm daemon"; ok=1; }
    echo "  $ns  $p"
  done
  if [ -e "/run/netns/$ctl_ns" ] && [ -f "$conf" ] && states=$(node_states) && [ -n "$states" ]; then
    sed 's/^/  node /' <<<"$states"
    nodes_answering || ok=1
  else
    echo "  slurmctld does not answer"
    ok=1
  fi
  return "$ok"
}

case ${1:-} in
  up) up ;;
  down) down ;;
  status) status ;;
  ctld) ctld "${2:-}" ;;
  exec)
    shift
    [ $# -gt 0 ] || die "usage: $me exec CMD [ARGS...]"
    check_settings
    [ -e "/run/netns/$ctl_ns" ] && [ -f "$conf" ] || die "cluster $prefix is not up (no namespace $ctl_ns or no $conf): run '$me up'"
    in_ns "$ctl_ns" ctl 0 "$@"
    ;;
  *)
    echo "usage: $me up|down|exec CMD...|status|ctld stop|start" >&2
    exit 2
    ;;
esac
