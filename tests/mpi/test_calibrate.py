"""calibrate on the whole world: a profile with a positive fit for every (collective, p), on one
node, and both levels on nodes simulated by splitting the world."""

import os

import pytest

from hpctrain.comm.benchmarks import DEFAULT_ALPHA, DEFAULT_BETA
from hpctrain.commands import calibrate as calibrate_command
from hpctrain.commands.calibrate import CalibrateError
from hpctrain.cost.machine import load_machine
from hpctrain.layout.partition import factorisations
from tests.mpi.helpers import all_agree

DEVICE = os.environ.get("HPCTRAIN_DEVICE", "cpu")


def expected_fits(world: int) -> set[tuple[str, int]]:
    shapes = factorisations(world)
    want = {(c, pr) for pr, _ in shapes if pr > 1 for c in ("allgather", "reduce_scatter")}
    want |= {("allreduce", pc) for _, pc in shapes if pc > 1}
    if world > 1:
        want |= {("allreduce", world), ("alltoall", world), ("halo", 2)}
    return want


def test_quick_calibration_writes_a_profile_every_rank_reads(comm, shared_dir):
    out = shared_dir / "machines" / "local.toml"  # a directory calibrate must create
    # a far sweep of 128 and 256 KiB past the quick one's 64 KiB: every fit gets a knee
    assert calibrate_command.run(["--quick", "--far-bytes", "256KiB", "--device", DEVICE, "--name",
                                  "test", "--out", str(out)], comm) == 0
    machine = load_machine(str(out))
    got = {(c, p) for c, sizes in machine.fits.items() for p in sizes}
    fits = [f for sizes in machine.fits.values() for f in sizes.values()]
    ok = (got == expected_fits(comm.size)
          and all(f.alpha > 0 and f.beta > 0 and 0 < f.knee <= 2**18 and f.far_beta > 0
                  for f in fits)
          and machine.flops > 0 and machine.device == DEVICE and machine.name == "test"
          and machine.threads >= 1  # the threads per rank the GEMM rate was measured with
          and 0 <= machine.overlap <= 1
          # mpiexec -n N here starts every rank on this one node: one level
          and machine.ranks_per_node == comm.size and machine.network is None)
    if comm.size == 1:
        ok = ok and (machine.alpha, machine.beta, machine.overlap) == (DEFAULT_ALPHA,
                                                                        DEFAULT_BETA, 0)
    else:  # the top level is the point-to-point fit
        ok = ok and (machine.alpha, machine.beta) == (machine.fits["halo"][2].alpha,
                                                      machine.fits["halo"][2].beta)
    assert all_agree(comm, ok), f"fits {sorted(got)}, profile {machine}"


def test_unwritable_out_is_refused_on_every_rank(comm, shared_dir):
    # rank 0's verdict is shared, so every rank raises together and none waits in a collective
    with pytest.raises(CalibrateError, match="is a directory"):
        calibrate_command.run(["--quick", "--out", str(shared_dir)], comm)


def test_both_levels_on_nodes_made_by_splitting_the_world(comm):
    """The world split into m "nodes" of R consecutive ranks (2 of 2 on four ranks, else one
    rank per node): node fits keyed by k | R, network fits keyed by m' | m, nics in [1, R]."""
    from hpctrain.comm.benchmarks import Sweep, build_machine, measure_levels
    from hpctrain.device.backend import make_backend

    size = comm.size
    if size == 1:
        pytest.skip("levels need two nodes")
    per_node = 2 if size % 2 == 0 and size > 2 else 1
    nodes = size // per_node
    node = comm.Split(color=comm.rank // per_node, key=comm.rank)
    sweep = Sweep(4096, 2, 2)
    try:
        results, sharing = measure_levels(comm, node, make_backend(DEVICE, "float32", comm),
                                          sweep)
    finally:
        node.Free()
    machine = build_machine("split", DEVICE, results, 1e9, 1, 0.0, per_node, sharing)
    net = machine.network
    got_node = {(c, p) for c, sizes in machine.fits.items() for p in sizes}
    got_net = {(c, p) for c, sizes in net.fits.items() for p in sizes}
    want_node = ({(c, per_node) for c in ("allgather", "reduce_scatter", "allreduce",
                                          "alltoall")} | {("halo", 2)}) if per_node > 1 else set()
    want_net = {(c, nodes) for c in ("allgather", "reduce_scatter", "allreduce", "alltoall")}
    want_net.add(("halo", 2))
    ok = (got_node == want_node and got_net == want_net and 1 <= net.nics <= per_node
          and (net.alpha, net.beta) == (net.fits["halo"][2].alpha, net.fits["halo"][2].beta)
          and all(f.alpha > 0 and f.beta > 0 for sizes in net.fits.values()
                  for f in sizes.values()))
    got_shapes = {(c, s) for c, shapes in net.shapes.items() for s in shapes}
    want_shapes = ({(c, (2, nodes)) for c in ("allreduce", "allgather", "reduce_scatter")}
                   if per_node > 1 else set())
    ok = ok and got_shapes == want_shapes
    if per_node == 1:
        ok = ok and (machine.alpha, machine.beta) == (DEFAULT_ALPHA, DEFAULT_BETA)
    assert all_agree(comm, ok), (f"node {sorted(got_node)}, network {sorted(got_net)}, shapes "
                                 f"{sorted(got_shapes)}, {net}")


@pytest.mark.parametrize("collectives", ["nccl", "mpi"])
def test_a_gpu_calibration_times_the_transport_training_uses_and_each_precisions_rate(
        standin_nccl, comm, shared_dir, collectives, monkeypatch, capsys):
    """On the GPU path (the CuPy and NCCL stand-ins) every message goes through the transport
    --collectives names, as in training: under NCCL no byte of a message reaches the host; and
    the GEMM rate is timed in tf32, bf16 and fp16 too, for the profile's per-precision rates."""
    from tests.gpu_standin import TO_HOST

    out = shared_dir / f"gpu-{collectives}.toml"
    standin_nccl.counters.reset()
    assert all_agree(comm, calibrate_command.run(
        ["--quick", "--sizes", "2", "--repeats", "1", "--gemm-size", "32", "--device", "gpu",
         "--collectives", collectives, "--out", str(out)], comm) == 0)
    machine = load_machine(str(out))
    assert all_agree(comm, set(machine.precision_flops) == {"tf32", "bf16", "fp16"})
    assert all_agree(comm, min(machine.precision_flops.values()) > 0)
    staged = standin_nccl.counters.bytes[TO_HOST] > 1024  # each message's bytes, staged
    assert all_agree(comm, staged == (collectives == "mpi" and comm.Get_size() > 1))


def test_a_busy_machine_is_written_with_a_warning_every_plan_repeats(comm, shared_dir,
                                                                      monkeypatch, capsys):
    """When a rank got a fraction of its cores while calibrate measured (here: told so), the
    profile is written with a warning, which calibrate prints and every plan made with the
    profile repeats; a quiet measurement writes none (the fits' residuals aside)."""
    from hpctrain.commands import plan as plan_command
    from hpctrain.cost import conditions

    out = shared_dir / "busy.toml"
    monkeypatch.setattr(calibrate_command, "quiet_share", lambda comm, node: 0.3)
    assert calibrate_command.run(["--quick", "--probe-nets", "none", "--out", str(out)],
                                 comm) == 0
    said = capsys.readouterr().out
    machine = load_machine(str(out))
    ok = "the least share of its cores a rank got was 30% before measuring" in machine.warning
    ok = ok and (comm.rank != 0 or f"warning: machine profile local: {machine.warning}" in said)
    if comm.rank == 0:
        assert plan_command.run(["--net", "smallcnn", "--procs", "2", "--batch", "8",
                                 "--compute", "flops", "--machine", str(out)]) == 0
        ok = ok and machine.warning in capsys.readouterr().out
    monkeypatch.setattr(calibrate_command, "quiet_share", lambda comm, node: 1.0)
    monkeypatch.setattr(conditions, "RESIDUAL_LIMIT", float("inf"))
    assert calibrate_command.run(["--quick", "--probe-nets", "none", "--out", str(out)],
                                 comm) == 0
    assert all_agree(comm, ok and load_machine(str(out)).warning == "")
