# Shared by the job scripts in jobs/; sourced, not run. (Threads per rank need no variable:
# hpctrain takes them from the CPU binding or --cpus-per-task.) Each *.sbatch finds it in
# $HPCTRAIN_JOBS_DIR, else in jobs/ under the submit directory (sbatch runs a copy of the script,
# so the script's own directory is unknown).
#
# check_mpi N: fails unless srun's N tasks see one MPI world of N.
#
# scaling_sweep strong|weak: for each P in PROCS and each grid in GRIDS, one
#   srun -n P $PYTHON -m hpctrain --net NET --grid G --batch B --steps STEPS \
#        --log RUN_DIR/KIND-pP-NAME.h5 --checkpoint-dir RUN_DIR/checkpoints/KIND-pP-NAME --resume
# with B = BATCH (strong: the global batch is fixed) or BATCH * P (weak: BATCH per process).
#
# Signals: the job is submitted with --signal=B:USR1@SECONDS, so only this shell gets SIGUSR1
# before the time limit. It forwards the signal to the running srun (which hands it to every
# rank: hpctrain finishes the step, checkpoints and exits 0), starts no further run, and
# requeues the job (REQUEUE=1). The requeued job has the same id, hence the same RUN_DIR: runs
# already finished are skipped, the interrupted one continues from its checkpoint (--resume),
# its log continued in place. SIGTERM (the time limit itself, or scancel) stops the same way,
# without the requeue.

say() { echo "[$(date +%H:%M:%S)] $*"; }

# GRIDS tokens for P processes, one concrete --grid per line (duplicates and misfits dropped):
#   auto          the planner's choice
#   square        the most square R x C with R, C > 1 and R <= C (none when P is 1 or prime)
#   anything with P, e.g. 1xP, Px1, conv=1xP,fc=Px1, conv=domain:Px1,fc=1xP: P substituted
#   a literal spec (2x2, conv=2x2,fc=4x1): kept only when every R x C in it multiplies to P
#   a plan file: used as it is (a plan is for one P: set PROCS to it)
# With one process every plan is 1x1, which runs once.
grids_for() {
    local p=$1 token spec r best rest
    shift
    if [ "$p" -eq 1 ]; then echo 1x1; return; fi
    for token in "$@"; do
        case "$token" in
            auto) spec=auto ;;
            square)
                best=""
                for ((r = 2; r * r <= p; r++)); do
                    if ((p % r == 0)); then best="${r}x$((p / r))"; fi
                done
                [ -n "$best" ] || continue
                spec=$best ;;
            *P*) spec=${token//P/$p} ;;
            *) spec=$token ;;
        esac
        if [ "$spec" != auto ]; then
            # every RxC in the spec must multiply to P
            rest=$spec
            while [[ $rest =~ ([0-9]+)x([0-9]+)(.*) ]]; do
                if ((BASH_REMATCH[1] * BASH_REMATCH[2] != p)); then spec=""; break; fi
                rest=${BASH_REMATCH[3]}
            done
            if [ -z "$spec" ]; then
                say "skip grid $token at P=$p: it does not multiply to $p" >&2
                continue
            fi
        fi
        echo "$spec"
    done | awk '!seen[$0]++'
}

# a file-name-safe name of a grid spec: conv=domain:2x2,fc=4x1 -> convdomain2x2-fc4x1
grid_name() { sed -e 's/[=:]//g' -e 's/,/-/g' -e 's/[^A-Za-z0-9x._-]/_/g' <<<"$1"; }

# default PROCS: the powers of two up to SLURM_NTASKS, and SLURM_NTASKS itself
default_procs() {
    local n=$1 p=1 list=""
    while ((p < n)); do list+="$p "; p=$((p * 2)); done
    echo "$list$n"
}

# nodes for a step of P tasks: as few as the allocation's tasks per node allow
nodes_for() {
    local p=$1 nodes=${SLURM_JOB_NUM_NODES:-1} ntasks=$2 per_node need
    per_node=$(((ntasks + nodes - 1) / nodes))
    need=$(((p + per_node - 1) / per_node))
    echo $((need < nodes ? need : nodes))
}

on_signal() {
    trapped=1
    stop_signal=$1
    say "SIG$1 received: forwarding it to the running step; no further runs in this job"
    if [ -n "${step_pid:-}" ]; then kill -s "$1" "$step_pid" 2>/dev/null || true; fi
}

# run_step COMMAND...: runs in the background so a trapped signal is forwarded at once (bash
# runs traps only between commands, and `wait` is interruptible); returns its exit status
run_step() {
    local rc
    "$@" &
    step_pid=$!
    while :; do
        trapped=0
        rc=0
        wait "$step_pid" || rc=$?
        [ "$trapped" -eq 1 ] || break # a trap interrupted the wait, not the end of the step
    done
    step_pid=""
    return "$rc"
}

# every rank must see the whole job as its MPI world: a world of 1 on each rank means srun
# gave no PMI this MPI understands, and P copies of a one-process training would run
check_mpi() {
    local ntasks=$1
    say "checking MPI under srun on $ntasks tasks"
    # shellcheck disable=SC2086
    srun ${SRUN_FLAGS:-} -n "$ntasks" -N "${SLURM_JOB_NUM_NODES:-1}" "${PYTHON:-python}" -c '
import os, sys
from mpi4py import MPI
world, want = MPI.COMM_WORLD, int(os.environ["SLURM_STEP_NUM_TASKS"])
if world.Get_size() != want:
    sys.exit(f"rank sees an MPI world of {world.Get_size()} but srun started {want} tasks: srun "
             "gives no PMI this MPI speaks; set SRUN_FLAGS=--mpi=pmi2 (the mpich wheel) or "
             "--mpi=pmix (Open MPI), see srun --mpi=list")
if world.Get_rank() == 0:
    print(f"MPI ok: {want} ranks, {MPI.Get_library_version().splitlines()[0].strip()}")
'
}

scaling_sweep() {
    local kind=$1
    cd "${SLURM_SUBMIT_DIR:-.}" || return 1
    : "${SLURM_JOB_ID:?submit with sbatch (it reads the allocation from SLURM_* variables)}"
    PYTHON=${PYTHON:-python}
    NET=${NET:-alexnet}
    STEPS=${STEPS:-20}
    GRIDS=${GRIDS:-auto 1xP conv=1xP,fc=Px1 square}
    SRUN_FLAGS=${SRUN_FLAGS:-}
    REQUEUE=${REQUEUE:-1}
    RUN_DIR=${RUN_DIR:-runs/${SLURM_JOB_NAME:-hpctrain}-$SLURM_JOB_ID}
    local ntasks=${SLURM_NTASKS:-1}
    PROCS=${PROCS:-$(default_procs "$ntasks")}

    local common=(--net "$NET" --steps "$STEPS")
    [ -n "${IMAGE_SIZE:-}" ] && common+=(--image-size "$IMAGE_SIZE")
    [ -n "${MACHINE:-}" ] && common+=(--machine "$MACHINE")
    # shellcheck disable=SC2206
    [ -n "${EXTRA_ARGS:-}" ] && common+=($EXTRA_ARGS)

    stop_signal="" step_pid="" trapped=0
    trap 'on_signal USR1' USR1
    trap 'on_signal TERM' TERM

    mkdir -p "$RUN_DIR/checkpoints"
    say "$kind scaling of $NET: job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0})," \
        "$ntasks tasks on ${SLURM_JOB_NUM_NODES:-1} node(s); P in {$PROCS}; grids {$GRIDS};" \
        "run dir $RUN_DIR"
    if ! "$PYTHON" -c 'import hpctrain, mpi4py'; then
        say "error: $PYTHON cannot import hpctrain and mpi4py; activate the venv or set PYTHON"
        return 1
    fi
    check_mpi "$ntasks" || { say "error: MPI check failed (above)"; return 1; }
    if [ ! -f "$RUN_DIR/sweep.tsv" ]; then
        printf 'run\tP\tgrid\tbatch\texit\tseconds\tstopped_by\n' >"$RUN_DIR/sweep.tsv"
    fi

    local p grid name run batch rc start failed=0 nodes
    for p in $PROCS; do
        if ((p > ntasks)); then say "skip P=$p: the job has $ntasks tasks"; continue; fi
        if [ "$kind" = weak ]; then batch=$((${BATCH:-32} * p)); else batch=${BATCH:-256}; fi
        nodes=$(nodes_for "$p" "$ntasks")
        # shellcheck disable=SC2086
        for grid in $(grids_for "$p" $GRIDS); do
            [ -z "$stop_signal" ] || break 2
            name=$(grid_name "$grid")
            run=$kind-p$p-$name
            if [ -e "$RUN_DIR/$run.done" ]; then
                say "$run: done in an earlier run of this job"
                continue
            fi
            say "$run: srun -n $p, --grid $grid --batch $batch"
            local extra=()
            [ "$grid" = auto ] && extra+=(--plan-file "$RUN_DIR/$run.plan")
            start=$SECONDS
            rc=0
            # shellcheck disable=SC2086
            run_step srun $SRUN_FLAGS --kill-on-bad-exit=1 -n "$p" -N "$nodes" \
                "$PYTHON" -m hpctrain "${common[@]}" --grid "$grid" --batch "$batch" \
                --log "$RUN_DIR/$run.h5" --checkpoint-dir "$RUN_DIR/checkpoints/$run" --resume \
                "${extra[@]}" || rc=$?
            printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$run" "$p" "$grid" "$batch" "$rc" \
                $((SECONDS - start)) "${stop_signal:--}" >>"$RUN_DIR/sweep.tsv"
            if [ "$rc" -ne 0 ]; then
                say "$run: FAILED with exit status $rc"
                failed=1
            elif [ -z "$stop_signal" ]; then
                touch "$RUN_DIR/$run.done"
            fi
        done
    done

    if [ -n "$stop_signal" ]; then
        if [ "$stop_signal" = USR1 ] && [ "$REQUEUE" = 1 ]; then
            say "stopped by SIGUSR1: requeueing job $SLURM_JOB_ID; it continues in $RUN_DIR"
            scontrol requeue "$SLURM_JOB_ID" || { say "error: scontrol requeue failed"; return 1; }
            return 0
        fi
        say "stopped by SIG$stop_signal; submit again with RUN_DIR=$RUN_DIR to continue"
        return "$failed"
    fi
    [ "$failed" -eq 0 ] || { say "some runs failed: see $RUN_DIR/sweep.tsv"; return 1; }
    say "all runs finished: logs in $RUN_DIR (table: $RUN_DIR/sweep.tsv)"
}
