"""Per-layer timing of real training steps: complete, consistent, and free of side effects."""

import math
import os

import numpy as np
from mpi4py import MPI

from hpctrain.comm.gather import gather_to_root
from hpctrain.comm.grid import GridSet
from hpctrain.data.synthetic import SyntheticData
from hpctrain.layout.partition import factorisations
from hpctrain.model.net import load_net
from hpctrain.plan.plans import plan_from_spec
from hpctrain.record.timing import (
    COMM_FIELDS,
    RECORD_FIELDS,
    TIME_FIELDS,
    StepTimes,
    max_over_ranks,
    median_times,
    over_ranks,
    summary_over_ranks,
)
from hpctrain.run.loop import TrainConfig, TrainResult, train
from hpctrain.run.network import Network
from hpctrain.run.optimizer import SGD
from tests.mpi.helpers import all_agree
from tests.mpi.test_training import NET, mixed_plans

BATCH, STEPS = 9, 3
SMALLCNN = load_net("smallcnn").with_image_size(12)


def specs(p):
    """Pure batch, every R×C in model mode, and domain-parallel convolutions."""
    found = [f"1x{p}"]
    for r, c in factorisations(p):
        found.append(f"{r}x{c}")
        if r > 1:
            found.append(f"conv=domain:{r}x{c},fc={r}x{c}")
    return list(dict.fromkeys(found))


def plans(p):
    """(label, net, plan) for smallcnn under every spec, and the mixed net under mixed plans."""
    cases = [(spec, SMALLCNN, plan_from_spec(spec, SMALLCNN, p)) for spec in specs(p)]
    for k, plan in enumerate(mixed_plans(p)):
        cases.append((f"mixed plan {k}", NET, plan))
    return cases


def run(net, plan, comm, timed):
    """Train STEPS steps: losses, parameters on rank 0, each step's record (timed) and facts."""
    from hpctrain.device.backend import make_backend

    backend = make_backend(os.environ.get("HPCTRAIN_DEVICE", "cpu"), "float64")
    with GridSet(comm) as grids:
        network = Network(net, plan, BATCH, grids, backend, seed=3)
        data = SyntheticData(backend, net.input_shape, net.classes, BATCH, seed=3)
        optimizer = SGD(network.params, lr=0.05, momentum=0.9, weight_decay=1e-3)
        losses, records = [], []
        for step in range(STEPS):
            times = network.step_times() if timed else None
            losses.append(network.train_step(data, step, times=times)[0])
            optimizer.step()
            records.append(times)
        params = [gather_to_root(backend, comm, p.value, p.shape, p.box, "copy")
                  for p in network.params]
        facts = plan_facts(network)  # while the grids' communicators exist
    return losses, params, records, facts


def plan_facts(network) -> dict:
    """Per layer: its name, mode, the move feeding it, and which of its own comm it does."""
    layers = []
    for layer, (move, *_) in zip(network.layers, network.moves):  # chains: one move each
        rows, grad_comm = getattr(layer, "rows", None), getattr(layer, "grad_comm", None)
        halo = rows is not None and rows.halo is not None
        layers.append({"name": layer.name, "mode": layer.mode, "move": move.move.method,
                       "halo": halo, "need_dx": layer.need_dx, "params": bool(layer.params),
                       "reduces": grad_comm is not None and grad_comm.Get_size() > 1})
    return {"layers": layers, "procs": network.grids.world.Get_size(),
            "to_loss": network.to_loss.move.method}


def problems(facts: dict, times: StepTimes) -> list[str]:
    """Every way ``times`` disagrees with what the plan implies (empty when all is well)."""
    found = []
    if [row.name for row in times.layers] != [layer["name"] for layer in facts["layers"]]:
        found.append(f"rows {[row.name for row in times.layers]} are not the layers")
    values = times.to_array()
    if not (np.all(np.isfinite(values)) and np.all(values >= 0)):
        found.append(f"negative or non-finite times {values}")
    covered = sum(row.total for row in times.rows)
    if covered > times.step * (1 + 1e-9) + 1e-9:
        found.append(f"rows sum to {covered} s, more than the step's {times.step} s")
    single = facts["procs"] == 1
    sums = any(layer["reduces"] for layer in facts["layers"])
    for k, (layer, row) in enumerate(zip(facts["layers"], times.layers)):
        # a layer's gradient sum is in flight: its backward sends it when that fills a bucket,
        # and the first layer's backward waits for any still travelling (None: either way)
        halo_back = layer["halo"] and layer["need_dx"]
        expect = {  # field: whether this plan makes it communicate on this rank
            "forward_redistribution": layer["move"] != "identity",
            "backward_redistribution": layer["move"] != "identity" and k > 0,
            "forward_layer_comm": layer["halo"],
            "backward_layer_comm": halo_back or (
                None if layer["reduces"] or (k == 0 and sums) else False),
        }
        for name, positive in expect.items():
            value = getattr(row, name)
            if (positive is not None and (value > 0) != positive) or (single and value != 0.0):
                found.append(f"{layer['name']} ({layer['mode']}, fed by {layer['move']}): "
                             f"{name} = {value!r}, expected {'> 0' if positive else '0'}")
    loss_comm = times.loss.forward_layer_comm
    if (loss_comm > 0) == single or (facts["to_loss"] == "identity"
                                     and times.loss.redistribution != 0.0):
        found.append(f"loss row {times.loss}")
    return found


def test_every_plan_records_every_layer_consistently(comm):
    for label, net, plan in plans(comm.Get_size()):
        _, _, records, facts = run(net, plan, comm, timed=True)
        found = [f"step {s}: {p}" for s, times in enumerate(records)
                 for p in problems(facts, times)]
        assert all_agree(comm, not found), f"{label} on rank {comm.Get_rank()}: {found}"


def test_model_parallel_and_batch_plans_communicate_where_expected(comm):
    """Spot checks naming the layers: an all-gather feeds a model-parallel conv2, ΔW reduced."""
    p = comm.Get_size()
    if p == 1:
        return
    _, _, records, facts = run(SMALLCNN, plan_from_spec(f"{p}x1", SMALLCNN, p), comm, True)
    names = [layer["name"] for layer in facts["layers"]]
    conv2 = records[-1].layers[names.index("conv2")]
    ok = facts["layers"][names.index("conv2")]["move"] == "allgather"
    ok = ok and conv2.forward_redistribution > 0 and conv2.backward_redistribution > 0
    ok = ok and conv2.backward_layer_comm == 0.0  # Pc = 1: no ΔW all-reduce
    _, _, records, facts = run(SMALLCNN, plan_from_spec(f"1x{p}", SMALLCNN, p), comm, True)
    summing = 0.0  # the gradient sums: sent as buckets fill, awaited in the first layer
    for k, (layer, row) in enumerate(zip(facts["layers"], records[-1].layers)):
        ok = ok and row.forward_comm == 0.0  # pure batch: nothing moves forward
        ok = ok and (row.backward_layer_comm == 0.0 or layer["params"] or k == 0)
        summing += row.backward_layer_comm
    assert all_agree(comm, ok and summing > 0)


def test_timing_changes_no_numbers(comm):
    for label, net, plan in plans(comm.Get_size())[:3]:
        plain = run(net, plan, comm, timed=False)
        timed = run(net, plan, comm, timed=True)
        same = plain[0] == timed[0]
        if comm.Get_rank() == 0:
            same = same and all(np.array_equal(a, b) for a, b in zip(plain[1], timed[1]))
        assert all_agree(comm, same), f"{label}: losses {plain[0]} vs {timed[0]}"


def test_max_over_ranks_is_the_largest_of_every_field(comm):
    rank = comm.Get_rank()
    template = StepTimes.blank(["conv1", "fc1"])
    n = template.to_array().size
    mine = template.from_array(np.arange(n, dtype=float) * (rank + 1) % 7 + rank)
    largest = max_over_ranks(mine, comm)
    every = np.array(comm.allgather(mine.to_array()))
    assert all_agree(comm, np.array_equal(largest.to_array(), every.max(axis=0)))
    assert all_agree(comm, [row.name for row in largest.rows] == ["conv1", "fc1", "loss"])


def test_the_fastest_rank_leaves_out_the_ranks_that_do_not_run_a_layer(comm):
    """A layer on a group of ranks: the others record zeros for it, which count in neither
    extreme; a layer nobody here runs reads 0."""
    rank, procs = comm.Get_rank(), comm.Get_size()
    template = StepTimes.blank(["branch", "everywhere"])
    n, width = template.to_array().size, len(RECORD_FIELDS)
    values = np.full(n, 1.0 + rank)
    runs = [rank == procs - 1, True]  # the branch on the last rank alone
    if not runs[0]:
        values[:width] = 0.0
    least = over_ranks(template.from_array(values), comm, "min", runs).to_array()
    ok = np.all(least[:width] == procs) and np.all(least[width:2 * width] == 1.0)
    assert all_agree(comm, bool(ok))
    nobody = over_ranks(template.from_array(values), comm, "min", [False, True]).to_array()
    assert all_agree(comm, bool(np.all(nobody[:width] == 0.0)))


class TimingsLog:
    """Rank 0's run log, as far as the loop sees it: the steps, and each write of the timings
    so far (the medians on the slowest and the fastest rank, the iteration, the steps)."""

    failure = None
    planned = "the plan"

    def __init__(self):
        self.written = []

    def step(self, *_):
        pass

    def timings(self, planned, slowest, fastest, iteration, steps, final):
        assert planned == "the plan" and not final
        self.written.append((slowest, fastest, iteration, steps))


def test_the_timings_so_far_are_the_medians_of_the_steps_so_far_on_every_rank(comm):
    """Every 2 steps every rank takes part in the medians (a rank that did not would hang the
    others) and rank 0 writes them: those of the steps so far, as the end reports all."""
    from hpctrain.device.backend import make_backend

    p = comm.Get_size()
    backend = make_backend(os.environ.get("HPCTRAIN_DEVICE", "cpu"), "float32")
    config = TrainConfig(batch=8, steps=7, lr=0.01, momentum=0.9, weight_decay=5e-4, seed=0,
                         print_every=100, timings_every=2)
    plan = plan_from_spec(f"conv=1x{p},fc={p}x1", SMALLCNN, p)
    log = TimingsLog() if comm.Get_rank() == 0 else None
    result = train(SMALLCNN, plan, config, backend, comm, out=lambda *_: None, log=log)
    ok = True
    if log is not None:  # after steps 2, 4 and 6 (the end's own summary after 7)
        ok = [steps for *_, steps in log.written] == [(2, 2), (2, 4), (2, 6)]
    written = comm.bcast(log.written if log is not None else None, root=0)
    for slowest, fastest, iteration, (first, last) in written:
        steady = result.step_times[first - 1:last]
        ok = ok and slowest == max_over_ranks(median_times(steady), comm)
        ok = ok and iteration == comm.allreduce(np.median(result.step_seconds[first - 1:last]),
                                                MPI.MAX)
        ok = ok and all(getattr(f, name) <= getattr(s, name) for f, s in
                        zip(fastest.rows, slowest.rows, strict=True) for name in TIME_FIELDS)
    assert all_agree(comm, bool(ok))


def test_train_prints_the_table_and_returns_the_summary(comm):
    from hpctrain.device.backend import make_backend

    p = comm.Get_size()
    backend = make_backend(os.environ.get("HPCTRAIN_DEVICE", "cpu"), "float32")
    lines: list[str] = []
    config = TrainConfig(batch=8, steps=3, lr=0.01, momentum=0.9, weight_decay=5e-4, seed=0,
                         print_every=1)
    plan = plan_from_spec(f"conv=1x{p},fc={p}x1", SMALLCNN, p)
    result = train(SMALLCNN, plan, config, backend, comm, out=lines.append)
    ok = isinstance(result, TrainResult) and len(result.losses) == 3
    ok = ok and len(result.step_times) == 3
    summary = result.layer_times
    ok = ok and summary == max_over_ranks(median_times(result.step_times[1:]), comm)
    ok = ok and all(math.isfinite(getattr(r, f)) for r in summary.rows for f in TIME_FIELDS)
    if comm.Get_rank() == 0:
        text = "\n".join(lines).splitlines()
        done = next(k for k, line in enumerate(text) if line.startswith("done:"))
        ok = ok and "median over steps 2-3" in text[done + 1]
        ok = ok and text[done + 2].split()[:2] == ["layer", "fwd"]
        rows = [line.split()[0] for line in text[done + 3:-1]]
        ok = ok and rows == [layer.name for layer in SMALLCNN.layers] + ["loss", "total"]
        ok = ok and text[-1].startswith("whole step")
    else:
        ok = ok and lines == []
    assert all_agree(comm, ok)


def test_one_rank_plan_records_no_communication(comm):
    """On one process (COMM_SELF, whatever the world size) every comm time is exactly 0."""
    _, _, records, _ = run(SMALLCNN, plan_from_spec("1x1", SMALLCNN, 1), MPI.COMM_SELF,
                           timed=True)
    comm_fields = [f for f in TIME_FIELDS if "compute" not in f]
    zero = all(getattr(row, f) == 0.0 for times in records for row in times.rows
               for f in comm_fields)
    positive = all(row.forward_compute > 0 for times in records for row in times.rows)
    assert all_agree(comm, zero and positive)


def test_the_summary_over_ranks_equals_the_max_and_mean_of_every_rank_record():
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    times = StepTimes.blank(["conv1", "linear1"])
    rng = np.random.default_rng(rank)
    record = times.from_array(rng.random(len(times.to_array())))
    seconds = 1.0 + rank
    summary = summary_over_ranks(record, seconds, comm)
    # the reference: every rank's whole record at rank 0 (fine for a test on a few ranks)
    rows = comm.gather(record, root=0)
    ok = summary is None if rank else True
    if rank == 0:
        tables = np.array([[[getattr(row, f) for f in RECORD_FIELDS] for row in r.rows]
                           for r in rows])
        shares = [sum(getattr(row, f) for row in r.rows for f in COMM_FIELDS) / (1.0 + k)
                  for k, r in enumerate(rows)]
        ok = (np.array_equal(summary.largest, tables.max(axis=0))
              and np.allclose(summary.mean, tables.mean(axis=0), rtol=1e-14)
              and summary.seconds == float(size)
              and math.isclose(summary.comm_fraction, np.mean(shares), rel_tol=1e-14))
    assert all_agree(comm, ok)
