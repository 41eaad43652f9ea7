"""hpctrain with a batch norm's statistics per rank (``--bn-group rank``) against PyTorch's
DistributedDataParallel on 2 ranks, float64: ResNet-18 on 32x32 images, batch 8, two steps of
SGD with momentum and weight decay.

DDP is the reference of per-rank statistics: each rank's module sees its own half of the batch
and normalises it with that half's statistics, the gradients are averaged over the ranks (so
they are those of the mean loss over the whole batch), and with ``broadcast_buffers=False``
each rank keeps its own running statistics. hpctrain's groups are groups of samples, so a
mixed plan (some layers splitting channels or rows, not samples) must give the same numbers.
Compared: logits, loss, every gradient and every parameter after each step; the running
statistics settled over the ranks (the mean of DDP's ranks' after the last step) and, under the
pure batch plan, each rank's own before settling.

Run with ``mpiexec -n 2 python -m mpi4py -m pytest tests/mpi/test_torch_ddp.py``; skipped on
other world sizes and without PyTorch.
"""

import socket

import numpy as np
import pytest
from mpi4py import MPI

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.reference

import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

from hpctrain.comm.gather import gather_to_root  # noqa: E402
from hpctrain.comm.grid import GridSet  # noqa: E402
from hpctrain.data.synthetic import SyntheticData  # noqa: E402
from hpctrain.device.backend import Backend  # noqa: E402
from hpctrain.plan.plans import plan_from_spec  # noqa: E402
from hpctrain.run.network import Network  # noqa: E402
from hpctrain.run.optimizer import SGD  # noqa: E402
from tests.mpi.test_torch_reference import mixed_plan, on_root  # noqa: E402
from tests.torch_reference import (  # noqa: E402
    LR,
    MODELS,
    MOMENTUM,
    SEED,
    TOLERANCE,
    WEIGHT_DECAY,
    Run,
    StepResult,
    check_bijection,
    compare,
    failures,
    relative_error,
    torch_steps,
)

PROCS, BATCH, STEPS = 2, 8, 2
MODEL = "resnet18"

# per conv and linear layer, in turn: samples, rows, channels on 2 ranks
CYCLE = (("batch", (1, 2)), ("domain", (2, 1)), ("model", (2, 1)))


PLANS = {"1x2": lambda net: plan_from_spec("1x2", net, PROCS),
         "mixed": lambda net: mixed_plan(net, cycle=CYCLE)}

@pytest.fixture(scope="module")
def process_group():
    """torch.distributed over gloo on this MPI job's ranks, on a port rank 0 found free."""
    comm = MPI.COMM_WORLD
    if comm.Get_size() != PROCS:
        pytest.skip(f"DDP is compared on {PROCS} ranks; this run has {comm.Get_size()}")
    if not (dist.is_available() and dist.is_gloo_available()):
        pytest.skip("this PyTorch has no torch.distributed with gloo")
    port = None
    if comm.Get_rank() == 0:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
    port = comm.bcast(port, root=0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # two ranks share the cores
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=comm.Get_rank(), world_size=PROCS)
    yield comm
    dist.destroy_process_group()
    torch.set_num_threads(threads)


def hpctrain_ranks(net, plan, comm):
    """hpctrain's steps (gathered whole on rank 0, None elsewhere), and each rank's own
    running statistics after every step (a list of dicts on rank 0), before they are settled;
    the run's final buffers are the settled ones."""
    backend = Backend(np, np.float64)
    root = comm.Get_rank() == 0

    def whole(tensors, value):
        return {t.name: gather_to_root(backend, comm, getattr(t, value), t.shape, t.box, "copy")
                for t in tensors}

    with GridSet(comm) as grids:
        network = Network(net, plan, BATCH, grids, backend, SEED)
        data = SyntheticData.for_net(backend, net, BATCH, SEED)
        optimizer = SGD(network.params, LR, MOMENTUM, WEIGHT_DECAY)
        initial_params = whole(network.params, "value")
        initial_buffers = whole(network.buffers, "value")
        results, batches, own = [], [], []
        last = network.layers[-1]
        for step in range(STEPS):
            outputs = []
            loss, _ = network.train_step(data, step, outputs)
            logits = gather_to_root(backend, comm, outputs[-1], last.out_layout.shape,
                                    last.out_layout.box, "copy")
            grads = whole(network.params, "grad")
            optimizer.step()
            results.append(StepResult(logits, loss, grads, whole(network.params, "value"), {}))
            own.append(comm.gather({b.name: b.value.copy() for b in network.buffers}, root=0))
            if root:
                everything = tuple((0, n) for n in (BATCH, *net.input_shape))
                batches.append((data.images(step, everything), data.labels(step, (0, BATCH))))
        network.settle_buffers()
        settled = whole(network.buffers, "value")
    if not root:
        return None, None
    results[-1].buffers = settled
    return Run(initial_params, initial_buffers, results, batches), own


def ddp_ranks(model, names, start, comm):
    """The PyTorch model under DDP on every rank from ``start``'s initial values (broadcast
    from rank 0), each rank training on its half of ``start``'s batches. On rank 0: the steps
    with the logits of both halves, the mean of their losses, the (averaged) gradients, the
    parameters, and the mean over the ranks of the running statistics; and each rank's own
    running statistics after every step; and how far the other ranks' gradients and
    parameters are from rank 0's (DDP keeps them equal). None elsewhere."""
    start = comm.bcast(start, root=0)
    model = model.double().train()
    params, buffers = dict(model.named_parameters()), dict(model.named_buffers())
    check_bijection("parameter", names.params, start.initial_params, params)
    with torch.no_grad():
        for ours, theirs in names.params.items():
            params[theirs].copy_(torch.from_numpy(start.initial_params[ours]))
        for ours, theirs in names.buffers.items():
            buffers[theirs].copy_(torch.from_numpy(start.initial_buffers[ours]))
    ddp = DistributedDataParallel(model, broadcast_buffers=False)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=LR, momentum=MOMENTUM, dampening=0.0,
                                weight_decay=WEIGHT_DECAY, nesterov=False)
    rank = comm.Get_rank()
    lo, hi = rank * BATCH // PROCS, (rank + 1) * BATCH // PROCS
    steps = []
    for images, labels in start.batches:
        optimizer.zero_grad(set_to_none=True)
        logits = ddp(torch.from_numpy(images[lo:hi]))
        loss = F.cross_entropy(logits, torch.from_numpy(labels[lo:hi]), reduction="mean")
        loss.backward()  # DDP averages the gradients over the ranks
        grads = {ours: params[theirs].grad.numpy().copy() for ours, theirs in names.params.items()}
        optimizer.step()
        steps.append((logits.detach().numpy().copy(), float(loss.detach()), grads,
                      {ours: params[theirs].detach().numpy().copy()
                       for ours, theirs in names.params.items()},
                      {ours: buffers[theirs].numpy().copy()
                       for ours, theirs in names.buffers.items()}))
    ranks = comm.gather(steps, root=0)
    if rank != 0:
        return None, None, None
    merged, replicas = [], {}
    for k, step in enumerate(zip(*ranks, strict=True)):
        logits, losses, grads, values, own = zip(*step, strict=True)
        for r in range(1, PROCS):  # DDP keeps the ranks' gradients and parameters equal
            for what, tensors in (("grads", grads), ("params", values)):
                for name, value in tensors[r].items():
                    replicas[f"step {k} rank {r} {what} {name}"] = relative_error(
                        value, tensors[0][name])
        merged.append(StepResult(np.concatenate(logits), float(np.mean(losses)), grads[0],
                                 values[0], {name: np.mean([b[name] for b in own], axis=0)
                                             for name in own[0]}))
    own_buffers = [[step[4] for step in rank_steps] for rank_steps in ranks]
    return merged, own_buffers, replicas


def per_rank_errors(ours, theirs):
    """Each rank's running statistics before settling, hpctrain's against DDP's, step by
    step: ``ours`` step → rank → name → value; ``theirs`` rank → step → name → value."""
    errors = {}
    for step, ranks in enumerate(ours):
        for rank, values in enumerate(ranks):
            for name, value in values.items():  # every channel (else the error is inf)
                errors[f"step {step} rank {rank} own buffers {name}"] = relative_error(
                    value, theirs[rank][step][name])
    return errors


@pytest.mark.filterwarnings("ignore:`broadcast_buffers` is deprecated:FutureWarning")
@pytest.mark.parametrize("plan_name", [
    "1x2", "mixed"])
def test_per_rank_statistics_match_pytorch_ddp(process_group, plan_name):
    comm = process_group
    make_net, make_model, make_names = MODELS[MODEL]
    net = make_net().with_statistics("rank", PROCS)
    assert {spec.options.groups for spec in net.layers if spec.kind == "batchnorm"} == {PROCS}
    plan = PLANS[plan_name](net)
    modes = {entry.mode for entry in plan} - {"follow"}
    assert modes == ({"batch"} if plan_name == "1x2" else {"batch", "model", "domain"}), modes
    run, ours_own = hpctrain_ranks(net, plan, comm)
    steps, theirs_own, replicas = ddp_ranks(make_model(net), make_names(), run, comm)

    def check():
        last = len(run.steps) - 1
        for k, step in enumerate(steps):  # the running statistics: settled, after the last
            if k != last:
                step.buffers = {}
        errors = compare(run.steps, steps)
        if not any("buffers" in name for name in errors):
            errors["no running statistics compared"] = np.inf
        errors.update(replicas)
        if plan_name == "1x2":  # each rank holds its own group whole, as a DDP rank does
            errors.update(per_rank_errors(ours_own, theirs_own))
            # and per-rank statistics are not global ones: PyTorch on the whole batch differs
            whole = torch_steps(make_model(net), make_names(), run)
            differs = relative_error(whole[0].logits, steps[0].logits)
            if not differs > 1e-6:
                errors["global statistics, not per rank"] = np.inf
        return failures(errors, TOLERANCE)

    problem = on_root(comm, check)
    assert not problem, f"{plan_name}: {problem}"
