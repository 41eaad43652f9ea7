"""``python -m hpctrain simulate``: the HDF5 it writes against the equations, its plots, its errors.

Pure batch parallelism (Eq. 4) and the FLOP counts are written out here from the net's shapes,
not taken from the code under test; other rows are checked against
:func:`hpctrain.plan.paper.strategy_comm`, which tests/test_paper_equations.py checks by hand.
"""

import contextlib
import dataclasses
import importlib.util
import io
import math
import re
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from hpctrain.commands import simulate as simulate_command
from hpctrain.cost.compute import FlopModel
from hpctrain.cost.machine import load_machine, parse_machine
from hpctrain.device.precision import PRECISIONS
from hpctrain.errors import OutputError, UserError
from hpctrain.model.kinds import KINDS
from hpctrain.model.net import load_net
from hpctrain.plan.paper import strategy_comm
from hpctrain.plan.planner import evaluate, plan_network
from hpctrain.plan.plans import LayerPlan
from hpctrain.plan.pricing import CostModel
from hpctrain.plan.spaces import plan_over
from hpctrain.study import levels as levels_study
from hpctrain.study import paper
from hpctrain.study import volumes as volumes_study
from hpctrain.study.paper import PLANS as SIM_PLANS
from hpctrain.study.paper import ImplementationPlans, Settings

ROOT = Path(__file__).resolve().parent.parent
NET = load_net("alexnet")
MACHINE = load_machine("cori-knl")
IMAGES = 1_200_000
STUDIES = ("strong", "weak", "domain")
ROW_KEYS = ("procs", "batch", "pr", "pc", "strategy", "comm_per_epoch", "compute_per_epoch",
            "total_per_epoch")


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    out = tmp_path_factory.mktemp("sim") / "nested" / "simulation.h5"
    assert simulate_command.run(["--out", str(out)]) == 0
    with h5py.File(out, "r") as f:
        yield f


def table(group):
    return {k: (v.asstr()[()] if h5py.check_string_dtype(v.dtype) else v[()])
            for k, v in group.items() if isinstance(v, h5py.Dataset)}


def test_help_names_every_option():
    text = simulate_command.build_parser().format_help()
    assert "python -m hpctrain simulate" in text
    for flag in ("--net", "--machine", "--images", "--out", "--plots", "--precision",
                 "--weak-batch-per-rank", "--overlap", "--levels", "--volumes",
                 "--mem-per-rank"):
        assert flag in text


def test_layout_and_attributes(sim):
    for key in ("net", "machine", "alpha", "beta", "flops", "images", "word_bytes", "precision",
                "command"):
        assert key in sim.attrs
    assert sim.attrs["net"] == "alexnet" and sim.attrs["machine"] == "cori-knl"
    assert sim.attrs["images"] == IMAGES and sim.attrs["word_bytes"] == 4
    assert sim.attrs["precision"] == "fp32"
    for name in STUDIES:
        group = sim[name]
        lengths = {len(group[k]) for k in ROW_KEYS}
        assert len(lengths) == 1 and lengths.pop() > 0
        assert group["total_per_epoch"].attrs["units"] == "s"
        for sub, keys in (("best", ("procs", "strategy", "pr", "pc", "total_per_epoch",
                                    "speedup_over_batch")),
                          ("auto", ("procs", "batch", "total_per_epoch", "comm_per_epoch",
                                    "plan"))):
            assert len({len(group[sub][k]) for k in keys}) == 1
        assert group["auto/total_per_epoch"].attrs["units"] == "s"
        assert "implementation" in group["auto"].attrs["description"]
    assert sorted(set(sim["strong/procs"][()])) == [8, 16, 32, 64, 128, 256, 512]
    assert set(sim["strong/batch"][()]) == {2048}
    weak = table(sim["weak"])
    assert np.array_equal(weak["batch"], 16 * weak["procs"])
    assert sorted(set(sim["domain/procs"][()])) == [512, 1024, 2048, 4096]


def test_every_factorisation_with_a_sample_per_batch_group(sim):
    rows = table(sim["strong"])
    for p in (8, 512):
        grids = {(r, c) for r, c, q, s in zip(rows["pr"], rows["pc"], rows["procs"],
                                              rows["strategy"]) if q == p and s == "1.5d"}
        assert grids == {(r, p // r) for r in range(1, p + 1) if p % r == 0}
    domain = table(sim["domain"])
    assert np.all(domain["pc"] <= domain["batch"])
    assert np.all(domain["pr"] * domain["pc"] == domain["procs"])
    # convolutions batch parallel over P need P <= B
    assert not np.any((domain["strategy"] == "conv-batch") & (domain["procs"] > 512))
    assert np.any((domain["strategy"] == "integrated") & (domain["procs"] == 4096))


def eq4_batch_per_iteration(batch, procs, word=4):
    """Pure batch parallelism, Eq. 4: one all-reduce of every weight tensor over all P."""
    shapes = NET.shapes()
    total = 0.0
    for k, layer in enumerate(NET.layers):
        if not KINDS[layer.kind].weighted:
            continue
        fan_in = shapes[k][0] * (layer.options.kernel[0] ** 2 if layer.kind == "conv" else 1)
        weights = layer.options.out * fan_in
        total += 2 * (MACHINE.alpha * math.ceil(math.log2(procs))
                      + MACHINE.beta * (procs - 1) / procs * weights * word)
    return total


def row(rows, procs, strategy, grid):
    hits = np.nonzero((rows["procs"] == procs) & (rows["strategy"] == strategy)
                      & (rows["pr"] == grid[0]) & (rows["pc"] == grid[1]))[0]
    assert len(hits) == 1
    return hits[0]


def test_communication_is_the_paper_equations_per_epoch(sim):
    rows = table(sim["strong"])
    iterations = IMAGES / 2048
    k = row(rows, 256, "1.5d", (1, 256))
    assert rows["comm_per_epoch"][k] == pytest.approx(eq4_batch_per_iteration(2048, 256)
                                                      * iterations, rel=1e-12)
    for strategy, procs, grid in (("1.5d", 512, (8, 64)), ("conv-batch", 64, (16, 4))):
        k = row(rows, procs, strategy, grid)
        want = sum(f + b for f, b in strategy_comm(NET, strategy, 2048, grid, MACHINE))
        assert rows["comm_per_epoch"][k] == pytest.approx(want * iterations, rel=1e-12)
    domain = table(sim["domain"])
    k = row(domain, 4096, "integrated", (64, 64))
    want = sum(f + b for f, b in strategy_comm(NET, "integrated", 512, (64, 64), MACHINE))
    assert domain["comm_per_epoch"][k] == pytest.approx(want * IMAGES / 512, rel=1e-12)


def whole_batch_flops_per_sample():
    """Forward + backward FLOPs of one sample (a multiply-add is 2): conv and linear 2 per MAC
    forward, twice that backward (ΔW and ΔX; ΔW only for the first layer); max-pool a compare
    per window entry forward, one per input entry backward; ReLU and dropout one each way."""
    shapes = NET.shapes()
    total = 0.0
    first = next(k for k, layer in enumerate(NET.layers) if KINDS[layer.kind].weighted)
    for k, layer in enumerate(NET.layers):
        x, y = shapes[k], shapes[k + 1]
        if layer.kind == "conv":
            forward = 2.0 * math.prod(y) * x[0] * layer.options.kernel[0] ** 2
            total += forward * (2 if k == first else 3)
        elif layer.kind == "linear":
            forward = 2.0 * x[0] * y[0]
            total += forward * (2 if k == first else 3)
        elif layer.kind == "maxpool":
            total += math.prod(y) * layer.options.kernel[0] ** 2 + math.prod(x)
        elif layer.kind in ("relu", "dropout"):
            total += 2.0 * math.prod(x)
    return total


def test_compute_is_perfectly_scaled_flops(sim):
    per_epoch_rank = whole_batch_flops_per_sample() * IMAGES / MACHINE.flops
    for name in STUDIES:
        rows = table(sim[name])
        assert rows["compute_per_epoch"] * rows["procs"] == pytest.approx(
            np.full(len(rows["procs"]), per_epoch_rank), rel=1e-12)
        assert rows["total_per_epoch"] == pytest.approx(rows["compute_per_epoch"]
                                                        + rows["comm_per_epoch"], rel=1e-12)


def test_best_grid_and_speedup_over_batch(sim):
    for name in STUDIES:
        rows, best = table(sim[name]), table(sim[name]["best"])
        for k in range(len(best["procs"])):
            mine = (rows["procs"] == best["procs"][k]) & (rows["strategy"] == best["strategy"][k])
            assert best["total_per_epoch"][k] == rows["total_per_epoch"][mine].min()
            at = row(rows, best["procs"][k], best["strategy"][k], (best["pr"][k], best["pc"][k]))
            assert rows["total_per_epoch"][at] == best["total_per_epoch"][k]
            pure = mine & (rows["pr"] == 1)
            if best["procs"][k] > best["batch"][k]:
                assert not np.any(pure) and math.isnan(best["speedup_over_batch"][k])
            else:
                assert best["speedup_over_batch"][k] == pytest.approx(
                    rows["total_per_epoch"][pure][0] / best["total_per_epoch"][k], rel=1e-12)
    # the paper's finding: at P = 512, B = 2048 the best 1.5D grid is neither pure batch nor
    # pure model parallelism, and it beats pure batch
    best = table(sim["strong/best"])
    k = np.nonzero((best["procs"] == 512) & (best["strategy"] == "1.5d"))[0][0]
    assert (best["pr"][k], best["pc"][k]) not in ((1, 512), (512, 1))
    assert best["speedup_over_batch"][k] > 1.5


def test_domain_speedup_over_the_batch_limit(sim):
    group = sim["domain"]
    rows, best = table(group), table(group["best"])
    limit = row(rows, 512, "1.5d", (1, 512))
    assert group.attrs["batch_limit_total_per_epoch"] == pytest.approx(
        rows["total_per_epoch"][limit], rel=1e-12)
    assert best["speedup_over_batch_limit"] == pytest.approx(
        rows["total_per_epoch"][limit] / best["total_per_epoch"], rel=1e-12)
    integrated = best["strategy"] == "integrated"
    assert np.all(np.diff(best["total_per_epoch"][integrated]) < 0)  # keeps scaling past P = B


def test_auto_plan_is_the_planners(sim):
    auto = table(sim["strong/auto"])
    k = np.nonzero(auto["procs"] == 64)[0][0]
    planned = plan_network(CostModel(NET, 2048, 64, MACHINE, FlopModel(MACHINE.flops)))
    iterations = IMAGES / 2048
    assert auto["total_per_epoch"][k] == pytest.approx(planned.iteration_time * iterations,
                                                       rel=1e-12)
    totals = planned.totals()
    assert auto["comm_per_epoch"][k] == pytest.approx(
        (totals["communication"] + totals["redistribution"]) * iterations, rel=1e-12)
    names = [layer.name for layer in NET.layers if KINDS[layer.kind].weighted]
    assert [part.split("=")[0] for part in auto["plan"][k].split(", ")] == names
    for name in STUDIES:
        auto = table(sim[name]["auto"])
        assert np.all(auto["total_per_epoch"] > 0)
        assert all(plan.count("=") == len(names) for plan in auto["plan"])


# -- the auto plan against pure batch and one weird trick (implementation model) -------------

PLANS = ("auto", "pure_batch", "weird_trick")
PLAN_KEYS = ("procs", "batch", "runnable", "iteration_time", "total_per_epoch",
             "compute_per_epoch", "comm_per_epoch", "layer_comm_per_epoch",
             "redistribution_per_epoch", "plan", "plan_summary")


@pytest.fixture(scope="module")
def sim_resnet(tmp_path_factory):
    """ResNet-50: residual adds and batch norm, planned by variable elimination."""
    out = tmp_path_factory.mktemp("sim") / "resnet50.h5"
    assert simulate_command.run(["--net", "resnet50", "--out", str(out)]) == 0
    with h5py.File(out, "r") as f:
        yield f


@pytest.fixture(params=["alexnet", "resnet50"])
def any_sim(request, sim, sim_resnet):
    return {"alexnet": sim, "resnet50": sim_resnet}[request.param]


def explicit_baseline(model, plan):
    """The baseline's choices written out here, not by the code under test: pure batch puts
    every weighted layer batch parallel on 1xP; one weird trick does so for the convolutions
    and puts the linear layers model parallel on Px1."""
    choices = []
    for segment in model.segments:
        kind = model.net.layers[segment[0]].kind
        if plan == "weird_trick" and kind == "linear":
            choices.append(LayerPlan("model", (model.procs, 1)))
        else:
            choices.append(LayerPlan("batch", (1, model.procs)))
    return choices


def test_every_plan_group_has_every_column(any_sim):
    for name in STUDIES:
        for plan in PLANS:
            group = any_sim[name][plan]
            assert len({len(group[k]) for k in PLAN_KEYS}) == 1
            assert np.array_equal(group["procs"][()], any_sim[name]["auto/procs"][()])
            for key in ("iteration_time", "total_per_epoch", "redistribution_per_epoch"):
                assert group[key].attrs["units"] == "s"
            assert group.attrs["description"]
        assert any_sim[name]["auto/speedup_over_weird_trick"].attrs["units"] == "1"
    assert "weird trick" in any_sim["strong/weird_trick"].attrs["description"]


def test_split_adds_up(any_sim):
    for name in STUDIES:
        for plan in PLANS:
            t = table(any_sim[name][plan])
            ok = t["runnable"]
            assert t["comm_per_epoch"][ok] == pytest.approx(
                t["layer_comm_per_epoch"][ok] + t["redistribution_per_epoch"][ok], rel=1e-12)
            assert t["total_per_epoch"][ok] == pytest.approx(
                t["compute_per_epoch"][ok] + t["comm_per_epoch"][ok], rel=1e-9)
            iterations = IMAGES / t["batch"]
            assert t["total_per_epoch"][ok] == pytest.approx(
                t["iteration_time"][ok] * iterations[ok], rel=1e-12)


def test_auto_is_never_slower_than_either_baseline(any_sim):
    """The planner is exact over a set that holds both baselines."""
    for name in STUDIES:
        auto = table(any_sim[name]["auto"])
        for plan in ("pure_batch", "weird_trick"):
            base = table(any_sim[name][plan])
            ok = base["runnable"]
            assert np.all(auto["total_per_epoch"][ok] <= base["total_per_epoch"][ok] * (1 + 1e-9))
            key = {"pure_batch": "speedup_over_batch",
                   "weird_trick": "speedup_over_weird_trick"}[plan]
            assert auto[key][ok] == pytest.approx(base["total_per_epoch"][ok]
                                                  / auto["total_per_epoch"][ok], rel=1e-12)
            assert np.all(np.isnan(auto[key][~ok]))


@pytest.mark.parametrize("study,procs", [("strong", 64), ("weak", 512), ("domain", 512)])
def test_baselines_are_evaluate_of_the_explicit_choices(any_sim, study, procs):
    net = load_net(any_sim.attrs["net"])
    k = np.nonzero(any_sim[f"{study}/auto/procs"][()] == procs)[0][0]
    batch = int(any_sim[f"{study}/auto/batch"][k])
    model = CostModel(net, batch, procs, MACHINE, FlopModel(MACHINE.flops))
    iterations = IMAGES / batch
    for plan in ("pure_batch", "weird_trick"):
        stored = table(any_sim[study][plan])
        assert stored["runnable"][k]
        want = evaluate(model, explicit_baseline(model, plan))
        totals = want.totals()
        assert stored["iteration_time"][k] == pytest.approx(want.iteration_time, rel=1e-12)
        assert stored["compute_per_epoch"][k] == pytest.approx(totals["compute"] * iterations,
                                                               rel=1e-12)
        assert stored["layer_comm_per_epoch"][k] == pytest.approx(
            totals["communication"] * iterations, rel=1e-12)
        assert stored["redistribution_per_epoch"][k] == pytest.approx(
            totals["redistribution"] * iterations, rel=1e-12)
    # pure batch moves nothing between layers; the trick gathers the batch for the classifier
    assert table(any_sim[study]["pure_batch"])["redistribution_per_epoch"][k] == 0.0
    assert table(any_sim[study]["weird_trick"])["redistribution_per_epoch"][k] > 0.0


def test_baselines_beyond_p_equals_b_are_not_runnable(any_sim):
    domain = any_sim["domain"]
    auto = table(domain["auto"])
    for plan in ("pure_batch", "weird_trick"):
        t = table(domain[plan])
        beyond = t["procs"] > t["batch"]
        assert np.any(beyond) and not np.any(t["runnable"][beyond])
        assert np.all(t["runnable"][~beyond])
        for key in ("iteration_time", "total_per_epoch", "compute_per_epoch",
                    "comm_per_epoch"):
            assert np.all(np.isnan(t[key][beyond]))
        assert all(p.startswith("none: ") for p in t["plan"][beyond])
    assert np.all(auto["runnable"]) and np.all(np.isfinite(auto["total_per_epoch"]))
    # beyond P = B: the speedup over each baseline at its limit, on B ranks
    first = auto["procs"] == auto["batch"]
    for plan, attr, key in (("pure_batch", "batch_limit_impl_total_per_epoch",
                             "speedup_over_batch_limit"),
                            ("weird_trick", "weird_trick_limit_total_per_epoch",
                             "speedup_over_weird_trick_limit")):
        limit = domain.attrs[attr]
        assert limit == pytest.approx(table(domain[plan])["total_per_epoch"][first][0],
                                      rel=1e-12)
        assert auto[key] == pytest.approx(limit / auto["total_per_epoch"], rel=1e-12)


def test_plan_descriptions(any_sim):
    net = load_net(any_sim.attrs["net"])
    weighted = [layer for layer in net.layers if KINDS[layer.kind].weighted]
    for name in STUDIES:
        for plan in PLANS:
            t = table(any_sim[name][plan])
            for k in np.nonzero(t["runnable"])[0]:
                assert t["plan"][k].count("=") == len(weighted)
                counts = re.findall(r"(\d+) (?:batch|model|domain) \d+x\d+", t["plan_summary"][k])
                assert sum(int(n) for n in counts) == len(weighted)
        trick = table(any_sim[name]["weird_trick"])
        for k in np.nonzero(trick["runnable"])[0]:
            linear = sum(1 for w in weighted if w.kind == "linear")
            assert trick["plan_summary"][k].endswith(
                f"linear: {linear} model {trick['procs'][k]}x1")


def test_resnet_auto_plan_wins_where_it_should(sim_resnet):
    """What the README reports: at strong P = 512 the auto plan beats both baselines; one weird
    trick is slower than pure batch there (the classifier's 2 M weights save less all-reduce
    than gathering the batch costs); beyond P = B the auto plan keeps scaling."""
    strong = {plan: table(sim_resnet["strong"][plan]) for plan in PLANS}
    k = np.nonzero(strong["auto"]["procs"] == 512)[0][0]
    assert strong["auto"]["speedup_over_batch"][k] > 1.05
    assert strong["auto"]["speedup_over_weird_trick"][k] > 1.05
    assert strong["weird_trick"]["total_per_epoch"][k] > strong["pure_batch"]["total_per_epoch"][k]
    auto = table(sim_resnet["domain/auto"])
    assert np.all(np.diff(auto["total_per_epoch"]) < 0)
    assert auto["speedup_over_batch_limit"][-1] > 2.0
    assert "domain" in auto["plan_summary"][-1]


def test_inception_auto_beats_the_baselines():
    """Inception-v3 (concatenated branches) at two points, without the whole study."""
    net = load_net("inception_v3")
    settings = Settings(net, MACHINE, IMAGES, PRECISIONS["fp32"], 2048, 16, 512)
    impl = ImplementationPlans(settings, FlopModel(MACHINE.flops))
    assert tuple(SIM_PLANS) == PLANS
    for batch, procs in ((2048, 512), (512, 512)):
        auto = impl.outcome(batch, procs, "auto").planned
        for plan in ("pure_batch", "weird_trick"):
            base = impl.outcome(batch, procs, plan).planned
            model = impl.model(batch, procs)
            assert base.iteration_time == pytest.approx(
                evaluate(model, explicit_baseline(model, plan)).iteration_time, rel=1e-12)
            assert auto.iteration_time < base.iteration_time
    assert impl.outcome(512, 1024, "pure_batch").planned is None
    assert "batch" in impl.outcome(512, 1024, "pure_batch").why_not


# -- --overlap: the implementation model's plans with gradient sums in flight ----------------

HALF = dataclasses.replace(MACHINE, name="half", overlap=0.5)


@pytest.fixture(scope="module")
def sim_overlap(tmp_path_factory):
    """AlexNet with --overlap on Cori's constants and half of every gradient sum free to hide
    (a profile's 'overlap' 0.5)."""
    where = tmp_path_factory.mktemp("sim")
    profile = where / "half.toml"
    cori = (ROOT / "hpctrain" / "inputs" / "machines" / "cori-knl.toml").read_text()
    profile.write_text(cori.replace('name = "cori-knl"', 'name = "half"') + "overlap = 0.5\n")
    out = where / "overlap.h5"
    assert simulate_command.run(["--overlap", "--machine", str(profile), "--out", str(out)]) == 0
    with h5py.File(out, "r") as f:
        yield f


def test_overlap_is_recorded_and_off_by_default(sim, sim_overlap):
    assert not sim.attrs["overlap"] and sim.attrs["overlap_share"] == 0.0
    assert sim_overlap.attrs["overlap"] and sim_overlap.attrs["overlap_share"] == 0.5
    assert sim_overlap.attrs["machine"] == "half"
    for name in STUDIES:
        for plan in PLANS:
            hidden = table(sim[name][plan])["hidden_per_epoch"]
            assert np.all(hidden[np.isfinite(hidden)] == 0.0)
            assert sim_overlap[name][plan]["hidden_per_epoch"].attrs["units"] == "s"


def test_overlap_hides_part_of_the_sums_and_the_rest_is_counted(sim, sim_overlap):
    for name in STUDIES:
        for plan in PLANS:
            got, counted = table(sim_overlap[name][plan]), table(sim[name][plan])
            ok = got["runnable"]
            total = got["compute_per_epoch"] + got["comm_per_epoch"] - got["hidden_per_epoch"]
            np.testing.assert_allclose(got["total_per_epoch"][ok], total[ok], rtol=1e-12)
            # at most the share of the communication hides; the paper's rows are untouched
            assert np.all(got["hidden_per_epoch"][ok] >= 0)
            assert np.all(got["hidden_per_epoch"][ok] <= 0.5 * got["comm_per_epoch"][ok])
            if plan != "auto":  # the same plan, some of its sums hidden
                assert np.all(got["total_per_epoch"][ok] <= counted["total_per_epoch"][ok])
        assert np.array_equal(sim_overlap[name]["total_per_epoch"][()],
                              sim[name]["total_per_epoch"][()])
    batch = table(sim_overlap["strong/pure_batch"])
    assert np.all(batch["hidden_per_epoch"] > 0)  # every layer's sum, behind the layer below


@pytest.mark.parametrize("study,procs", [("strong", 64), ("domain", 1024)])
def test_overlap_plans_are_the_planners_with_sums_in_flight(sim_overlap, study, procs):
    k = np.nonzero(sim_overlap[f"{study}/auto/procs"][()] == procs)[0][0]
    batch = int(sim_overlap[f"{study}/auto/batch"][k])
    model = CostModel(NET, batch, procs, HALF, FlopModel(HALF.flops), 4, overlap=True)
    iterations = IMAGES / batch
    planned = plan_network(model)
    auto = table(sim_overlap[study]["auto"])
    assert auto["total_per_epoch"][k] == pytest.approx(planned.iteration_time * iterations,
                                                       rel=1e-12)
    assert auto["hidden_per_epoch"][k] == pytest.approx(planned.hidden_sums() * iterations,
                                                        rel=1e-12)
    assert planned.lower_bound <= planned.iteration_time
    if procs > batch:  # the baselines cannot run
        return
    trick = evaluate(model, explicit_baseline(model, "weird_trick"))
    assert table(sim_overlap[study]["weird_trick"])["iteration_time"][k] == pytest.approx(
        trick.iteration_time, rel=1e-12)


def test_summary_names_the_baselines(tmp_path, capsys):
    assert simulate_command.run(["--net", "mlp", "--out", str(tmp_path / "sim.h5")]) == 0
    text = capsys.readouterr().out
    assert "pure batch" in text and "weird trick" in text and "cannot run" in text


def plot_module():
    spec = importlib.util.spec_from_file_location("plot_simulation",
                                                  ROOT / "analysis" / "plot_simulation.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_plotter():
    return plot_module().plot_simulation


def test_plots_are_written(sim, tmp_path):
    written = load_plotter()(sim.filename, tmp_path / "plots")
    assert {p.name for p in written} == {f"{s}_{kind}.png" for s in STUDIES
                                         for kind in ("grids", "speedup", "plans")}
    for path in written:
        assert path.stat().st_size > 10_000
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_runs_without_mpi(tmp_path):
    out = tmp_path / "sim.h5"
    code = ("import sys; from hpctrain.commands import simulate as simulate_command; "
            f"rc = simulate_command.run(['--out', {str(out)!r}, '--images', '1.2e6']); "
            "assert 'mpi4py' not in sys.modules, 'simulate imported mpi4py'; sys.exit(rc)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert "wrote" in result.stdout and out.is_file()


@pytest.mark.parametrize("args,message", [
    (["--images", "0"], "--images 0"),
    (["--images", "many"], "--images 'many'"),
    (["--precision", "fp8"], "--precision: invalid choice: 'fp8'"),
    (["--weak-batch-per-rank", "2.5"], "--weak-batch-per-rank 2.5"),
    (["--net", "resnet"], "unknown net 'resnet'"),
    (["--machine", "nowhere"], "unknown machine 'nowhere'"),
])
def test_bad_options_raise_user_errors(tmp_path, args, message):
    with pytest.raises(UserError, match=re.escape(message)):
        simulate_command.run([*args, "--out", str(tmp_path / "sim.h5")])
    assert not (tmp_path / "sim.h5").exists()


def test_out_must_not_be_a_directory(tmp_path):
    with pytest.raises(UserError, match=re.escape(str(tmp_path))):
        simulate_command.run(["--out", str(tmp_path)])


@pytest.mark.parametrize("target", ["run_studies", "write_table"])
def test_a_failure_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch, target):
    out = tmp_path / "sim.h5"
    out.write_bytes(b"the previous results")

    def fail(*args, **kwargs):
        raise RuntimeError("injected failure")

    monkeypatch.setattr(paper, target, fail)
    with pytest.raises(RuntimeError, match="injected"):
        simulate_command.run(["--out", str(out)])
    assert out.read_bytes() == b"the previous results"
    assert [p.name for p in tmp_path.iterdir()] == ["sim.h5"]


def fewer_points(patch):
    """Two P in each study, the domain study's P = B and 4096 among them: drawing a study's
    figures costs seconds per P, and what the tests that draw them check needs no more."""
    patch.setattr(paper, "STRONG_PROCS", (8, 64))
    patch.setattr(paper, "WEAK_PROCS", (8, 64))
    patch.setattr(paper, "DOMAIN_PROCS", (512, 4096))


@pytest.fixture(scope="module")
def drawn_without_4096(tmp_path_factory):
    """(file, figures) of ``simulate --net mlp --plots`` (fewer_points) with the planner failing
    at P = 4096, where the baselines cannot run either: one run of the checkout's script draws
    a P where nothing runs and every figure --plots makes (no figures without matplotlib)."""
    from hpctrain.plan.planner import PlannerError

    real = paper.plan_network

    def plan_unless_4096(model):
        if model.procs == 4096:
            raise PlannerError("layer fc8 cannot be split on 4096 processes")
        return real(model)

    where = tmp_path_factory.mktemp("sim")
    out, figs = where / "sim.h5", where / "figs"
    plots = ["--plots", str(figs)] if importlib.util.find_spec("matplotlib") else []
    with pytest.MonkeyPatch.context() as patch:
        fewer_points(patch)
        patch.setattr(paper, "plan_network", plan_unless_4096)
        assert simulate_command.run(["--net", "mlp", "--out", str(out), *plots]) == 0
    return out, figs


def test_a_point_without_a_plan_keeps_its_rows(drawn_without_4096):
    out, figs = drawn_without_4096
    with h5py.File(out, "r") as f:
        auto = table(f["domain/auto"])
        k = np.nonzero(auto["procs"] == 4096)[0][0]
        assert math.isnan(auto["total_per_epoch"][k])
        assert auto["plan"][k].startswith("none: layer fc8")
        assert np.any(f["domain/procs"][()] == 4096)
        assert not any(table(f["domain"][plan])["runnable"][k] for plan in PLANS)
    # a P where nothing runs still gets its panel
    assert (figs / "domain_plans.png").is_file()


def test_plots_option_runs_the_checkouts_script(drawn_without_4096, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    _, figs = drawn_without_4096
    assert sorted(p.name for p in figs.iterdir()) == sorted(
        f"{s}_{kind}.png" for s in STUDIES for kind in ("grids", "speedup", "plans"))
    # a script that fails: the results are kept, and the failure is an output error (status 3)
    broken = tmp_path / "plot_simulation.py"
    broken.write_text("import sys; sys.exit(4)\n")
    monkeypatch.setattr(simulate_command, "plot_script", lambda: broken)
    fewer_points(monkeypatch)
    out = tmp_path / "sim.h5"
    with pytest.raises(OutputError, match="plot_simulation.py failed with status 4"):
        simulate_command.run(["--net", "mlp", "--out", str(out), "--plots", str(tmp_path)])
    assert out.is_file()


# -- --levels: plans made with and without the machine's levels, priced on the levelled one ---

# DGX-like nodes: 8 ranks on a 450 GB/s link, 8 NICs of 50 GB/s between nodes
TWO_LEVELS = """name = "two-levels"
alpha = 3e-6
beta = 2.2222e-12
flops = 1.5e14
device = "gpu"
ranks_per_node = 8

[network]
alpha = 8e-6
beta = 2e-11
nics = 8
"""
LEVELLED = parse_machine(TWO_LEVELS, "two-levels")
LEVELS_COLUMNS = ("procs", "batch", "levelled_time", "flat_on_levelled_time", "flat_time", "loss",
                  "segments", "segments_changed",
                  *(f"{plan}_{key}" for plan in ("levelled", "flat")
                    for key in ("widest_model_group", "model_group_crosses_nodes",
                                "domain_halos_crossing", "plan", "summary",
                                "planning_seconds")))


@pytest.fixture(scope="module")
def two_levels(tmp_path_factory):
    path = tmp_path_factory.mktemp("machines") / "two-levels.toml"
    path.write_text(TWO_LEVELS)
    return path


@pytest.fixture(scope="module")
def small_levels():
    """AlexNet and ResNet-50 (branches: planned by elimination) on P = 8..64."""
    return levels_study.run_levels([NET, load_net("resnet50")], LEVELLED, 2048,
                                       (8, 16, 32, 64))


def choices(plan):
    """{layer: 'mode RxC'} of a stored plan string."""
    return dict(part.split("=") for part in plan.split(", "))


def test_the_flat_plan_is_never_faster_on_the_levelled_machine(small_levels):
    """The planner is exact on the levelled machine, and the flat plan is one of its
    candidates."""
    assert list(small_levels.tables) == ["alexnet", "resnet50"]
    for t in small_levels.tables.values():
        assert list(t["procs"]) == [8, 16, 32, 64] and set(t["batch"]) == {2048}
        for k in range(len(t["procs"])):
            assert t["flat_on_levelled_time"][k] >= t["levelled_time"][k] * (1 - 1e-12)
            assert t["loss"][k] == pytest.approx(
                t["flat_on_levelled_time"][k] / t["levelled_time"][k] - 1, abs=1e-12)
            assert t["loss"][k] >= -1e-12
            levelled, flat = choices(t["levelled_plan"][k]), choices(t["flat_plan"][k])
            assert levelled.keys() == flat.keys() and len(levelled) == t["segments"][k]
            assert t["segments_changed"][k] == sum(levelled[n] != flat[n] for n in levelled)
            for plan, chosen in (("levelled", levelled), ("flat", flat)):
                widest = max([int(c.split()[1].split("x")[0]) for c in chosen.values()
                              if c.startswith("model")], default=1)
                assert t[f"{plan}_widest_model_group"][k] == widest
                assert t[f"{plan}_model_group_crosses_nodes"][k] == (widest > 8)
    # the flat profile prices a model group of 16 as if every byte crossed one NIC: it keeps
    # AlexNet's classifier on groups of 8 where the levelled plan takes 16, across two nodes
    alexnet = small_levels.tables["alexnet"]
    assert max(alexnet["loss"]) > 0.01
    assert any(a > b for a, b in zip(alexnet["levelled_widest_model_group"],
                                     alexnet["flat_widest_model_group"]))


def test_the_times_are_the_planners_and_evaluates():
    net, batch, procs = load_net("resnet50"), 2048, 32
    got = levels_study.compare_levels(net, LEVELLED, batch, procs).row()
    flops = FlopModel(LEVELLED.flops)
    model = CostModel(net, batch, procs, LEVELLED, flops)
    flat = plan_network(CostModel(net, batch, procs, LEVELLED.flattened(), flops))
    assert got["levelled_time"] == pytest.approx(plan_network(model).iteration_time, rel=1e-12)
    assert got["flat_time"] == pytest.approx(flat.iteration_time, rel=1e-12)
    on_levelled = evaluate(model, [flat.plans[head] for head in model.heads])
    assert got["flat_on_levelled_time"] == pytest.approx(on_levelled.iteration_time, rel=1e-12)
    assert LEVELLED.flattened().alpha == 8e-6  # the network's link, between every pair


def test_on_a_flat_profile_the_loss_is_exactly_zero():
    t = levels_study.run_levels([NET], MACHINE, 2048, (8, 64)).tables["alexnet"]
    assert list(t["loss"]) == [0.0, 0.0] and list(t["segments_changed"]) == [0, 0]
    assert t["flat_plan"] == t["levelled_plan"] and t["flat_time"] == t["levelled_time"]
    assert not any(t["levelled_model_group_crosses_nodes"])  # no nodes to cross


def test_levels_writes_every_column(two_levels, tmp_path, capsys):
    out = tmp_path / "levels.h5"
    assert simulate_command.run(["--levels", "--machine", str(two_levels), "--net", "alexnet",
                                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "loss %" in text and "alexnet" in text and f"wrote {out}" in text
    with h5py.File(out, "r") as f:
        assert list(f) == ["levels", "levels_domain"] and list(f["levels"]) == ["alexnet"]
        assert f.attrs["machine"] == "two-levels" and f.attrs["ranks_per_node"] == 8
        assert f.attrs["least_batch"] == 2048 and "--levels" in f.attrs["command"]
        assert f.attrs["domain_batch"] == 512
        tables = []
        for study in ("levels", "levels_domain"):
            group = f[f"{study}/alexnet"]
            assert set(group) == set(LEVELS_COLUMNS)
            assert len({len(group[key]) for key in LEVELS_COLUMNS}) == 1
            for key in ("levelled_time", "flat_on_levelled_time", "flat_time"):
                assert group[key].attrs["units"] == "s"
            assert group["loss"].attrs["units"] == "1"
            tables.append(table(group))
    t, domain = tables
    assert list(t["procs"]) == [2**k for k in range(3, 13)]
    assert list(t["batch"]) == [max(2048, p) for p in t["procs"]]
    # fewer samples than ranks: B = --domain-batch at each P of the domain study above it
    assert list(domain["procs"]) == [1024, 2048, 4096] and set(domain["batch"]) == {512}
    for t in tables:
        assert np.all(t["flat_on_levelled_time"] >= t["levelled_time"] * (1 - 1e-12))
        for plan in ("levelled", "flat"):  # halos cross nodes where Pr does not divide 8
            assert list(t[f"{plan}_domain_halos_crossing"]) == [
                sum(1 for c in choices(text).values()
                    if c.startswith("domain") and 8 % int(c.split()[1].split("x")[0]))
                for text in t[f"{plan}_plan"]]
    written = load_plotter()(out, tmp_path / "plots")
    assert [p.name for p in written] == ["levels_alexnet.png", "levels_domain_alexnet.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in written)


def test_levels_plans_three_nets_unless_told_one(two_levels, tmp_path, monkeypatch):
    monkeypatch.setattr(levels_study, "LEVELS_PROCS", (8,))  # one P: the nets are what counts
    monkeypatch.setattr(paper, "DOMAIN_PROCS", (16,))
    monkeypatch.chdir(tmp_path)
    assert simulate_command.run(["--levels", "--machine", str(two_levels)]) == 0
    monkeypatch.setattr(paper, "DOMAIN_PROCS", (16,))
    assert simulate_command.run(["--levels", "--machine", str(two_levels), "--domain-batch",
                                 "8", "--out", "small.h5"]) == 0
    with h5py.File(tmp_path / "runs" / "levels.h5", "r") as f:  # the default --out
        assert list(f["levels"]) == ["alexnet", "inception_v3", "resnet50"]
        assert f["levels"].attrs["nets"] == "alexnet,resnet50,inception_v3"
        assert "levels_domain" not in f  # no P of the domain study above 512
    with h5py.File(tmp_path / "small.h5", "r") as f:
        assert list(f["levels_domain/alexnet/batch"]) == [8]


@pytest.mark.parametrize("args,message", [
    ([], "--levels needs a machine profile with levels"),
    (["--machine", "gpu-like"], "gpu-like is flat: give --machine"),
    (["--images", "5"], "--images belongs to the strong, weak and domain studies"),
    (["--overlap"], "--overlap belongs to"),
])
def test_levels_refuses_in_one_line(two_levels, tmp_path, args, message):
    if "--images" in args or "--overlap" in args:
        args = [*args, "--machine", str(two_levels)]
    with pytest.raises(UserError, match=re.escape(message)) as refused:
        simulate_command.run(["--levels", *args, "--out", str(tmp_path / "levels.h5")])
    assert "\n" not in str(refused.value)
    assert not (tmp_path / "levels.h5").exists()


# -- --volumes: CosmoFlow on 128³ and 512³ under a memory cap per rank ---------------------------

GPU = load_machine("perlmutter-gpu")
A100 = 40 * 2**30
# at B = 64 no plan fits a 512³ volume up to P = 64 and one does from P = 128 (two ranks per
# sample), where pure batch no longer runs on 128³ either: every case below is met by P = 128,
# and P = 512, where the planner's searches cost the most, adds none
VOLUME_PROCS = (8, 16, 64, 128)


@dataclasses.dataclass(frozen=True)
class VolumesRun:
    """What one ``simulate --volumes`` did: the study it made, the file it wrote, what it
    printed and the folder of its plots (none without matplotlib)."""

    study: volumes_study.VolumesStudy
    out: Path
    printed: str
    figs: Path


@pytest.fixture(scope="module")
def volumes_run(tmp_path_factory):
    """``simulate --volumes`` with its defaults, at VOLUME_PROCS, run once for the module: the
    planning is what costs, and the study's tables and the file, summary and plots the command
    makes of them are checked apart below."""
    where = tmp_path_factory.mktemp("volumes")
    made, run = [], volumes_study.run_volumes

    def run_volumes(*args, **kwargs):
        made.append(run(*args, **kwargs))
        return made[-1]

    plots = ["--plots", str(where / "figs")] if importlib.util.find_spec("matplotlib") else []
    printed = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(printed):
        patch.setattr(volumes_study, "VOLUMES_PROCS", VOLUME_PROCS)
        patch.setattr(volumes_study, "run_volumes", run_volumes)
        assert simulate_command.run(["--volumes", "--out", str(where / "volumes.h5"),
                                     *plots]) == 0
    return VolumesRun(made.pop(), where / "volumes.h5", printed.getvalue(), where / "figs")


@pytest.fixture(scope="module")
def volumes(volumes_run):
    """The study of CosmoFlow on 128³ and 512³ on perlmutter-gpu at B = 64 under 40 GiB per
    rank, as ``simulate --volumes`` makes it by default."""
    study = volumes_run.study
    assert (study.net.name, study.machine, study.cap, study.strong_batch, study.space) == (
        "cosmoflow", GPU, A100, 64, "auto")
    with h5py.File(volumes_run.out, "r") as f:
        assert f.attrs["precision"] == "fp32"
    return study


def test_volumes_points_follow_the_scaling_rules(volumes):
    assert list(volumes.tables) == [(128, "strong"), (128, "weak"), (512, "strong"),
                                    (512, "weak")]
    for (size, scaling), t in volumes.tables.items():
        assert list(t["procs"]) == list(VOLUME_PROCS)
        per_sample = {128: 1, 512: 4}[size]
        assert list(t["batch"]) == ([64] * len(VOLUME_PROCS) if scaling == "strong"
                                    else [p // per_sample for p in VOLUME_PROCS])


def test_volumes_pure_batch_runs_only_where_it_splits_and_fits(volumes):
    for t in volumes.tables.values():
        for k, (procs, batch) in enumerate(zip(t["procs"], t["batch"], strict=True)):
            memory = t["pure_batch_memory_per_rank"][k]
            runs = procs <= batch and memory <= A100
            assert t["pure_batch_runnable"][k] == runs
            assert math.isfinite(t["pure_batch_iteration_time"][k]) == runs
            assert math.isnan(memory) == (procs > batch)  # over the cap: its peak is kept
            if not runs:
                assert t["pure_batch_plan"][k].startswith("none: ")
                assert math.isnan(t["auto_speedup_over_batch"][k])
    # a 512³ sample needs 75.6 GiB: pure batch fits nowhere; 128³ up to P = B = 64 it does
    assert not any(volumes.tables[512, "strong"]["pure_batch_runnable"])
    assert not any(volumes.tables[512, "weak"]["pure_batch_runnable"])
    assert list(volumes.tables[128, "strong"]["pure_batch_runnable"]) == [True] * 3 + [False]
    assert all(volumes.tables[128, "weak"]["pure_batch_runnable"])


def depth_ranks(first_layer: str) -> int:
    """The ranks a volume's depth is cut over, from the first layer's mode and grid: 'domain
    8x4' (the depth over the grid's rows), 'split n=64,c=1,d=4,h=2,w=2' (its d), else 1."""
    mode, grid = first_layer.split()
    if mode == "domain":
        return int(grid.split("x")[0])
    found = re.search(r"\bd=(\d+)", grid) if mode == "split" else None
    return int(found[1]) if found else 1


def test_volumes_auto_at_512_splits_the_depth_within_the_cap(volumes):
    for scaling in ("strong", "weak"):
        t = volumes.tables[512, scaling]
        for k, procs in enumerate(t["procs"]):
            fits = scaling == "weak" or procs >= 2 * 64  # at least two ranks per sample
            assert t["auto_runnable"][k] == fits
            if fits:
                assert depth_ranks(t["auto_first_layer"][k]) > 1
                assert t["auto_memory_per_rank"][k] <= A100
                assert t["auto_plan"][k].startswith(f"block1.conv1={t['auto_first_layer'][k]}")
            else:
                assert t["auto_plan"][k].startswith("none: no plan fits in --mem-per-rank")
    # one volume per node: the depth over the node's 4 ranks, about 18.5 GiB each at every P
    weak = volumes.tables[512, "weak"]
    assert all(first.startswith("domain 4x") for first in weak["auto_first_layer"])
    assert max(weak["auto_memory_per_rank"]) / min(weak["auto_memory_per_rank"]) < 1.02


def test_volumes_auto_is_never_slower_than_pure_batch(volumes):
    """The planner is exact under the cap, and pure batch, where it fits, is a candidate."""
    compared = 0
    for t in volumes.tables.values():
        for k in range(len(t["procs"])):
            if t["pure_batch_runnable"][k]:
                assert t["auto_runnable"][k]
                assert t["auto_iteration_time"][k] <= t["pure_batch_iteration_time"][k] * (
                    1 + 1e-12)
                assert t["auto_speedup_over_batch"][k] == pytest.approx(
                    t["pure_batch_iteration_time"][k] / t["auto_iteration_time"][k], rel=1e-12)
                compared += 1
    assert compared == 3 + len(VOLUME_PROCS)


def test_volumes_rates_speedups_and_the_planners_numbers(volumes):
    strong = volumes.tables[128, "strong"]
    times = strong["auto_iteration_time"]
    assert times[0] > times[1] > times[2]  # P = 8 -> 16 -> 64 at B = 64
    for plan in ("auto", "pure_batch"):
        for t in volumes.tables.values():
            ok = [k for k, runs in enumerate(t[f"{plan}_runnable"]) if runs]
            for k in ok:
                rate = t["batch"][k] / t[f"{plan}_iteration_time"][k]
                assert t[f"{plan}_samples_per_second"][k] == pytest.approx(rate, rel=1e-12)
                speedup = rate / t[f"{plan}_samples_per_second"][ok[0]]
                assert t[f"{plan}_speedup"][k] == pytest.approx(speedup, rel=1e-12)
                assert t[f"{plan}_efficiency"][k] == pytest.approx(
                    speedup * t["procs"][ok[0]] / t["procs"][k], rel=1e-12)
                assert t[f"{plan}_iteration_time"][k] == pytest.approx(
                    t[f"{plan}_compute"][k] + t[f"{plan}_communication"][k], rel=1e-9)
    # the stored auto plan is the planner's under the cap over --space auto, priced alike
    t = volumes.tables[512, "strong"]
    k = list(t["procs"]).index(128)
    model = CostModel(load_net("cosmoflow", 512), 64, 128, GPU, FlopModel(GPU.flops))
    planned = plan_over(model, A100, space="auto")
    assert t["auto_iteration_time"][k] == pytest.approx(planned.iteration_time, rel=1e-12)
    assert t["auto_memory_per_rank"][k] == pytest.approx(planned.memory, rel=1e-12)


def test_volumes_writes_its_file_and_plots(volumes_run):
    pytest.importorskip("matplotlib")
    text = volumes_run.printed
    assert "perlmutter-gpu" in text and "at most 40 GiB per rank" in text
    assert "512^3 strong (B = 64)" in text and "no plan fits" in text
    with h5py.File(volumes_run.out, "r") as f:
        assert f.attrs["machine"] == "perlmutter-gpu" and f.attrs["net"] == "cosmoflow"
        assert f.attrs["mem_per_rank"] == A100 and "--volumes" in f.attrs["command"]
        assert list(f["volumes"]) == ["cosmoflow_128", "cosmoflow_512"]
        group = f["volumes/cosmoflow_512/weak"]
        assert group.attrs["batch_rule"] == "B = P/4"
        assert list(group["batch"][()]) == [2, 4, 16, 32]
        for plan in ("auto", "pure_batch"):
            for key in volumes_study.VOLUME_COLUMNS:
                assert len(group[f"{plan}_{key}"]) == len(VOLUME_PROCS)
        assert group["auto_memory_per_rank"].attrs["units"] == "B"
        assert group["auto_iteration_time"].attrs["units"] == "s"
        assert group["auto_first_layer"].asstr()[0] == "domain 4x2"
    assert sorted(p.name for p in volumes_run.figs.iterdir()) == [
        "volumes_cosmoflow_128.png", "volumes_cosmoflow_512.png"]


@pytest.mark.parametrize("args,message", [
    (["--levels"], "--volumes and --levels are two studies"),
    (["--images", "5"], "--images belongs to the strong, weak and domain studies; --volumes "
                        "takes"),
    (["--net", "alexnet"], "--volumes needs a net on volumes"),
    (["--strong-batch", "0"], "--strong-batch 0"),
])
def test_volumes_refuses_in_one_line(tmp_path, args, message):
    with pytest.raises(UserError, match=re.escape(message)) as refused:
        simulate_command.run(["--volumes", *args, "--out", str(tmp_path / "v.h5")])
    assert "\n" not in str(refused.value)
    assert not (tmp_path / "v.h5").exists()


def test_mem_per_rank_belongs_to_volumes(tmp_path):
    with pytest.raises(UserError, match="--mem-per-rank belongs to the --volumes study"):
        simulate_command.run(["--mem-per-rank", "40G", "--out", str(tmp_path / "s.h5")])


# -- the --ddp study --------------------------------------------------------------------------

def test_the_ddp_study_prices_ddp_and_auto_under_the_same_terms(tmp_path, capsys):
    """ResNet-18 on dgx-h100: a table per batch-norm choice, P = 8..4096; the auto plan never
    slower than DDP's; DDP's step is pure batch with statistics per rank (no batch-norm
    communication in the forward) and its sums in flight (some hidden)."""
    from hpctrain.plan.ddp import against_ddp, ddp_faithful, ddp_model

    out = tmp_path / "ddp.h5"
    assert simulate_command.run(["--ddp", "--net", "resnet18", "--machine", "dgx-h100",
                                 "--out", str(out)]) == 0
    assert "auto against the DDP-faithful step" in capsys.readouterr().out
    with h5py.File(out) as h5:
        groups = h5["ddp"]["dgx-h100"]
        assert sorted(groups) == ["resnet18_global", "resnet18_rank"]
        for name in groups:
            t = groups[name]
            assert list(t["procs"][:]) == [2**k for k in range(3, 13)]
            assert np.all(t["auto_time"][:] <= t["ddp_time"][:] * (1 + 1e-12))
            assert np.all(t["speedup"][:] >= 1 - 1e-12)
            assert np.all(t["ddp_hidden"][:] > 0)
        rank, every = groups["resnet18_rank"], groups["resnet18_global"]
        assert np.all(rank["ddp_time"][:] < every["ddp_time"][:])  # no statistics sums
    machine, net = load_machine("dgx-h100"), load_net("resnet18")
    model = ddp_model(net, machine, 2048, 64)
    ddp = ddp_faithful(model)
    assert {p.describe() for p in ddp.plans if p.mode != "follow"} == {"batch 1x64"}
    assert all(c.comm[0] == 0 for c in ddp.layers if c.kind == "batchnorm")
    assert ddp.hidden_sums() > 0 and model.machine.bucket_bytes == 25 * 2**20
    found = against_ddp(net, machine, 2048, 64)
    assert found.ddp.iteration_time == pytest.approx(ddp.iteration_time)


def test_the_ddp_study_refuses_what_it_does_not_take(tmp_path):
    with pytest.raises(UserError, match="--overlap does not apply to --ddp"):
        simulate_command.run(["--ddp", "--overlap", "--out", str(tmp_path / "d.h5")])
    with pytest.raises(UserError, match="three studies"):
        simulate_command.run(["--ddp", "--levels", "--out", str(tmp_path / "d.h5")])


# -- the --side-by-side study ------------------------------------------------------------------

def test_the_side_by_side_study_plans_with_and_without_groups(tmp_path, capsys):
    """resdigits (one block with a convolution on its shortcut) on dgx-h100: a table per
    batch-norm choice, P = 4..4096; the plan that may use groups never slower than the one
    that may not; FlexFlow's case written beside."""
    out = tmp_path / "side.h5"
    assert simulate_command.run(["--side-by-side", "--net", "resdigits", "--machine",
                                 "dgx-h100", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "branches allowed on groups" in printed and "FlexFlow's case" in printed
    with h5py.File(out) as h5:
        groups = h5["side_by_side"]["dgx-h100"]
        assert sorted(groups) == ["resdigits_global", "resdigits_rank"]
        for name in groups:
            t = groups[name]
            assert list(t["procs"][:]) == [4**k for k in range(1, 7)]
            assert np.all(t["groups_time"][:] <= t["serial_time"][:] * (1 + 1e-12))
            assert np.all(t["gain"][:] >= -1e-12)
            assert np.all((t["regions_on_groups"][:] == 0) == (t["side_by_side"][:] == 0))
        flexflow = h5["side_by_side"]["flexflow"].attrs
        assert flexflow["procs"] == 4 and flexflow["auto_time"] <= flexflow["data_parallel_time"]


def test_the_side_by_side_study_refuses_what_it_does_not_take(tmp_path):
    with pytest.raises(UserError, match="--overlap does not apply to --side-by-side"):
        simulate_command.run(["--side-by-side", "--overlap", "--out", str(tmp_path / "s.h5")])
    with pytest.raises(UserError, match="four studies"):
        simulate_command.run(["--side-by-side", "--ddp", "--out", str(tmp_path / "s.h5")])


def test_a_log_axis_within_one_decade_still_has_numbers():
    """A plot's log axis whose values cross no power of ten (30 to 80) is labelled: at 1…9 of
    the decade, in plain numbers; a wide one at 1, 2 and 5 of each decade."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    module = plot_module()
    for values, wanted in (([31.0, 47.0, 78.0], {"40", "50", "60", "70"}),
                           ([0.3, 4.0, 700.0], {"1", "10", "100"})):
        fig, ax = plt.subplots()
        ax.plot([1, 2, 3], values)
        module.plain_log_axis(ax)
        fig.canvas.draw()
        shown = {t.get_text() for t in ax.get_yticklabels()
                 if t.get_text() and ax.get_ylim()[0] <= t.get_position()[1] <= ax.get_ylim()[1]}
        plt.close(fig)
        assert wanted <= shown, shown
