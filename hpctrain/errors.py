"""Errors a user can fix, and how a value the user gave is shown in one.

A :class:`UserError` is found from the command line, the net file and the number of processes
alone, so every rank raises the same one at the same point, before any rank can block: each rank
exits with status 2 and rank 0 prints the one-line message. Any other exception may have struck
one rank only, so the command line aborts the whole job instead (see :mod:`hpctrain.cli`).

A message echoes what the user wrote through :func:`shown`, which cuts it to a readable length and
escapes line breaks and control characters, so that a 10 MB token or a binary file still gives
one short line.
An :class:`OutputError` is a result that could not be written (disk full, permission taken
away): rank 0 writes, then tells every rank, so each exits with status 3.

A failure line reaches the user through :func:`write_line`: the line and its newline in one
write, so that the launcher, which merges every rank's output, cannot put another rank's line
between them.
"""

import argparse
import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import PurePath
from types import FrameType, SimpleNamespace
from typing import NoReturn, TextIO

SHOWN_LIMIT = 80  # characters of a user's value echoed in a message
PATH_LIMIT = 240  # characters of a file's path shown in a message: its name must survive a
# deep working directory (a scheduler's scratch, a test's temporary folder), which 80 cuts off


class UserError(ValueError):
    """Bad input, detected identically on every rank; the message names the value and the fix."""


def shown(value: object, limit: int = SHOWN_LIMIT, quoted: bool = True) -> str:
    """``value`` as a message shows it: its ``repr``, cut to ``limit`` characters.

    A cut value ends in ``…`` and says how long the whole was. With ``quoted=False`` a short
    printable string (a file name) is shown as it is, without quotes; anything else is shown as
    with ``quoted=True``.

    Examples
    --------
    >>> shown("relu")
    "'relu'"
    >>> shown("x" * 10_000_000, limit=8)
    "'xxxxxx… (10,000,000 characters)"
    >>> shown("inputs/my.net", quoted=False)
    'inputs/my.net'
    """
    if isinstance(value, PurePath):
        value = str(value)
    if not quoted and isinstance(value, str) and len(value) <= limit and value.isprintable():
        return value
    text = repr(value)
    if len(text) <= limit:
        return text
    size = len(value) if isinstance(value, str | bytes) else len(text)
    return f"{text[:limit - 1]}… ({size:,} characters)"


def shown_path(path: object) -> str:
    """A file's path as a message shows it: as it is, or escaped and quoted when it holds a
    line break, a control character or bytes that are not UTF-8 (so that no name can split a
    line or forge one); cut to PATH_LIMIT characters.

    >>> shown_path("/scratch/run 7/model.onnx")
    '/scratch/run 7/model.onnx'
    """
    return shown(str(path), PATH_LIMIT, quoted=False)


def one_line(message: str, limit: int = 200) -> str:
    """``message`` on one line (runs of whitespace, line breaks included, become one space),
    cut to ``limit`` characters with ``…`` and the whole length."""
    text = " ".join(message.split())
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    if len(text) <= limit:
        return text
    return f"{text[:limit - 1]}… ({len(text):,} characters)"


def write_line(text: str, stream: TextIO | None = None) -> None:
    """``text`` and its newline written to ``stream`` (default: stderr) in one write, flushed.

    ``print`` writes the text and its end apart; under ``PYTHONUNBUFFERED=1`` (as batch
    scripts and containers often set) each is a write of its own, and the launcher, reading
    every rank's output as it comes, may put another rank's line between them ("…the file is
    damagedhpctrain: rank 1 failed…"). One write of the whole line, which the stream hands to
    the file in one system call, arrives whole. Trailing line breaks of ``text`` (a traceback's)
    are dropped, so the line ends with exactly one.
    """
    stream = sys.stderr if stream is None else stream
    stream.write(text.rstrip("\n") + "\n")
    stream.flush()


class OutputError(Exception):
    """A result (checkpoint, log, plan, profile, dataset) that could not be written; raised on
    every rank together, and the message names the file and the operating system's reason."""


class Failure(RuntimeError):
    """A run that failed for a reason outside its input, such as a worker process lost to the
    out-of-memory killer: one line naming what was lost, status 1 (not a traceback: it is no
    bug of the code either)."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C's ``KeyboardInterrupt`` would be, so a command that has no
    clean stop of its own (``convert``, ``plan``) removes what it had not finished alike; the
    command line then exits with 128 + 15, as a process killed by SIGTERM does."""


# A Terminated raised from the signal handler lands in whatever Python code runs at that
# moment. Where that is a weakref callback or another finaliser, Python prints it ("Exception
# ignored in ...") and carries on, and the stop is lost: h5py runs such a callback for each of
# the many objects it frees while a dataset is written. So the handler notes the SIGTERM too,
# and while code that writes through such a library runs (sigterm_at_safe_points) it only notes.
_sigterm = SimpleNamespace(noted=False, deferring=0)


def on_sigterm(signum: int, frame: FrameType | None) -> None:
    """The SIGTERM handler of a command without MPI (installed by :mod:`hpctrain.cli`): note the
    stop, and raise it as :class:`Terminated` unless :func:`sigterm_at_safe_points` defers it."""
    _sigterm.noted = True
    if not _sigterm.deferring:
        raise Terminated


def forget_sigterm() -> None:
    """Forget a noted SIGTERM: for the command line, as it installs or removes
    :func:`on_sigterm`, so that one command's stop never stops the next in the same process."""
    _sigterm.noted = False


def stop_if_terminated() -> None:
    """A safe point: raise :class:`Terminated` if :func:`on_sigterm` noted a SIGTERM."""
    if _sigterm.noted:
        raise Terminated


@contextlib.contextmanager
def sigterm_at_safe_points() -> Iterator[None]:
    """While entered, a SIGTERM that :func:`on_sigterm` takes is only noted; the code inside
    calls :func:`stop_if_terminated` at each point where it can stop, and leaving is one such
    point too, so that a SIGTERM noted after the last is not lost. Where :func:`on_sigterm` is
    not the handler (the API, training), SIGTERM acts as it would without this."""
    if threading.current_thread() is not threading.main_thread():
        yield  # a handler runs in the main thread, so only the main thread's code is stopped
        return
    _sigterm.deferring += 1
    try:
        yield
    finally:
        _sigterm.deferring -= 1
    stop_if_terminated()


STOPS = (signal.SIGINT, signal.SIGTERM)  # Ctrl-C and a polite kill: what stops a command
Handler = Callable[[int, FrameType | None], object] | int  # or signal.SIG_DFL, signal.SIG_IGN


@contextlib.contextmanager
def stops_held_for_a_fork() -> Iterator[None]:
    """SIGINT and SIGTERM held back from this thread while entered, to start a child by fork;
    the child inherits the mask and takes them once its own handlers are in place
    (:func:`take_held_stops`), this thread as it leaves.

    A forked child runs this process's handlers until it installs its own, and the command
    line's SIGTERM handler raises (:func:`on_sigterm`). A stop that reached a child as it was
    forked (a worker ended a moment after it was started) raised in the child's copy of the
    caller's code, before ``multiprocessing`` guards the child with an exit: the child then
    ran on as a second copy of the caller. Held, the stop waits for the child's own handlers.
    Where there is no signal mask (no fork either) this holds nothing."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def take_held_stops(sigint_handler: Handler, sigterm_handler: Handler) -> None:
    """In a child forked under :func:`stops_held_for_a_fork`: these handlers (or
    ``signal.SIG_DFL``, ``signal.SIG_IGN``) for SIGINT and SIGTERM, then the stops held."""
    signal.signal(signal.SIGINT, sigint_handler)
    signal.signal(signal.SIGTERM, sigterm_handler)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)


EXIT_FAILURE = 1  # a crash, or a Failure
EXIT_USER_ERROR = 2  # bad input
EXIT_OUTPUT_ERROR = 3  # a result could not be written


class ArgumentParser(argparse.ArgumentParser):
    """An ``argparse`` parser whose usage errors are :class:`UserError`.

    Under MPI every rank parses the command line; argparse's own handling would print the usage
    once per rank. As a UserError the message is printed once, by rank 0, and every rank exits
    with status 2. argparse echoes the offending argument whole, so its message is cut to one
    line of bounded length.
    """

    def error(self, message: str) -> NoReturn:
        """Raise argparse's usage error ``message`` as a :class:`UserError`, cut to one line."""
        raise UserError(f"{one_line(message)} (see {self.prog} --help)")
