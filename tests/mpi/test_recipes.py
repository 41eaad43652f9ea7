"""Gradient accumulation with label smoothing on 1–4 ranks: three float64 steps of K
micro-batches under batch, model, domain and mixed plans (every Pr×Pc factorisation of the
world), and on 4 ranks under splits of several axes and of the input channels, equal one
process accumulating the same way, and PyTorch's ``(loss / K).backward()`` per micro-batch:
logits, loss, every gradient, every weight and running statistic. A segmentation's per-pixel
loss too, with class weights and unlabelled pixels.

Run with ``mpiexec -n N python -m mpi4py -m pytest tests/mpi/test_recipes.py``, N = 1..4.
"""

import pytest
from mpi4py import MPI

pytest.importorskip("torch")

from hpctrain.layout.partition import SplitError  # noqa: E402
from hpctrain.plan.placement import plan_layouts  # noqa: E402
from hpctrain.plan.plans import plan_from_spec  # noqa: E402
from tests.recipes_reference import (  # noqa: E402
    CASES,
    TOLERANCE,
    hpctrain_accumulating,
    torch_accumulating,
)
from tests.torch_reference import compare, failures  # noqa: E402

BATCH, ACCUMULATE, SMOOTHING = 12, 3, 0.1

SPECS = {  # what each plan gives every conv and linear layer, on an R×C grid
    "batch": lambda r, c: f"1x{r * c}",
    "model": lambda r, c: f"{r}x{c}",
    "domain": lambda r, c: f"conv=domain:{r}x{c},fc={r}x{c}",
    "mixed": lambda r, c: f"conv=domain:{r}x{c},fc={c}x{r}",
}


def reference_run(make_net, weights, comm):
    """One process accumulating (rank 0; None elsewhere)."""
    if comm.Get_rank() != 0:
        return None
    net = make_net().with_class_weights(weights)
    return hpctrain_accumulating(net, plan_from_spec("1x1", net, 1), MPI.COMM_SELF, BATCH,
                                 ACCUMULATE, SMOOTHING)


# several axes at once, and input channels (features) split and summed in the layer: 4 ranks
FOUR_RANKS = {"multi-axis": "conv=h2w2,fc=n2c2", "input-split": "conv=n2i2,fc=n2s2"}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("mode", SPECS)
def test_accumulating_on_ranks_equals_one_process_and_pytorch(comm, grid_shape, case, mode):
    net = CASES[case][0]().with_class_weights(CASES[case][3])
    plan = plan_from_spec(SPECS[mode](*grid_shape), net, comm.Get_size())
    if mode == "domain" and all(p.mode != "domain" for p in plan):
        pytest.skip("no layer deep enough for the rows split")
    check_against_one_process_and_pytorch(comm, case, plan)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("spec", FOUR_RANKS.values(), ids=list(FOUR_RANKS))
def test_accumulating_under_splits_of_several_axes(comm, case, spec):
    if comm.Get_size() != 4:
        pytest.skip("the specs name degrees of 4 ranks")
    net = CASES[case][0]().with_class_weights(CASES[case][3])
    check_against_one_process_and_pytorch(comm, case, plan_from_spec(spec, net, 4))


def check_against_one_process_and_pytorch(comm, case, plan):
    """Three steps of ``case`` under ``plan`` on ``comm`` against one process and PyTorch,
    both accumulating; the verdict on every rank."""
    make_net, make_model, make_names, weights = CASES[case]
    net = make_net().with_class_weights(weights)
    try:
        plan_layouts(net, plan, BATCH // ACCUMULATE, comm.Get_size())
    except SplitError as err:  # the same on every rank: the plan alone decides
        pytest.skip(str(err))
    run = hpctrain_accumulating(net, plan, comm, BATCH, ACCUMULATE, SMOOTHING)
    verdict = ""
    if comm.Get_rank() == 0:
        serial = reference_run(make_net, weights, comm)
        verdict = failures(compare(run.steps, serial.steps), TOLERANCE)
        want = torch_accumulating(make_model(), make_names(), run, ACCUMULATE, SMOOTHING,
                                  weights)
        verdict += failures(compare(run.steps, want), TOLERANCE)
    verdict = comm.bcast(verdict, root=0)
    assert not verdict, verdict


def test_a_micro_batch_the_ranks_cannot_split_is_named_as_one(comm, capsys):
    """--batch P in P micro-batches of 1 sample on P ranks of a pure batch plan: every rank
    exits 2, and the refusal says the batch it names is the micro-batch."""
    from hpctrain import cli

    procs = comm.Get_size()
    if procs == 1:
        pytest.skip("one sample splits over one rank")
    code = cli.main(["--net", "smallcnn", "--batch", str(procs), "--accumulate", str(procs),
                     "--steps", "1"])
    err = capsys.readouterr().err
    assert comm.allgather(code) == [2] * procs
    if comm.Get_rank() == 0:
        assert (f"(batch 1 is the micro-batch, --batch {procs} / --accumulate {procs}: lower "
                f"--accumulate)") in err, err


def test_accumulating_under_a_grouped_plan_equals_one_process_and_pytorch(comm):
    """The decoder's ASPP branches on groups of ranks: each rank adds only the micro-batches'
    gradients of the layers its group holds, and the sums over each group's ranks still come
    once per step, equal to one process and PyTorch accumulating."""
    from tests.grouped_plans import grouped_plan
    from tests.torch_reference import MODELS

    procs = comm.Get_size()
    if procs == 1:
        pytest.skip("one rank makes one group")
    make_net, make_model, make_names = MODELS["decoder"]
    net = make_net()
    plan = grouped_plan(net, procs, BATCH // ACCUMULATE)
    groups = {p.ranks for p in plan} - {None}
    assert len(groups) >= 2, plan  # the test is of groups, not of the whole world
    run = hpctrain_accumulating(net, plan, comm, BATCH, ACCUMULATE, SMOOTHING)
    serial = None
    if comm.Get_rank() == 0:
        serial = hpctrain_accumulating(net, plan_from_spec("1x1", net, 1), MPI.COMM_SELF,
                                       BATCH, ACCUMULATE, SMOOTHING)
    verdict = ""
    if comm.Get_rank() == 0:
        verdict = failures(compare(run.steps, serial.steps), TOLERANCE)
        want = torch_accumulating(make_model(net), make_names(), run, ACCUMULATE, SMOOTHING)
        verdict += failures(compare(run.steps, want), TOLERANCE)
    verdict = comm.bcast(verdict, root=0)
    assert not verdict, verdict
