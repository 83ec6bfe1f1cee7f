#!/usr/bin/env bash
# A single-node Slurm cluster on localhost, for tests/test_slurm.py (Debian, root, no systemd).
#
#   scripts/slurm-local.sh install [PACKAGE...]
#                                      apt-get install Slurm, munge, slurmdbd and MariaDB
#                                      where missing, and the PACKAGEs in the same call
#   scripts/slurm-local.sh start DIR   start munged, MariaDB, slurmdbd, slurmctld and slurmd
#   scripts/slurm-local.sh stop DIR    cancel the jobs, stop the daemons, restore /etc/slurm
#
# Everything lives in DIR (configs, munge key and socket, database, state, spool, logs, pid
# files) except /etc/slurm/slurm.conf and gres.conf: Snakemake's job-step plugin runs `srun`
# inside each job without SLURM_CONF, so Slurm's default path must hold the config. start
# keeps the files it replaces in DIR/etc-backup and stop puts them back (or removes ours).
# sacct needs slurmdbd, and slurmdbd a database: MariaDB runs from DIR on a Unix socket and
# 127.0.0.1:$PROFBENCH_SLURM_DB_PORT (default 33061). No cgroups (containers rarely allow
# them): proctrack/linuxproc and task/none. The node advertises four GPUs (gres/gpu, each a
# character device that is /dev/null: DIR/dev/gpu0..3), so `--gpus=N` jobs schedule on a
# machine without one and get CUDA_VISIBLE_DEVICES as on a GPU node; the CPU smoke jobs do not
# touch them. Four, not one: GPU jobs then run side by side as on a cluster (limited by the
# node's CPUs), and analysis jobs are not held back behind GPU jobs waiting for the one GPU
# (Slurm's main scheduler starts no job after the first one that must wait in a partition).
set -euo pipefail

ETC=/etc/slurm
DB_PORT=${PROFBENCH_SLURM_DB_PORT:-33061}
MARK="Written by scripts/slurm-local.sh"
NODE_MEM_MB=65536  # declared, not checked (config_overrides): jobs ask up to 8 GB each

die() { echo "slurm-local: $*" >&2; exit 1; }

install() {  # install [PACKAGE...]: other packages come along, one apt-get call for all
  local packages=("$@") tool
  for tool in slurmctld slurmd slurmdbd sbatch sacct munged mariadbd; do
    if ! command -v "$tool" >/dev/null; then
      packages+=(slurm-wlm slurmdbd munge mariadb-server)
      break
    fi
  done
  if [ ${#packages[@]} -eq 0 ]; then
    echo "slurm-local: Slurm, munge and MariaDB are installed"
    return
  fi
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
    die "missing packages; install them (Debian: apt-get install ${packages[*]}) and rerun"
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # policy-rc.d 101: the packages must not start their daemons (we start our own).
  local policy=/usr/sbin/policy-rc.d created=
  [ -e "$policy" ] || { printf '#!/bin/sh\nexit 101\n' > "$policy"; chmod +x "$policy"; created=1; }
  # --force-unsafe-io: dpkg skips its fsync after every file it unpacks (the setting of
  # container image builds); a machine that crashed mid-install installs again.
  apt-get install -y -qq --no-install-recommends -o Dpkg::Options::=--force-unsafe-io \
      "${packages[@]}" >/dev/null || { [ -n "$created" ] && rm -f "$policy"; die "apt-get install failed"; }
  [ -n "$created" ] && rm -f "$policy"
  echo "slurm-local: installed ${packages[*]} ($(sbatch --version))"
}

write_configs() {
  local dir=$1 host cpus
  host=$(hostname -s)
  cpus=$(nproc)
  mkdir -p "$dir"/{etc,state,spool,log,run,munge,mysql,dev}
  for i in 0 1 2 3; do  # /dev/null's major and minor
    [ -e "$dir/dev/gpu$i" ] || mknod "$dir/dev/gpu$i" c 1 3
  done
  cat > "$dir/etc/slurm.conf" <<EOF
# $MARK for a throwaway test cluster (state in $dir).
ClusterName=profbench
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/linux
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePass=$dir/munge/munge.socket
AccountingStorageTRES=gres/gpu
AccountingStoreFlags=job_comment
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
GresTypes=gpu
MpiDefault=none
ReturnToService=2
MinJobAge=600
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$NODE_MEM_MB Gres=gpu:4 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
  cat > "$dir/etc/gres.conf" <<EOF
# $MARK (state in $dir).
AutoDetect=off
NodeName=$host Name=gpu File=$dir/dev/gpu[0-3]
EOF
  cat > "$dir/etc/slurmdbd.conf" <<EOF
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
DbdHost=localhost
DbdAddr=127.0.0.1
SlurmUser=root
PidFile=$dir/run/slurmdbd.pid
LogFile=$dir/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
EOF
  chmod 600 "$dir/etc/slurmdbd.conf"
}

install_etc_configs() {
  local dir=$1
  mkdir -p "$dir/etc-backup" "$ETC"
  rm -f "$dir"/etc-backup/*
  for f in slurm.conf gres.conf; do
    # A file of ours left by a run that was never stopped is not worth keeping.
    if [ -e "$ETC/$f" ] && ! grep -q "$MARK" "$ETC/$f"; then
      cp -p "$ETC/$f" "$dir/etc-backup/$f"
    else
      touch "$dir/etc-backup/$f.absent"
    fi
    cp "$dir/etc/$f" "$ETC/$f"
  done
}

restore_etc_configs() {
  local dir=$1
  for f in slurm.conf gres.conf; do
    if [ -e "$dir/etc-backup/$f" ]; then
      cp -p "$dir/etc-backup/$f" "$ETC/$f"
    elif [ -e "$dir/etc-backup/$f.absent" ]; then
      rm -f "$ETC/$f"
    fi
  done
}

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
  local seconds=$1 what=$2; shift 2
  for _ in $(seq $((seconds * 5))); do
    timeout 5 "$@" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  die "$what did not come up in ${seconds}s (logs in $DIR/log)"
}

start_munge() {
  mungekey --create --keyfile="$DIR/munge/munge.key" --force
  chmod 600 "$DIR/munge/munge.key"
  munged --force --key-file="$DIR/munge/munge.key" --socket="$DIR/munge/munge.socket" \
      --pid-file="$DIR/run/munged.pid" --log-file="$DIR/log/munged.log" \
      --seed-file="$DIR/munge/munge.seed"
  wait_for 10 munged munge --socket="$DIR/munge/munge.socket" --string=ok
}

start_mariadb() {
  mariadb-install-db --no-defaults --datadir="$DIR/mysql" --user=root \
      --auth-root-authentication-method=socket --skip-test-db > "$DIR/log/mariadb-install.log" 2>&1
  # mariadbd stays in the foreground: run it in the background and keep its pid.
  setsid mariadbd --no-defaults --datadir="$DIR/mysql" --user=root \
      --socket="$DIR/run/mysqld.sock" --port="$DB_PORT" --bind-address=127.0.0.1 \
      --skip-name-resolve --pid-file="$DIR/run/mariadbd.pid" \
      --log-error="$DIR/log/mariadb.log" < /dev/null > /dev/null 2>&1 &
  wait_for 30 MariaDB mariadb --no-defaults --socket="$DIR/run/mysqld.sock" -u root -e 'SELECT 1'
  mariadb --no-defaults --socket="$DIR/run/mysqld.sock" -u root -e "
    CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
}

start_slurm() {
  # slurmdbd reads slurmdbd.conf from the directory of SLURM_CONF.
  SLURM_CONF="$DIR/etc/slurm.conf" slurmdbd
  wait_for 30 slurmdbd sacctmgr -i list cluster
  sacctmgr -i add cluster profbench >/dev/null 2>&1 || true
  slurmctld
  wait_for 30 slurmctld scontrol ping
  slurmd
  wait_for 30 "slurmd (node idle)" bash -c 'sinfo -h -o %t | grep -qx idle'
}

start() {
  [ "$(id -u)" -eq 0 ] || die "start needs root (it writes $ETC and runs the daemons as root)"
  for daemon in slurmctld slurmd slurmdbd; do
    pgrep -x "$daemon" >/dev/null && die "$daemon is already running; not touching a live cluster"
  done
  mkdir -p "$DIR"
  write_configs "$DIR"
  install_etc_configs "$DIR"
  start_munge
  start_mariadb
  start_slurm
  echo "slurm-local: cluster up ($(sinfo -h -o '%P %D %t %G'))"
}

stop_daemons() {  # stop_daemons NAME...: TERM the daemons (pids in DIR/run/NAME.pid), wait
  local pids=() name pid
  for name in "$@"; do
    [ -s "$DIR/run/$name.pid" ] || continue
    pid=$(cat "$DIR/run/$name.pid")
    kill -TERM "$pid" 2>/dev/null && pids+=("$pid")
  done
  for _ in $(seq 150); do
    alive=()
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive+=("$pid"); done
    [ ${#alive[@]} -eq 0 ] && return 0
    sleep 0.1
  done
  for pid in "${alive[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
}

stop() {
  [ -d "$DIR" ] || die "no cluster state in $DIR"
  if [ -s "$DIR/run/slurmctld.pid" ] && kill -0 "$(cat "$DIR/run/slurmctld.pid")" 2>/dev/null; then
    scancel --full --user="$(id -un)" 2>/dev/null || true
    for _ in $(seq 50); do [ -z "$(squeue -h 2>/dev/null)" ] && break; sleep 0.2; done
  fi
  # slurmctld reports to slurmdbd on its way out; munged authenticates until the end.
  stop_daemons slurmd slurmctld
  stop_daemons slurmdbd
  stop_daemons mariadbd munged
  restore_etc_configs "$DIR"
  echo "slurm-local: cluster stopped"
}

command=${1:-}
case "$command" in
  install) shift; install "$@" ;;
  start|stop)
    [ $# -eq 2 ] || die "usage: $0 $command DIR"
    DIR=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")
    "$command" ;;
  *) die "usage: $0 install [PACKAGE...] | start DIR | stop DIR" ;;
esac
