"""Fitting the cost model's constants to training steps: known constants are recovered from
synthetic layer times, exactly; a log of other plans refits a profile, read back from HDF5;
the profile keeps the factors and says where they came from."""

import itertools
import subprocess
import sys

import numpy as np
import pytest

from hpctrain.cost.compute import FlopModel
from hpctrain.cost.machine import format_machine, load_machine, parse_machine, scaled_links
from hpctrain.model.net import load_net
from hpctrain.plan.planner import choices_of, evaluate
from hpctrain.plan.plans import plan_from_spec, plan_text
from hpctrain.plan.pricing import CostModel
from hpctrain.plan.stepfit import (
    COLUMNS,
    LayerSample,
    communication_columns,
    fit,
    nonnegative_least_squares,
    samples_of_run,
)

TRUE_COMPUTE = {"conv": (1.3, 0.8), "linear": (0.6, 1.7), "relu": (2.0, 2.5),
                "maxpool": (0.9, 1.1), "dropout": (1.5, 0.7)}
TRUE_LINKS = (3.0, 0.4, 2.0, 1.5)
SPECS = ("1x4", "4x1", "2x2", "conv=1x4,fc=4x1", "conv=domain:2x2,fc=2x2")
PROCS = 4  # two nodes of 2 ranks: every group of links carries some messages


@pytest.mark.parametrize("seed", range(6))
def test_nonnegative_least_squares_is_the_best_over_every_subset(seed):
    """The active set's answer equals the best unconstrained least squares over every subset
    of the columns whose entries are all ≥ 0 (the exact non-negative optimum)."""
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(30, 5))
    b = a @ rng.normal(size=5) + rng.normal(scale=0.5, size=30)
    found = np.array(nonnegative_least_squares(a, b))
    assert (found >= 0).all()
    best = np.sum(b ** 2)
    for size in range(1, 6):
        for subset in itertools.combinations(range(5), size):
            x = np.linalg.lstsq(a[:, subset], b, rcond=None)[0]
            if (x >= 0).all():
                best = min(best, np.sum((a[:, subset] @ x - b) ** 2))
    assert np.sum((a @ found - b) ** 2) == pytest.approx(best, rel=1e-9)


def test_a_floor_holds_a_factor_the_times_would_drive_below_it():
    """Times that a second column explains better alone: its partner is held at the floor,
    the floor's share taken off before the rest is fitted."""
    a = np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
    b = a @ np.array([-0.5, 2.0])
    x = nonnegative_least_squares(a, b, floor=0.05)
    assert x[0] == pytest.approx(0.05)
    assert x[1] == pytest.approx(np.linalg.lstsq(a[:, 1:], b - 0.05 * a[:, 0], rcond=None)[0][0])


def test_a_column_no_row_uses_keeps_factor_one():
    a = np.array([[1.0, 0.0], [2.0, 0.0]])
    assert nonnegative_least_squares(a, np.array([2.0, 4.0])) == pytest.approx([2.0, 1.0])
    # more rows than columns: solved on the R of a QR, the unused column still 1
    tall = np.array([[1.0, 0.0, 1.0], [2.0, 0.0, 0.0], [3.0, 0.0, 1.0], [1.0, 0.0, 2.0]])
    found = nonnegative_least_squares(tall, tall @ np.array([2.0, 7.0, 0.5]), floor=0.05)
    assert found == pytest.approx([2.0, 1.0, 0.5], rel=1e-12)


def measured_runs(machine, procs=PROCS, batch=8, compute=TRUE_COMPUTE, links=TRUE_LINKS):
    """For each plan of SPECS on smallcnn: (plans, base compute (rows, 2), columns (rows, 2,
    4), measured (rows, 2)) with the measured times made from ``compute`` and ``links``
    (TRUE_COMPUTE and TRUE_LINKS)."""
    net = load_net("smallcnn")
    kinds = [layer.kind for layer in net.layers] + [net.loss.name]

    def model_of(links):
        return CostModel(net, batch, procs, links, FlopModel(links.flops))

    runs = []
    for spec in SPECS:
        plans = plan_from_spec(spec, net, procs)
        model = model_of(machine)
        planned = evaluate(model, choices_of(model, plans))
        base = np.array([c.compute for c in [*planned.layers, planned.loss]])
        columns = communication_columns(model_of, plans, machine)
        factors = np.array([compute.get(k, (1.0, 1.0)) for k in kinds])
        measured = base * factors + columns @ np.array(links)
        runs.append((net, plans, kinds, base, columns, measured, planned))
    return runs


def levelled_machine():
    """The dgx-h100 profile on 2 ranks per node."""
    from dataclasses import replace

    return replace(load_machine("dgx-h100"), ranks_per_node=2)


def test_known_constants_are_recovered_from_synthetic_layer_times():
    """Layer times made from known factors on compute per kind and on the four groups of
    links: the fit finds those factors (to rounding)."""
    machine = levelled_machine()
    runs = measured_runs(machine)
    samples = [s for _, _, kinds, base, columns, measured, _ in runs
               for s in samples_of_run(kinds, base, columns, measured)]
    found = fit(samples, plans=len(runs))
    assert found.links == pytest.approx(TRUE_LINKS, rel=1e-6)
    for kind, factors in TRUE_COMPUTE.items():
        assert found.compute[kind] == pytest.approx(factors, rel=1e-6), kind
    # the columns are the model's communication, linear in the four groups
    _, plans, _, _, columns, _, planned = runs[2]
    comm = [sum(c.comm) + sum(c.redistribution) for c in [*planned.layers, planned.loss]]
    assert columns.sum(axis=(1, 2)) == pytest.approx(comm, rel=1e-9)
    scaled = scaled_links(machine, TRUE_LINKS[:2], TRUE_LINKS[2:])
    model = CostModel(runs[2][0], 8, PROCS, scaled, FlopModel(machine.flops))
    again = evaluate(model, choices_of(model, plans), timed=False)
    assert [sum(c.comm) + sum(c.redistribution) for c in [*again.layers, again.loss]] == (
        pytest.approx(list(columns.sum(axis=1) @ np.array(TRUE_LINKS)), rel=1e-9))


def write_log(path, machine, runs, procs=PROCS, batch=8, links=TRUE_LINKS):
    """A compare-plans log of ``runs`` (as measured_runs makes them with ``links``), its layout
    as :func:`hpctrain.commands.compare_plans.write_log` writes it."""
    import h5py

    with h5py.File(path, "w") as h5:
        h5.attrs.update({"processes": procs, "net": "smallcnn", "batch": batch,
                         "dtype": "float32", "machine_profile": format_machine(machine),
                         "input_shape": list(runs[0][0].input_shape)})
        for k, (net, plans, _, base, columns, measured, planned) in enumerate(runs):
            group = h5.create_group(f"plans/{k:02d}")
            group.attrs["plan_file"] = plan_text(net, plans)
            comm = columns.sum(axis=2)
            for source, (compute, talk) in {
                    "predicted": (base, comm),
                    "measured": (measured - columns @ np.array(links),
                                 columns @ np.array(links)),
                    "measured_fastest_rank": (measured - columns @ np.array(links),
                                              columns @ np.array(links))}.items():
                for d, direction in enumerate(("forward", "backward")):
                    layers = group.create_group(f"layers/{source}") if d == 0 else (
                        group[f"layers/{source}"])
                    layers[f"{direction}_compute"] = compute[:, d]
                    layers[f"{direction}_layer_comm"] = talk[:, d]
                    layers[f"{direction}_redistribution"] = np.zeros(len(compute))
            rest = planned.iteration_time - base.sum() - comm.sum()
            group.create_group("iteration").attrs.update(
                {"predicted": planned.iteration_time, "measured": measured.sum() + rest})


def test_a_log_of_other_plans_refits_the_profile(tmp_path):
    """Plans measured under known factors, written as a log and read back: the refitted
    profile carries those factors (its links scaled, compute per kind) and its sources, goes
    through TOML and back, and predicts the logged iterations exactly."""
    from hpctrain.record.measured import read_measured_plans
    from hpctrain.record.refit import errors, refit

    machine = levelled_machine()
    runs = measured_runs(machine)
    write_log(tmp_path / "runs.h5", machine, runs)
    plans = read_measured_plans(tmp_path / "runs.h5")
    assert len(plans) == len(SPECS) and plans[1].plans == runs[1][1]
    fitted, step_fit, found = refit(plans, machine, "4 plans of smallcnn")
    assert step_fit.links == pytest.approx(TRUE_LINKS, rel=1e-6)
    assert fitted.alpha == pytest.approx(machine.alpha * TRUE_LINKS[0])
    assert fitted.network.beta == pytest.approx(machine.network.beta * TRUE_LINKS[3])
    assert fitted.compute_scale["conv"] == pytest.approx(TRUE_COMPUTE["conv"], rel=1e-6)
    assert "4 plans of smallcnn" in fitted.sources["links"]
    assert max(abs(e) for e in errors(found, machine, step_fit)) < 1e-9
    assert max(abs(e) for e in errors(found, machine)) > 0.05  # the profile before was off
    again = parse_machine(format_machine(fitted), "fitted.toml")
    for kind, factors in fitted.compute_scale.items():
        assert again.compute_scale[kind] == pytest.approx(factors, rel=1e-5)
    assert again.sources == fitted.sources
    # a refit of the refitted profile from the same times changes nothing
    _, twice, _ = refit(plans, again, "again")
    assert twice.links == pytest.approx((1, 1, 1, 1), rel=1e-4)


def test_the_compute_scale_multiplies_the_model_s_compute_per_kind():
    from dataclasses import replace

    net = load_net("smallcnn")
    machine = load_machine("default")
    plans = plan_from_spec("1x2", net, 2)
    base = CostModel(net, 8, 2, machine, FlopModel(machine.flops))
    scaled_machine = replace(machine, compute_scale={"conv": (2.0, 3.0)})
    scaled = CostModel(net, 8, 2, scaled_machine, FlopModel(machine.flops))
    one, two = (evaluate(m, choices_of(m, plans)) for m in (base, scaled))
    for a, b in zip(one.layers, two.layers, strict=True):
        factor = (2.0, 3.0) if a.kind == "conv" else (1.0, 1.0)
        assert b.compute == pytest.approx(tuple(c * f for c, f in zip(a.compute, factor)))


def test_a_profile_refuses_a_malformed_compute_scale_or_source():
    from hpctrain.cost.machine import MachineError

    head = 'name = "x"\nalpha = 1e-6\nbeta = 1e-9\nflops = 1e10\n'
    for bad, why in [("[compute_scale]\nconv = [1.0]\n", r"\[forward, backward\]"),
                     ("[compute_scale]\nconv = [1.0, -2]\n", "positive|from"),
                     ("[sources]\nweather = \"sunny\"\n", "unknown key"),
                     ("[sources]\nlinks = 3\n", "a line of text")]:
        with pytest.raises(MachineError, match=why):
            parse_machine(head + bad, "bad.toml")


def test_calibrate_from_log_writes_the_refitted_profile(tmp_path):
    """The command: refits --machine to the log, writes --out, says what changed."""
    machine = levelled_machine()
    from hpctrain.cost.machine import save_machine

    save_machine(machine, tmp_path / "start.toml")
    write_log(tmp_path / "runs.h5", machine, measured_runs(machine))
    done = subprocess.run(
        [sys.executable, "-m", "hpctrain", "calibrate", "--from-log", str(tmp_path / "runs.h5"),
         "--machine", str(tmp_path / "start.toml"), "--out", str(tmp_path / "fitted.toml")],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "alpha x 3, beta x 0.4 inside a node" in done.stdout
    assert "after" in done.stdout and "0.0% after" in done.stdout
    fitted = load_machine(str(tmp_path / "fitted.toml"))
    assert fitted.compute_scale["linear"] == pytest.approx(TRUE_COMPUTE["linear"], rel=1e-4)
    missing = subprocess.run(
        [sys.executable, "-m", "hpctrain", "calibrate", "--from-log", str(tmp_path / "no.h5"),
         "--out", str(tmp_path / "x.toml")], capture_output=True, text=True, timeout=120)
    assert missing.returncode != 0 and "no.h5" in missing.stderr + missing.stdout
    assert len(COLUMNS) == 4


def calibrate(*args):
    return subprocess.run([sys.executable, "-m", "hpctrain", "calibrate", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def test_a_refit_that_predicts_worse_is_not_written(tmp_path):
    """A check log (--check-log) that the profile being replaced predicts exactly, and that a
    refit to another machine's times predicts worse: nothing written, one line saying both
    errors; --force writes it and says so. A log given twice, or copied, counts once; a check
    log that is also fitted, a directory, and measuring options are refused in one line."""
    import shutil

    machine = levelled_machine()
    from hpctrain.cost.machine import save_machine

    start = tmp_path / "start.toml"
    save_machine(machine, start)
    write_log(tmp_path / "runs.h5", machine, measured_runs(machine))
    shutil.copy(tmp_path / "runs.h5", tmp_path / "copy.h5")
    exact = measured_runs(machine, compute={}, links=(1.0, 1.0, 1.0, 1.0))
    write_log(tmp_path / "other.h5", machine, exact, links=(1.0, 1.0, 1.0, 1.0))
    out = tmp_path / "fitted.toml"
    base = ["--from-log", tmp_path / "runs.h5", "--machine", start, "--out", out]
    refused = calibrate(*base, "--check-log", tmp_path / "other.h5")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "the refit predicts worse than dgx-h100" in refused.stderr
    assert "0.0% with dgx-h100" in refused.stderr and not out.exists()
    forced = calibrate(*base, "--check-log", tmp_path / "other.h5", "--force")
    assert forced.returncode == 0 and "worse, written anyway (--force)" in forced.stdout
    assert out.exists()
    once = calibrate("--from-log", tmp_path / "runs.h5", tmp_path / "runs.h5",
                     tmp_path / "copy.h5", "--machine", start, "--out", tmp_path / "o.toml")
    assert once.returncode == 0, once.stderr
    assert once.stdout.count("again: counted once") == 2
    assert f"to {len(exact) * 22} layer times of {len(exact)} plans (runs.h5)" in once.stdout
    for args, said in (((*base, "--check-log", tmp_path / "copy.h5"), "is also fitted"),
                       (("--from-log", tmp_path, "--out", out), "is a directory"),
                       ((*base, "--quick"), "--quick measures nothing with --from-log"),
                       ((*base, "--precision", "bf16"), "--precision measures nothing"),
                       (("--check-log", tmp_path / "runs.h5"), "belongs to --from-log")):
        done = calibrate(*args)
        assert done.returncode == 2 and said in done.stderr, (args, done.stderr)
        assert done.stderr.count("\n") == 1, done.stderr


BEYOND = {"conv": (0.9, 1.1), "relu": (1.4, 0.6)}  # the factors of work beyond the cache


def synthetic_with_a_cache(halving="relu"):
    """Samples of every SPECS plan whose work beyond a cache of the returned bytes ran with
    the BEYOND factors; with the machine and the runs. The cache halves the sizes of the
    ReLUs' work (``halving`` "relu"), or the predicted compute ("compute")."""
    machine = levelled_machine()
    runs = measured_runs(machine, batch=64)
    touched = []
    for net, plans, _, _, _, _, _ in runs:
        model = CostModel(net, 64, PROCS, machine, FlopModel(machine.flops))
        planned = evaluate(model, choices_of(model, plans), timed=False)
        touched.append([c.work.touched_elements() * 4 if c.work else 0
                        for c in [*planned.layers, planned.loss]])
    work = sorted((t, float(sum(b)) if halving == "compute" else 1.0)
                  for row, run in zip(touched, runs, strict=True)
                  for t, b, kind in zip(row, run[3], run[2], strict=True)
                  if halving == "compute" or kind == "relu")
    halves = np.cumsum([b for _, b in work]) >= sum(b for _, b in work) / 2
    cache = work[int(np.argmax(halves))][0]
    samples = []
    for (_, _, kinds, base, columns, _, _), row in zip(runs, touched, strict=True):
        factors = np.array([BEYOND.get(k, (1.0, 1.0)) if t > cache else
                            TRUE_COMPUTE.get(k, (1.0, 1.0)) for k, t in zip(kinds, row,
                                                                           strict=True)])
        measured = base * factors + columns @ np.array(TRUE_LINKS)
        samples += samples_of_run(kinds, base, columns, measured, row)
    return samples, cache, machine, runs, touched


def test_factors_inside_and_beyond_the_cache_are_fitted_apart():
    """Layer times made with one set of factors for work within the cache and another for
    work beyond it: the fit finds both, a kind it saw only inside takes its class's factor
    beyond, and the profile it writes prices each layer by its size."""
    from hpctrain.model.kinds import BEYOND_CACHE, compute_factors

    samples, cache, machine, runs, touched = synthetic_with_a_cache()
    for kind in ("conv", "relu"):
        assert {s.touched > cache for s in samples if s.kind == kind} == {False, True}, kind
    found = fit(samples, len(runs), cache_bytes=cache)
    assert found.links == pytest.approx(TRUE_LINKS, rel=1e-6)
    assert found.compute["conv"] == pytest.approx(TRUE_COMPUTE["conv"], rel=1e-6)
    for kind, factors in BEYOND.items():
        assert found.compute[kind + BEYOND_CACHE] == pytest.approx(factors, rel=1e-6)
    # a kind that ran inside the cache only takes, beyond it, its class's factor there
    fitted = found.applied_to(machine, "synthetic")
    assert fitted.cache_bytes == cache
    inside_only = {s.kind for s in samples} - {s.kind for s in samples if s.touched > cache}
    assert "dropout" in inside_only and "dropout" + BEYOND_CACHE not in fitted.compute_scale
    assert compute_factors(fitted.compute_scale, "dropout", True) == pytest.approx(
        fitted.compute_scale["(memory)" + BEYOND_CACHE])
    assert compute_factors(fitted.compute_scale, "dropout") == pytest.approx(
        TRUE_COMPUTE["dropout"], rel=1e-6)
    # the fitted profile prices every layer with the factor of its size
    model = CostModel(runs[0][0], 64, PROCS, fitted, FlopModel(machine.flops))
    plans, kinds, base = runs[0][1], runs[0][2], runs[0][3]
    priced = evaluate(model, choices_of(model, plans))
    for cost, kind, size, b in zip([*priced.layers, priced.loss], kinds, touched[0], base,
                                   strict=True):
        if kind in ("conv", "relu"):
            want = (BEYOND if size > cache else TRUE_COMPUTE)[kind]
            assert cost.compute == pytest.approx(tuple(b * np.array(want)), rel=1e-6), kind


def test_the_size_past_which_work_leaves_the_cache_is_fitted_too():
    """Not told the cache: the split that fits best classes every sample as the true one
    does, and finds the factors; times with one set of factors keep one set."""
    from hpctrain.plan.stepfit import fit_cache_bytes

    samples, cache, _, runs, _ = synthetic_with_a_cache("compute")
    found = fit_cache_bytes(samples, len(runs))
    assert found.cache_bytes > 0
    assert [s.touched > found.cache_bytes for s in samples] == [s.touched > cache
                                                                for s in samples]
    assert found.links == pytest.approx(TRUE_LINKS, rel=1e-6)
    same = [replace_measured(s, s.predicted * TRUE_COMPUTE.get(s.kind, (1, 1))[s.backward]
                             + float(np.dot(s.columns, TRUE_LINKS))) for s in samples]
    assert fit_cache_bytes(same, len(runs)).cache_bytes == 0


def replace_measured(sample, measured):
    from dataclasses import replace

    return replace(sample, measured=measured)


def test_a_convolution_touches_its_input_output_weights_and_columns():
    from hpctrain.cost.work import LocalWork
    from hpctrain.model.kinds import KINDS

    conv = LocalWork(KINDS["conv"], (2, 3, 8, 8), 4, (3, 3), (1, 1), ((1, 1), (1, 1)))
    windows = 2 * 8 * 8  # output positions
    assert conv.touched_elements() == (2 * 3 * 64 + windows * 4 + 2 * 4 * 3 * 9
                                       + windows * 3 * 9)
    relu = LocalWork(KINDS["relu"], (2, 3, 8, 8))
    assert relu.touched_elements() == 2 * 2 * 3 * 64
    linear = LocalWork(KINDS["linear"], (2, 10), 5)
    assert linear.touched_elements() == 20 + 10 + 2 * 50


def test_a_profile_keeps_the_size_past_which_work_leaves_the_cache():
    from dataclasses import replace

    from hpctrain.cost.machine import MachineError

    machine = replace(load_machine("default"), cache_bytes=16 << 20)
    assert parse_machine(format_machine(machine), "x.toml").cache_bytes == 16 << 20
    head = 'name = "x"\nalpha = 1e-6\nbeta = 1e-9\nflops = 1e10\n'
    for bad, shown in (("-1", "-1"), ("1.5", "1.5"), ('"big"', "'big'"), ("true", "True")):
        with pytest.raises(MachineError, match=f"'cache_bytes' must be .*got {shown}"):
            parse_machine(head + f"cache_bytes = {bad}\n", "bad.toml")


def test_a_convolution_is_fitted_by_the_shape_of_its_window():
    """Pointwise, factorised and volume convolutions each take a factor of their own where the
    layer times hold them; a shape the runs never held takes the convolutions' pooled
    factor; the lookup falls back from a shape to its kind to its class."""
    from hpctrain.model.kinds import compute_factors, shape_class

    assert [shape_class("conv", k) for k in ((3, 3), (1, 1), (1, 7), (7, 1), (3, 3, 3),
                                             (1, 1, 1), ())] == [
        "conv", "conv 1x1", "conv 1xk", "conv 1xk", "conv 3-D", "conv 1x1", "conv"]
    assert shape_class("maxpool", (2, 2)) == "maxpool"
    truth = {"conv": (1.5, 2.0), "conv 1x1": (0.5, 0.8), "conv 1xk": (1.2, 1.1),
             "linear": (0.9, 1.0)}
    rng = np.random.default_rng(0)
    kinds = [k for k in truth for _ in range(6)]
    base = rng.uniform(1e-3, 1e-2, size=(len(kinds), 2))
    columns = np.zeros((len(kinds), 2, 4))
    measured = base * np.array([truth[k] for k in kinds])
    found = fit(samples_of_run(kinds, base, columns, measured))
    for key, factors in truth.items():
        assert found.compute[key] == pytest.approx(factors, rel=1e-6), key
    # the kind pools its shapes, weighted by their predicted time: conv's own fit stays
    assert compute_factors(found.compute, "conv 3-D") == pytest.approx(truth["conv"])
    alone = fit(samples_of_run(kinds[6:18], base[6:18], columns[6:18], measured[6:18]))
    weights = base[6:18].sum(axis=0)  # conv 1x1's and conv 1xk's, in equal numbers
    pooled = [(base[6:12, d].sum() * truth["conv 1x1"][d]
               + base[12:18, d].sum() * truth["conv 1xk"][d]) / weights[d] for d in (0, 1)]
    assert compute_factors(alone.compute, "conv 3-D") == pytest.approx(pooled, rel=1e-6)
    assert compute_factors(alone.compute, "linear") == pytest.approx(pooled, rel=1e-6)  # (gemm)


def test_the_probe_nets_run_every_shape_class_of_the_shipped_nets():
    """calibrate's probes hold every convolution window shape the shipped nets use, so no
    shipped net is priced with a factor fitted on other shapes alone."""
    from hpctrain.commands.probes import PROBE_NETS, parse_probe_nets
    from hpctrain.model.kinds import shape_class
    from hpctrain.model.net import load_net
    from hpctrain.plan.planner import serial_layers
    from hpctrain.plan.pricing import works_of

    def shapes(net):
        return {shape_class(w.op.name, w.kernel, w.groups)
                for w in works_of(serial_layers(net, 1))}

    probed = set().union(*(shapes(load_net(name, size))
                           for name, size in parse_probe_nets(PROBE_NETS)))
    assert {"conv", "conv 1x1", "conv 1xk", "conv 3-D", "conv grouped", "deconv"} <= probed
    for name in ("resnet18", "resnet50", "inception_v3", "cosmoflow", "res3d", "mobilenet_v2",
                 "resnext50"):
        assert shapes(load_net(name, None)) <= probed, name


def test_a_pull_moves_a_lone_factor_its_share_of_the_way_from_one():
    """Times that say x 2: fitted freely the factor is 2; pulled by 1 it goes half the way
    from 1, by 3 a quarter, by 100 hardly leaves 1."""
    samples = [LayerSample("conv", False, p, (0.0,) * len(COLUMNS), 2.0 * p)
               for p in (1.0, 2.0, 3.0)]
    for pull, share in ((0.0, 1.0), (1.0, 0.5), (3.0, 0.25), (100.0, 1 / 101)):
        found = fit(samples, pull=pull)
        assert found.compute["conv"][0] == pytest.approx(1.0 + share, rel=1e-9), pull
        assert found.pull == pull
    # the pull counts in plans: the same rows as two plans' make each plan's worth half
    assert fit(samples, plans=2, pull=2.0).compute["conv"][0] == pytest.approx(1.5, rel=1e-9)


def priced_nets(conv_factors):
    """Two plans of each of a few nets, as refit prices them: a convolution whose steps ran
    its factor in ``conv_factors`` (one per net) times its timing, and a ReLU as timed."""
    from types import SimpleNamespace

    from hpctrain.record.refit import PricedPlan

    found = []
    for k, factor in enumerate(conv_factors):
        net = SimpleNamespace(name=f"net{k}")
        for size in (1.0, 2.0):
            rows = [LayerSample("conv", False, size, (0.0,) * len(COLUMNS), factor * size),
                    LayerSample("relu", False, size / 2, (0.0,) * len(COLUMNS), size / 2)]
            step = sum(s.measured for s in rows)
            found.append(PricedPlan(SimpleNamespace(net=net, iteration=(step, step)), rows, 0.0))
    return found


def test_the_pull_is_the_one_that_predicts_each_net_best_from_the_others():
    """A factor every net shares is worth fitting: no pull. Factors each net has of its own
    (around 1) tell nothing of the next net: the strongest pull, which keeps to the
    microbenchmarks. With two nets there is no net to leave out and fit the rest: none."""
    from hpctrain.cost.machine import Machine
    from hpctrain.record.refit import PULLS, pulled_fit

    plain = Machine("none", 1.0, 1.0, 1.0)

    def pull_of(found):
        rows = [s for p in found for s in p.samples]
        weights = [p.plan.iteration[1] ** -2 for p in found for _ in p.samples]
        whole = pulled_fit(found, plain, lambda pull: fit(rows, len(found), weights, 0, pull))
        pull = whole.pull
        # the fit to every net, under the pull chosen
        assert whole == fit(rows, len(found), weights, 0, pull)
        said = whole.applied_to(plain, "the probes").sources["compute"]
        assert said.endswith(f"pulled towards 1 by {pull:g}") if pull else "pulled" not in said
        return pull

    shared = priced_nets([1.5, 1.5, 1.5, 1.5])
    assert pull_of(shared) == 0.0
    own = priced_nets([0.6, 1.4, 0.7, 1.3])
    assert pull_of(own) == max(PULLS)
    assert pull_of(priced_nets([0.6, 1.4])) == 0.0
    # every pull predicts steps that ran as timed exactly: of equal errors, the strongest
    assert pull_of(priced_nets([1.0, 1.0, 1.0])) == max(PULLS)
