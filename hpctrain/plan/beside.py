"""A search run on a second core: a forked child computes it while this process goes on with
its own, and hands back what it found through a pipe.

``plan --space auto`` searches the 1.5D grids (with groups of ranks) and the balanced space; with
compute priced from FLOPs neither search waits for the other, and for a branched net each takes
about half of a plan's time (:mod:`hpctrain.plan.spaces`). A fork shares the cost model as it
stands, so the child prices the same moves and layers to the same floats, and what it sends back is
the plan alone, priced again here. A child may also be told something found here after the fork
(:meth:`Beside.tell`): it waits for it only when it needs it, by then most often long sent.

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

    With ``told``, ``search`` takes one argument: a call that returns what this process hands
    it with :meth:`tell`, waiting for it until then (a child may start before all it needs is
    known here). It must be told before :meth:`result` is asked for."""

    def __init__(self, search: Callable[..., object], told: bool = False) -> None:
        self.search, self.told = search, told
        self.pid: int | None = None
        self.readable: int | None = None
        self.telling: int | None = None  # where the child hears what it is told
        self._message: tuple[object] | None = None  # what it was told, for a search run here
        readable, writable = os.pipe()
        inbox = os.pipe() if told else None
        try:
            with stops_held_for_a_fork():
                pid = os.fork()
                if pid == 0:
                    _child(search, readable, writable, inbox)  # never returns
            self.pid, self.readable = pid, readable
            if inbox is not None:
                os.close(inbox[0])
                self.telling = inbox[1]
        except OSError:  # no process to be had (memory, a limit): the search runs here
            os.close(readable)
            for end in inbox or ():
                os.close(end)
        finally:
            os.close(writable)

    def tell(self, message: object) -> None:
        """Hand ``message`` to the search (``told``): once, and it must pickle."""
        self._message = (message,)
        if self.telling is not None:
            telling, self.telling = self.telling, None
            try:
                left = memoryview(pickle.dumps(message))
                while left:
                    left = left[os.write(telling, left):]
            except BrokenPipeError:  # the child ended without reading it: result() says why
                pass
            finally:
                os.close(telling)

    def result(self) -> object:
        """The child's value (once it has ended), or what it raised, raised here."""
        if self.told and self._message is None:  # the child would wait for it for ever
            raise RuntimeError("a search that is told something was not told it")
        if self.readable is None:  # not forked
            return self._search_here()
        chunks = []
        readable, self.readable = self.readable, None  # the file below closes it
        with os.fdopen(readable, "rb") as pipe:
            while chunk := pipe.read(1 << 20):
                chunks.append(chunk)
        self._reap()
        if not chunks:  # lost before it answered: search here instead
            return self._search_here()
        ok, value = pickle.loads(b"".join(chunks))
        if not ok:
            raise value
        return value

    def _search_here(self) -> object:
        if not self.told:
            return self.search()
        if self._message is None:
            raise RuntimeError("a search that is told something was not told it")
        return self.search(lambda: self._message[0])

    def close(self) -> None:
        """End the child if it still runs, and release its pipes."""
        if self.pid is not None:
            os.kill(self.pid, signal.SIGKILL)
            self._reap()
        for name in ("readable", "telling"):
            if getattr(self, name) is not None:
                os.close(getattr(self, name))
                setattr(self, name, None)

    def _reap(self) -> None:
        if self.pid is not None:
            os.waitpid(self.pid, 0)
            self.pid = None


def _child(search: Callable[..., object], readable: int, writable: int,
           inbox: tuple[int, int] | None) -> None:
    """The forked child: run ``search`` (given, where it is ``told``, a call that reads what
    the parent tells it from ``inbox``), write (ok, value) pickled to ``writable``, and exit
    without running anything of the parent's."""
    try:
        take_held_stops(signal.SIG_DFL, signal.SIG_DFL)
        os.close(readable)
        try:
            if inbox is None:
                outcome = (True, search())
            else:
                os.close(inbox[1])
                outcome = (True, search(_Inbox(inbox[0])))
        except Exception as err:  # noqa: BLE001 -- whatever it raised is raised in the parent
            outcome = (False, err)
        try:
            data = pickle.dumps(outcome)
        except Exception:  # noqa: BLE001 -- a value that does not pickle: the parent searches
            data = b""
        with os.fdopen(writable, "wb") as pipe:
            pipe.write(data)
    finally:
        os._exit(0)


class _Inbox:
    """What the parent tells the child through ``readable``, as a call: read to its end when
    first asked for, waiting for it until then, and kept (a parent that ended first leaves
    nothing, and unpickling nothing raises, each time)."""

    def __init__(self, readable: int) -> None:
        self.readable = readable
        self.heard: bytes | None = None

    def __call__(self) -> object:
        if self.heard is None:
            with os.fdopen(self.readable, "rb") as pipe:
                self.heard = pipe.read()
        return pickle.loads(self.heard)
