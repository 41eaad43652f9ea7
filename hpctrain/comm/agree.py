"""Agreement: one outcome on every rank, so that no rank fails alone and leaves others waiting.

What is read from files — the net, a plan, a machine profile, the dataset, a checkpoint — goes
through :func:`agreed`: a file that only some ranks can see (node-local disk) then fails the whole
job at once with one message, where ranks that failed alone would leave the others waiting in a
collective. What rank 0 writes — the run log, a plan file — goes through :func:`on_root`: a write
that fails there raises the same :class:`~hpctrain.errors.OutputError` on every rank. The messages
are small Python objects (a result, an error text), so the pickling lower-case calls fit here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from hpctrain.errors import OutputError, UserError

#: The type of what ``work`` returns.
T = TypeVar("T")


def agreed(comm: Any, work: Callable[[], T], everywhere: bool = False) -> T:
    """``work()`` run by rank 0 and its result broadcast (or, ``everywhere``, run by every
    rank); a :class:`~hpctrain.errors.UserError` or :class:`~hpctrain.errors.OutputError` on any
    rank is raised on every rank, rank 0's or the first."""
    result = error = None
    if everywhere or comm.Get_rank() == 0:
        try:
            result = work()
        except (UserError, OutputError) as err:
            error = _message(err)
    if everywhere:  # the lowest failed rank tells the others: O(log P), not P messages
        from mpi4py import MPI

        size = comm.Get_size()
        first = comm.allreduce(comm.Get_rank() if error is not None else size, op=MPI.MIN)
        if first < size:
            error = comm.bcast(error, root=first)
    else:
        result, error = comm.bcast((result, error), root=0)
    _raise(error)
    return result


def on_root(comm: Any, work: Callable[[], T]) -> T | None:
    """``work()`` run by rank 0 alone, its result kept there (None elsewhere); a
    :class:`~hpctrain.errors.UserError` or :class:`~hpctrain.errors.OutputError` it raises is raised
    on every rank. Collective."""
    result = error = None
    if comm.Get_rank() == 0:
        try:
            result = work()
        except (UserError, OutputError) as err:
            error = _message(err)
    _raise(comm.bcast(error, root=0))
    return result


def _message(err: Exception) -> tuple[bool, str]:
    """(whether it is an OutputError, its text): what travels to the other ranks."""
    return isinstance(err, OutputError), str(err)


def _raise(error: tuple[bool, str] | None) -> None:
    if error is not None:
        output, text = error
        raise OutputError(text) if output else UserError(text)
