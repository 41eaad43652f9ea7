"""Draw the timeline of a run log (``--timeline``) and export it as a Chrome trace.

Usage::

    python analysis/timeline.py run.h5 --out plots/

writes ``<stem>-timeline.png``: one lane per rank, time across; each layer's forward and
backward as a compute bar, the communication inside it (halo, statistics, gradient sums
awaited) drawn over it, redistributions in their own colour, and, below each lane, the buckets
of gradient sums in flight (``--overlap``) from sent to arrived: where they lie under compute
bars, communication is hidden behind computation. And ``<stem>-timeline.json``, a Chrome trace
(the Trace Event Format) that https://ui.perfetto.dev and chrome://tracing open: one process per
rank, one thread per kind of span.

Reads the HDF5 file only (h5py, NumPy, matplotlib); never imports MPI or hpctrain.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

COLOURS = {"compute": "0.62", "communication": "tab:blue", "redistribution": "tab:orange",
           "gradient sum in flight": "tab:red"}


class TimelineError(ValueError):
    """A file without a readable timeline; the message names it."""


@dataclass
class Timeline:
    """Spans of a run log's ``/timeline``: rows of (rank, row, phase, category, start, end)."""

    spans: np.ndarray
    rows: list[str]
    phases: list[str]
    categories: list[str]
    steps: list[int]
    title: str

    @property
    def ranks(self) -> int:
        return int(self.spans[:, 0].max()) + 1 if len(self.spans) else 0

    def label(self, span: np.ndarray) -> str:
        """'conv3 backward': the layer and phase of a span."""
        return f"{self.rows[int(span[1])]} {self.phases[int(span[2])]}"


def read_timeline(path: str | Path) -> Timeline:
    import h5py

    try:
        with h5py.File(path, "r", locking=False) as h5:
            if "timeline/spans" not in h5:
                raise TimelineError(f"{path} has no /timeline: run with --timeline FIRST:LAST "
                                    f"--log {Path(path).name}")
            group = h5["timeline"]
            steps = [int(s) for s in group["steps"][:]]
            attrs = h5.attrs
            title = (f"{attrs.get('net', '?')}, P = {attrs.get('processes', '?')}, batch "
                     f"{attrs.get('batch', '?')}, step{'s' if len(steps) > 1 else ''} "
                     f"{', '.join(map(str, steps))}")
            return Timeline(np.asarray(group["spans"][:], dtype=np.float64),
                            [r.decode() for r in group["rows"][:]],
                            str(group.attrs["phases"]).split(","),
                            str(group.attrs["categories"]).split(","), steps, title)
    except OSError as err:
        raise TimelineError(f"{path}: cannot read it as HDF5 ({err})") from None


def chrome_trace(timeline: Timeline) -> dict:
    """The spans as Trace Event Format "complete" events (microseconds), one process per rank
    and one thread per category."""
    events = [{"name": "process_name", "ph": "M", "pid": rank, "args": {"name": f"rank {rank}"}}
              for rank in range(timeline.ranks)]
    events += [{"name": "thread_name", "ph": "M", "pid": rank, "tid": k, "args": {"name": name}}
               for rank in range(timeline.ranks) for k, name in enumerate(timeline.categories)]
    for span in timeline.spans:
        rank, _, _, category, start, end = span
        events.append({"name": timeline.label(span), "cat": timeline.categories[int(category)],
                       "ph": "X", "pid": int(rank), "tid": int(category),
                       "ts": round(start * 1e6, 3), "dur": round((end - start) * 1e6, 3)})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"title": timeline.title}}


def draw_timeline(timeline: Timeline):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    ranks = timeline.ranks
    fig, ax = plt.subplots(figsize=(13, 1.1 + 0.9 * ranks))
    # per lane: the main band (compute, with communication and redistribution over it) and,
    # below it, a thinner band of gradient sums in flight
    band = {"compute": (0.45, 0.45), "communication": (0.5, 0.35),
            "redistribution": (0.45, 0.45), "gradient sum in flight": (0.08, 0.28)}
    for k, name in enumerate(timeline.categories):
        chosen = timeline.spans[timeline.spans[:, 3] == k]
        if not len(chosen):
            continue
        low, height = band[name]
        for rank in range(ranks):
            mine = chosen[chosen[:, 0] == rank]
            bars = [(s * 1e3, (e - s) * 1e3) for s, e in mine[:, 4:6]]
            lane = ranks - 1 - rank
            # the sums in flight overlap one another: draw them see-through
            alpha = 0.45 if name == "gradient sum in flight" else 1.0
            ax.broken_barh(bars, (lane + low, height), facecolors=COLOURS[name],
                           edgecolors="white" if name == "compute" else "none",
                           linewidth=0.3, alpha=alpha)
    ax.set_yticks([ranks - 1 - r + 0.5 for r in range(ranks)],
                  [f"rank {r}" for r in range(ranks)])
    ax.set_ylim(0, ranks)
    ax.set_xlabel("time (ms)")
    ax.set_title(f"Timeline: {timeline.title}")
    present = [n for k, n in enumerate(timeline.categories) if (timeline.spans[:, 3] == k).any()]
    ax.legend(handles=[Patch(color=COLOURS[n], label=n) for n in present],
              loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    fig.tight_layout()
    return fig


def plot_timeline(path: str | Path, out_dir: str | Path, name: str | None = None
                  ) -> list[Path]:
    """``<name>-timeline.png`` and ``<name>-timeline.json`` of the run log ``path`` (``name``
    by default its stem)."""
    import matplotlib.pyplot as plt

    timeline = read_timeline(path)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = name or Path(path).stem
    png, trace = out / f"{stem}-timeline.png", out / f"{stem}-timeline.json"
    fig = draw_timeline(timeline)
    fig.savefig(png, dpi=120)
    plt.close(fig)
    trace.write_text(json.dumps(chrome_trace(timeline)))
    return [png, trace]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Draw a run log's timeline (--timeline) as a PNG, one lane per rank, and "
                    "export it as a Chrome trace for Perfetto.")
    parser.add_argument("log", metavar="LOG.h5", help="a run log written with --timeline")
    parser.add_argument("--out", default="plots", help="directory for the PNG and JSON files "
                                                       "(default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        written = plot_timeline(args.log, args.out)
    except TimelineError as error:
        print(f"timeline.py: error: {error}", file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
