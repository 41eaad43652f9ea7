"""Plot the HDF5 file of ``python -m hpctrain simulate`` in the style of Gholami et al. (2018).

For each study (``strong``, ``weak``, ``domain``) two PNG files:

- ``<study>_grids.png``: one row of panels per strategy, one panel per P with a bar per Pr×Pc
  grid: compute (grey) and communication (the strategy's colour) stacked, in seconds per epoch
  (linear, the same scale down each column; bars taller than the panel are cut and labelled
  with their height). The pure batch bar (1×P) is outlined in red, the best grid is marked with a
  triangle, grids hpctrain cannot execute (a split with an empty part, or a halo wider than a
  neighbour's rows) are faded, and a black line across each group marks the planner's auto plan.
- ``<study>_speedup.png``: the best grid of each strategy, pure batch and the auto plan in time
  per epoch against P, and their speedup over pure batch parallelism (over 1×B at the pure batch
  limit P = B in the domain study, where 1×P leaves ranks without a sample).

The auto plan is costed by hpctrain's implementation-faithful model, the bars by the paper's
equations; the legends say so. Reads the HDF5 file only; never imports MPI or hpctrain.

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
        ax.set_xscale("log", base=2)
        ax.set_xticks(procs)
        ax.set_xticklabels([str(p) for p in procs])
        ax.set_xlabel("processes P")
        ax.grid(alpha=0.3)
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
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Plot the output of 'python -m hpctrain simulate': per study, stacked "
                    "compute + communication bars per Pr x Pc grid, and speedup over pure "
                    "batch parallelism.")
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
