"""hpctrain on 4 ranks, under mixed per-layer plans, against an independent PyTorch model (no
torchvision), float64: ResNet-18, one InceptionA module, CosmoFlow (3-D volumes split along
their depth, a regression), a mobile block (depthwise, grouped and dilated convolutions and a
squeeze-excitation gate) and a decoder (a dilated ASPP module, transposed convolutions); logits,
loss, every gradient, the parameters after each SGD update (two steps, so momentum is used)
and the running statistics.

Then the whole loop: the ``train`` command on 2, 3 or 4 ranks reads a dataset through its reader
under ``--augment standard`` for an epoch and three steps, with momentum, weight decay, a
warm-up and a step schedule, under batch, model and mixed plans; PyTorch trains the same net
from the same weights on batches rebuilt from the documented draws (the epoch permutation, each
sample's crop and flip) with the documented update. Every logged loss, and every weight,
velocity and running statistic after every step, agree to 1e-9.

Run with ``mpiexec -n 4 python -m mpi4py -m pytest tests/mpi/test_torch_reference.py``; the
step-by-step cases are skipped on other world sizes (their plans name 2x2, 4x1 and 1x4 grids),
the whole-loop cases on one rank.
"""

import time

import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.reference

from hpctrain.plan.plans import LayerPlan, parse_plan, plan_from_spec  # noqa: E402
from tests.grouped_plans import grouped_plan  # noqa: E402
from tests.torch_reference import (  # noqa: E402
    BATCH,
    MODELS,
    STEPS,
    TOLERANCE,
    EpochConfig,
    compare,
    compare_epochs,
    failures,
    hpctrain_steps,
    torch_epoch,
    torch_steps,
    train_command_epoch,
)

PROCS = 4

# per weighted layer, in turn: every mode on every grid shape of 4 ranks
CYCLE = (("domain", (2, 2)), ("model", (2, 2)), ("domain", (4, 1)), ("model", (4, 1)),
         ("batch", (1, 4)), ("model", (2, 2)))


def mixed_plan(net, offset=0, cycle=CYCLE):
    """Each conv and linear layer takes the next entry of ``cycle``, starting at ``offset``; a
    domain entry is passed over where the layer's output has fewer than two rows per rank (and
    always for linear layers). Other layers follow their input."""
    plan, k = [], offset
    for layer, shape in zip(net.layers, net.out_shapes, strict=True):
        if layer.kind not in ("conv", "deconv", "linear"):
            plan.append(LayerPlan("follow"))
            continue
        while True:
            mode, grid = cycle[k % len(cycle)]
            k += 1
            if mode != "domain" or (layer.kind != "linear" and shape[1] >= 2 * grid[0]):
                break
        plan.append(LayerPlan(mode, grid))
    return plan


def on_root(comm, work):
    """``work()`` on rank 0, its result on every rank. The other ranks sleep meanwhile rather
    than spin in a collective: on a machine with fewer cores than ranks, spinning ranks would
    slow rank 0's PyTorch run several times over."""
    result = work() if comm.Get_rank() == 0 else None
    request = comm.Ibarrier()
    while not request.Test():
        time.sleep(0.005)
    return comm.bcast(result, root=0)


CASES = {  # name → (model of MODELS, plan for its net)
    "resnet18-mixed": ("resnet18", mixed_plan),
    "inception_a-mixed": ("inception_a", mixed_plan),
    "inception_a-mixed-offset": ("inception_a", lambda net: mixed_plan(net, offset=3)),
    "inception_a-conv=domain:2x2,fc=4x1": (
        "inception_a", lambda net: plan_from_spec("conv=domain:2x2,fc=4x1", net, PROCS)),
    "cosmoflow-mixed": ("cosmoflow", mixed_plan),
    # --grid: block5 (2 planes) is too shallow for a 4x1 depth split and falls back to model
    "cosmoflow-conv=domain:4x1,fc=4x1": (
        "cosmoflow", lambda net: plan_from_spec("conv=domain:4x1,fc=4x1", net, PROCS)),
    "cosmoflow-conv=domain:2x2,fc=2x2": (
        "cosmoflow", lambda net: plan_from_spec("conv=domain:2x2,fc=2x2", net, PROCS)),
}


# several axes at once: on 4 ranks a volume's height × width and channels × depth, with the
# layers too small for the split falling back to channels
CASES.update({
    "cosmoflow-conv=h2w2,fc=4x1": (
        "cosmoflow", lambda net: plan_from_spec("conv=h2w2,fc=4x1", net, PROCS)),
    "cosmoflow-conv=c2d2,fc=n2c2": (
        "cosmoflow", lambda net: plan_from_spec("conv=c2d2,fc=n2c2", net, PROCS)),
    "inception_a-conv=n1h2w2,fc=4x1": (
        "inception_a", lambda net: plan_from_spec("conv=n1h2w2,fc=4x1", net, PROCS)),
})

# the reduction split too: out × in weight blocks whose digits alternate down the chain (column
# then row, and back), an input split alone summed by a reduce-scatter, and input channels with
# the samples and the height
ALTERNATING_MLP = "linear1 split c=2,i=2\nlinear2 split i=2,c=2\nlinear3 split c=2,s=2\n"
ALTERNATING_CNN = ("conv1 split n=2,c=2\nconv2 split h=2,i=2\nlinear1 split c=2,i=2\n"
                   "linear2 split i=2,c=2\n")
CASES.update({
    "mlp-alternating": ("mlp", lambda net: parse_plan(ALTERNATING_MLP, "t", net, PROCS)),
    "mlp-fc=s4": ("mlp", lambda net: plan_from_spec("fc=s4", net, PROCS)),
    "small_cnn-alternating": (
        "small_cnn", lambda net: parse_plan(ALTERNATING_CNN, "t", net, PROCS)),
    "small_cnn-conv=n2i2,fc=n2s2": (
        "small_cnn", lambda net: plan_from_spec("conv=n2i2,fc=n2s2", net, PROCS)),
})

# a mobile block: the depthwise and grouped layers split by whole groups, by rows with their
# dilated halos, and the gate moved onto a height split
CASES.update({
    "mobile-mixed": ("mobile", mixed_plan),
    "mobile-mixed-offset": ("mobile", lambda net: mixed_plan(net, offset=2)),
    "mobile-conv=domain:4x1,fc=4x1": (
        "mobile", lambda net: plan_from_spec("conv=domain:4x1,fc=4x1", net, PROCS)),
    "mobile-conv=h2w2/model,fc=2x2": (
        "mobile", lambda net: plan_from_spec("conv=h2w2/model,fc=2x2", net, PROCS)),
})

# a decoder: a dilated ASPP module and transposed convolutions split by rows (the input rows that
# reach each output row, with halos), by the weight's columns, and by height and width at once
CASES.update({
    "decoder-mixed": ("decoder", mixed_plan),
    "decoder-conv=domain:4x1,fc=4x1": (
        "decoder", lambda net: plan_from_spec("conv=domain:4x1,fc=4x1", net, PROCS)),
    "decoder-conv=h2w2/model,fc=2x2": (
        "decoder", lambda net: plan_from_spec("conv=h2w2/model,fc=2x2", net, PROCS)),
})

# branches side by side on groups of ranks: a ResNet block's main path and its shortcut, an
# InceptionA module's four branches (each on a rank of its own, every other layer model-parallel)
CASES.update({
    "resnet18-groups": ("resnet18", lambda net: grouped_plan(net, PROCS, BATCH)),
    "inception_a-groups": ("inception_a", lambda net: grouped_plan(
        net, PROCS, BATCH, offset=1, world=LayerPlan("model", (2, 2)))),
})

# depth × height × width needs 8 ranks: tests/test_multiaxis_on_ranks.py calls the test below
# on 8 launched ranks without pytest, PyTorch imported on rank 0 alone (the only rank using it)
CASES_ON_8 = {
    "cosmoflow-conv=d2h2w2,fc=8x1": (
        "cosmoflow", lambda net: plan_from_spec("conv=d2h2w2,fc=8x1", net, 8)),
}


@pytest.mark.parametrize("case", CASES_ON_8)
def test_eight_ranks_split_in_depth_height_and_width_match_pytorch(comm, case):
    if comm.Get_size() != 8:
        pytest.skip(f"the plans are for 8 ranks; this run has {comm.Get_size()}")
    _matches_pytorch(comm, case, *CASES_ON_8[case])


@pytest.mark.parametrize("case", CASES)
def test_four_ranks_match_pytorch(comm, case):
    if comm.Get_size() != PROCS:
        pytest.skip(f"the plans are for {PROCS} ranks; this run has {comm.Get_size()}")
    _matches_pytorch(comm, case, *CASES[case])


def _matches_pytorch(comm, case, model, make_plan):
    make_net, make_model, make_names = MODELS[model]
    net = make_net()
    plan = make_plan(net)
    modes = {entry.mode for entry in plan} - {"follow"}
    reduction = model in ("mlp", "small_cnn")
    assert modes == {"batch", "model", "domain"} or "conv=" in case or reduction or (
        "groups" in case), modes
    if "groups" in case:  # branches really run on groups
        assert len({entry.ranks for entry in plan} - {None}) >= 2, plan
    if ("conv=" in case and "domain" not in case) or reduction:
        assert "split" in modes, modes  # the multi-axis split is really used
    if reduction:  # and the input features or channels are split
        assert any(e.split is not None and e.split.inputs > 1 for e in plan), plan
    run = hpctrain_steps(net, plan, comm, BATCH, STEPS)

    def check() -> str:
        errors = compare(run.steps, torch_steps(make_model(net), make_names(), run))
        return failures(errors, TOLERANCE)

    problem = on_root(comm, check)
    assert not problem, f"{case}: {problem}"


# the whole loop on P ranks: --grid for P, the modes conv1, conv2 and linear1 then run in, and
# the configuration (the mixed plan's net reads an 8x8 window of the 10x10 images, so its crops
# have more offsets and the held-out images are cut to their centre)
EPOCH_CASES = {
    "batch": (lambda p: f"1x{p}", ("batch", "batch", "batch"), EpochConfig()),
    "model": (lambda p: f"{p}x1", ("model", "model", "model"), EpochConfig()),
    "mixed": (lambda p: f"conv1 domain {p}x1\nconv2 model {p}x1\nlinear1 batch 1x{p}\n",
              ("domain", "model", "batch"), EpochConfig(size=8)),
}


@pytest.mark.parametrize("case", EPOCH_CASES)
def test_the_train_command_for_an_epoch_matches_pytorch(comm, case, shared_dir, monkeypatch):
    procs = comm.Get_size()
    if not 2 <= procs <= 4:
        pytest.skip(f"the plans are for 2 to 4 ranks; this run has {procs}")
    monkeypatch.setenv("HPCTRAIN_CACHE_DIR", str(shared_dir / "cache"))
    make_grid, modes, config = EPOCH_CASES[case]
    grid = make_grid(procs)
    if "\n" in grid:  # a plan file
        if comm.Get_rank() == 0:
            (shared_dir / "mixed.plan").write_text(grid)
        grid = str(shared_dir / "mixed.plan")
    ran = train_command_epoch(comm, shared_dir, config, grid)

    def check() -> str:
        run, data, params, buffers = ran
        ran_in = tuple(run.modes[layer] for layer in ("conv1", "conv2", "linear1"))
        if ran_in != modes:  # a layer fell back to another mode: not the plan to test
            return f"conv1, conv2, linear1 ran {ran_in}, not {modes}"
        problem = failures(compare_epochs(run, torch_epoch(config, data, params, buffers)),
                           TOLERANCE)
        # the comparison sees a wrong flip and a missing weight decay
        for broken in ({"flip_wrong": True}, {"weight_decay": 0.0}):
            errors = compare_epochs(run, torch_epoch(config, data, params, buffers, **broken))
            if not failures(errors, 1e-3):
                problem += f"\nPyTorch with {broken} matched too"
        return problem

    problem = on_root(comm, check)
    assert not problem, f"{case} on {procs} ranks: {problem}"
