#!/usr/bin/env bash
# A Slurm cluster of two nodes on this machine, from Debian's packages, to try the job scripts
# in jobs/ (and for `make test-slurm`). Needs root; installs munge, slurmctld and slurmd with
# apt-get when they are missing. No systemd: the daemons are started directly.
#
#   bash jobs/local-cluster.sh up       # start munged, slurmctld, a slurmd per node; wait idle
#   bash jobs/local-cluster.sh status   # daemons and sinfo
#   bash jobs/local-cluster.sh down     # stop them (state and logs stay in the state dir)
#
# Then, e.g.:  sbatch -n 4 jobs/strong-scaling.sbatch ;  srun -N 2 --ntasks-per-node=2 \
#   .venv/bin/python -c "from mpi4py import MPI; print(MPI.COMM_WORLD.Get_size())"
#
# The nodes are HOST-0 and HOST-1 (HOST the short host name), one slurmd each on its own port
# (HPCTRAIN_SLURM_NODES of them, default 2; 1 gives a one-node cluster), each declared with
# HPCTRAIN_SLURM_CPUS CPUs (default 16, whatever the real core count:
# SlurmdParameters=config_overrides), so ranks beyond the cores are oversubscribed as with
# `mpiexec -n 4` on a laptop. MPICH learns the nodes from Slurm's PMI, so a job on both gets a
# node-local communicator per node and its messages between them take the network path: a
# machine with two levels, as calibrate and the planner see a cluster. MpiDefault=pmi2: `srun`
# gives the `mpich` wheel's ranks a PMI server, so no mpiexec is needed inside a job. No
# accounting database (sacct does not work; scontrol show job does, for MinJobAge seconds after
# the end).
#
# Environment: HPCTRAIN_SLURM_DIR (state, logs, pid files; default /var/tmp/hpctrain-slurm),
# HPCTRAIN_SLURM_CPUS (default 16), HPCTRAIN_SLURM_NODES (default 2), HPCTRAIN_SLURM_TIMEOUT
# (seconds `up` waits; default 60).
# The configuration goes to /etc/slurm/slurm.conf, where sinfo, sbatch and srun look for it;
# an existing one not written by this script is left alone and `up` refuses.
set -euo pipefail

STATE_DIR=${HPCTRAIN_SLURM_DIR:-/var/tmp/hpctrain-slurm}
CPUS=${HPCTRAIN_SLURM_CPUS:-16}
COUNT=${HPCTRAIN_SLURM_NODES:-2}
TIMEOUT=${HPCTRAIN_SLURM_TIMEOUT:-60}
CONF=/etc/slurm/slurm.conf
MARKER="# written by hpctrain jobs/local-cluster.sh"
HOST=$(hostname -s)
NODES=()
for ((i = 0; i < COUNT; i++)); do NODES+=("$HOST-$i"); done
export SLURM_CONF=$CONF
PATH=$PATH:/usr/sbin:/sbin

say() { echo "local-cluster: $*"; }
die() { echo "local-cluster: error: $*" >&2; exit 1; }

# pid_alive FILE: the pid in FILE names a running process
pid_alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

munge_ok() { command -v munge >/dev/null && munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }

install_packages() {
    local missing=()
    command -v munged >/dev/null || missing+=(munge)
    command -v slurmctld >/dev/null || missing+=(slurmctld)
    command -v slurmd >/dev/null || missing+=(slurmd)
    command -v sbatch >/dev/null || missing+=(slurm-client)
    [ ${#missing[@]} -eq 0 ] && return 0
    [ "$(id -u)" -eq 0 ] || die "missing ${missing[*]}; run as root to apt-get install them"
    say "installing ${missing[*]} (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    # policy-rc.d and the lack of systemd keep the packages' own services from starting
    apt-get install -y --no-install-recommends "${missing[@]}" >"$STATE_DIR/apt.log" 2>&1 || {
        apt-get update >>"$STATE_DIR/apt.log" 2>&1 &&
        apt-get install -y --no-install-recommends "${missing[@]}" >>"$STATE_DIR/apt.log" 2>&1
    } || {
        tail -20 "$STATE_DIR/apt.log" >&2
        die "apt-get install ${missing[*]} failed (log: $STATE_DIR/apt.log)"
    }
}

# the configuration's text, for write_config and to tell whether the running one is it
config_text() {
    cat <<EOF
$MARKER: a cluster of ${#NODES[@]} node(s) on localhost
ClusterName=hpctrain-local
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$STATE_DIR/ctld
SlurmdSpoolDir=$STATE_DIR/slurmd/%n
SlurmctldPidFile=$STATE_DIR/slurmctld.pid
SlurmdPidFile=$STATE_DIR/slurmd-%n.pid
SlurmctldLogFile=$STATE_DIR/slurmctld.log
SlurmdLogFile=$STATE_DIR/slurmd-%n.log
SlurmctldPort=6817
SlurmdPort=6818
# No cgroups (they need a writable cgroup tree, which containers rarely give)
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
# srun is the MPI launcher: PMI-2 server in slurmstepd (it speaks the PMI-1 wire protocol too)
MpiDefault=pmi2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# The node's CPUs below, not the hardware's: oversubscribe a small machine on purpose
SlurmdParameters=config_overrides
ReturnToService=2
# Jobs may requeue themselves (jobs/*.sbatch do on SIGUSR1 before the time limit)
JobRequeue=1
MinJobAge=600
KillWait=30
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=60
EOF
    # one slurmd per node, each on its own port, all on this host
    local i
    for i in "${!NODES[@]}"; do
        echo "NodeName=${NODES[$i]} NodeHostname=$HOST NodeAddr=127.0.0.1 Port=$((6818 + i))" \
             "CPUs=$CPUS State=UNKNOWN"
    done
    local IFS=,
    echo "PartitionName=local Nodes=${NODES[*]} Default=YES MaxTime=INFINITE State=UP"
}

write_config() {
    if [ -e "$CONF" ] && ! grep -qF "$MARKER" "$CONF"; then
        die "$CONF exists and was not written by this script; this machine already has a Slurm" \
            "configuration, so use that cluster (or move $CONF aside)"
    fi
    mkdir -p /etc/slurm "$STATE_DIR/ctld" "$STATE_DIR/slurmd"
    local tmp="$CONF.tmp.$$"
    config_text >"$tmp"
    mv "$tmp" "$CONF"
}

start_munge() {
    if munge_ok; then return 0; fi
    [ -s /etc/munge/munge.key ] || {
        say "creating /etc/munge/munge.key"
        if command -v mungekey >/dev/null; then mungekey --create --force; else
            dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 2>/dev/null; fi
        chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
    }
    mkdir -p /run/munge /var/lib/munge /var/log/munge
    chown munge:munge /run/munge /var/lib/munge /var/log/munge
    chmod 755 /run/munge
    say "starting munged"
    # munged daemonizes; its pid file tells `down` that this script started it
    runuser -u munge -- /usr/sbin/munged --pid-file=/run/munge/munged.pid \
        || die "munged failed to start (see /var/log/munge/munged.log)"
    cp /run/munge/munged.pid "$STATE_DIR/munged.pid" 2>/dev/null || true
    for _ in $(seq 20); do munge_ok && return 0; sleep 0.5; done
    die "munged started but munge -n | unmunge fails (see /var/log/munge/munged.log)"
}

node_state() { sinfo -h -N -n "$1" -o '%T' 2>/dev/null | head -1; }

# wait_idle NODE: wait until NODE takes jobs
wait_idle() {
    local node=$1 state="" resumed=0 deadline=$((SECONDS + TIMEOUT))
    while [ $SECONDS -lt $deadline ]; do
        state=$(node_state "$node")
        case "$state" in
            idle|mixed|allocated|completing) say "node $node is $state"; return 0 ;;
            down*|drain*|fail*)
                # e.g. left down by an earlier unclean stop: ReturnToService covers most cases
                if [ $resumed -eq 0 ]; then
                    scontrol update NodeName="$node" State=RESUME >/dev/null 2>&1 || true
                    resumed=1
                fi ;;
        esac
        sleep 1
    done
    echo "local-cluster: error: node $node not idle after ${TIMEOUT}s" \
        "(state: '${state:-no answer}')" >&2
    sinfo -N -l >&2 || true
    scontrol show node "$node" 2>/dev/null | grep -i reason >&2 || true
    for log in slurmctld.log "slurmd-$node.log"; do
        echo "--- tail of $STATE_DIR/$log" >&2
        tail -15 "$STATE_DIR/$log" >&2 2>/dev/null || true
    done
    exit 1
}

# every slurmd of the configuration is running
slurmds_alive() {
    local node
    for node in "${NODES[@]}"; do pid_alive "$STATE_DIR/slurmd-$node.pid" || return 1; done
}

up() {
    local node
    if [ -f "$CONF" ] && [ "$(cat "$CONF")" = "$(config_text)" ] &&
        pid_alive "$STATE_DIR/slurmctld.pid" && slurmds_alive && munge_ok; then
        say "already up"
        for node in "${NODES[@]}"; do wait_idle "$node"; done
        return 0
    fi
    [ "$(id -u)" -eq 0 ] || die "run as root (it starts munged, slurmctld and slurmd)"
    mkdir -p "$STATE_DIR"
    install_packages
    # daemons started for another configuration (other nodes, or an earlier version of this
    # script) would not take the new one: stop them first
    if [ -f "$CONF" ] && [ "$(cat "$CONF")" != "$(config_text)" ]; then stop_slurm; fi
    write_config
    start_munge
    if ! pid_alive "$STATE_DIR/slurmctld.pid"; then
        say "starting slurmctld (log: $STATE_DIR/slurmctld.log)"
        slurmctld -f "$CONF" || die "slurmctld failed to start; see $STATE_DIR/slurmctld.log"
    fi
    for node in "${NODES[@]}"; do
        pid_alive "$STATE_DIR/slurmd-$node.pid" && continue
        say "starting slurmd for node $node (log: $STATE_DIR/slurmd-$node.log)"
        slurmd -f "$CONF" -N "$node" ||
            die "slurmd for $node failed to start; see $STATE_DIR/slurmd-$node.log"
    done
    for node in "${NODES[@]}"; do wait_idle "$node"; done
}

# stop NAME PIDFILE: SIGTERM the daemon, then wait up to 15 s for it to go
stop() {
    local name=$1 pidfile=$2 pid
    pid_alive "$pidfile" || return 0
    pid=$(cat "$pidfile")
    say "stopping $name (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.5; done
    say "$name (pid $pid) ignored SIGTERM for 15 s; sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
}

# stop_slurm: every slurmd this state dir knows (slurmd.pid: one started before the nodes were
# several), then slurmctld
stop_slurm() {
    local file
    for file in "$STATE_DIR"/slurmd.pid "$STATE_DIR"/slurmd-*.pid; do
        [ -e "$file" ] && stop slurmd "$file"
    done
    stop slurmctld "$STATE_DIR/slurmctld.pid"
}

down() {
    stop_slurm
    # munged only when this script started it (its pid is the one recorded at start)
    if [ -s "$STATE_DIR/munged.pid" ]; then
        if [ "$(cat "$STATE_DIR/munged.pid")" = "$(cat /run/munge/munged.pid 2>/dev/null)" ]; then
            stop munged "$STATE_DIR/munged.pid"
        fi
        rm -f "$STATE_DIR/munged.pid"
    fi
    say "down"
}

status() {
    local name file node rc=0
    for name in munged slurmctld; do
        file="$STATE_DIR/$name.pid"
        [ $name = munged ] && file=/run/munge/munged.pid
        if pid_alive "$file"; then echo "$name: running (pid $(cat "$file"))"
        else echo "$name: not running"; rc=3; fi
    done
    for node in "${NODES[@]}"; do
        file="$STATE_DIR/slurmd-$node.pid"
        if pid_alive "$file"; then echo "slurmd $node: running (pid $(cat "$file"))"
        else echo "slurmd $node: not running"; rc=3; fi
    done
    if [ $rc -eq 0 ]; then sinfo -N -l || rc=3; squeue || true; fi
    return $rc
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    status) status ;;
    *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
