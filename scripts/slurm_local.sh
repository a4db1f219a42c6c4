#!/usr/bin/env bash
# A real single-node Slurm cluster on this machine, for the tests marked `slurm` and bench/bench_slurm.py.
#
#   bash scripts/slurm_local.sh start   # prints `export SLURM_CONF=...` on stdout (eval it); the rest on stderr
#   bash scripts/slurm_local.sh stop    # stops the daemons, removes the state folder
#   bash scripts/slurm_local.sh env     # the export line of a running cluster
#
# Debian's slurm-wlm and munge (installed with apt when missing), configured in a folder of their own
# ($SHIFTBENCH_SLURM_LOCAL, default ${TMPDIR:-/tmp}/shiftbench-slurm): munged, slurmctld and slurmd run as plain
# processes (no systemd, no cgroups: proctrack/linuxproc, task/none) on free ports, as root. One node, this
# machine's name, its CPUs and memory; one partition `debug`; jobs may be requeued; no accounting database
# (sacct is unavailable here: finished jobs stay visible to `scontrol show job` for MinJobAge, 10 minutes, and
# are logged by jobcomp/filetxt). `start` is idempotent: a running, healthy cluster is left as it is. It returns
# once `sinfo` shows the node idle and a trivial `sbatch --wrap` job has completed.
set -euo pipefail

DIR="${SHIFTBENCH_SLURM_LOCAL:-${TMPDIR:-/tmp}/shiftbench-slurm}"
CONF="$DIR/slurm.conf"
say() { echo "[slurm_local] $*" >&2; }

install_packages() {
  if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
    && command -v sbatch >/dev/null; then
    return
  fi
  if [ "$(id -u)" != 0 ]; then
    say "slurm-wlm and munge are missing and this is not root: install them (apt-get install slurm-wlm munge)"
    exit 1
  fi
  say "installing slurm-wlm and munge with apt"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge >"$DIR.apt.log" 2>&1 || {
    apt-get update -q >>"$DIR.apt.log" 2>&1
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge >>"$DIR.apt.log" 2>&1
  } || { say "apt-get failed: see $DIR.apt.log"; exit 1; }
}

running() {
  # Every daemon of this folder alive and the controller answering.
  for name in munged slurmctld slurmd; do
    [ -f "$DIR/$name.pid" ] && kill -0 "$(cat "$DIR/$name.pid")" 2>/dev/null || return 1
  done
  SLURM_CONF="$CONF" timeout 10 sinfo -h >/dev/null 2>&1
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

write_config() {
  local host cpus memory user ctld_port slurmd_port
  host="$(hostname -s)"
  cpus="$(nproc)"
  memory=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 512 ))  # MiB, less a margin for the OS
  user="$(id -un)"
  ctld_port="$(free_port)"
  slurmd_port="$(free_port)"
  while [ "$slurmd_port" = "$ctld_port" ]; do slurmd_port="$(free_port)"; done
  mkdir -p "$DIR/spool/ctld" "$DIR/spool/d" "$DIR/munge" "$DIR/logs"
  chmod 700 "$DIR/munge"
  dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
  chmod 400 "$DIR/munge/munge.key"
  cat >"$CONF" <<EOF
# Written by scripts/slurm_local.sh: a single-node cluster on this machine (tests and benchmarks only).
ClusterName=shiftbench-local
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=$user
SlurmdUser=$user
AuthType=auth/munge
CredType=cred/munge
# cred_expire is also how long a requeued job waits before it may start again (default 120 s).
AuthInfo=socket=$DIR/munge/munge.socket,cred_expire=10
StateSaveLocation=$DIR/spool/ctld
SlurmdSpoolDir=$DIR/spool/d
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/logs/slurmctld.log
SlurmdLogFile=$DIR/logs/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$DIR/logs/jobcomp.txt
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
# Look at pending jobs every second (default 60 s): a requeued job starts as soon as it may.
SchedulerParameters=sched_interval=1,bf_interval=1
JobRequeue=1
MinJobAge=600
KillWait=30
ReturnToService=2
MpiDefault=none
SwitchType=switch/none
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$memory State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
}

start_daemons() {
  munged --key-file="$DIR/munge/munge.key" --socket="$DIR/munge/munge.socket" --pid-file="$DIR/munged.pid" \
    --log-file="$DIR/logs/munged.log" --seed-file="$DIR/munge/munge.seed" --force
  SLURM_CONF="$CONF" slurmctld -f "$CONF" -i
  SLURM_CONF="$CONF" slurmd -f "$CONF"
}

wait_until_ready() {
  local state=""
  for _ in $(seq 60); do
    state="$(SLURM_CONF="$CONF" sinfo -h -o %T 2>/dev/null || true)"
    [ "$state" = idle ] && break
    sleep 1
  done
  if [ "$state" != idle ]; then
    say "the node is not idle after 60 s (sinfo: '${state}'); logs in $DIR/logs"
    exit 1
  fi
  local job
  job="$(SLURM_CONF="$CONF" sbatch --parsable --output="$DIR/logs/probe-%j.out" --wrap 'echo probe ok')"
  for _ in $(seq 60); do
    if ! SLURM_CONF="$CONF" squeue -h -j "$job" 2>/dev/null | grep -q .; then
      break
    fi
    sleep 0.5
  done
  if ! grep -q "probe ok" "$DIR/logs/probe-$job.out" 2>/dev/null; then
    say "a trivial sbatch job ($job) did not complete within 30 s; logs in $DIR/logs"
    exit 1
  fi
}

stop_daemons() {
  # Jobs still running first (their slurmstepd would outlive slurmd), then the daemons.
  if running; then
    SLURM_CONF="$CONF" scancel --user="$(id -un)" 2>/dev/null || true
    for _ in $(seq 40); do
      SLURM_CONF="$CONF" squeue -h -t running,completing 2>/dev/null | grep -q . || break
      sleep 1
    done
  fi
  for name in slurmd slurmctld munged; do
    local pidfile="$DIR/$name.pid"
    if [ -f "$pidfile" ]; then
      local pid
      pid="$(cat "$pidfile")"
      if kill -0 "$pid" 2>/dev/null; then
        kill "$pid"
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
      fi
    fi
  done
  return 0
}

case "${1:-}" in
  start)
    if running; then
      say "already running; logs in $DIR/logs"
    else
      stop_daemons
      rm -rf "$DIR"
      mkdir -p "$DIR"
      install_packages
      write_config
      start_daemons
      wait_until_ready
      say "a single-node cluster is up ($(SLURM_CONF="$CONF" sinfo -h -o '%N, %c CPUs, partition %P')); logs in $DIR/logs"
    fi
    echo "export SLURM_CONF=$CONF"
    ;;
  stop)
    stop_daemons
    rm -rf "$DIR"
    say "stopped"
    ;;
  env)
    running || { say "not running: bash scripts/slurm_local.sh start"; exit 1; }
    echo "export SLURM_CONF=$CONF"
    ;;
  *)
    echo "usage: bash scripts/slurm_local.sh start|stop|env" >&2
    exit 2
    ;;
esac
