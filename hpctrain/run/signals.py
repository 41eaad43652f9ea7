"""Stop requests: SIGTERM or SIGUSR1 asks the run to checkpoint and exit at the next step.

Slurm sends SIGTERM at the time limit (then SIGKILL after ``KillWait``), and with
``--signal=USR1@120`` it sends SIGUSR1 two minutes early. A signal may reach some ranks and not
others, and at different moments, so the handler only records it; at the end of each step all
ranks agree with one small all-reduce whether any rank was asked to stop, and then all stop
after the same step.

``python -m hpctrain`` starts recording on its first line (``hpctrain/__main__.py``), before
NumPy or MPI is loaded: a signal while the run starts up, plans or opens its files is kept, and
every rank stops before the first training step with status 0 (:mod:`hpctrain.commands.train`).
Commands that do not stop cleanly hand the handlers back (:meth:`StopRequests.release`), so a
signal then acts as usual. Only a signal that reaches a rank before its interpreter has run our
first line (the first few tens of milliseconds) is the launcher's to report.
This module imports nothing slow, so that line comes early.
"""

from __future__ import annotations

import signal
from types import FrameType
from typing import Any

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

    def release(self) -> None:
        """Stop recording: restore the previous handlers, then deliver a signal already
        recorded again, so the process acts on it as it would have without us."""
        self.__exit__()
        if self.received:
            import os

            os.kill(os.getpid(), signal.Signals[self.received])

    def agreed(self, comm: Any) -> str | None:
        """Collective: the signal some rank received (SIGUSR1 when both were), or None.

        Every rank returns the same answer, so all stop after the same step.
        """
        return self.agreed_with(comm, False)[0]

    def agreed_with(self, comm: Any, flag: bool) -> tuple[str | None, bool]:
        """:meth:`agreed`, and whether ``flag`` is true on some rank, in the same all-reduce
        (the step's one agreement carries other news too, such as rank 0's log failing)."""
        import numpy as np

        code = np.array([STOP_SIGNALS.index(signal.Signals[self.received]) + 1
                         if self.received else 0, int(flag)], dtype=np.int64)
        if comm.Get_size() > 1:
            from mpi4py import MPI

            comm.Allreduce(MPI.IN_PLACE, code, op=MPI.MAX)
        return (STOP_SIGNALS[code[0] - 1].name if code[0] else None), bool(code[1])
