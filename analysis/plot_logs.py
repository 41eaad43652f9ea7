"""Plot hpctrain's HDF5 run logs: scaling, per-layer time, predicted against measured, training.

Usage::

    python analysis/plot_logs.py runs/*.h5 --out plots/

From all the logs given together:

- ``strong-scaling.png``: runs of one net and input at the same global batch; time per iteration
  and speedup against P, one line per kind of grid ("auto", "1xP (batch)", "conv=1xP,fc=Px1"…),
  measured solid, predicted dashed in the same colour. One row of panels per (net, input, batch).
- ``weak-scaling.png``: the same for runs at the same batch per process (speedup: images/s).
- ``compare-<net>-p<P>-b<B>-layers.png``: two or more runs of one net, P and batch (different
  grids): the per-layer stacks side by side, and the whole iteration of each run.

From each run log:

- ``<stem>-layers.png``: per layer, stacked compute / communication / redistribution (forward +
  backward, ms), measured (the slowest rank) beside predicted (hatched).
- ``<stem>-predicted-vs-measured.png``: per layer, predicted against measured (log-log, y = x and
  ±20 %), for the total and each component; and the relative error of each layer's total.
- ``<stem>-training.png``: loss and accuracy against step, with the held-out evaluations.
- ``<stem>-timeline.png`` and ``<stem>-timeline.json``: for a log written with ``--timeline``,
  every rank's spans (``analysis/timeline.py``).

A compare-plans log (``python -m hpctrain compare-plans --log``) gives
``<stem>-plans-layers.png``, its plans compared as above. Plots the logs cannot support are
skipped with a note. Reads the HDF5 files only (h5py, NumPy, matplotlib); never imports MPI or
hpctrain.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

if __package__:  # imported as analysis.plot_logs
    from .logs import (
        COMPONENTS,
        LayerTimes,
        LogError,
        OtherHpctrainFile,
        Run,
        ScalingStudy,
        read_log,
        scaling_studies,
    )
    from .timeline import COLOURS as TIMELINE_COLOURS
    from .timeline import plot_timeline
else:  # run as a script: python analysis/plot_logs.py
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from logs import (
        COMPONENTS,
        LayerTimes,
        LogError,
        OtherHpctrainFile,
        Run,
        ScalingStudy,
        read_log,
        scaling_studies,
    )
    from timeline import COLOURS as TIMELINE_COLOURS
    from timeline import plot_timeline

COLOURS = TIMELINE_COLOURS  # the same colour for each part in every figure
LABELS = {"compute": "compute (forward + backward)",
          "communication": "layer's own communication",
          "redistribution": "redistribution (layout change feeding the layer)"}
PREDICTED_HATCH = "////"
BAND = 0.2  # the ±20 % band of the predicted-against-measured plots
MS = 1e3
OUTSIDE = {"loc": "upper left", "bbox_to_anchor": (1.01, 1.0)}  # a legend right of its axes


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a login node
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path, dpi: int = 120) -> Path:
    plt = _pyplot()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def layer_stacks_ms(times: LayerTimes) -> dict[str, np.ndarray]:
    """Milliseconds per row of each stack: compute = forward_compute + backward_compute,
    communication = forward_layer_comm + backward_layer_comm, redistribution =
    forward_redistribution + backward_redistribution."""
    return {name: MS * times.component(name) for name in COMPONENTS}


def _stacked(ax, x: np.ndarray, stacks: dict[str, np.ndarray], width: float,
             predicted: bool = False) -> np.ndarray:
    """Bars of ``stacks`` piled in order at ``x``; returns their heights."""
    bottom = np.zeros(len(x))
    for name, values in stacks.items():
        ax.bar(x, values, width, bottom=bottom, color=COLOURS[name],
               hatch=PREDICTED_HATCH if predicted else None,
               edgecolor="white" if predicted else "none", linewidth=0.0,
               alpha=0.75 if predicted else 1.0)
        bottom = bottom + values
    return bottom


def _top(ax, *heights) -> None:
    """Room above the tallest bar or line (stacked bars keep autoscale from adding any)."""
    tallest = np.nanmax(np.concatenate([np.ravel(h) for h in heights]), initial=0.0)
    if tallest > 0:
        ax.set_ylim(0, 1.06 * tallest)


def _component_legend(ax, predicted: bool = True, **kwargs) -> None:
    from matplotlib.patches import Patch

    handles = [Patch(color=COLOURS[c], label=LABELS[c]) for c in COMPONENTS]
    if predicted:
        handles += [Patch(facecolor="0.95", edgecolor="0.3", label="measured (slowest rank)"),
                    Patch(facecolor="0.95", edgecolor="0.3", hatch=PREDICTED_HATCH,
                          label="predicted (cost model)")]
    ax.legend(handles=handles, **{"fontsize": 8, **kwargs})


# ---------------------------------------------------------------------------------------------
# scaling


def _study_title(study: ScalingStudy) -> str:
    shape = "×".join(str(s) for s in study.input_shape) if study.input_shape else "?"
    what = (f"global batch {study.batch:g}" if study.kind == "strong"
            else f"{study.batch:g} samples per process")
    return f"{study.kind.capitalize()} scaling: {study.net}, input {shape}, {what}"


def _plain_log_axis(axis, base: float = 10) -> None:
    """Label a log axis with plain numbers (0.2, 0.5, 1, 2) rather than 2×10⁻¹."""
    from matplotlib.ticker import LogFormatterSciNotation

    class Plain(LogFormatterSciNotation):
        def __call__(self, x, pos=None):
            return f"{x:g}" if super().__call__(x, pos) else ""

    axis.set_major_formatter(Plain(base=base))
    axis.set_minor_formatter(Plain(base=base, labelOnlyBase=False))


def draw_scaling(studies: Sequence[ScalingStudy]):
    """One row per study: time per iteration against P (measured solid, predicted dashed) and
    speedup against P with the ideal P/P₀."""
    from matplotlib.lines import Line2D

    plt = _pyplot()
    fig = plt.figure(figsize=(12, 4.6 * len(studies)), layout="constrained")
    subfigs = np.atleast_1d(fig.subfigures(len(studies), 1))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for subfig, study in zip(subfigs, studies):
        time_ax, speed_ax = subfig.subplots(1, 2)
        subfig.suptitle(_study_title(study), fontsize=11, weight="bold")
        procs = study.processes
        for k, (label, points) in enumerate(study.lines.items()):
            colour = colours[k % len(colours)]
            p = [q.processes for q in points]
            time_ax.plot(p, [q.measured for q in points], "o-", color=colour, label=label)
            speed_ax.plot(p, study.speedup(label), "o-", color=colour, label=label)
            if any(q.predicted is not None for q in points):
                predicted = [np.nan if q.predicted is None else q.predicted for q in points]
                time_ax.plot(p, predicted, "--", color=colour, marker="x")
                speed_ax.plot(p, study.speedup(label, predicted=True), "--", color=colour,
                              marker="x")
        first = procs[0]
        speed_ax.plot(procs, [q / first for q in procs], ":", color="black", linewidth=1)
        for ax in (time_ax, speed_ax):
            ax.set_xscale("log", base=2)
            ax.set_xticks(procs, [str(q) for q in procs])
            ax.xaxis.set_minor_locator(plt.NullLocator())
            ax.set_xlabel("processes P")
            ax.grid(alpha=0.3, which="both", linewidth=0.5)
        time_ax.set_yscale("log")
        _plain_log_axis(time_ax.yaxis)
        time_ax.set_ylabel("time per iteration (s)")
        time_ax.set_title("time per iteration: median of the steps after the first", fontsize=9)
        speed_ax.set_yscale("log", base=2)
        _plain_log_axis(speed_ax.yaxis, base=2)
        _, baseline = study.baseline()
        if baseline is not None:
            reference = f"pure batch (1xP) at P = {baseline.processes}"
        else:
            reference = "each line's own smallest P"
        if study.kind == "strong":
            speed_ax.set_ylabel("speedup (×)")
            speed_ax.set_title(f"speedup over {reference}", fontsize=9)
        else:
            speed_ax.set_ylabel("scaled speedup (× images/s)")
            speed_ax.set_title(f"scaled speedup: images/s over {reference}", fontsize=9)
        style = [Line2D([], [], color="0.3", marker="o", label="measured"),
                 Line2D([], [], color="0.3", marker="x", linestyle="--",
                        label="predicted (cost model)"),
                 Line2D([], [], color="black", linestyle=":", label=f"ideal (P / {first})")]
        handles, _ = time_ax.get_legend_handles_labels()
        time_ax.legend(handles=handles + style[:2], fontsize=8, title="grid", title_fontsize=8)
        handles, _ = speed_ax.get_legend_handles_labels()
        speed_ax.legend(handles=handles + style, fontsize=8, title="grid", title_fontsize=8)
    return fig


def plot_scaling(studies: Sequence[ScalingStudy], path: Path) -> Path:
    return _save(draw_scaling(studies), path)


# ---------------------------------------------------------------------------------------------
# per-layer bars


def draw_layers(run: Run):
    """Per layer (rows of ``/layers/name``): measured stack (slowest rank, field by field) and
    predicted stack (hatched) side by side, in ms."""
    plt = _pyplot()
    measured, predicted = run.measured, run.predicted
    names = measured.names
    x = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(max(8.0, 0.45 * len(names) + 4.5), 5.2),
                           layout="constrained")
    width = 0.4
    heights = [_stacked(ax, x - width / 2, layer_stacks_ms(measured), width * 0.95)]
    if predicted is not None and predicted.names == names:
        heights.append(_stacked(ax, x + width / 2, layer_stacks_ms(predicted), width * 0.95,
                                predicted=True))
    _top(ax, *heights)
    ax.set_xticks(x, names, rotation=60, ha="right", fontsize=8)
    ax.set_xlim(-0.7, len(names) - 0.3)
    ax.set_ylabel("time per iteration (ms)")
    ax.set_xlabel("layer (left bar measured, right bar predicted)")
    ax.grid(axis="y", alpha=0.3)
    measured_total = MS * measured.total.sum()
    text = f"sum of rows: measured {measured_total:.1f} ms"
    if predicted is not None:
        text += f", predicted {MS * predicted.total.sum():.1f} ms"
    if run.iteration_time is not None:
        text += f"; whole iteration measured {MS * run.iteration_time:.1f} ms"
    ax.set_title(f"{run.title}\n{text}", fontsize=9)
    _component_legend(ax, predicted=predicted is not None, **OUTSIDE)
    fig.suptitle(f"Per-layer time: {run.name}", fontsize=11)
    return fig


def plot_layers(run: Run, path: Path) -> Path:
    return _save(draw_layers(run), path)


def _is_plan(run: Run) -> bool:
    """Whether ``run`` is one plan of a compare-plans log."""
    return run.compare_plan is not None


def _short(label: str, limit: int = 28) -> str:
    return label if len(label) <= limit else label[: limit - 1] + "…"


def _merge_small_rows(runs: Sequence[Run], share: float = 0.02) -> tuple[list[str], np.ndarray]:
    """Row names to draw and, for each, the indices it sums: rows whose largest total over the
    runs is under ``share`` of the largest row are summed into one "other" row."""
    totals = np.max([r.measured.total for r in runs], axis=0)
    keep = totals >= share * totals.max() if totals.max() > 0 else np.ones(len(totals), bool)
    names = [n for n, k in zip(runs[0].measured.names, keep) if k]
    groups = [np.array([i]) for i in np.nonzero(keep)[0]]
    if not keep.all():
        names.append(f"other ({int((~keep).sum())} rows)")
        groups.append(np.nonzero(~keep)[0])
    return names, groups


def draw_layer_comparison(runs: Sequence[Run], title: str):
    """Runs of one net (the same rows): per layer one measured stack per run, numbered; below,
    each run's whole iteration, measured stacks beside predicted."""
    plt = _pyplot()
    names, groups = _merge_small_rows(runs)
    n = len(runs)
    width = 0.8 / n
    fig, (ax, total_ax) = plt.subplots(
        2, 1, figsize=(min(24.0, max(10.0, (0.13 * n + 0.35) * len(names) + 4.5)), 9.5),
        gridspec_kw={"height_ratios": [3, 2]}, layout="constrained")
    centres = np.arange(len(names))
    ticks, tick_labels, heights = [], [], []
    for k, run in enumerate(runs):
        stacks = layer_stacks_ms(run.measured)
        x = centres - 0.4 + (k + 0.5) * width
        merged = {c: np.array([v[g].sum() for g in groups]) for c, v in stacks.items()}
        heights.append(_stacked(ax, x, merged, width * 0.9))
        ticks += list(x)
        tick_labels += [str(k + 1)] * len(x)
    ax.set_xticks(ticks, tick_labels, fontsize=6)
    ax.tick_params(axis="x", length=2, pad=1)
    for centre, name in zip(centres, names):  # the layer under its group of numbered bars
        ax.text(centre, -0.045, name, transform=ax.get_xaxis_transform(), ha="center",
                va="top", fontsize=8)
    ax.set_xlim(-0.6, len(names) - 0.4)
    _top(ax, *heights)
    ax.set_ylabel("measured time per iteration (ms)")
    ax.set_title("per layer, measured (slowest rank); the number under a bar is the run, "
                 "named below", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    _component_legend(ax, predicted=False, **OUTSIDE)

    x = np.arange(n)
    totals = []
    for times, offset, predicted in ((lambda r: r.measured, -0.2, False),
                                     (lambda r: r.predicted, 0.2, True)):
        usable = [times(r) is not None for r in runs]
        stacks = {c: np.array([MS * times(r).component(c).sum() if ok else np.nan
                               for r, ok in zip(runs, usable)]) for c in COMPONENTS}
        totals.append(_stacked(total_ax, x + offset, stacks, 0.38, predicted=predicted))
    iterations = np.array([np.nan if r.iteration_time is None else MS * r.iteration_time
                           for r in runs])
    for k, seconds in enumerate(iterations):
        total_ax.plot([k - 0.4, k], [seconds] * 2, color="black", lw=1.5)
    _top(total_ax, *totals, iterations)
    total_ax.set_xticks(x, [f"{k + 1}: {_short(r.grid_spec or '1xP (default)')}"
                            + ("" if _is_plan(r) else f"\n{_short(r.name)}")
                            for k, r in enumerate(runs)], fontsize=7)
    total_ax.set_ylabel("time per iteration (ms)")
    total_ax.set_title("sum over the rows: measured (left) and predicted (right, hatched); "
                       "black line: measured whole iteration", fontsize=9)
    total_ax.grid(axis="y", alpha=0.3)
    _component_legend(total_ax, predicted=True, **OUTSIDE)
    fig.suptitle(title, fontsize=11)
    return fig


def layer_comparisons(runs: Sequence[Run]) -> dict[str, list[Run]]:
    """Groups of two or more runs worth comparing layer by layer: from one compare-plans log
    (named ``<stem>-plans``), or run logs of one net, input, P and batch (named
    ``compare-<net>-p<P>-b<B>``); each run with a measured per-layer summary of the same rows."""
    groups: dict[tuple, list[Run]] = {}
    for run in runs:
        if run.measured is None:
            continue
        if _is_plan(run):
            key = ("plans", str(run.path), run.path.stem)
        else:
            key = ("runs", run.net, run.input_shape, run.processes, run.batch,
                   run.measured.names)
        groups.setdefault(key, []).append(run)
    named = {}
    for key, members in groups.items():
        members = [r for r in members if r.measured.names == members[0].measured.names]
        if len(members) < 2:
            continue
        if key[0] == "plans":
            name = f"{key[2]}-plans"
        else:
            name = f"compare-{members[0].net}-p{members[0].processes}-b{members[0].batch}"
        while name in named:
            name += "+"
        named[name] = members
    return named


# ---------------------------------------------------------------------------------------------
# predicted against measured


def relative_error(predicted: np.ndarray, measured: np.ndarray) -> np.ndarray:
    """(predicted − measured) / measured, NaN where nothing was measured."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(measured > 0, (predicted - measured) / measured, np.nan)


def _scatter(ax, names, predicted: np.ndarray, measured: np.ndarray, title: str) -> None:
    """Predicted against measured (log-log) with y = x and the ±20 % band; a row predicted as 0
    but measured above 0 sits on the bottom edge (▼), the reverse on the left edge (◀)."""
    names = np.asarray(names)
    both = (predicted > 0) & (measured > 0)
    only_measured = (predicted <= 0) & (measured > 0)
    only_predicted = (predicted > 0) & (measured <= 0)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("measured (ms)")
    ax.set_ylabel("predicted (ms)")
    positive = np.concatenate([predicted[predicted > 0], measured[measured > 0]])
    if len(positive) == 0:
        ax.text(0.5, 0.5, "every row is 0,\npredicted and measured", ha="center",
                va="center", transform=ax.transAxes, color="0.4")
        ax.set_xticks([])
        ax.set_yticks([])
        return
    lo, hi = positive.min() / 3, positive.max() * 2
    line = np.geomspace(lo, hi, 50)
    ax.fill_between(line, (1 - BAND) * line, (1 + BAND) * line, color="tab:green", alpha=0.15)
    ax.plot(line, line, color="tab:green", linewidth=1)
    inside = both & (np.abs(relative_error(predicted, measured)) <= BAND)
    outside = both & ~inside
    ax.scatter(measured[inside], predicted[inside], s=18, color="tab:green", zorder=3)
    ax.scatter(measured[outside], predicted[outside], s=18, color="tab:red", zorder=3)
    floor = lo * 1.15
    ax.scatter(measured[only_measured], np.full(int(only_measured.sum()), floor), s=22,
               marker="v", color="tab:red", zorder=3, clip_on=False)
    ax.scatter(np.full(int(only_predicted.sum()), floor), predicted[only_predicted], s=22,
               marker="<", color="tab:red", zorder=3, clip_on=False)
    x = np.where(only_predicted, floor, measured)
    y = np.where(only_measured, floor, predicted)
    for k in np.nonzero(both | only_measured | only_predicted)[0]:
        ax.annotate(names[k], (x[k], y[k]), xytext=(3, 2), textcoords="offset points",
                    fontsize=6)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_aspect("equal")
    ax.grid(alpha=0.3, which="major", linewidth=0.5)
    note = f"{int(both.sum())} rows, {int(inside.sum())} within ±{BAND:.0%}"
    if only_measured.any():
        note += f"\n▼ {int(only_measured.sum())} predicted 0, measured > 0"
    if only_predicted.any():
        note += f"\n◀ {int(only_predicted.sum())} measured 0, predicted > 0"
    zero = int(((predicted <= 0) & (measured <= 0)).sum())
    if zero:
        note += f"\n{zero} rows 0 in both (not shown)"
    ax.text(0.03, 0.97, note, transform=ax.transAxes, va="top", fontsize=7)


def draw_predicted_vs_measured(run: Run):
    """Per layer predicted against measured: total and each component (log-log), and the
    relative error of each row's total and of the whole iteration."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    plt = _pyplot()
    measured, predicted = run.measured, run.predicted
    names = measured.names
    fig = plt.figure(figsize=(16, 10), layout="constrained")
    grid = fig.add_gridspec(2, 4, height_ratios=[1.15, 1])
    panels = [("total", MS * predicted.total, MS * measured.total)]
    panels += [(c, MS * predicted.component(c), MS * measured.component(c)) for c in COMPONENTS]
    for k, (label, p, m) in enumerate(panels):
        _scatter(fig.add_subplot(grid[0, k]), names, p, m,
                 "total per layer" if k == 0 else LABELS[label])
    ax = fig.add_subplot(grid[1, :])
    error = 100 * relative_error(predicted.total, measured.total)
    labels = list(names)
    colours = ["tab:blue"] * len(names)
    if run.iteration_time is not None and run.iteration_predicted is not None:
        error = np.append(error, 100 * relative_error(np.array(run.iteration_predicted),
                                                      np.array(run.iteration_time)))
        labels.append("whole iteration")
        colours.append("black")
    x = np.arange(len(labels))
    ax.axhspan(-100 * BAND, 100 * BAND, color="tab:green", alpha=0.15)
    ax.bar(x, np.nan_to_num(error), color=colours, width=0.7)
    for position, value in zip(x, error):
        if np.isnan(value):
            ax.text(position, 0, "n/a", ha="center", va="bottom", fontsize=6, color="0.4")
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(x, labels, rotation=60, ha="right", fontsize=8)
    ax.set_xlim(-0.7, len(labels) - 0.3)
    ax.set_ylabel("(predicted − measured) / measured (%)")
    ax.set_title("relative error of each layer's total (n/a: nothing measured); black: the "
                 "whole iteration (median step time)", fontsize=9)
    if np.nanmax(np.abs(error), initial=0.0) > 400:  # a few near-empty rows flatten the rest
        ax.set_yscale("symlog", linthresh=100)
    ax.grid(axis="y", alpha=0.3)
    handles = [Line2D([], [], color="tab:green", label="y = x"),
               Patch(color="tab:green", alpha=0.15, label=f"±{BAND:.0%}"),
               Line2D([], [], color="tab:green", marker="o", linestyle="", label="within ±20 %"),
               Line2D([], [], color="tab:red", marker="o", linestyle="", label="outside")]
    fig.legend(handles=handles, loc="outside upper right", ncol=4, fontsize=8)
    fig.suptitle(f"Predicted against measured, per layer: {run.name}\n{run.title}",
                 fontsize=11)
    return fig


def plot_predicted_vs_measured(run: Run, path: Path) -> Path:
    return _save(draw_predicted_vs_measured(run), path)


# ---------------------------------------------------------------------------------------------
# training curves


def has_training_curves(run: Run) -> bool:
    return len(run.loss) >= 2 or len(run.validation_accuracy) >= 1


def draw_training(run: Run):
    """Loss and (when logged) accuracy against step: training (each step's batch) and
    held-out."""
    plt = _pyplot()
    with_accuracy = len(run.accuracy) > 0 or len(run.validation_accuracy) > 0
    fig, axes = plt.subplots(1, 2 if with_accuracy else 1, figsize=(12 if with_accuracy else 7,
                                                                    4.3),
                             squeeze=False, layout="constrained")
    loss_ax = axes[0, 0]
    steps = run.step if len(run.step) == len(run.loss) else np.arange(len(run.loss))
    if len(run.loss):
        loss_ax.plot(steps, run.loss, color="tab:blue", linewidth=1, label="training (batch)")
    if len(run.validation_step):
        loss_ax.plot(run.validation_step, run.validation_loss, "o-", color="tab:red",
                     label="held-out")
    loss_ax.set_ylabel("loss (cross-entropy)")
    loss_ax.set_title("loss", fontsize=9)
    if with_accuracy:
        acc_ax = axes[0, 1]
        if len(run.accuracy):
            acc_ax.plot(steps[: len(run.accuracy)], 100 * run.accuracy, color="tab:blue",
                        linewidth=1, alpha=0.5, label="training (batch)")
        if len(run.validation_step):
            acc_ax.plot(run.validation_step, 100 * run.validation_accuracy, "o-",
                        color="tab:red", label="held-out")
            last = 100 * run.validation_accuracy[-1]
            acc_ax.annotate(f"held-out {last:.1f} %", (run.validation_step[-1], last),
                            xytext=(-8, -14), textcoords="offset points", ha="right",
                            fontsize=8, color="tab:red")
        acc_ax.set_ylabel("accuracy (%)")
        acc_ax.set_ylim(0, 100)
        acc_ax.set_title("accuracy", fontsize=9)
    for ax in axes[0]:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"Training: {run.name}\n{run.title}", fontsize=11)
    return fig


def plot_training(run: Run, path: Path) -> Path:
    return _save(draw_training(run), path)


# ---------------------------------------------------------------------------------------------
# all plots


def _unique_names(runs: list[Run]) -> list[Run]:
    """Give runs from different folders with one file stem distinct names ("a-run", "b-run")."""
    from dataclasses import replace

    seen: dict[str, int] = {}
    for run in runs:
        seen[run.name] = seen.get(run.name, 0) + 1
    return [replace(r, name=f"{r.path.parent.name}-{r.name}") if seen[r.name] > 1 else r
            for r in runs]


def plot_logs(runs: Sequence[Run], out_dir: str | Path,
              say=print) -> list[Path]:
    """Every plot ``runs`` support, into ``out_dir``; says (``say``) what it skips and why."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    runs = _unique_names(list(runs))
    written = []
    for kind in ("strong", "weak"):
        studies = scaling_studies(runs, kind)
        if studies:
            written.append(plot_scaling(studies, out / f"{kind}-scaling.png"))
        else:
            what = "global batch" if kind == "strong" else "batch per process"
            say(f"skipped {kind}-scaling.png: no two runs of one net, input and {what} at "
                "different process counts")
    for run in runs:
        if _is_plan(run):
            continue  # drawn with the other plans of its compare-plans log, below
        if run.measured is None:
            say(f"skipped {run.name}-layers.png and {run.name}-predicted-vs-measured.png: no "
                f"per-layer summary, written when a run ends (status: {run.status or '?'})")
        else:
            written.append(plot_layers(run, out / f"{run.name}-layers.png"))
            if run.predicted is not None and run.predicted.names == run.measured.names:
                written.append(plot_predicted_vs_measured(
                    run, out / f"{run.name}-predicted-vs-measured.png"))
            else:
                say(f"skipped {run.name}-predicted-vs-measured.png: no per-layer prediction")
        if run.timeline:
            written += plot_timeline(run.path, out, run.name)
        if has_training_curves(run):
            written.append(plot_training(run, out / f"{run.name}-training.png"))
        else:
            say(f"skipped {run.name}-training.png: fewer than 2 steps and no held-out "
                "evaluation")
    for name, members in layer_comparisons(runs).items():
        first = members[0]
        title = (f"Per-layer time of {len(members)} runs: {first.net}, P = {first.processes}, "
                 f"batch {first.batch}")
        written.append(_save(draw_layer_comparison(members, title), out / f"{name}-layers.png"))
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Plot hpctrain HDF5 run logs: strong and weak scaling, per-layer compute / "
                    "communication / redistribution, predicted against measured, training "
                    "curves.")
    parser.add_argument("logs", nargs="+", metavar="LOG.h5",
                        help="run logs (--log) or compare-plans logs; other hpctrain files "
                             "(simulate output, datasets, checkpoints) are skipped with a note")
    parser.add_argument("--out", default="plots", help="directory for the PNG files "
                                                       "(default: %(default)s)")
    args = parser.parse_args(argv)
    runs: list[Run] = []
    try:
        for path in dict.fromkeys(args.logs):  # a file named twice is read once
            try:
                runs += read_log(path)
            except OtherHpctrainFile as note:
                print(f"skipped {note}")
    except LogError as error:
        print(f"plot_logs.py: error: {error}", file=sys.stderr)
        return 2
    if not runs:
        print("plot_logs.py: error: none of the files is a run log; write one with "
              "'python -m hpctrain ... --log run.h5'", file=sys.stderr)
        return 2
    for path in plot_logs(runs, args.out):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
