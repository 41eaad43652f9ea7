#!/usr/bin/env bash
# make test-slurm: the job scripts in jobs/ under a real Slurm, at tiny sizes, in a few minutes.
#
#   bash tests/slurm/run.sh          # as root, after `make install`
#
# Brings up the one-node cluster of jobs/local-cluster.sh when it is not up (and leaves it up;
# `bash jobs/local-cluster.sh down` stops it), then submits with sbatch and waits for each:
#   verify.sbatch       smallcnn, conv=domain:2x2,fc=4x1 on 4 tasks: must PASS
#   calibrate.sbatch    QUICK=1 on 4 tasks, to its default place in the config directory, which
#                       is the work dir's (XDG_CONFIG_HOME=WORK/config, not the user's)
#   strong-scaling      alexnet 67x67, global batch 8, 2 steps, compute from FLOPs;
#                       P = 1, 2, 4 x four grids
#   weak-scaling        the same with 4 images per process; P = 1, 2, 4 x two grids
#   weak-scaling again  P = 2, 30 steps; SIGUSR1 to the batch shell after step 3 (as
#                       --signal=B:USR1@120 would): checkpoint, requeue, resume, finish
# and runs `srun -n 4 python -m hpctrain --grid auto` directly, on the calibrated profile
# (--machine local). On two nodes (the local cluster has two), `srun -N 2 --ntasks-per-node=2`
# runs calibrate, which must find both levels, and verify under the plan made for that profile,
# which must PASS with no placement warning. Then
# tests/slurm/check_logs.py checks every HDF5 log: present, finished, on P processes, one row
# per step, nothing else written. Exit status 0 when all is well; on any failure (or a job
# taking longer than TEST_SLURM_JOB_TIMEOUT seconds, default 300) it prints squeue, the job
# and the tail of its output and the daemons' logs, cancels its jobs and exits 1.
#
# Environment: VENV (default .venv), TEST_SLURM_DIR (work dir, default runs/test-slurm, emptied
# first), TEST_SLURM_UP=0 to use the cluster sinfo already talks to instead of the local one.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
VENV=${VENV:-.venv}
case "$VENV" in /*) ;; *) VENV="$ROOT/$VENV" ;; esac  # absolute, for the jobs' PATH
WORK=$(realpath -m "${TEST_SLURM_DIR:-runs/test-slurm}")
JOB_TIMEOUT=${TEST_SLURM_JOB_TIMEOUT:-300}
START=$SECONDS
JOBS=()

say() { echo "== test-slurm [$((SECONDS - START)) s] $*"; }

diagnose() {
    echo "--- squeue"; squeue 2>&1 || true
    local jid=${1:-} out=${2:-}
    if [ -n "$jid" ]; then
        echo "--- scontrol show job $jid"
        scontrol show job "$jid" 2>&1 || true
    fi
    if [ -n "$out" ]; then echo "--- tail of $out"; tail -40 "$out" 2>&1 || true; fi
    local dir=${HPCTRAIN_SLURM_DIR:-/var/tmp/hpctrain-slurm} log
    for log in "$dir"/slurmctld.log "$dir"/slurmd-*.log; do
        [ -f "$log" ] && { echo "--- tail of $log"; tail -15 "$log"; }
    done
    return 0
}

# fail MESSAGE [JOBID OUTPUT]: diagnostics, cancel this test's jobs, exit 1
fail() {
    echo "test-slurm: FAILED: $1" >&2
    diagnose "${2:-}" "${3:-}" >&2
    [ ${#JOBS[@]} -eq 0 ] || scancel "${JOBS[@]}" 2>/dev/null || true
    exit 1
}

job_field() { scontrol show job -o "$1" 2>/dev/null | grep -oE "(^| )$2=[^ ]*" | cut -d= -f2-; }

# submit NAME [VAR=VALUE ...] -- SBATCH_ARGS...: sets jid; the output goes to WORK/NAME-JID.out
submit() {
    local name=$1 envs=()
    shift
    while [ "$1" != -- ]; do envs+=("$1"); shift; done
    shift
    jid=$(env "${envs[@]}" sbatch --parsable -t 10 -o "$WORK/$name-%j.out" "$@") ||
        fail "sbatch $* did not submit"
    jid=${jid%%;*}
    JOBS+=("$jid")
}

# wait_job JOBID NAME: until the job has ended; fails unless it COMPLETED with exit code 0
wait_job() {
    local jid=$1 name=$2 out="$WORK/$2-$1.out" state deadline=$((SECONDS + JOB_TIMEOUT))
    while [ $SECONDS -lt $deadline ]; do
        state=$(job_field "$jid" JobState)
        case "$state" in
            COMPLETED)
                [ "$(job_field "$jid" ExitCode)" = 0:0 ] ||
                    fail "$name (job $jid) exit code $(job_field "$jid" ExitCode)" "$jid" "$out"
                say "$name (job $jid) completed"
                return 0 ;;
            "") fail "$name (job $jid) unknown to scontrol" "$jid" "$out" ;;
            PENDING|CONFIGURING|RUNNING|COMPLETING|REQUEUED|RESIZING|SUSPENDED) sleep 1 ;;
            *) fail "$name (job $jid) ended $state, exit code $(job_field "$jid" ExitCode)" \
                   "$jid" "$out" ;;
        esac
    done
    fail "$name (job $jid) not done after ${JOB_TIMEOUT}s" "$jid" "$out"
}

# ---------------------------------------------------------------------------------------------
[ -x "$VENV/bin/python" ] || fail "no $VENV/bin/python: run make install first"
"$VENV/bin/python" -c 'import hpctrain, mpi4py, h5py' || fail "$VENV cannot import hpctrain"
if [ "${TEST_SLURM_UP:-1}" = 1 ]; then
    say "bash jobs/local-cluster.sh up"
    bash jobs/local-cluster.sh up || fail "the local Slurm did not come up"
fi
command -v sbatch >/dev/null || fail "no sbatch on PATH"
sinfo >/dev/null || fail "sinfo cannot reach slurmctld"

case "$WORK" in
    /|"$ROOT"|"$HOME") fail "TEST_SLURM_DIR=$WORK: it is emptied first; name a work dir" ;;
esac
rm -rf "$WORK"
mkdir -p "$WORK/direct"
# What `source .venv/bin/activate` does for the jobs' `python`; sbatch passes the environment on
export PATH="$VENV/bin:$PATH"
export HPCTRAIN_CACHE_DIR="$WORK/cache" # measured compute times: this test's own
export XDG_CONFIG_HOME="$WORK/config"  # calibrate writes here, not into the user's config
PROFILE="$XDG_CONFIG_HOME/hpctrain/machines/local.toml"
# The sweeps price compute from FLOPs: timing every kernel of every grid at every P would take
# minutes; measured compute under srun is what the direct run and the two-node steps check.
tiny=(NET=alexnet IMAGE_SIZE=67 STEPS=2 MACHINE=default PROCS="1 2 4"
      EXTRA_ARGS="--print-every=1 --compute=flops")

say "srun -n 2: MPI ranks see each other"
sizes=$(timeout 120 srun -n 2 -t 2 python -c \
    'from mpi4py import MPI; print(MPI.COMM_WORLD.Get_size())' | tr '\n' ' ') ||
    fail "srun -n 2 python -c ... failed"
[ "$sizes" = "2 2 " ] || fail "srun -n 2: world sizes '$sizes', want '2 2': no PMI reached MPI"

say "verify.sbatch"
submit verify NET=smallcnn -- -n 4 jobs/verify.sbatch
wait_job "$jid" verify
out="$WORK/verify-$jid.out"
grep -q "PASS" "$out" || fail "verify printed no PASS" "$jid" "$out"

say "calibrate.sbatch"
submit calibrate QUICK=1 NAME=test-slurm -- -n 4 jobs/calibrate.sbatch
wait_job "$jid" calibrate
[ -f "$PROFILE" ] || fail "calibrate wrote no $PROFILE" "$jid" "$WORK/calibrate-$jid.out"

say "strong-scaling.sbatch"
submit strong "${tiny[@]}" BATCH=8 RUN_DIR="$WORK/strong" -- -n 4 jobs/strong-scaling.sbatch
wait_job "$jid" strong

say "weak-scaling.sbatch"
submit weak "${tiny[@]}" BATCH=4 GRIDS="1xP square" RUN_DIR="$WORK/weak" \
    -- -n 4 jobs/weak-scaling.sbatch
wait_job "$jid" weak

say "weak-scaling.sbatch stopped by SIGUSR1, requeued and resumed"
submit signal "${tiny[@]}" STEPS=30 BATCH=4 PROCS=2 GRIDS=1xP RUN_DIR="$WORK/signal" \
    -- -n 2 jobs/weak-scaling.sbatch
out="$WORK/signal-$jid.out"
deadline=$((SECONDS + JOB_TIMEOUT))
until grep -qE '^step +3/30' "$out" 2>/dev/null; do
    [ $SECONDS -lt $deadline ] || fail "signal: no step 3 after ${JOB_TIMEOUT}s" "$jid" "$out"
    [ "$(job_field "$jid" JobState)" != COMPLETED ] || fail "signal: ended at once" "$jid" "$out"
    sleep 0.5
done
scancel --batch --signal=USR1 "$jid" || fail "scancel --batch --signal=USR1 $jid" "$jid" "$out"
# A requeued job waits ~2 minutes (BeginTime) before it may start again; let it start sooner,
# though not within the second of the requeue, when slurmd still refuses its revoked credential
# ("Killing non-startable batch job: Job credential revoked": the job would fail)
until [ "$(job_field "$jid" Restarts)" -ge 1 ] 2>/dev/null; do
    [ $SECONDS -lt $deadline ] || fail "signal: job not requeued after SIGUSR1" "$jid" "$out"
    case "$(job_field "$jid" JobState)" in COMPLETED|FAILED|CANCELLED)
        fail "signal: job ended instead of requeueing itself" "$jid" "$out" ;; esac
    sleep 0.5
done
sleep 2
scontrol update JobId="$jid" StartTime=now || fail "scontrol update StartTime=now" "$jid" "$out"
wait_job "$jid" signal
grep -q "stopped by SIGUSR1 after step" "$out" || fail "signal: no SIGUSR1 stop" "$jid" "$out"
grep -q "resumed from" "$out" || fail "signal: the requeued job did not resume" "$jid" "$out"

say "srun -n 4 python -m hpctrain --grid auto (on the calibrated profile)"
direct="$WORK/direct/alexnet-auto-p4.h5"
timeout 300 srun -n 4 -t 5 python -m hpctrain --net alexnet --grid auto --image-size 127 \
    --batch 16 --steps 3 --machine local --plan-file "$WORK/direct/auto.plan" \
    --log "$direct" >"$WORK/direct/srun.out" 2>&1 ||
    fail "srun -n 4 python -m hpctrain (exit $?)" "" "$WORK/direct/srun.out"

nodes=$(sinfo -h -N -o %N | sort -u | wc -l)
if [ "$nodes" -ge 2 ]; then
    say "srun -N 2 --ntasks-per-node=2: calibrate finds two levels, verify passes on its plan"
    two="$WORK/two-nodes"
    mkdir -p "$two"
    (cd "$two" && timeout 300 srun -N 2 --ntasks-per-node=2 -t 5 python -m hpctrain calibrate \
        --quick --threads 1 --out "$two/profile.toml") >"$two/calibrate.out" 2>&1 ||
        fail "srun -N 2 python -m hpctrain calibrate (exit $?)" "" "$two/calibrate.out"
    "$VENV/bin/python" -c "
import sys
from hpctrain.cost.machine import load_machine
m = load_machine(sys.argv[1])
assert m.levelled and m.ranks_per_node == 2 and 2 in m.network.fits['allreduce'], m
" "$two/profile.toml" || fail "calibrate on two nodes wrote no profile with levels" "" \
        "$two/calibrate.out"
    (cd "$two" && timeout 300 srun -N 2 --ntasks-per-node=2 -t 5 python -m hpctrain verify \
        --net smallcnn --grid auto --batch 8 --threads 1 --machine "$two/profile.toml") \
        >"$two/verify.out" 2>&1 || fail "srun -N 2 python -m hpctrain verify (exit $?)" "" \
        "$two/verify.out"
    grep -q PASS "$two/verify.out" || fail "verify on two nodes printed no PASS" "" \
        "$two/verify.out"
    ! grep -q "^warning" "$two/verify.out" ||
        fail "verify on two nodes: the placement did not match the profile" "" "$two/verify.out"
else
    say "one node in the cluster: the two-node steps are skipped"
fi

say "checking the logs"
specs=()
for p in 1 2 4; do
    grids="auto 1x$p conv1x$p-fc${p}x1"
    [ $p -eq 1 ] && grids=1x1
    [ $p -eq 4 ] && grids+=" 2x2"
    for g in $grids; do specs+=("$WORK/strong/strong-p$p-$g.h5:processes=$p,steps=2,batch=8"); done
    grids="1x$p"
    [ $p -eq 4 ] && grids+=" 2x2"
    for g in $grids; do
        specs+=("$WORK/weak/weak-p$p-$g.h5:processes=$p,steps=2,batch=$((4 * p))")
    done
done
specs+=("$WORK/signal/weak-p2-1x2.h5:processes=2,steps=30,batch=8,resumed")
specs+=("$direct:processes=4,steps=3,batch=16")
"$VENV/bin/python" tests/slurm/check_logs.py --profile "$PROFILE" \
    --only "$WORK/strong" --only "$WORK/weak" --only "$WORK/signal" --only "$WORK/direct" \
    "${specs[@]}" || fail "tests/slurm/check_logs.py found problems (above)"

say "all passed (work dir $WORK; the cluster stays up: bash jobs/local-cluster.sh down)"
