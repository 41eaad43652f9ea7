"""Command line: ``python -m hpctrain [COMMAND] [options]``; parses the command's name and hands
its options to the module that owns the command.

A :class:`~hpctrain.errors.UserError` (a bad net, grid or size) is found identically on every rank
before any rank can block, so every rank exits with status 2 and rank 0 prints one line naming the
fix. Anything else may have struck one rank only: that rank prints what happened and aborts the
whole job, so no rank is left waiting in a collective.

Exit status: 0 done (or stopped by a signal, with a checkpoint); 1 a crash on some rank, or a
:class:`~hpctrain.errors.Failure` (one line: a lost worker process); 2 bad input; 3 a result
(checkpoint, log, plan file) could not be written — every rank learns it from rank 0, which
wrote, and exits with 3. A command without MPI stopped by Ctrl-C exits with 130, by SIGTERM
with 143, each in one line, having removed what it had not finished.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator

from hpctrain.errors import (
    EXIT_FAILURE,
    EXIT_OUTPUT_ERROR,
    EXIT_USER_ERROR,
    Failure,
    OutputError,
    Terminated,
    UserError,
    forget_sigterm,
    on_sigterm,
    stop_if_terminated,
    write_line,
)

# Commands whose runner takes the stop requests recorded since start-up (``stop=``) and stops
# cleanly on SIGTERM or SIGUSR1; the others hand the handlers back, and a signal acts as usual.
STOPS_CLEANLY = frozenset({"train"})
# seconds a failed rank waits between printing why and aborting: the launcher forwards a rank's
# output through its proxy, and MPICH's hydra drops what is still in flight when a rank aborts
ABORT_GRACE = 0.5

# Every command NAME is the module hpctrain.commands.NAME ('-' spelled '_'), with build_parser()
# and run(argv[, comm, ...]); the value says whether it runs under MPI. Modules are imported only
# when their command runs: `plan --help` loads no MPI.
COMMANDS: dict[str, bool] = {
    "train": True,
    "verify": True,
    "plan": False,
    "calibrate": True,
    "simulate": False,
    "compare-plans": True,
    "convert": False,
    "export": False,
    "predict": True,
}


def command_module(command: str):
    """The module of ``command``: ``hpctrain.commands.NAME``."""
    from importlib import import_module

    return import_module(f"hpctrain.commands.{command.replace('-', '_')}")


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """While a command without MPI runs, SIGTERM raises :class:`~hpctrain.errors.Terminated`
    (a ``KeyboardInterrupt``), so it stops as Ctrl-C does: temporaries removed, one line. By
    default SIGTERM would kill the process where it stands, leaving its temporary file and,
    for ``convert``, its decoding workers writing tracebacks into a closed pipe. While an
    output is written the stop waits for a safe point, such as the next batch of a dataset
    (:func:`~hpctrain.errors.sigterm_at_safe_points`)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    forget_sigterm()
    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
        # a SIGTERM whose Terminated a finaliser swallowed outside any safe point still stops
        # the command, as one that came a moment later would
        stop_if_terminated()
    finally:
        signal.signal(signal.SIGTERM, previous)
        forget_sigterm()


def _caused_by(err: BaseException, kind: type[BaseException]) -> bool:
    """Whether ``err`` or an exception it was raised while handling is a ``kind``."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, kind):
            return True
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return False


def _say_error(err: UserError | OutputError) -> int:
    write_line(f"hpctrain: error: {err}")
    return EXIT_OUTPUT_ERROR if isinstance(err, OutputError) else EXIT_USER_ERROR


def _check_launch(comm) -> None:
    """Refuse tasks that srun started together but MPI sees apart (srun without a PMI the MPI
    library speaks makes each task a world of one): each would train alone, all writing the
    same files. Only that case: under mpiexec inside an allocation the step's task count is
    that of mpiexec's own proxies, not of the ranks."""
    import os

    launched = os.environ.get("SLURM_STEP_NUM_TASKS", "")
    if comm.Get_size() == 1 and launched.isdigit() and int(launched) > 1:
        raise UserError(f"srun launched {launched} tasks but MPI sees each alone; the MPI "
                        f"library and srun do not share a PMI: use srun --mpi=pmi2 (the mpich "
                        f"wheel) or mpiexec")


def _launched_rank() -> int:
    """This process's rank as the launcher numbered it (MPICH's, Open MPI's or Slurm's), read
    without starting MPI; 0 when not launched as one of many."""
    import os

    for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"):
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


def unknown_command(word: str) -> str:
    """The refusal of ``word`` where a command belongs, with the nearest command's name. (A
    bare option list means ``train``: no command takes a word before its options.)"""
    from difflib import get_close_matches

    near = get_close_matches(word, COMMANDS, n=1, cutoff=0.6)
    hint = f"did you mean '{near[0]}'? " if near else ""
    return (f"unknown command {word!r}: {hint}the commands are {', '.join(COMMANDS)} "
            f"(options alone mean train)")


def main(argv: list[str] | None = None, stop=None) -> int:
    """Run the command ``argv`` names; its exit status. ``stop``: the
    :class:`~hpctrain.run.signals.StopRequests` recording since start-up, if any."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--version"]:
        from hpctrain import __version__

        print(f"hpctrain {__version__}")
        return 0
    if argv and not argv[0].startswith("-") and argv[0] not in COMMANDS:
        if stop is not None:
            stop.release()
        # before MPI starts (the word may be a typo of a command that would not start it): one
        # line from the launcher's first rank
        return (_say_error(UserError(unknown_command(argv[0]))) if _launched_rank() == 0
                else EXIT_USER_ERROR)
    command = argv.pop(0) if argv and argv[0] in COMMANDS else "train"
    options = {}
    if stop is not None and command in STOPS_CLEANLY:
        options["stop"] = stop
    elif stop is not None:
        stop.release()
    if any(a in ("-h", "--help") for a in argv):  # help needs no MPI
        try:
            command_module(command).build_parser().parse_args(argv)
        except UserError as err:
            return _say_error(err)
    run, under_mpi = command_module(command).run, COMMANDS[command]
    if not under_mpi:  # the cost model alone, or dataset conversion
        try:
            with _terminate_as_interrupt():
                return run(argv)
        except (UserError, OutputError) as err:
            return _say_error(err)
        except Failure as err:
            write_line(f"hpctrain {command}: error: {err}")
            return EXIT_FAILURE
        except Terminated:  # SIGTERM: as Ctrl-C, with the status a kill by SIGTERM gives
            write_line(f"hpctrain {command}: stopped by SIGTERM")
            return 128 + signal.SIGTERM
        except KeyboardInterrupt:  # Ctrl-C: one line, no traceback (outputs are renamed last)
            write_line(f"hpctrain {command}: interrupted")
            return 130
        except Exception as err:
            if not _caused_by(err, Terminated):
                raise
            # SIGTERM raised inside a library's callback (h5py writing an attribute), which
            # reported it as an error of its own: still the stop SIGTERM asked for
            write_line(f"hpctrain {command}: stopped by SIGTERM")
            return 128 + signal.SIGTERM
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    try:
        _check_launch(comm)
        return run(argv, comm, **options)
    except UserError as err:
        return _say_error(err) if comm.Get_rank() == 0 else EXIT_USER_ERROR
    except OutputError as err:  # raised on every rank together (see hpctrain.comm.agree)
        return _say_error(err) if comm.Get_rank() == 0 else EXIT_OUTPUT_ERROR
    except SystemExit:
        raise
    except BaseException as err:
        detail = str(err) if isinstance(err, RuntimeError) else traceback.format_exc()
        line = f"hpctrain: rank {comm.Get_rank()} failed: {detail}"
        write_line(line)
        if sys.__stderr__ is not None and sys.stderr is not sys.__stderr__:
            # whoever holds sys.stderr (a test harness capturing it) is killed by the abort
            # before it can show the line: the process's own stderr gets it too
            write_line(line, sys.__stderr__)
        time.sleep(ABORT_GRACE)
        comm.Abort(1)
        return 1
