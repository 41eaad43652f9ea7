"""--grid auto, compare-plans and run logs on the launched ranks; the auto plan trains exactly."""

import tempfile
from pathlib import Path

import h5py
import numpy as np
from mpi4py import MPI

from hpctrain.commands import compare_plans as compare_plans_command
from hpctrain.commands import train as train_command
from hpctrain.commands.verify import serial_plan
from hpctrain.cost.machine import load_machine
from hpctrain.model.net import load_net
from hpctrain.plan.planner import plan_network
from hpctrain.plan.plans import read_plan
from hpctrain.plan.pricing import build_cost_model
from tests.mpi.helpers import all_agree, check_close
from tests.mpi.test_training import NET, train


def shared_dir(comm) -> Path:
    """One temporary directory, named by rank 0, for every rank (removed by the OS later)."""
    return Path(comm.bcast(tempfile.mkdtemp(prefix="hpctrain-") if comm.Get_rank() == 0
                           else None, root=0))


def test_auto_plan_is_the_same_on_every_rank_and_trains_like_one_process(comm, monkeypatch):
    monkeypatch.setenv("HPCTRAIN_CACHE_DIR", str(shared_dir(comm)))
    model = build_cost_model(NET, 9, comm.Get_size(), load_machine("default"), "measured",
                             comm=comm)
    planned = plan_network(model)
    described = [p.describe() for p in planned.plans]
    assert all_agree(comm, comm.bcast(described, root=0) == described)
    # the second plan reads every compute time from the cache: nothing is timed again
    cached = build_cost_model(NET, 9, comm.Get_size(), load_machine("default"), "measured",
                              comm=comm)
    assert all_agree(comm, len(cached.compute.known) == len(model.compute.known))
    losses, params = train(NET, planned.plans, comm)
    reference = train(NET, serial_plan(planned.plans), MPI.COMM_SELF) \
        if comm.Get_rank() == 0 else None
    check_close(comm, np.array(losses), reference and np.array(reference[0]), "auto losses",
                1e-9)
    for k, got in enumerate(params):
        check_close(comm, got, reference and reference[1][k], f"auto parameter {k}", 1e-9)


def test_grid_auto_writes_its_plan_and_a_log_with_predictions(comm, monkeypatch):
    where = shared_dir(comm)
    monkeypatch.setenv("HPCTRAIN_CACHE_DIR", str(where))
    plan_file, log = where / "auto.plan", where / "run.h5"
    code = train_command.run(
        ["--net", "smallcnn", "--grid", "auto", "--steps", "3", "--batch", "8",
         "--machine", "default", "--plan-file", str(plan_file), "--log", str(log)], comm)
    comm.Barrier()
    assert all_agree(comm, code == 0)
    plan = read_plan(plan_file, load_net("smallcnn"), comm.Get_size())
    assert all_agree(comm, len(plan) == len(load_net("smallcnn").layers))
    ok = True
    if comm.Get_rank() == 0:
        with h5py.File(log) as h5:
            names = [n.decode() for n in h5["layers/name"][:]]
            ok &= names[0] == "conv1" and names[-1] == "loss"
            ok &= h5["steps/loss"].shape == (3,) and h5["steps/seconds"].shape == (3,)
            for kind in ("predicted", "measured", "measured_fastest_rank"):
                for field in ("forward_compute", "backward_layer_comm"):
                    values = h5[f"layers/{kind}/{field}"][:]
                    ok &= values.shape == (len(names),) and bool(np.all(values >= 0))
            ok &= h5["layers/predicted/forward_compute"][0] > 0
            ok &= h5["iteration"].attrs["predicted"] > 0 and h5["iteration"].attrs["measured"] > 0
    assert all_agree(comm, ok)


def test_compare_plans_runs_each_plan_and_logs_it(comm, monkeypatch):
    where = shared_dir(comm)
    monkeypatch.setenv("HPCTRAIN_CACHE_DIR", str(where))
    p = comm.Get_size()
    log = where / "compare.h5"
    code = compare_plans_command.run(
        ["--net", "smallcnn", "--batch", "8", "--steps", "2", "--rounds", "2", "--plan", "auto",
         "--plan", f"1x{p}", "--plan", f"conv=domain:{p}x1,fc={p}x1",
         "--machine", "default", "--log", str(log)], comm)
    comm.Barrier()
    ok = code == 0
    if comm.Get_rank() == 0:
        with h5py.File(log) as h5:
            specs = [h5[f"plans/{k}"].attrs["spec"] for k in sorted(h5["plans"])]
            ok &= specs == ["auto", f"1x{p}", f"conv=domain:{p}x1,fc={p}x1"]
            ok &= h5.attrs["rounds"] == 2
            # kernels timed again before round 2: the first timing's price kept beside
            ok &= all(h5[f"plans/{k}/iteration"].attrs.get("predicted_first_timing", 0) > 0
                      for k in h5["plans"])
    # every compute time was timed in this run: none was read from or written to the cache
    ok &= not (where / "compute-times.json").exists()
    assert all_agree(comm, ok)


def test_replan_switches_plans_at_a_step_boundary_with_the_same_numbers(comm, monkeypatch):
    """--replan-after 3 with a decision that always switches (to domain-parallel
    convolutions): the run goes on from the checkpoint of step 3 under the new plan, its
    losses those of the run that kept its plan, and the log says what changed."""
    from hpctrain.commands import replan
    from hpctrain.plan.plans import plan_from_spec, plan_text
    from hpctrain.plan.spaces import predict

    where = shared_dir(comm)
    monkeypatch.setenv("HPCTRAIN_CACHE_DIR", str(where))
    p = comm.Get_size()
    other = f"conv=domain:{p}x1,fc={p}x1"

    limits = []

    def switch(setup, request, step, result, threshold, comm, limit=None):
        limits.append(limit)  # the run's own, agreed at set-up: not agreed again
        model = build_cost_model(setup.net, request.batch, p, setup.machine, "flops")
        planned = predict(model, plan_from_spec(other, setup.net, p))
        return replan.Replan(True, True, f"after step {step}: {other} (test)", planned,
                             setup.machine)

    monkeypatch.setattr(replan, "decide", switch)
    common = ["--net", "smallcnn", "--grid", "auto", "--steps", "6", "--batch", "8",
              "--dtype", "float64", "--machine", "default", "--compute", "flops",
              "--print-every", "3"]
    kept, switched = where / "kept.h5", where / "switched.h5"
    codes = [train_command.run([*common, "--plan-file", str(where / "a.plan"), "--log",
                                str(kept)], comm),
             train_command.run([*common, "--plan-file", str(where / "b.plan"), "--log",
                                str(switched), "--replan-after", "3", "--checkpoint-dir",
                                str(where / "checkpoints"), "--timings-every", "2"], comm)]
    comm.Barrier()
    ok = codes == [0, 0]
    if comm.Get_rank() == 0:
        net = load_net("smallcnn")
        with h5py.File(kept) as a, h5py.File(switched) as b:
            ok &= a["steps/loss"].shape == (6,) and b["steps/loss"].shape == (6,)
            ok &= bool(np.allclose(a["steps/loss"][:], b["steps/loss"][:], rtol=1e-9, atol=0))
            ok &= b.attrs["replanned"] == f"after step 3: {other} (test)"
            ok &= b.attrs["plan"] == plan_text(net, plan_from_spec(other, net, p))
            ok &= b.attrs["first_plan"] == a.attrs["plan"] and "first_plan" in b
            ok &= "replanned" not in a.attrs
            # timed every 2 steps across the switch, then at the end: beside the new plan
            ok &= b["layers"].attrs["final"] == 1 and b["layers"].attrs["first_step"] == 5
            ok &= bool(np.array_equal(b["layers/predicted/forward_compute"][:],
                                      b["plan/predicted/forward_compute"][:]))
        ok &= sorted(f.name for f in (where / "checkpoints").iterdir()) == [
            "step-00000003.h5", "step-00000006.h5"]
        ok &= read_plan(where / "b.plan", net, p) == plan_from_spec(other, net, p)
    ok &= len(limits) == 1 and limits[0] is not None and limits[0][0] > 0
    assert all_agree(comm, ok)
