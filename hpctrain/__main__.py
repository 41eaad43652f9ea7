"""``python -m hpctrain``. SIGTERM and SIGUSR1 are recorded from this first line on, before
anything slow is imported (NumPy, MPI), so that a signal while starting up stops the run
cleanly (see :mod:`hpctrain.run.signals`). Importing this module (as the API reference does)
starts nothing."""

import sys

if __name__ == "__main__":
    from hpctrain.run.signals import StopRequests

    stop = StopRequests().__enter__()  # for the whole process: handed to the command, or released

    try:
        from hpctrain.cli import main  # after the handlers, on purpose

        sys.exit(main(stop=stop))
    except ModuleNotFoundError as err:  # a Python without hpctrain's dependencies
        if (err.name or "").partition(".")[0] == "hpctrain":
            raise
        sys.stderr.write(f"hpctrain: error: this Python ({sys.executable}) has no module "
                         f"{err.name!r}: run 'make install' and use .venv/bin/python, or "
                         f"'pip install -e .' into this one\n")
        sys.exit(2)
