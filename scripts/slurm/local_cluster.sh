#!/usr/bin/env bash
# A SLURM cluster on this machine, for testing the job script (scripts/slurm/train.sbatch) the
# way users submit it: munged, slurmctld and one slurmd per node on 127.0.0.1, each node with this
# machine's cores, two partitions (jobs in "urgent" preempt those in "debug"), no accounting, no
# cgroups (proctrack/linuxproc, task/none). NODES=N (default 1) starts N nodes, node1..nodeN:
# N slurmd on this one host, each on a port of its own (Debian's SLURM is built with
# --enable-multiple-slurmd: `scontrol show config` says MULTIPLE_SLURMD = Yes). One node is
# named after this host.
# Every file it writes (config, munge key and socket, state, logs, pid files) lives in DIR, so it
# leaves any system SLURM alone; clients find it through SLURM_CONF=DIR/slurm.conf.
#
#   scripts/slurm/local_cluster.sh install        apt-get install slurmctld slurmd slurm-client
#                                                 munge, if missing (root and apt-get needed)
#   scripts/slurm/local_cluster.sh start [DIR]    install if missing, start, wait for the nodes
#                                                 to be idle; prints `export SLURM_CONF=...`
#   NODES=2 scripts/slurm/local_cluster.sh start [DIR]   the same with two nodes
#   scripts/slurm/local_cluster.sh stop [DIR]     cancel its jobs, stop the daemons it started
#
# DIR defaults to $SLURM_LOCAL_DIR, else /tmp/attnmt-slurm. The ports are free ones picked at
# start. No systemd: the daemons are started directly and stopped through their pid files.
# Exit status 77 with one line on stderr when it cannot run here (not root, no apt-get, ...), 1
# when it fails.
set -euo pipefail

PACKAGES=(slurmctld slurmd slurm-client munge)
cmd=${1:-}
DIR=${2:-${SLURM_LOCAL_DIR:-/tmp/attnmt-slurm}}
NODES=${NODES:-1}

cannot() { echo "local_cluster.sh: $*" >&2; exit 77; }
fail() { echo "local_cluster.sh: $*" >&2; exit 1; }

installed() {
  command -v slurmctld && command -v slurmd && command -v sbatch && command -v munged
} >/dev/null

install() {
  installed && return 0
  [ "$(id -u)" = 0 ] ||
    cannot "SLURM is missing and installing it needs root: apt-get install ${PACKAGES[*]}"
  command -v apt-get >/dev/null ||
    cannot "SLURM is missing and there is no apt-get: install ${PACKAGES[*]}"
  export DEBIAN_FRONTEND=noninteractive
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}"; } \
    >/dev/null || cannot "apt-get install ${PACKAGES[*]} failed (offline?)"
  installed ||
    fail "apt-get installed ${PACKAGES[*]}, yet slurmctld, slurmd, sbatch or munged is missing"
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])'
}

# Stop the daemon whose pid file is $1 (only that pid, and only if it is still the daemon $2).
stop_pid() {
  local file=$1 name=$2 pid
  [ -f "$file" ] || return 0
  pid=$(cat "$file")
  if [ -n "$pid" ] && grep -qs "$name" "/proc/$pid/comm"; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 100); do [ -d "/proc/$pid" ] || break; sleep 0.1; done
    [ -d "/proc/$pid" ] && kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$file"
}

start() {
  [ "$(id -u)" = 0 ] ||
    cannot "needs root (slurmd runs jobs as their users; munged and slurmctld run as root here)"
  install
  if [ -f "$DIR/slurmctld.pid" ] && [ -d "/proc/$(cat "$DIR/slurmctld.pid")" ]; then
    fail "a cluster is already running from $DIR: run 'stop $DIR' first"
  fi
  mkdir -p "$DIR"/{munge,state,spool}
  chmod 700 "$DIR/munge"
  [[ $NODES =~ ^[1-9][0-9]*$ ]] || fail "NODES=$NODES: give a number of nodes, 1 or more"
  local host cpus ctld_port slurmd_port names=() lines="" port i
  host=$(hostname -s)
  cpus=$(nproc)
  ctld_port=$(free_port)
  slurmd_port=$(free_port)
  while [ "$slurmd_port" = "$ctld_port" ]; do slurmd_port=$(free_port); done
  if [ "$NODES" = 1 ]; then
    names=("$host")
    lines="NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN"
  else  # several slurmd on this host: one port each, all on NodeHostname=this host
    for i in $(seq "$NODES"); do
      port=$(free_port)
      while [ "$port" = "$ctld_port" ]; do port=$(free_port); done
      names+=("node$i")
      lines+="NodeName=node$i NodeHostname=$host NodeAddr=127.0.0.1 Port=$port CPUs=$cpus"
      lines+=$' State=UNKNOWN\n'
    done
  fi
  mkdir -p "${names[@]/#/$DIR/spool/}"

  # munge: a key of our own, a socket of our own.
  [ -f "$DIR/munge/munge.key" ] || head -c 1024 /dev/urandom >"$DIR/munge/munge.key"
  chmod 400 "$DIR/munge/munge.key"
  munged --force --socket="$DIR/munge/munge.sock" --key-file="$DIR/munge/munge.key" \
    --log-file="$DIR/munge/munged.log" --pid-file="$DIR/munge/munged.pid" \
    --seed-file="$DIR/munge/munged.seed"

  cat >"$DIR/slurm.conf" <<EOF
# Written by scripts/slurm/local_cluster.sh: a test cluster of $NODES node(s) on this host.
ClusterName=attnmt-local
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge/munge.sock
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.%n.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
ReturnToService=2
$(printf '%b' "$lines")
# Jobs in "urgent" preempt jobs in "debug": SIGTERM to their steps, killed and requeued 60 s later.
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=1 GraceTime=60
PartitionName=urgent Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF
EOF
  export SLURM_CONF="$DIR/slurm.conf"
  slurmctld -f "$SLURM_CONF"
  for i in "${names[@]}"; do slurmd -f "$SLURM_CONF" -N "$i"; done

  local state="" idle
  idle=$(printf 'idle %.0s' "${names[@]}")
  for _ in $(seq 60); do
    state=$(sinfo -h -N -p debug -o %t 2>/dev/null | tr '\n' ' ' || true)
    [ "$state" = "$idle" ] && break
    sleep 0.5
  done
  if [ "$state" != "$idle" ]; then
    tail -n 5 "$DIR/slurmctld.log" "$DIR"/slurmd.*.log >&2 || true
    stop
    fail "the nodes did not become idle in 30 s (sinfo: '${state}'); logs above"
  fi
  echo "export SLURM_CONF=$SLURM_CONF"
}

stop() {
  export SLURM_CONF="$DIR/slurm.conf"
  if [ -f "$DIR/slurmctld.pid" ] && [ -f "$SLURM_CONF" ]; then
    scancel --full --quiet --user="$(id -un)" 2>/dev/null || true
    for _ in $(seq 60); do
      [ -z "$(squeue -h 2>/dev/null)" ] && break
      sleep 0.5
    done
  fi
  local file
  for file in "$DIR"/slurmd.*.pid; do stop_pid "$file" slurmd; done
  stop_pid "$DIR/slurmctld.pid" slurmctld
  stop_pid "$DIR/munge/munged.pid" munged
}

case $cmd in
  install) install ;;
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 install | start [DIR] | stop [DIR]" >&2; exit 2 ;;
esac
