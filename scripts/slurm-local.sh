#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, for trying and testing ferry under Slurm:
# installs Debian's slurm-wlm and munge when missing, writes a minimal slurm.conf
# (this host as the only node, oversubscribable so that more tasks than cores run),
# starts munged, slurmctld and slurmd, and waits until the node is idle.
#
#   scripts/slurm-local.sh start      # then: srun -n 4 ..., sbatch ...
#   scripts/slurm-local.sh stop       # stops the daemons and removes what start made
#
# Root only (it writes /etc/slurm and starts daemons). Nothing is left running or
# written after `stop` but the installed packages.
set -euo pipefail
STATE=/run/ferry-slurm # what start made, for stop
CONF=/etc/slurm/slurm.conf

die() {
    echo "slurm-local.sh: $*" >&2
    exit 1
}

start() {
    [ "$(id -u)" -eq 0 ] || die "needs root"
    if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
        echo "installing slurm-wlm and munge (apt)" >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
            slurm-wlm munge >/dev/null
    fi
    [ -e "$STATE" ] && die "already started (run stop first)"
    mkdir -p "$STATE"
    local host cpus mem
    host=$(hostname -s)
    cpus=$(nproc)
    mem=$(($(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 512))
    # munge: a key of our own unless the machine has one.
    if [ ! -s /etc/munge/munge.key ]; then
        mkdir -p /etc/munge
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
        chown munge:munge /etc/munge/munge.key 2>/dev/null || true
        chmod 400 /etc/munge/munge.key
        touch "$STATE/made-munge-key"
    fi
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown munge:munge /run/munge /var/log/munge /var/lib/munge 2>/dev/null || true
    if ! pgrep -r R,S,D -x munged >/dev/null; then
        runuser -u munge -- munged --force 2>/dev/null || munged --force
        touch "$STATE/started-munged"
    fi
    [ -e "$CONF" ] && cp "$CONF" "$STATE/slurm.conf.orig"
    mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
    cat >"$CONF" <<EOF
# Written by ferry's scripts/slurm-local.sh (removed by its stop).
ClusterName=ferry-test
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmdParameters=config_overrides
MpiDefault=none
SchedulerType=sched/backfill
JobAcctGatherType=jobacct_gather/none
# More tasks than cores: the node claims 16 CPUs, so srun -n 4 runs on 2 cores.
NodeName=$host CPUs=16 RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
    slurmctld
    slurmd
    for _ in $(seq 100); do
        sinfo -h -o %T 2>/dev/null | grep -q idle && break
        sleep 0.2
    done
    sinfo -h -o %T 2>/dev/null | grep -q idle ||
        die "the node did not come up: $(tail -3 /var/log/slurm/slurmd.log /var/log/slurm/slurmctld.log 2>/dev/null)"
    echo "slurm: one node ($host) idle in partition debug" >&2
}

stop() {
    [ -e "$STATE" ] || { echo "slurm-local.sh: not started" >&2; return 0; }
    scancel --user="$(id -un)" 2>/dev/null || true
    for pidf in "$STATE/slurmd.pid" "$STATE/slurmctld.pid"; do
        [ -s "$pidf" ] && kill "$(cat "$pidf")" 2>/dev/null || true
    done
    pkill -x slurmd 2>/dev/null || true
    pkill -x slurmctld 2>/dev/null || true
    if [ -e "$STATE/started-munged" ]; then pkill -x munged 2>/dev/null || true; fi
    # They shut down in their own time: wait (zombies of daemons whose parent never
    # reaps them do not count).
    alive() { pgrep -r R,S,D,T -x slurmd >/dev/null || pgrep -r R,S,D,T -x slurmctld >/dev/null; }
    for _ in $(seq 100); do
        alive || break
        sleep 0.1
    done
    if alive; then pkill -9 -x slurmd; pkill -9 -x slurmctld; fi || true
    if [ -e "$STATE/made-munge-key" ]; then rm -f /etc/munge/munge.key; fi
    rm -f "$CONF"
    [ -e "$STATE/slurm.conf.orig" ] && cp "$STATE/slurm.conf.orig" "$CONF"
    rm -rf /var/spool/slurmctld /var/spool/slurmd /var/log/slurm "$STATE"
    echo "slurm: stopped and removed" >&2
}

case "${1:-}" in
start) start ;;
stop) stop ;;
*) echo "usage: scripts/slurm-local.sh start|stop" >&2; exit 2 ;;
esac
