"""``python -m hpctrain``. SIGTERM and SIGUSR1 are recorded from this first line on, before
anything slow is imported (NumPy, MPI), so that a signal while starting up stops the run
cleanly (see :mod:`hpctrain.run.signals`)."""

import sys

from hpctrain.run.signals import StopRequests

stop = StopRequests().__enter__()  # for the whole process: handed to the command, or released

from hpctrain.cli import main  # noqa: E402  (after the handlers, on purpose)

sys.exit(main(stop=stop))
