"""analysis/plot_logs.py and analysis/logs.py: plots from HDF5 run logs (serial, no MPI).

Synthetic logs are written with h5py in the layout of :mod:`hpctrain.record.runlog`; one test reads
the log of a real one-process run, so the reader is checked against the writer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

h5py = pytest.importorskip("h5py")
pytest.importorskip("matplotlib")

from analysis import logs, plot_logs, timeline  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NAMES = ("conv1", "fc1", "loss")
PNG = b"\x89PNG\r\n\x1a\n"


def layer_fields(scale: float) -> dict[str, np.ndarray]:
    """Distinct seconds for every (field, row), so that a sum of the wrong fields shows."""
    return {f: scale * (k + 1) * np.array([1e-3, 2e-3, 5e-4])
            for k, f in enumerate(logs.TIME_FIELDS)}


def write_log(path: Path, *, processes: int = 1, batch: int = 8, grid: str | None = None,
              step_seconds=(0.5, 0.1, 0.3, 0.2), net: str = "alexnet",
              predicted_iteration: float | None = 0.15, iteration_measured: float | None = 0.25,
              validation: bool = False, summary: bool = True) -> Path:
    """A minimal run log in the layout hpctrain.record.runlog writes."""
    steps = len(step_seconds)
    with h5py.File(path, "w") as f:
        f.attrs.update({
            "processes": processes, "batch": batch, "net": net, "input_shape": [3, 67, 67],
            "device": "cpu", "dtype": "float32", "status": f"finished at step {steps}",
            "config": json.dumps({"net": net, "grid": grid, "batch": batch}),
            "plan": "conv1 batch 1x1\nfc1 batch 1x1",
            "command": f"python -m hpctrain --net {net} --log {path.name}",
        })
        if predicted_iteration is not None:
            f.attrs["predicted_iteration"] = predicted_iteration
        f["steps/step"] = np.arange(steps)
        f["steps/seconds"] = np.asarray(step_seconds, dtype=float)
        f["steps/loss"] = np.linspace(2.3, 1.0, steps)
        f["steps/accuracy"] = np.linspace(0.1, 0.6, steps)
        f["steps/layers/name"] = np.array(NAMES, dtype="S")
        f["validation/step"] = np.array([steps // 2, steps] if validation else [], dtype="i8")
        f["validation/loss"] = np.array([1.5, 1.1] if validation else [], dtype=float)
        f["validation/accuracy"] = np.array([0.5, 0.8] if validation else [], dtype=float)
        if summary:
            f["layers/name"] = np.array(NAMES, dtype="S")
            for kind, scale in (("predicted", 0.8), ("measured", 1.0),
                                ("measured_fastest_rank", 0.9)):
                for name, values in layer_fields(scale).items():
                    f[f"layers/{kind}/{name}"] = values
            iteration = f.create_group("iteration")
            if predicted_iteration is not None:
                iteration.attrs["predicted"] = predicted_iteration
            if iteration_measured is not None:
                iteration.attrs["measured"] = iteration_measured
    return path


def read_one(path: Path) -> logs.Run:
    runs = logs.read_log(path)
    assert len(runs) == 1
    return runs[0]


# ---------------------------------------------------------------------------------------------
# reading


def test_iteration_time_is_the_median_without_the_first_step(tmp_path):
    run = read_one(write_log(tmp_path / "a.h5", step_seconds=(9.0, 0.1, 0.3, 0.2),
                             iteration_measured=7.0))
    assert run.iteration_time == pytest.approx(0.2)  # median of 0.1, 0.3, 0.2; not 7.0
    single = read_one(write_log(tmp_path / "b.h5", step_seconds=(0.4,)))
    assert single.iteration_time == pytest.approx(0.4)
    no_steps = read_one(write_log(tmp_path / "c.h5", step_seconds=(), iteration_measured=0.3))
    assert no_steps.iteration_time == pytest.approx(0.3)


def test_reads_the_fields_of_a_run_log(tmp_path):
    run = read_one(write_log(tmp_path / "run.h5", processes=4, batch=16, grid="conv=1x4,fc=4x1",
                             validation=True))
    assert (run.name, run.net, run.processes, run.batch) == ("run", "alexnet", 4, 16)
    assert run.grid_spec == "conv=1x4,fc=4x1" and run.grid_label == "conv=1xP,fc=Px1"
    assert run.input_shape == (3, 67, 67)
    assert run.measured.names == NAMES and run.predicted.names == NAMES
    np.testing.assert_allclose(run.measured.fields["backward_layer_comm"],
                               layer_fields(1.0)["backward_layer_comm"])
    assert run.iteration_predicted == pytest.approx(0.15)
    assert list(run.validation_accuracy) == [0.5, 0.8]


@pytest.mark.parametrize(("spec", "procs", "kinds"), [
    (None, 4, ["1xP (batch)"]),
    ("1x4", 4, ["1xP (batch)"]),
    ("4x1", 4, ["Px1 (model)"]),
    ("2x2", 4, ["2x2"]),
    ("auto", 2, ["auto"]),
    ("conv=1x2,fc=2x1", 2, ["conv=1xP,fc=Px1"]),
    ("conv=domain:2x2,fc=4x1", 4, ["conv=domain:2x2,fc=Px1"]),
    ("hpctrain/inputs/plans/smallcnn-p4-mixed.plan", 4, ["smallcnn-p4-mixed.plan"]),
    ("smallcnn-p4-mixed", 4, ["smallcnn-p4-mixed"]),
    ("1x1", 1, ["1xP (batch)", "Px1 (model)"]),
    ("conv=1x1,fc=1x1", 1,
     ["conv=1xP,fc=1xP", "conv=1xP,fc=Px1", "conv=Px1,fc=1xP", "conv=Px1,fc=Px1"]),
])
def test_grid_kinds_name_the_grid_independently_of_p(spec, procs, kinds):
    assert logs.grid_kinds(spec, procs) == kinds


# ---------------------------------------------------------------------------------------------
# scaling


def scaling_runs(tmp_path: Path) -> list[logs.Run]:
    """Strong: batch 16 on P = 1, 2, 4 under three grids; weak: batch 2·P under two; each
    measured iteration is (1 + number) / P seconds and predicted half of it."""
    runs = []
    for procs in (1, 2, 4):
        for k, grid in enumerate((None, "auto", f"conv=1x{procs},fc={procs}x1")):
            seconds = (1 + k) / procs
            runs += logs.read_log(write_log(
                tmp_path / f"strong-{k}-p{procs}.h5", processes=procs, batch=16, grid=grid,
                step_seconds=(5.0, seconds, seconds), predicted_iteration=seconds / 2))
        for k, grid in enumerate((f"1x{procs}", "auto")):
            seconds = 1.0 + k + procs / 10
            runs += logs.read_log(write_log(
                tmp_path / f"weak-{k}-p{procs}.h5", processes=procs, batch=2 * procs,
                grid=grid, step_seconds=(5.0, seconds), predicted_iteration=seconds))
    return runs


def test_strong_scaling_groups_runs_of_one_batch_and_lines_per_grid(tmp_path):
    runs = scaling_runs(tmp_path)
    [strong] = logs.scaling_studies(runs, "strong")
    assert (strong.kind, strong.batch, strong.processes) == ("strong", 16, [1, 2, 4])
    # the one-rank conv=1x1,fc=1x1 run joins the conv=1xP,fc=Px1 line, not a line of its own
    assert list(strong.lines) == ["auto", "1xP (batch)", "conv=1xP,fc=Px1"]
    for label, points in strong.lines.items():
        assert [p.processes for p in points] == [1, 2, 4], label
        assert all(p.batch == 16 for p in points)
    assert [p.measured for p in strong.lines["auto"]] == pytest.approx([2.0, 1.0, 0.5])
    assert [p.predicted for p in strong.lines["auto"]] == pytest.approx([1.0, 0.5, 0.25])
    # speedup over pure batch at P = 1 (1 s): auto 0.5, 1, 2
    assert strong.baseline()[0] == "1xP (batch)"
    np.testing.assert_allclose(strong.speedup("auto"), [0.5, 1.0, 2.0])
    np.testing.assert_allclose(strong.speedup("1xP (batch)"), [1.0, 2.0, 4.0])


def test_weak_scaling_groups_runs_of_one_batch_per_process(tmp_path):
    runs = scaling_runs(tmp_path)
    [weak] = logs.scaling_studies(runs, "weak")
    assert (weak.kind, weak.batch, weak.processes) == ("weak", 2, [1, 2, 4])
    assert list(weak.lines) == ["auto", "1xP (batch)"]
    assert [p.batch for p in weak.lines["1xP (batch)"]] == [2, 4, 8]
    # scaled speedup: images/s over pure batch at P = 1 (2 images in 1.1 s)
    times = np.array([1.1, 1.2, 1.4])
    np.testing.assert_allclose(weak.speedup("1xP (batch)"),
                               (np.array([2, 4, 8]) / times) / (2 / 1.1))


def test_repeated_runs_take_the_median_and_one_p_is_no_study(tmp_path):
    runs = [read_one(write_log(tmp_path / f"r{k}.h5", processes=2, batch=8, grid="auto",
                               step_seconds=(9.0, s))) for k, s in enumerate((1.0, 2.0, 6.0))]
    assert logs.scaling_studies(runs, "strong") == []
    runs.append(read_one(write_log(tmp_path / "p4.h5", processes=4, batch=8, grid="auto")))
    [study] = logs.scaling_studies(runs, "strong")
    first = study.lines["auto"][0]
    assert first.measured == pytest.approx(2.0) and len(first.runs) == 3
    assert study.baseline() == (None, None)  # no pure batch run: each line its own reference


# ---------------------------------------------------------------------------------------------
# drawing


def test_stacked_bars_are_the_sums_of_their_fields(tmp_path):
    run = read_one(write_log(tmp_path / "run.h5"))
    stacks = plot_logs.layer_stacks_ms(run.measured)
    fields = layer_fields(1.0)
    np.testing.assert_allclose(stacks["compute"],
                               1e3 * (fields["forward_compute"] + fields["backward_compute"]))
    np.testing.assert_allclose(stacks["communication"], 1e3 * (fields["forward_layer_comm"]
                                                               + fields["backward_layer_comm"]))
    np.testing.assert_allclose(stacks["redistribution"],
                               1e3 * (fields["forward_redistribution"]
                                      + fields["backward_redistribution"]))
    fig = plot_logs.draw_layers(run)
    bars = fig.axes[0].patches
    rows = len(NAMES)
    assert len(bars) == 2 * 3 * rows  # measured and predicted, three stacks, every row
    heights = np.array([b.get_height() for b in bars]).reshape(2, 3, rows)
    bottoms = np.array([b.get_y() for b in bars]).reshape(2, 3, rows)
    predicted = plot_logs.layer_stacks_ms(run.predicted)
    for side, values in enumerate((stacks, predicted)):
        np.testing.assert_allclose(heights[side], [values[c] for c in logs.COMPONENTS])
        np.testing.assert_allclose(bottoms[side, 2], values["compute"] + values["communication"])
    plot_logs._pyplot().close(fig)


def test_relative_error():
    error = plot_logs.relative_error(np.array([1.2, 0.5, 1.0]), np.array([1.0, 1.0, 0.0]))
    np.testing.assert_allclose(error[:2], [0.2, -0.5])
    assert np.isnan(error[2])


def is_png(path: Path) -> bool:
    return path.is_file() and path.stat().st_size > 1000 and path.read_bytes()[:8] == PNG


def test_cli_writes_every_plot(tmp_path, capsys):
    logs_dir = tmp_path / "logs"
    logs_dir.mkdir()
    # strong: batch 8 on P = 1, 2 under two grids; weak: 8 per process on P = 1, 2; the
    # one-step logs without a summary give no per-run plots, only notes
    write_log(logs_dir / "strong-batch-p1.h5", validation=True)
    write_log(logs_dir / "strong-auto-p1.h5", grid="auto", step_seconds=(0.3,))
    for name, procs, batch, grid in (("strong-batch-p2", 2, 8, "1x2"),
                                     ("strong-auto-p2", 2, 8, "auto"),
                                     ("weak-batch-p2", 2, 16, None)):
        write_log(logs_dir / f"{name}.h5", processes=procs, batch=batch, grid=grid,
                  step_seconds=(0.2,), summary=False)
    out = tmp_path / "plots"
    paths = sorted(str(p) for p in logs_dir.glob("*.h5"))
    assert plot_logs.main([*paths, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    expected = ["strong-scaling.png", "weak-scaling.png", "strong-batch-p1-layers.png",
                "strong-batch-p1-predicted-vs-measured.png", "strong-batch-p1-training.png",
                "strong-auto-p1-layers.png", "strong-auto-p1-predicted-vs-measured.png",
                "compare-alexnet-p1-b8-layers.png"]
    for name in expected:
        assert is_png(out / name), name
        assert f"wrote {out / name}" in printed
    assert sorted(p.name for p in out.iterdir()) == sorted(expected)
    assert "skipped strong-auto-p2-layers.png" in printed
    assert "skipped strong-auto-p1-training.png" in printed


def test_cli_skips_scaling_it_cannot_draw(tmp_path, capsys):
    log = write_log(tmp_path / "only.h5", validation=True)
    assert plot_logs.main([str(log), "--out", str(tmp_path / "plots")]) == 0
    printed = capsys.readouterr().out
    assert "skipped strong-scaling.png" in printed and "skipped weak-scaling.png" in printed
    assert is_png(tmp_path / "plots" / "only-training.png")


def test_compare_plans_log_gives_one_comparison(tmp_path, capsys):
    path = tmp_path / "compare.h5"
    with h5py.File(path, "w") as f:
        f.attrs.update({"net": "alexnet", "batch": 16, "steps": 4})
        for k, spec in enumerate(("auto", "1x4", "2x2")):
            group = f.create_group(f"plans/{k:02d}")
            group.attrs.update({"spec": spec, "plan": "model 2x2\nfollow\nbatch 1x4"})
            group["layers/name"] = np.array(NAMES, dtype="S")
            for kind in ("predicted", "measured"):
                for name, values in layer_fields(1.0 + k).items():
                    group[f"layers/{kind}/{name}"] = values
            group.create_group("iteration").attrs.update({"predicted": 0.1, "measured": 0.2})
    runs = logs.read_log(path)
    assert [(r.processes, r.grid_spec, r.compare_plan) for r in runs] == [
        (4, "auto", "00"), (4, "1x4", "01"), (4, "2x2", "02")]
    assert plot_logs.main([str(path), "--out", str(tmp_path / "plots")]) == 0
    assert is_png(tmp_path / "plots" / "compare-plans-layers.png")
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == ["compare-plans-layers.png"]


def test_bad_input_is_one_error_line_and_exit_2(tmp_path, capsys):
    not_hdf5 = tmp_path / "notes.txt"
    not_hdf5.write_text("hello")
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f["x"] = np.zeros(3)
    dataset = tmp_path / "data.h5"
    with h5py.File(dataset, "w") as f:
        f.attrs["format"] = "hpctrain-dataset"
    good = write_log(tmp_path / "good.h5", step_seconds=(0.1,), summary=False)
    for args, words in (([tmp_path / "missing.h5"], "no such file"),
                        ([not_hdf5], "not an HDF5 file"),
                        ([good, other], "not an hpctrain run log"),
                        ([dataset], "none of the files is a run log")):
        assert plot_logs.main([*map(str, args), "--out", str(tmp_path / "plots")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("plot_logs.py: error:") and words in err
    # an hpctrain file of another kind beside a log is skipped with a note
    assert plot_logs.main([str(dataset), str(good), "--out", str(tmp_path / "plots")]) == 0
    assert "skipped" in capsys.readouterr().out


def test_analysis_imports_neither_mpi_nor_hpctrain():
    code = ("import sys; sys.argv = ['x']; import runpy; "
            "runpy.run_path('analysis/plot_logs.py', run_name='not_main'); "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('mpi4py', 'hpctrain')]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)


def test_reads_the_log_of_a_real_run(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HPCTRAIN_CACHE_DIR": str(tmp_path / "cache")}
    subprocess.run([sys.executable, "-m", "hpctrain", "--net", "mlp", "--steps", "3", "--batch",
                    "8", "--log", "run.h5"], cwd=tmp_path, env=env, check=True, timeout=120,
                   capture_output=True)
    run = read_one(tmp_path / "run.h5")
    assert (run.net, run.processes, run.batch, run.grid_label) == ("mlp", 1, 8, "1xP (batch)")
    assert len(run.step_seconds) == 3 and run.iteration_time > 0
    assert run.measured.names == run.predicted.names and run.measured.names[-1] == "loss"
    assert run.iteration_predicted is not None and run.iteration_measured is not None
    result = subprocess.run([sys.executable, str(ROOT / "analysis" / "plot_logs.py"), "run.h5",
                             "--out", "plots"], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    for name in ("run-layers.png", "run-predicted-vs-measured.png", "run-training.png"):
        assert is_png(tmp_path / "plots" / name), name


def add_timeline(path: Path, spans, rows: list[str], steps=(2,)) -> None:
    """A /timeline in the run log ``path``, as hpctrain.record.runlog writes it."""
    with h5py.File(path, "a") as f:
        group = f.create_group("timeline")
        group["spans"] = np.asarray(spans, dtype=np.float64)
        group["steps"] = np.array(steps)
        group["rows"] = np.array(rows, dtype="S")
        group.attrs["phases"] = "forward,backward"
        group.attrs["categories"] = ("compute,communication,redistribution,"
                                     "gradient sum in flight")


def write_timeline(path: Path, ranks: int = 3) -> np.ndarray:
    """A run log whose timeline has per rank two layers forward and backward, a communication
    inside one, a redistribution, and a sum in flight."""
    spans = []
    for rank in range(ranks):
        t = 0.001 * rank
        spans += [(rank, 0, 0, 0, t, t + 0.01), (rank, 1, 0, 2, t + 0.01, t + 0.012),
                  (rank, 1, 0, 0, t + 0.012, t + 0.02), (rank, 1, 1, 0, t + 0.02, t + 0.03),
                  (rank, 1, 1, 1, t + 0.025, t + 0.028), (rank, 1, 1, 3, t + 0.021, t + 0.04),
                  (rank, 0, 1, 0, t + 0.03, t + 0.04)]
    write_log(path, processes=ranks, step_seconds=(0.1, 0.1))
    add_timeline(path, spans, ["conv1", "fc1", "loss"])
    return np.array(spans)


def test_timeline_draws_every_rank_and_exports_a_chrome_trace(tmp_path):
    spans = write_timeline(tmp_path / "run.h5")
    assert timeline.main([str(tmp_path / "run.h5"), "--out", str(tmp_path / "out")]) == 0
    assert is_png(tmp_path / "out" / "run-timeline.png")
    trace = json.loads((tmp_path / "out" / "run-timeline.json").read_text())
    complete = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(complete) == len(spans)
    for event, span in zip(complete, spans, strict=True):
        assert event["pid"] == span[0] and event["tid"] == span[3]
        assert event["ts"] == pytest.approx(span[4] * 1e6)
        assert event["dur"] == pytest.approx((span[5] - span[4]) * 1e6)
    assert complete[4]["name"] == "fc1 backward" and complete[4]["cat"] == "communication"
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M"}
    assert {"rank 0", "rank 2", "gradient sum in flight"} <= names


def test_timeline_of_a_log_without_one_is_one_error_line(tmp_path, capsys):
    path = write_log(tmp_path / "plain.h5", step_seconds=(0.1,), summary=False)
    assert timeline.main([str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has no /timeline: run with --timeline" in err


def test_plot_logs_draws_the_timeline_of_a_log_that_has_one(tmp_path):
    write_timeline(tmp_path / "run.h5")
    assert plot_logs.main([str(tmp_path / "run.h5"), "--out", str(tmp_path / "plots")]) == 0
    assert is_png(tmp_path / "plots" / "run-timeline.png")
