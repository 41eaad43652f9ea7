"""Stop requests: SIGTERM or SIGUSR1 asks the run to checkpoint and exit at the next step.

Slurm sends SIGTERM at the time limit (then SIGKILL after ``KillWait``), and with
``--signal=USR1@120`` it sends SIGUSR1 two minutes early. A signal may reach some ranks and not
others, and at different moments, so the handler only records it; at the end of each step all
ranks agree with one small all-reduce whether any rank was asked to stop, and then all stop
after the same step.
"""

from __future__ import annotations

import signal
from types import FrameType
from typing import Any

import numpy as np

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class StopRequests:
    """While entered, SIGTERM and SIGUSR1 are recorded instead of killing the process (the
    first of each; a second one acts as usual).

    Examples
    --------
    >>> import os
    >>> with StopRequests() as stop:
    ...     os.kill(os.getpid(), signal.SIGUSR1)
    ...     stop.received
    'SIGUSR1'
    """

    def __init__(self) -> None:
        self.received: str | None = None
        self._previous: dict[int, Any] = {}

    def _record(self, signum: int, frame: FrameType | None) -> None:
        self.received = self.received or signal.Signals(signum).name
        # a second one kills as usual: a job stuck where no step ends can still be stopped
        signal.signal(signum, signal.SIG_DFL)

    def __enter__(self) -> StopRequests:
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._record)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def agreed(self, comm: Any) -> str | None:
        """Collective: the signal some rank received (SIGUSR1 when both were), or None.

        Every rank returns the same answer, so all stop after the same step.
        """
        code = np.array([STOP_SIGNALS.index(signal.Signals[self.received]) + 1
                         if self.received else 0], dtype=np.int64)
        if comm.Get_size() > 1:
            from mpi4py import MPI

            comm.Allreduce(MPI.IN_PLACE, code, op=MPI.MAX)
        return STOP_SIGNALS[code[0] - 1].name if code[0] else None
