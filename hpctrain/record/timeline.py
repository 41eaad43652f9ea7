"""A timeline of chosen training steps: every rank's spans, gathered into the run log.

``--timeline FIRST:LAST`` records steps FIRST to LAST (as the progress lines count them, from
1): on every rank, each layer's forward and backward as a compute span, each communication
inside it (halo, statistics, gradient sums awaited), each redistribution feeding a layer, and,
with ``--overlap``, each bucket of gradient sums from the moment it is sent to the moment its
sum is seen to have arrived. Times are seconds from a barrier before the first recorded step,
so the ranks share an origin (to within the barrier's skew, microseconds on one node).

After the last recorded step every rank's spans are gathered to rank 0 (one ``Gatherv``), which
writes them to the run log's ``/timeline`` (see :meth:`hpctrain.record.runlog.RunLog.timeline`);
``analysis/timeline.py`` draws them and exports a Chrome trace. The gather brings every rank's
spans to one rank: a timeline of a few steps is meant for up to a few hundred ranks.
"""

from __future__ import annotations

import re
import time
from typing import Any

import numpy as np

from hpctrain.errors import UserError
from hpctrain.record.timing import StepTimes

#: The fields of one span, in the order of a row of the gathered timeline.
SPAN_FIELDS = ("rank", "row", "phase", "category", "start", "end")
_WINDOW = re.compile(r"([0-9]+):([0-9]+)", re.ASCII)


def parse_window(text: str) -> tuple[int, int]:
    """``FIRST:LAST`` (steps counted from 1, LAST ≥ FIRST ≥ 1) as a pair."""
    match = _WINDOW.fullmatch(text.strip())
    if match is None or not 1 <= int(match[1]) <= int(match[2]):
        raise UserError(f"--timeline {text!r} must be FIRST:LAST, steps counted from 1 with "
                        f"FIRST <= LAST (e.g. --timeline 3:4)")
    return int(match[1]), int(match[2])


class TimelineWindow:
    """Records the spans of steps ``first`` to ``last`` (counted from 1) on this rank.

    Per step of the run: :meth:`begin` before it with its timing record, :meth:`end` after;
    :meth:`gather` (collective, once the window is over or the run stops) returns rank 0 the
    spans of every rank, as rows of :data:`SPAN_FIELDS`.
    """

    def __init__(self, window: tuple[int, int], comm: Any, backend: Any) -> None:
        self.first, self.last = window
        self.comm, self.backend = comm, backend
        self.origin: float | None = None
        self.spans: list[tuple[int, int, int, float, float]] = []
        self.recorded: list[int] = []  # the steps recorded, counted from 1

    def records(self, step: int) -> bool:
        """Whether step ``step`` (counted from 0) is in the window."""
        return self.first <= step + 1 <= self.last

    def begin(self, step: int, times: StepTimes) -> None:
        if not self.records(step):
            return
        if self.origin is None:  # one origin for every rank: all leave the barrier together
            self.comm.Barrier()
            self.origin = time.perf_counter()
        times.spans = self.spans
        self.backend.clock.intervals = []

    def end(self, step: int, times: StepTimes) -> None:
        if self.records(step):
            times.spans = None
            self.backend.clock.intervals = None
            self.recorded.append(step + 1)

    @property
    def done(self) -> bool:
        """Whether the last step of the window has been recorded."""
        return bool(self.recorded) and self.recorded[-1] == self.last

    def gather(self) -> np.ndarray | None:
        """Every rank's spans at rank 0 (None elsewhere), times from the common origin.
        Collective."""
        from mpi4py import MPI

        mine = np.array(self.spans, dtype=np.float64).reshape(-1, 5)
        if self.origin is not None:
            mine[:, 3:] -= self.origin
        rows = np.column_stack([np.full(len(mine), self.comm.Get_rank(), np.float64), mine])
        counts = self.comm.gather(rows.size, root=0)
        if self.comm.Get_rank() != 0:
            self.comm.Gatherv(rows, None, root=0)
            return None
        whole = np.empty(sum(counts), dtype=np.float64)
        self.comm.Gatherv(rows, [whole, counts, MPI.DOUBLE], root=0)
        return whole.reshape(-1, len(SPAN_FIELDS))
