"""CosmoFlow's volumes under a cap on the predicted peak memory per rank (serial, the cost model
only: compute from the profile's FLOP rate, nothing timed or run).

A 512³ sample does not fit one 40 GB GPU, so the planner must split each sample's depth over
several ranks (domain mode) to find a plan at all; pure batch parallelism, which gives every rank
whole samples, never fits. On one node whose memory the ranks share (``memory_limit``: the
node's memory ÷ the ranks on it), a split shrinks each rank's share as fast as each rank's part:
it lets a job use more ranks on the node, not train a larger batch there.
"""

import math
import re
from functools import cache

import pytest

from hpctrain.commands import plan as plan_command
from hpctrain.cost.compute import FlopModel
from hpctrain.cost.machine import load_machine
from hpctrain.layout.partition import SplitError
from hpctrain.model.net import NetSpec, load_net
from hpctrain.plan.planner import PlannedNetwork, PlannerError, evaluate, plan_network
from hpctrain.plan.plans import LayerPlan
from hpctrain.plan.pricing import CostModel
from hpctrain.plan.spaces import plan_over

GiB = 2**30
GPU = load_machine("perlmutter-gpu")  # 4 A100 per node
A100 = 40 * GiB  # --mem-per-rank 40G
# the memory a node of the 2-core test machine has available (MemAvailable, 23 GiB in all),
# shared among the ranks on it as hpctrain.cost.memory.memory_limit shares it
NODE = 22 * GiB
CHANNELS, KERNEL_ENTRIES, WORD = 4, 2**3, 4  # CosmoFlow's input channels, 2x2x2 kernel, float32


@cache
def cosmoflow(size: int) -> NetSpec:
    return load_net("cosmoflow", size)


def cost_model(size: int, batch: int, procs: int) -> CostModel:
    return CostModel(cosmoflow(size), batch, procs, GPU, FlopModel(GPU.flops))


def pure_batch(model: CostModel) -> list[LayerPlan]:
    """Every weighted layer batch parallel on 1×P, written out here."""
    return [LayerPlan("batch", (1, model.procs))] * len(model.segments)


def first_weighted(planned: PlannedNetwork) -> tuple[str, LayerPlan]:
    return next((c.layer, p) for c, p in zip(planned.layers, planned.plans, strict=True)
                if p.mode != "follow")


# (B, P) at 512³ where a plan fits 40 GiB: P ≥ 2B, and every layer can still be cut P ways
POINTS_512 = [(8, 16), (8, 64), (8, 512), (16, 32), (16, 512), (32, 64), (32, 512), (32, 4096),
              (64, 128), (64, 512), (64, 4096)]


@pytest.mark.parametrize("batch,procs", POINTS_512)
def test_512_volumes_are_split_by_depth_to_fit_a_gpu(batch, procs):
    model = cost_model(512, batch, procs)
    planned = plan_network(model, A100)
    name, first = first_weighted(planned)
    assert name == "block1.conv1"
    assert first.mode == "domain" and first.grid[0] > 1
    assert planned.memory <= A100
    # the first convolution keeps its im2col columns for ΔW: (B/Pc) samples of a 512/Pr-deep
    # slab, 4 channels x 8 kernel entries per output point, counted here from the shapes
    pr, pc = first.grid
    columns = (batch // pc) * (512 // pr) * 512 * 512 * CHANNELS * KERNEL_ENTRIES * WORD
    conv1 = next(c for c in planned.layers if c.layer == name)
    assert conv1.resident["im2col columns"] == columns
    # pure batch cannot use P ranks (P > B: ranks without a sample) ...
    with pytest.raises(SplitError, match="cannot be split"):
        evaluate(model, pure_batch(model))
    # ... and on B ranks, one whole sample each, it needs more than a GPU has
    limit = cost_model(512, batch, batch)
    assert evaluate(limit, pure_batch(limit), timed=False).memory > A100


@pytest.mark.parametrize("batch", [8, 16, 32, 64])
def test_512_with_a_sample_or_more_per_rank_fits_nowhere(batch):
    """At P ≤ B every rank holds at least one sample's worth, 75.6 GiB: the planner refuses,
    naming the fixes, and pure batch (runnable there) is over the cap."""
    model = cost_model(512, batch, batch)
    with pytest.raises(PlannerError) as refused:
        plan_network(model, A100)
    message = str(refused.value)
    assert "no plan fits in --mem-per-rank = 40 GiB per rank" in message
    assert "smaller --batch or --image-size, more processes" in message
    need = float(re.search(r"the leanest needs ([\d.]+) GiB", message)[1])
    assert need > 40
    assert evaluate(model, pure_batch(model), timed=False).memory > A100


def peak(size: int, batch: int, procs: int, cap: float) -> float:
    return plan_network(cost_model(size, batch, procs), cap).memory


def test_512_peak_halves_as_the_ranks_double():
    """Each rank holds a slab half as thick on twice the ranks: the peak per rank falls by
    half while most of it is activations, and keeps falling where fixed costs (parameters,
    the late layers' replicated inputs) start to count."""
    for batch, procs in ((8, (16, 32, 64, 128)), (64, (128, 256, 512, 1024))):
        peaks = [peak(512, batch, p, A100) for p in procs]
        for smaller, larger in zip(peaks, peaks[1:]):
            assert 0.45 < larger / smaller < 0.55
    strong = [peak(512, 64, p, A100) for p in (128, 256, 512, 1024, 2048, 4096)]
    assert all(b < a for a, b in zip(strong, strong[1:]))


def test_512_peak_depends_on_samples_per_rank_only():
    """Weak scaling at half a sample per rank: the same peak at every P (to 1 %)."""
    peaks = [peak(512, p // 2, p, A100) for p in (16, 32, 64, 512)]
    assert max(peaks) / min(peaks) < 1.01
    assert 34 * GiB < peaks[0] <= A100  # 37.0 GiB: the thinnest share that fits a GPU


def test_the_plan_command_prints_the_split_and_its_memory(capsys):
    assert plan_command.run(["--net", "cosmoflow", "--image-size", "512", "--batch", "8",
                             "--procs", "64", "--machine", "perlmutter-gpu", "--compute",
                             "flops", "--mem-per-rank", "40G", "--overlap", "off"]) == 0
    text = capsys.readouterr().out
    # the default --space auto: balanced with FLOP-priced compute, depth, height and width cut
    assert re.search(r"^block1\.conv1 +conv +split +n8 c1 d2 h2 w2 ", text, flags=re.M)
    memory = float(re.search(r"peak memory ([\d.]+) MiB per rank", text)[1])
    want = plan_over(cost_model(512, 8, 64), A100).memory
    assert memory == pytest.approx(want / 2**20, abs=0.05) and memory * 2**20 <= A100


# -- 256³ on one node of this machine, its memory shared among the ranks -------------------------

@pytest.mark.parametrize("procs", [2, 4])
def test_256_one_sample_is_split_over_the_ranks_of_a_node(procs):
    cap = NODE / procs
    model = cost_model(256, 1, procs)
    planned = plan_network(model, cap, "the node's memory per rank")
    _, first = first_weighted(planned)
    assert first == LayerPlan("domain", (procs, 1))  # the depth over every rank
    assert planned.memory <= cap
    with pytest.raises(SplitError):  # one sample cannot feed two batch ranks
        evaluate(model, pure_batch(model))


def test_256_pure_batch_is_over_a_ranks_share_where_the_split_fits():
    """4 ranks share the node: 5.5 GiB each. With B = 2 pure batch can use 2 of them, and a
    whole sample (9.5 GiB) is over one rank's share; half a sample per rank fits."""
    cap = NODE / 4
    planned = plan_network(cost_model(256, 2, 4), cap)
    _, first = first_weighted(planned)
    assert first.mode == "domain" and first.grid == (2, 2)
    assert planned.memory <= cap
    limit = cost_model(256, 2, 2)
    assert evaluate(limit, pure_batch(limit), timed=False).memory > cap


def test_256_a_split_does_not_make_a_node_hold_more():
    """At a fixed batch the peak per rank times the ranks is the node's need, whatever P: a
    split over the ranks of one node divides the work, not the memory it takes."""
    needs = [peak(256, 1, p, NODE / p) * p for p in (1, 2, 4)]
    assert max(needs) / min(needs) < 1.03
    assert 9 * GiB < needs[0] < 10 * GiB  # one 256³ sample: 9.5 GiB


@pytest.mark.parametrize("procs", [1, 2, 4])
def test_256_a_batch_over_the_nodes_memory_is_refused_naming_the_fix(procs):
    """Four samples need 4 x 9.5 GiB, over the node's 22 GiB whatever the split: refused in
    one line naming the cap, the leanest plan's need and what to change."""
    cap = NODE / procs
    with pytest.raises(PlannerError) as refused:
        plan_network(cost_model(256, 4, procs), cap)
    message = str(refused.value)
    assert "\n" not in message
    assert re.match(r"no plan fits in --mem-per-rank = [\d.]+ GiB per rank: even the leanest "
                    r"needs [\d.]+ GiB", message)
    need = float(re.search(r"the leanest needs ([\d.]+) GiB", message)[1]) * GiB
    assert need > cap and math.isclose(need * procs, 4 * 9.4 * GiB, rel_tol=0.1)
    assert "use a smaller --batch or --image-size, more processes" in message
