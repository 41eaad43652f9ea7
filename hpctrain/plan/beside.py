"""A search run on a second core: a forked child computes it while this process goes on with
its own, and hands back what it found through a pipe.

``plan --space auto`` searches the 1.5D grids (with groups of ranks) and the balanced space; with
compute priced from FLOPs neither search waits for the other, and for a branched net each takes
about half of a plan's time (:mod:`hpctrain.plan.spaces`). A fork shares the cost model as it
stands, so the child prices the same moves and layers to the same floats, and what it sends back is
the plan alone, priced again here. A child may also note a value as soon as it has it, before
its search ends (:meth:`Beside.noted`): a bound that tells this process it need not wait for the
rest.

Only where forking is safe and pays: on Linux (macOS's system libraries are not safe to use in a
forked child, which is why Python spawns there), in a process that runs one thread (a lock another
thread held at the fork would stay held in the child), has loaded neither MPI (a forked MPI process
is undefined) nor CuPy (nor is a forked CUDA context), and may run on two CPUs or more. A child that
is lost (killed, out of memory) costs nothing but time: the search then runs here. SIGINT and
SIGTERM are held while the child is forked and given their default actions in it before it takes
them (:func:`~hpctrain.errors.stops_held_for_a_fork`), so that no handler of this process (the
command line's raises) runs in the copy; the child leaves by ``os._exit``, running none of this
process's exit handlers and flushing none of its buffers."""

from __future__ import annotations

import os
import pickle
import signal
import sys
import threading
from collections.abc import Callable
from typing import BinaryIO

from hpctrain.device.cpus import affinity
from hpctrain.errors import stops_held_for_a_fork, take_held_stops


def may_fork() -> bool:
    """Whether a search may run in a forked child here (the module's text)."""
    return (sys.platform.startswith("linux") and threading.active_count() == 1
            and not {"mpi4py.MPI", "cupy"} & sys.modules.keys()
            and len(affinity()) >= 2)


class Beside:
    """``search()`` run in a forked child from the moment this is made; ``result()`` its
    value, or what it raised raised here, or ``search()`` run here if the child was lost.
    ``close()`` ends a child whose result is no longer wanted. What ``search`` returns, and
    any exception it raises, must pickle.

    With ``noting``, ``search`` takes one argument: a call that hands a value (which must
    pickle) to this process at once, while the search goes on (:meth:`noted`). The child
    writes each note, then its outcome, as pickles one after another into one pipe."""

    def __init__(self, search: Callable[..., object], noting: bool = False) -> None:
        self.search, self.noting = search, noting
        self.pid: int | None = None
        self._pipe: BinaryIO | None = None  # the child's notes and outcome, read in turn
        self._notes: list[object] = []
        self._heard = 0  # the notes noted() has handed out
        self._outcome: tuple | None = None  # (ok, value), once read
        readable, writable = os.pipe()
        try:
            with stops_held_for_a_fork():
                pid = os.fork()
                if pid == 0:
                    _child(search, readable, writable, noting)  # never returns
            self.pid, self._pipe = pid, os.fdopen(readable, "rb")
        except OSError:  # no process to be had (memory, a limit): the search runs here
            os.close(readable)
        finally:
            os.close(writable)

    def noted(self) -> object | None:
        """The next value the search noted (the first, at the first call), waiting for it;
        None once it has ended (or was lost, or never forked) noting no more."""
        while len(self._notes) <= self._heard and self._read():
            pass
        if len(self._notes) <= self._heard:
            return None
        self._heard += 1
        return self._notes[self._heard - 1]

    def result(self) -> object:
        """The child's value (once it has ended), or what it raised, raised here."""
        while self._read():
            pass
        if self._outcome is not None and self.pid is not None:  # it exits once it has written
            os.waitpid(self.pid, 0)
            self.pid = None
        self.close()
        if self._outcome is None:  # not forked, or lost before it answered: search here
            return self.search(self._notes.append) if self.noting else self.search()
        ok, value = self._outcome
        if not ok:
            raise value
        return value

    def _read(self) -> bool:
        """Read the child's next message; False once there is none left to read (its
        outcome read, or the pipe ended: a child lost mid-write leaves a broken pickle)."""
        if self._pipe is None or self._outcome is not None:
            return False
        try:
            message = pickle.load(self._pipe)
        except (EOFError, pickle.UnpicklingError):
            self.close()
            return False
        if message[0] == "note":
            self._notes.append(message[1])
        else:
            self._outcome = message[1:]
        return True

    def close(self) -> None:
        """End the child if it still runs, and release its pipe."""
        if self.pid is not None:
            os.kill(self.pid, signal.SIGKILL)  # none left to kill once it has been reaped
            os.waitpid(self.pid, 0)
            self.pid = None
        if self._pipe is not None:
            self._pipe.close()
            self._pipe = None


def _child(search: Callable[..., object], readable: int, writable: int, noting: bool) -> None:
    """The forked child: run ``search`` (given, where it is ``noting``, a call that writes a
    note), write its outcome, (ok, value), after any notes, each pickled, to ``writable``, and
    exit without running anything of the parent's."""
    try:
        take_held_stops(signal.SIG_DFL, signal.SIG_DFL)
        os.close(readable)
        with os.fdopen(writable, "wb") as pipe:
            def note(value: object) -> None:
                pipe.write(pickle.dumps(("note", value)))
                pipe.flush()

            try:
                outcome = ("end", True, search(note) if noting else search())
            except Exception as err:  # noqa: BLE001 -- whatever it raised is raised in the parent
                outcome = ("end", False, err)
            try:
                data = pickle.dumps(outcome)
            except Exception:  # noqa: BLE001 -- a value that does not pickle: the parent searches
                data = b""
            pipe.write(data)
    finally:
        os._exit(0)
