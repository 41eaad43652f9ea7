"""Plot the HDF5 file of ``python -m hpctrain simulate`` in the style of Gholami et al. (2018).

For each study (``strong``, ``weak``, ``domain``) three PNG files:

- ``<study>_grids.png``: one row of panels per strategy, one panel per P with a bar per Pr×Pc
  grid: compute (grey) and communication (the strategy's colour) stacked, in seconds per epoch
  (linear, the same scale down each column; bars taller than the panel are cut and labelled
  with their height). The pure batch bar (1×P) is outlined in red, the best grid is marked with a
  triangle, grids hpctrain cannot execute (a split with an empty part, or a halo wider than a
  neighbour's rows) are faded, and a black line across each group marks the planner's auto plan.
- ``<study>_speedup.png``: the best grid of each strategy, pure batch and the auto plan in time
  per epoch against P, and their speedup over pure batch parallelism (over 1×B at the pure batch
  limit P = B in the domain study, where 1×P leaves ranks without a sample).
- ``<study>_plans.png`` (as the paper's Fig. 6 and 7): per P, the auto plan against pure batch
  and one weird trick (convolutions batch parallel, fully connected layers model parallel), each
  a bar of compute, communication inside the layers and redistribution between layouts stacked,
  in seconds per epoch (one linear scale per P); below, their communication per epoch against P
  and the auto plan's speedup over each baseline. A baseline that cannot run at a P (fewer
  samples than ranks) has no bar; beyond P = B its speedup is taken over the baseline on B
  ranks (dashed). Written only for files that have the ``pure_batch`` and ``weird_trick`` groups.

For a file of ``simulate --volumes``, per volume edge ``volumes_<net>_<edge>.png``: a row each
for strong and weak scaling, with the iteration time (each point labelled with the auto plan's
first layer, e.g. ``domain 8x64``), samples per second (and linear scaling from the least P
where the auto plan runs) and peak memory per rank against P, for the auto plan under the
memory cap and pure batch where it runs and fits; the cap is a line, pure batch's peak is drawn
hollow where it is over the cap, and a P where no plan fits is shaded.

For a file of ``simulate --levels``, per net ``levels_<net>.png`` (and ``levels_domain_<net>.png``
for the points with fewer samples than ranks): the iteration time against P
of the plan made on the levelled machine and of the plan made on its flat profile, both priced
on the levelled machine (and, dashed, the flat plan's own prediction); beside it the flat plan's
loss in per cent against P, each point labelled with the widest model group of the flat plan
and of the levelled plan (``*``: wider than a node) and the segments that changed.

The auto plan and its baselines are costed by hpctrain's implementation-faithful model, the
grids' bars by the paper's equations; the legends say so. Reads the HDF5 file only; never
imports MPI or hpctrain.

Usage::

    python analysis/plot_simulation.py runs/simulation.h5 --out plots/
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import h5py
import numpy as np

STUDIES = ("strong", "weak", "domain")
COLOURS = {"1.5d": "tab:blue", "conv-batch": "tab:orange", "integrated": "tab:green"}
LABELS = {"1.5d": "1.5D: every layer on Pr×Pc",
          "conv-batch": "conv batch over P, FC 1.5D on Pr×Pc",
          "integrated": "conv domain on Pr×Pc, FC 1.5D (Eq. 9)"}
COMPUTE_COLOUR = "0.8"
BATCH_EDGE = "tab:red"
# the implementation model's plans (HDF5 groups): short bar label, long label, line colour
PLANS = {"auto": ("auto", "auto plan (planner)", "black"),
         "pure_batch": ("batch", "pure batch: every layer on 1×P", BATCH_EDGE),
         "weird_trick": ("trick", "one weird trick: conv 1×P batch, FC P×1 model", "tab:purple")}
SPEEDUP_OVER = {"pure_batch": "speedup_over_batch", "weird_trick": "speedup_over_weird_trick"}
PARTS = (("compute_per_epoch", "compute", COMPUTE_COLOUR),
         ("layer_comm_per_epoch", "communication inside layers (ΔW, halos, batch norm)",
          "tab:blue"),
         ("redistribution_per_epoch", "redistribution between layouts", "tab:orange"))
GAP = 1.5  # empty bar widths between two P groups


def read_table(group: h5py.Group) -> dict[str, np.ndarray]:
    """Every 1-D dataset of ``group`` as an array (strings decoded to ``str``)."""
    table = {}
    for key, dataset in group.items():
        if not isinstance(dataset, h5py.Dataset):
            continue
        table[key] = (dataset.asstr()[()] if h5py.check_string_dtype(dataset.dtype)
                      else dataset[()])
    return table


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a login node
    import matplotlib.pyplot as plt

    return plt


def _study_title(group: h5py.Group, root: h5py.File) -> str:
    return (f"{root.attrs.get('net', '?')} on {root.attrs.get('machine', '?')}: "
            f"{group.attrs.get('description', group.name)}")


def _panel_top(rows: dict[str, np.ndarray], auto: dict[str, np.ndarray], procs: int) -> float:
    """The y limit of the panels of one P: linear, so the communication share stays visible
    (a log axis squashes it), and capped near pure batch (or twice the best grid where 1×P is
    impossible) so that a few slow model-heavy grids do not flatten the ones worth choosing."""
    here = rows["procs"] == procs
    totals = rows["total_per_epoch"][here]
    batch = totals[rows["pr"][here] == 1]
    reference = batch.max() if len(batch) else 2.0 * totals.min()
    reference = max(reference, np.nanmax(auto["total_per_epoch"][auto["procs"] == procs],
                                         initial=0.0))
    return float(min(1.08 * totals.max(), 1.6 * reference))


def plot_grids(group: h5py.Group, root: h5py.File, path: Path) -> Path:
    """Stacked compute + communication bars per grid: one row of panels per strategy, one
    panel per P (linear y axis shared down each column, so the strategies compare at each P)."""
    plt = _pyplot()
    from matplotlib.colors import to_rgba
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    rows, auto = read_table(group), read_table(group["auto"])
    strategies = [s for s in str(group.attrs["strategies"]).split(",")
                  if np.any(rows["strategy"] == s)]
    procs_list = sorted(set(rows["procs"].tolist()))
    widths = [max(int(np.sum((rows["strategy"] == s) & (rows["procs"] == p))) for s in strategies)
              for p in procs_list]
    tops = [_panel_top(rows, auto, p) for p in procs_list]
    fig = plt.figure(figsize=(max(10.0, 0.3 * sum(widths) + 0.8 * len(procs_list)),
                              2.9 * len(strategies) + 1.3), layout="constrained")
    subfigs = np.atleast_1d(fig.subfigures(len(strategies), 1))
    for subfig, strategy in zip(subfigs, strategies):
        axes = np.atleast_1d(subfig.subplots(1, len(procs_list),
                                             gridspec_kw={"width_ratios": widths}))
        subfig.suptitle(LABELS.get(strategy, strategy), fontsize=10)
        for column, (ax, procs) in enumerate(zip(axes, procs_list)):
            mine = np.nonzero((rows["strategy"] == strategy) & (rows["procs"] == procs))[0]
            mine = mine[np.argsort(rows["pr"][mine])]
            batch = rows["batch"][rows["procs"] == procs][0]
            ax.set_title(f"P = {procs}, B = {batch}", fontsize=8)
            ax.set_ylim(0, tops[column])
            ax.set_xlim(-0.6, widths[column] - 0.4)
            ax.tick_params(axis="y", labelsize=7)
            if column == 0:
                ax.set_ylabel("seconds per epoch", fontsize=8)
            if len(mine) == 0:
                ax.set_xticks([])
                ax.text(0.5, 0.5, "none: conv\nbatch needs\nP ≤ B", transform=ax.transAxes,
                        ha="center", va="center", fontsize=7, color="0.4")
                continue
            best = mine[np.argmin(rows["total_per_epoch"][mine])]
            x = np.arange(len(mine))
            # one bar call per layer of the stack: per-bar colours fade what hpctrain cannot
            # run, per-bar edges outline pure batch
            alpha = np.where(rows["runnable"][mine], 1.0, 0.35)
            batch_bar = rows["pr"][mine] == 1
            edges = {"edgecolor": [BATCH_EDGE if b else "none" for b in batch_bar],
                     "linewidth": np.where(batch_bar, 1.8, 0.0)}
            comm_colour = COLOURS.get(strategy, "tab:purple")
            ax.bar(x, rows["compute_per_epoch"][mine], width=0.85,
                   color=[to_rgba(COMPUTE_COLOUR, a) for a in alpha], **edges)
            ax.bar(x, rows["comm_per_epoch"][mine], bottom=rows["compute_per_epoch"][mine],
                   width=0.85, color=[to_rgba(comm_colour, a) for a in alpha], **edges)
            for position, k in zip(x, mine):
                if rows["total_per_epoch"][k] > tops[column]:  # clipped: say how tall it is
                    ax.text(position, 0.98 * tops[column], f"{rows['total_per_epoch'][k]:.0f}",
                            rotation=90, ha="center", va="top", fontsize=6, color="white")
            ax.plot(np.nonzero(mine == best)[0][0], min(rows["total_per_epoch"][best]
                                                        + 0.04 * tops[column], tops[column]),
                    "v", color="black", ms=5, clip_on=False)
            where = np.nonzero(auto["procs"] == procs)[0]
            if len(where) and np.isfinite(auto["total_per_epoch"][where[0]]):
                ax.axhline(auto["total_per_epoch"][where[0]], color="black", linewidth=1.6)
            ax.set_xticks(x)
            # up to 10 grids per panel: vertical Pr×Pc labels stay under their own bars
            ax.set_xticklabels([f"{rows['pr'][k]}×{rows['pc'][k]}" for k in mine],
                               rotation=90, fontsize=7)
            ax.grid(axis="y", alpha=0.3)
    handles = [Patch(color=COMPUTE_COLOUR, label="compute (FLOP rate, perfect scaling)")]
    handles += [Patch(color=COLOURS.get(s, "tab:purple"), label=f"communication, {s}")
                for s in strategies]
    handles += [Patch(facecolor="white", edgecolor=BATCH_EDGE, linewidth=1.8,
                      label="pure batch 1×P"),
                Patch(facecolor="0.6", alpha=0.35, label="layout hpctrain cannot run"),
                Line2D([], [], color="black", marker="v", linestyle="", ms=5,
                       label="best grid (paper's equations)"),
                Line2D([], [], color="black", linewidth=1.6,
                       label="auto plan (hpctrain's implementation model)")]
    fig.legend(handles=handles, loc="outside lower center", ncol=4, fontsize=8, frameon=False)
    fig.suptitle(_study_title(group, root), fontsize=11)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _procs_axis(ax, procs, **label) -> None:
    """The x axis of a sweep over P: log₂, a tick at each P run."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(procs)
    ax.set_xticklabels([str(p) for p in procs])
    ax.set_xlabel("processes P", **label)
    ax.grid(alpha=0.3)


def plot_speedup(group: h5py.Group, root: h5py.File, path: Path) -> Path:
    """Best time per epoch of each strategy, pure batch and auto against P; speedup over batch."""
    plt = _pyplot()
    rows, best, auto = read_table(group), read_table(group["best"]), read_table(group["auto"])
    limit = "speedup_over_batch_limit" in best
    key = "speedup_over_batch_limit" if limit else "speedup_over_batch"
    fig, (time_ax, speed_ax) = plt.subplots(1, 2, figsize=(11, 4.2))
    for strategy in dict.fromkeys(best["strategy"].tolist()):
        mine = best["strategy"] == strategy
        colour = COLOURS.get(strategy, "tab:purple")
        time_ax.plot(best["procs"][mine], best["total_per_epoch"][mine], "o-", color=colour,
                     label=f"best grid, {strategy}")
        speed_ax.plot(best["procs"][mine], best[key][mine], "o-", color=colour,
                      label=f"best grid, {strategy}")
    # 1×P is the same layout under every strategy; one strategy's rows draw it once
    pure = (rows["pr"] == 1) & (rows["strategy"] == rows["strategy"][0])
    if np.any(pure):
        time_ax.plot(rows["procs"][pure], rows["total_per_epoch"][pure], "s--",
                     color=BATCH_EDGE, label="pure batch 1×P")
    procs = np.unique(rows["procs"])
    compute = [rows["compute_per_epoch"][rows["procs"] == p][0] for p in procs]
    time_ax.plot(procs, compute, ":", color="0.4", label="compute only (perfect scaling)")
    time_ax.plot(auto["procs"], auto["total_per_epoch"], "D-", color="black",
                 label="auto plan (implementation model)")
    speed_ax.plot(auto["procs"], auto[key], "D-", color="black",
                  label="auto plan over all-batch plan (implementation model)")
    speed_ax.axhline(1.0, color=BATCH_EDGE, linestyle="--", linewidth=1)
    for ax in (time_ax, speed_ax):
        _procs_axis(ax, procs)
    time_ax.set_yscale("log")
    time_ax.set_ylabel("seconds per epoch")
    time_ax.legend(fontsize=7)
    if limit:
        baseline = int(group.attrs["batch_limit_procs"])
        speed_ax.set_ylabel(f"speedup over pure batch at its limit (1×{baseline})")
    else:
        speed_ax.set_ylabel("speedup over pure batch (1×P)")
    speed_ax.legend(fontsize=7)
    fig.suptitle(_study_title(group, root), fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def plot_plans(group: h5py.Group, root: h5py.File, path: Path) -> Path:
    """The auto plan against pure batch and one weird trick: stacked compute / communication /
    redistribution bars per P; communication and speedup against P below."""
    plt = _pyplot()
    from matplotlib.patches import Patch

    plans = {name: read_table(group[name]) for name in PLANS}
    auto = plans["auto"]
    procs = auto["procs"]
    fig = plt.figure(figsize=(max(10.0, 1.5 * len(procs) + 1.0), 8.0), layout="constrained")
    top, bottom = fig.subfigures(2, 1, height_ratios=[1.15, 1.0])
    bars = np.atleast_1d(top.subplots(1, len(procs)))
    for k, ax in enumerate(bars):
        ax.set_title(f"P = {procs[k]}, B = {auto['batch'][k]}", fontsize=8)
        for x, (name, table) in enumerate(plans.items()):
            if not table["runnable"][k]:
                ax.text(x, 0.02, "cannot\nrun", transform=ax.get_xaxis_transform(),
                        ha="center", va="bottom", fontsize=7, color="0.4")
                continue
            bottom_of = 0.0
            for key, _, colour in PARTS:
                ax.bar(x, table[key][k], bottom=bottom_of, width=0.8, color=colour)
                bottom_of += table[key][k]
            if name != "auto" and auto["runnable"][k]:  # auto's speedup over this baseline
                speedup = auto[SPEEDUP_OVER[name]][k]
                ax.text(x, bottom_of, f"{speedup:.3f}×", ha="center", va="bottom", fontsize=6)
        # an explicit top: a zero-height bar on top of a stack pins autoscaling at its total
        ax.set_ylim(0, 1.12 * max((t["total_per_epoch"][k] for t in plans.values()
                                   if t["runnable"][k]), default=1.0))
        ax.set_xlim(-0.6, len(plans) - 0.4)
        ax.set_xticks(range(len(plans)))
        ax.set_xticklabels([PLANS[name][0] for name in plans], fontsize=7)
        ax.tick_params(axis="y", labelsize=7)
        ax.grid(axis="y", alpha=0.3)
    bars[0].set_ylabel("seconds per epoch", fontsize=8)
    top.legend(handles=[Patch(color=colour, label=label) for _, label, colour in PARTS],
               loc="outside lower center", ncol=3, fontsize=8, frameon=False)
    top.suptitle("per P: time per epoch (over the baselines: auto's speedup)", fontsize=9)

    comm_ax, speed_ax = bottom.subplots(1, 2)
    for name, table in plans.items():
        _, label, colour = PLANS[name]
        comm_ax.plot(procs, table["comm_per_epoch"], "o-", color=colour, label=label)
        if name == "auto":
            continue
        over = SPEEDUP_OVER[name]
        speed_ax.plot(procs, auto[over], "o-", color=colour, label=f"auto over {label}")
        if f"{over}_limit" in auto:  # beyond P = B: over the baseline on B ranks
            limit = int(group.attrs["batch_limit_procs"])
            beyond = ~table["runnable"] | (procs == limit)
            speed_ax.plot(procs[beyond], auto[f"{over}_limit"][beyond], "o--", color=colour,
                          label=f"auto over {PLANS[name][0]} on {limit} ranks")
    plain_log_axis(comm_ax)
    comm_ax.set_ylabel("communication + redistribution, s per epoch", fontsize=8)
    speed_ax.axhline(1.0, color="0.5", linewidth=1)
    speed_ax.set_ylabel("speedup of the auto plan", fontsize=8)
    for ax in (comm_ax, speed_ax):
        _procs_axis(ax, procs, fontsize=8)
        ax.tick_params(which="both", labelsize=7)
        ax.legend(fontsize=7)
    fig.suptitle(f"{_study_title(group, root)}\nauto plan against pure batch and one weird "
                 f"trick (all three costed by hpctrain's implementation model)", fontsize=10)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_levels(group: h5py.Group, root: h5py.File, path: Path) -> Path:
    """One net of the --levels study: iteration time of both plans on the levelled machine
    against P, and the flat plan's loss against P."""
    plt = _pyplot()

    t = read_table(group)
    procs = t["procs"]
    fig, (time_ax, loss_ax) = plt.subplots(1, 2, figsize=(11, 4.4))
    time_ax.plot(procs, t["levelled_time"] * 1e3, "D-", color="black",
                 label="levelled plan (planned with the levels)")
    time_ax.plot(procs, t["flat_on_levelled_time"] * 1e3, "o-", color=BATCH_EDGE,
                 label="flat plan (planned on the network's link everywhere)")
    time_ax.plot(procs, t["flat_time"] * 1e3, "s--", color="0.55",
                 label="flat plan, its own prediction (flat profile)")
    plain_log_axis(time_ax)
    time_ax.set_ylabel("ms per iteration")
    time_ax.legend(fontsize=7)
    loss_ax.plot(procs, t["loss"] * 100, "o-", color=BATCH_EDGE)
    for k, p in enumerate(procs):
        widths = [f"{t[f'{plan}_widest_model_group'][k]}"
                  + ("*" if t[f"{plan}_model_group_crosses_nodes"][k] else "")
                  for plan in ("flat", "levelled")]
        loss_ax.annotate(f"{widths[0]}→{widths[1]}\n{t['segments_changed'][k]}/"
                         f"{t['segments'][k]}", (p, t["loss"][k] * 100),
                         textcoords="offset points", xytext=(0, 6), ha="center", fontsize=6)
    loss_ax.set_ylim(0, max(1.0, 1.3 * float(np.max(t["loss"])) * 100))
    loss_ax.set_ylabel("flat plan's loss on the levelled machine, %")
    loss_ax.set_title("labels: widest model group flat→levelled (* wider than a node); "
                      "segments changed", fontsize=7)
    for ax in (time_ax, loss_ax):
        _procs_axis(ax, procs)
    fig.suptitle(f"{group.attrs.get('net', group.name)} on {root.attrs.get('machine', '?')}: "
                 f"flat against levelled planning, {group.attrs.get('batch_rule', '')}"
                 f"\n{root.attrs.get('machine_levels', '')}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


VOLUME_PLANS = {"auto": ("auto plan under the memory cap", "black", "D-"),
                "pure_batch": ("pure batch (where it runs and fits)", BATCH_EDGE, "s--")}
GIB = 2.0**30


def _plain(value: float, _position: object = None) -> str:
    """A tick label without powers of ten: 0.1, 2.5, 100, 1,000,000."""
    return f"{value:,.0f}" if value >= 10 else f"{value:g}"


def plain_log_axis(ax) -> None:
    """Make ``ax``'s y axis logarithmic with plain labels (10, 100, not 10^1, 10^2) that show
    whatever its range: ticks at 1, 2 and 5 of each decade, or at every 1…9 of one where the
    lines drawn span less than a decade (a range such as 30–80 crosses no power of ten, and
    labels at powers of ten alone would leave it without a number)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    low, high = _drawn_range(ax)
    ax.set_yscale("log")
    subs = (1.0, 2.0, 5.0) if high >= 10 * low else tuple(float(k) for k in range(1, 10))
    ax.yaxis.set_major_locator(LogLocator(subs=subs))
    ax.yaxis.set_major_formatter(FuncFormatter(_plain))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _drawn_range(ax) -> tuple[float, float]:
    """The least and largest finite positive y of the lines drawn on ``ax`` (1, 1: none)."""
    values = np.concatenate([np.asarray(line.get_ydata(), dtype=float)
                             for line in ax.get_lines()] or [np.ones(1)])
    values = values[np.isfinite(values) & (values > 0)]
    return (float(values.min()), float(values.max())) if len(values) else (1.0, 1.0)


def plot_volumes(group: h5py.Group, root: h5py.File, path: Path) -> Path:
    """One volume edge of the --volumes study: a row per scaling rule (strong, weak), with
    iteration time (the auto plan's first layer written at each point), samples per second and
    peak memory per rank against P; the memory cap as a line, pure batch's peak drawn where it
    is over the cap (hollow), P where no plan fits marked on the axis."""
    plt = _pyplot()

    rules = [name for name in ("strong", "weak") if name in group]
    cap = float(root.attrs.get("mem_per_rank", np.nan))
    fig, axes = plt.subplots(len(rules), 3, figsize=(15, 4.3 * len(rules)), squeeze=False)
    for row, rule in zip(axes, rules):
        t = read_table(group[rule])
        procs = t["procs"]
        time_ax, rate_ax, memory_ax = row
        for plan, (label, colour, style) in VOLUME_PLANS.items():
            runs = t[f"{plan}_runnable"].astype(bool)
            if not np.any(np.isfinite(t[f"{plan}_memory_per_rank"])):
                continue  # it splits nowhere: nothing to draw
            time_ax.plot(procs, t[f"{plan}_iteration_time"] * 1e3, style, color=colour,
                         label=label)
            rate_ax.plot(procs, t[f"{plan}_samples_per_second"], style, color=colour,
                         label=label)
            memory = t[f"{plan}_memory_per_rank"] / GIB
            memory_ax.plot(procs[runs], memory[runs], style[0], color=colour, label=label)
            over = ~runs & np.isfinite(memory)
            if np.any(over):
                memory_ax.plot(procs[over], memory[over], style[0], color=colour,
                               markerfacecolor="none", label=f"{label}: over the cap")
        auto = t["auto_runnable"].astype(bool)
        for k in np.nonzero(auto)[0]:  # the first layer's grid, where the auto plan runs
            time_ax.annotate(t["auto_first_layer"][k].replace(" ", "\n"),
                             (procs[k], t["auto_iteration_time"][k] * 1e3),
                             textcoords="offset points", xytext=(0, -8), ha="center",
                             va="top", fontsize=6)  # below: pure batch is never faster
        if np.any(auto):  # ideal scaling from the least P where the auto plan runs
            first = np.nonzero(auto)[0][0]
            ideal = t["auto_samples_per_second"][first] * procs / procs[first]
            rate_ax.plot(procs[first:], ideal[first:], ":", color="0.5",
                         label="ideal (linear in P)")
        memory_ax.axhline(cap / GIB, color="tab:red", linewidth=1,
                          label=f"cap {cap / GIB:g} GiB per rank")
        time_ax.set_ylabel("ms per iteration")
        rate_ax.set_ylabel("samples per second")
        memory_ax.set_ylabel("peak memory per rank, GiB")
        batch_rule = group[rule].attrs.get("batch_rule", "")
        for ax, what in ((time_ax, "iteration time (labels: auto's first layer)"),
                         (rate_ax, "throughput"), (memory_ax, "memory per rank")):
            low, high = _drawn_range(ax)
            if high > 4 * low:  # a wide range: log, labelled 10, 100 (not 10^1, 10^2)
                plain_log_axis(ax)
                ax.set_ylim(low / 1.6, high * 1.6)
            else:  # a narrow one (weak scaling): linear from 0, so that it looks as flat as it is
                ax.set_ylim(0, 1.25 * high)
            for p in procs[~auto]:  # no plan fits, or none splits
                ax.axvline(p, color="0.85", linewidth=6, zorder=0)
            ax.set_title(f"{rule} scaling, {batch_rule}: {what}", fontsize=9)
            _procs_axis(ax, procs)
            ax.tick_params(axis="x", labelsize=7)
            ax.legend(fontsize=7)
    fig.suptitle(f"{root.attrs.get('net', '?')} on {group.attrs.get('size', '?')}³ volumes, "
                 f"{root.attrs.get('machine', '?')}: the auto plan under the memory cap "
                 f"against pure batch (grey: P where no plan fits)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_simulation(h5_path: str | Path, out_dir: str | Path) -> list[Path]:
    """Draw every study of ``h5_path`` into ``out_dir``; returns the PNG paths written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    with h5py.File(h5_path, "r") as root:
        for name in STUDIES:
            if name not in root:
                continue
            written.append(plot_grids(root[name], root, out / f"{name}_grids.png"))
            written.append(plot_speedup(root[name], root, out / f"{name}_speedup.png"))
            if all(plan in root[name] for plan in PLANS):  # files of older versions lack them
                written.append(plot_plans(root[name], root, out / f"{name}_plans.png"))
        for study in ("levels", "levels_domain"):  # simulate --levels
            for net, group in root.get(study, {}).items():
                written.append(plot_levels(group, root, out / f"{study}_{net}.png"))
        for name, group in root.get("volumes", {}).items():  # simulate --volumes
            written.append(plot_volumes(group, root, out / f"volumes_{name}.png"))
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Plot the output of 'python -m hpctrain simulate': per study, stacked "
                    "compute + communication bars per Pr x Pc grid, speedup over pure "
                    "batch parallelism, and the auto plan against pure batch and one weird "
                    "trick; for a file of 'simulate --levels', per net the plans made with and "
                    "without the machine's levels; for 'simulate --volumes', per volume edge "
                    "the auto plan under the memory cap against pure batch.")
    parser.add_argument("h5", help="HDF5 file written by 'python -m hpctrain simulate'")
    parser.add_argument("--out", default="plots", help="directory for the PNG files "
                                                       "(default: %(default)s)")
    args = parser.parse_args(argv)
    if not Path(args.h5).is_file():
        parser.error(f"no file {args.h5}; write it with 'python -m hpctrain simulate'")
    for path in plot_simulation(args.h5, args.out):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
