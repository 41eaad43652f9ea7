"""How one group of ranks moves arrays: MPI (through host memory, or reading device memory where
the MPI library is CUDA-aware) or NCCL on the device, behind one interface.

A :class:`Group` wraps one MPI communicator; the primitives of :mod:`hpctrain.comm` call its
methods and never ask which transport runs them:

- :meth:`Group.allreduce` and :meth:`Group.start_allreduce` (a sum that is waited for later);
- :meth:`Group.allgather` and :meth:`Group.reduce_scatter` of blocks along the first axis,
  possibly uneven;
- :meth:`Group.start_exchange`: point-to-point messages between stretches of two flat buffers.

MPI has no 16-bit float types. Moves of ``float16`` and ``bfloat16`` arrays send their bytes
(a ``uint16`` view, ``MPI.UINT16_T``); their sums use a commutative user-defined operation that
adds two values in float32 and rounds the sum back, as NCCL sums them (:func:`sum_op`, made once
per dtype and kept for the life of the process).

Under NCCL (``Backend.collectives == 'nccl'``) every call is queued on the current CUDA stream,
the one the kernels run on: no host copy and no wait for the stream; what reads the result is
queued after it. A sum started to be waited for later (:meth:`Group.start_allreduce`: a bucket
of gradients in flight) goes on a stream of the group's own instead, so that it runs beside the
rest of the backward, ordered by events: it starts once the compute stream has reached the
point where it was started (the gradients are made), and ``wait()`` makes the compute stream
wait for it, with no wait on the host. Each NCCL communicator runs its operations in the order
they were queued, and every rank queues the same ones in the same order (the same plan), so the
sums beside the compute stream cannot meet the compute stream's collectives in another order
on another rank. The NCCL communicator of an MPI communicator is made once, the first time a
group is asked for it (:func:`group_of`: the unique id made on the group's rank 0, bytes, and
broadcast over the MPI communicator), and released by :func:`release` before that communicator
is freed. Every rank runs the same plan, so the ranks of a group reach that first use in the
same order relative to every other collective: creating the communicator there is as safe from
deadlock as the MPI collective that would have run in its place.

Releasing one is collective too: ``ncclCommDestroy`` waits for every rank of the communicator,
so a rank that destroys it while another is still inside a collective (one rank raised, the
others did not) hangs. On the normal path every rank destroys; on an exception path
``release(comm, abort=True)`` aborts instead (``ncclCommAbort``, which returns at once on its
own rank). Whatever is left when Python exits is aborted by :func:`release_all`, registered
with ``atexit`` when the first communicator is made: it runs before mpi4py finalises MPI, and
the ranks need not be at the same place by then.
"""

from __future__ import annotations

import atexit
import importlib
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
from mpi4py import MPI

from hpctrain.device.backend import Backend
from hpctrain.device.precision import bfloat16

# ----------------------------------------------------------------------------------------------
# 16-bit floats over MPI


def sixteen_bit(dtype: Any) -> bool:
    """Whether ``dtype`` is ``float16`` or ``bfloat16``, which MPI has no type for."""
    dtype = np.dtype(dtype)
    return dtype == np.float16 or (bfloat16 is not None and dtype == np.dtype(bfloat16))


_SUM_OPS: dict[np.dtype, MPI.Op] = {}  # made on first use, one per dtype, never freed


def _adder(dtype: np.dtype) -> Any:
    def add(incoming: Any, inout: Any, datatype: MPI.Datatype) -> None:
        a = np.frombuffer(incoming, dtype)
        b = np.frombuffer(inout, dtype)
        b[...] = (a.astype(np.float32) + b.astype(np.float32)).astype(dtype)

    return add


def sum_op(dtype: Any) -> MPI.Op:
    """``MPI.SUM``, or for a 16-bit float dtype the commutative operation that adds two values
    in float32 and rounds the sum to ``dtype`` (each partial sum rounded, as NCCL's are). It
    works on buffers described as ``MPI.UINT16_T`` (see :func:`mpi_buffer`)."""
    dtype = np.dtype(dtype)
    if not sixteen_bit(dtype):
        return MPI.SUM
    op = _SUM_OPS.get(dtype)
    if op is None:
        op = _SUM_OPS[dtype] = MPI.Op.Create(_adder(dtype), commute=True)
    return op


def mpi_buffer(a: Any, counts: Any = None) -> Any:
    """The buffer spec of ``a`` for an mpi4py capitalised call: ``a`` itself, or for a 16-bit
    float its bytes as ``uint16`` with ``MPI.UINT16_T`` (with ``counts``, a vector spec)."""
    if not sixteen_bit(a.dtype):
        return a if counts is None else [a, counts]
    raw = a.view(np.uint16)
    return [raw, MPI.UINT16_T] if counts is None else [raw, counts, MPI.UINT16_T]


# ----------------------------------------------------------------------------------------------
# the interface


class Pending(Protocol):
    """A sum or an exchange under way. ``request`` is its MPI request, or None for one the
    device orders (NCCL's): waiting for it then costs the host nothing."""

    request: MPI.Request | None

    def test(self) -> bool:
        """Whether it has arrived (lets MPI move it on)."""

    def wait(self) -> Any:
        """Wait, and give the result on the device."""


class Group(Protocol):
    """One MPI communicator's collectives and messages, on the backend's arrays."""

    comm: MPI.Comm
    size: int
    rank: int

    def allreduce(self, a: Any) -> Any:
        """Σ over the group of the contiguous array ``a`` (summed in place where it can be)."""

    def start_allreduce(self, a: Any) -> Pending:
        """The same sum, started; ``wait()`` gives it."""

    def allgather(self, block: Any, lengths: Sequence[int]) -> Any:
        """The blocks of every rank along the first axis, in rank order: member k holds
        ``lengths[k]`` rows of the contiguous array ``block``."""

    def reduce_scatter(self, a: Any, lengths: Sequence[int]) -> Any:
        """Σ over the group of ``a``, of which member k keeps rows of block k (``lengths[k]``
        rows along the first axis, blocks in rank order): the adjoint of :meth:`allgather`."""

    def start_exchange(self, send: Any, sends: Sequence[tuple[int, int, int]], recv_size: int,
                       receives: Sequence[tuple[int, int, int]], tag: int) -> Pending:
        """Send stretch [lo, hi) of the flat, contiguous ``send`` to each (peer, lo, hi) of
        ``sends``, and receive into stretch [lo, hi) of a new flat buffer of ``recv_size``
        entries of ``send``'s dtype from each (peer, lo, hi) of ``receives``; ``wait()``
        gives that buffer on the device. At most one message each way per pair of ranks."""


def wait_any(pending: Sequence[Pending]) -> int:
    """The index of one of ``pending`` that has arrived, waiting for one if none has."""
    for index, p in enumerate(pending):
        if p.test():
            return index
    for index, p in enumerate(pending):
        if p.request is None:  # ordered on the device: its wait() does not block the host
            return index
    requests = [p.request for p in pending]  # all MPI sums still in flight
    return MPI.Request.Waitany(requests)


# ----------------------------------------------------------------------------------------------
# MPI


class _MpiPending:
    def __init__(self, request: MPI.Request, result: Any, finish: Any, keep: Any = None) -> None:
        self.request, self._result, self._finish, self._keep = request, result, finish, keep

    def test(self) -> bool:
        return bool(self.request.Test())

    def wait(self) -> Any:
        self.request.Wait()
        return self._finish(self._result)


class _MpiPendingAll:
    def __init__(self, requests: list[MPI.Request], result: Any, finish: Any,
                 keep: Any) -> None:
        self.requests, self._result, self._finish, self._keep = requests, result, finish, keep

    def test(self) -> bool:
        return bool(MPI.Request.Testall(self.requests))

    def wait(self) -> Any:
        MPI.Request.Waitall(self.requests)
        return self._finish(self._result)


class MpiGroup:
    """A group over MPI: device arrays staged through the host (``Backend.to_mpi`` and
    ``from_mpi``) unless the MPI library is CUDA-aware.

    A 16-bit sum is made on the host even with a CUDA-aware MPI: its operation is Python code
    that reads the buffers with NumPy."""

    def __init__(self, backend: Backend, comm: MPI.Comm) -> None:
        self.backend, self.comm = backend, comm
        self.size, self.rank = comm.Get_size(), comm.Get_rank()

    def _on_host(self, dtype: Any) -> bool:
        """Whether a sum of ``dtype`` is staged through the host though MPI is CUDA-aware."""
        be = self.backend
        return be.device == "gpu" and be.cuda_aware and sixteen_bit(dtype)

    def _to_sum(self, a: Any) -> tuple[Any, Any]:
        """A buffer MPI can sum ``a`` in, and how its sum returns to the device."""
        be = self.backend
        if self._on_host(a.dtype):
            return be.xp.asnumpy(a), be.xp.asarray
        return be.to_mpi(a), be.from_mpi

    def allreduce(self, a: Any) -> Any:
        buf, back = self._to_sum(a)
        self.backend.clock.sent(buf.nbytes)
        self.comm.Allreduce(MPI.IN_PLACE, mpi_buffer(buf), sum_op(buf.dtype))
        return back(buf)

    def start_allreduce(self, a: Any) -> Pending:
        buf, back = self._to_sum(a)
        self.backend.clock.sent(buf.nbytes)
        request = self.comm.Iallreduce(MPI.IN_PLACE, mpi_buffer(buf), sum_op(buf.dtype))
        return _MpiPending(request, buf, back)

    def allgather(self, block: Any, lengths: Sequence[int]) -> Any:
        be = self.backend
        inner = int(np.prod(block.shape[1:], dtype=np.int64))
        recv = be.empty_mpi((sum(lengths), *block.shape[1:]), block.dtype)
        be.clock.sent(block.nbytes)
        self.comm.Allgatherv(mpi_buffer(be.to_mpi(block)),
                             mpi_buffer(recv, [n * inner for n in lengths]))
        return be.from_mpi(recv)

    def reduce_scatter(self, a: Any, lengths: Sequence[int]) -> Any:
        be = self.backend
        inner = int(np.prod(a.shape[1:], dtype=np.int64))
        send, back = self._to_sum(a)
        shape = (lengths[self.rank], *a.shape[1:])
        recv = np.empty(shape, a.dtype) if self._on_host(a.dtype) else be.empty_mpi(shape, a.dtype)
        be.clock.sent(send.nbytes)
        self.comm.Reduce_scatter(mpi_buffer(send), mpi_buffer(recv),
                                 [n * inner for n in lengths], sum_op(a.dtype))
        return back(recv)

    def start_exchange(self, send: Any, sends: Sequence[tuple[int, int, int]], recv_size: int,
                       receives: Sequence[tuple[int, int, int]], tag: int) -> Pending:
        be = self.backend
        recv = be.empty_mpi((recv_size,), send.dtype)
        requests = [self.comm.Irecv(mpi_buffer(recv[lo:hi]), source=peer, tag=tag)
                    for peer, lo, hi in receives]
        out = be.to_mpi(send) if sends else send
        if sends:
            be.clock.sent(sum(hi - lo for _, lo, hi in sends) * out.itemsize)
        requests += [self.comm.Isend(mpi_buffer(out[lo:hi]), dest=peer, tag=tag)
                     for peer, lo, hi in sends]
        if not receives:  # nothing to bring back to the device
            return _MpiPendingAll(requests, None, lambda _: be.xp.empty(0, dtype=send.dtype),
                                  keep=out)
        return _MpiPendingAll(requests, recv, be.from_mpi, keep=out)


# ----------------------------------------------------------------------------------------------
# NCCL


def nccl_module(xp: Any) -> Any | None:
    """CuPy's NCCL module (``cupy.cuda.nccl``) where CuPy has one that works, else None."""
    nccl = getattr(getattr(xp, "cuda", None), "nccl", None)
    if nccl is None:
        try:
            nccl = importlib.import_module(f"{xp.__name__}.cuda.nccl")
        except ImportError:
            return None
    return nccl if getattr(nccl, "available", True) else None


class _Done:
    """A sum NCCL has queued on the stream: what reads it is queued after it."""

    request = None

    def __init__(self, result: Any) -> None:
        self._result = result

    def test(self) -> bool:
        return True

    def wait(self) -> Any:
        return self._result


class _Beside:
    """A sum NCCL has queued on a stream beside the compute stream, ``done`` recorded after
    it: :meth:`test` asks the device whether it has run (a query, no wait), :meth:`wait` makes
    the current stream wait for it (no wait on the host), so what reads the sum is queued
    after it."""

    request = None

    def __init__(self, result: Any, done: Any, cuda: Any) -> None:
        self._result, self._done, self._cuda = result, done, cuda

    def test(self) -> bool:
        return bool(self._done.done)

    def wait(self) -> Any:
        self._cuda.get_current_stream().wait_event(self._done)
        return self._result


class NcclGroup:
    """A group over NCCL: every call queued on the current stream, on device memory, but a sum
    started to be waited for later (:meth:`NcclGroup.start_allreduce`), queued on the group's own
    non-blocking stream beside it.

    NCCL has no uneven all-gather or reduce-scatter: blocks are padded to the largest and the
    padding dropped (or filled with zeros) on the device. One collective keeps NCCL's ring
    bandwidth, (P−1)/P of the padded bytes; the padding is at most one row of the gathered axis
    per rank (block splits differ by one), where P broadcasts or P−1 sends per rank would pay
    P latencies.
    """

    def __init__(self, backend: Backend, comm: MPI.Comm) -> None:
        self.backend, self.comm = backend, comm
        self.size, self.rank = comm.Get_size(), comm.Get_rank()
        nccl = self.nccl = nccl_module(backend.xp)
        unique_id = nccl.get_unique_id() if self.rank == 0 else None
        unique_id = comm.bcast(unique_id, root=0)
        self.nccl_comm = nccl.NcclCommunicator(self.size, unique_id, self.rank)
        types = {np.float16: "NCCL_FLOAT16", np.float32: "NCCL_FLOAT32",
                 np.float64: "NCCL_FLOAT64", bfloat16: "NCCL_BFLOAT16"}
        self._types = {np.dtype(t): getattr(nccl, name) for t, name in types.items()
                       if t is not None and hasattr(nccl, name)}
        self._beside: Any = None  # the stream of sums in flight, made on first use

    def _type(self, dtype: Any) -> int:
        try:
            return self._types[np.dtype(dtype)]
        except KeyError:
            raise ValueError(f"NCCL sums no arrays of {np.dtype(dtype)}") from None

    def _stream(self) -> int:
        return self.backend.xp.cuda.get_current_stream().ptr

    def destroy(self) -> None:
        """``ncclCommDestroy``: collective, every rank of the communicator calls it."""
        self.nccl_comm.destroy()

    def abort(self) -> None:
        """``ncclCommAbort``: local, safe while other ranks are still in a collective."""
        self.nccl_comm.abort()

    def allreduce(self, a: Any) -> Any:
        a = self.backend.xp.ascontiguousarray(a)
        self.backend.clock.sent(a.nbytes)
        self.nccl_comm.allReduce(a.data.ptr, a.data.ptr, a.size, self._type(a.dtype),
                                 self.nccl.NCCL_SUM, self._stream())
        return a

    def start_allreduce(self, a: Any) -> Pending:
        """The sum on the group's own stream, once the current stream has made ``a``."""
        cuda = self.backend.xp.cuda
        a = self.backend.xp.ascontiguousarray(a)
        if self._beside is None:  # non-blocking: not ordered with the null stream
            self._beside = cuda.Stream(non_blocking=True)
        made = cuda.Event(disable_timing=True)
        made.record(cuda.get_current_stream())
        self._beside.wait_event(made)
        self.backend.clock.sent(a.nbytes)
        self.nccl_comm.allReduce(a.data.ptr, a.data.ptr, a.size, self._type(a.dtype),
                                 self.nccl.NCCL_SUM, self._beside.ptr)
        done = cuda.Event(disable_timing=True)
        done.record(self._beside)
        return _Beside(a, done, cuda)

    def allgather(self, block: Any, lengths: Sequence[int]) -> Any:
        xp, rest, most = self.backend.xp, block.shape[1:], max(lengths)
        block = xp.ascontiguousarray(block)
        if lengths[self.rank] < most:
            padded = xp.zeros((most, *rest), dtype=block.dtype)
            padded[:lengths[self.rank]] = block
            block = padded
        recv = xp.empty((self.size * most, *rest), dtype=block.dtype)
        self.backend.clock.sent(block.nbytes)
        self.nccl_comm.allGather(block.data.ptr, recv.data.ptr, block.size,
                                 self._type(block.dtype), self._stream())
        if min(lengths) == most:
            return recv
        return xp.concatenate([recv[k * most:k * most + n] for k, n in enumerate(lengths)])

    def reduce_scatter(self, a: Any, lengths: Sequence[int]) -> Any:
        xp, rest, most = self.backend.xp, a.shape[1:], max(lengths)
        a = xp.ascontiguousarray(a)
        if min(lengths) < most:
            padded = xp.zeros((self.size * most, *rest), dtype=a.dtype)
            start = 0
            for k, n in enumerate(lengths):
                padded[k * most:k * most + n] = a[start:start + n]
                start += n
            a = padded
        recv = xp.empty((most, *rest), dtype=a.dtype)
        self.backend.clock.sent(a.nbytes)
        self.nccl_comm.reduceScatter(a.data.ptr, recv.data.ptr, recv.size, self._type(a.dtype),
                                     self.nccl.NCCL_SUM, self._stream())
        return recv if lengths[self.rank] == most else recv[:lengths[self.rank]]

    def start_exchange(self, send: Any, sends: Sequence[tuple[int, int, int]], recv_size: int,
                       receives: Sequence[tuple[int, int, int]], tag: int) -> Pending:
        # one send and one receive at most per pair: NCCL pairs them by order, tags need not
        xp, nccl = self.backend.xp, self.nccl
        recv = xp.empty(recv_size, dtype=send.dtype)
        send = xp.ascontiguousarray(send)
        kind, stream = self._type(send.dtype), self._stream()
        nccl.groupStart()
        try:
            for peer, lo, hi in receives:
                if hi > lo:
                    self.nccl_comm.recv(recv[lo:hi].data.ptr, hi - lo, kind, peer, stream)
            for peer, lo, hi in sends:
                if hi > lo:
                    self.nccl_comm.send(send[lo:hi].data.ptr, hi - lo, kind, peer, stream)
        finally:
            nccl.groupEnd()
        self.backend.clock.sent(sum(hi - lo for _, lo, hi in sends) * send.itemsize)
        return _Done(recv)


# ----------------------------------------------------------------------------------------------
# which group a communicator gets

_NCCL_GROUPS: dict[int, NcclGroup] = {}  # by MPI communicator handle, until released


def group_of(backend: Backend, comm: MPI.Comm) -> Group:
    """The group of ``comm`` on ``backend``'s transport. Its NCCL communicator is made on the
    first call for ``comm`` (collective over ``comm``) and kept until :func:`release`."""
    if getattr(backend, "collectives", "mpi") != "nccl" or comm.Get_size() == 1:
        return MpiGroup(backend, comm)
    group = _NCCL_GROUPS.get(comm.handle)
    if group is None:
        if not _NCCL_GROUPS:  # the first held: what is left at exit is aborted (once)
            atexit.unregister(release_all)
            atexit.register(release_all)
        group = _NCCL_GROUPS[comm.handle] = NcclGroup(backend, comm)
    group.backend = backend  # the communicator outlives a backend: report to this one's clock
    return group


def release(comm: MPI.Comm, abort: bool = False) -> None:
    """Release the NCCL communicator made for ``comm``, if any, before ``comm`` is freed:
    destroy it (collective over ``comm``: every rank calls this), or with ``abort`` (an
    exception path, where some ranks may still be inside a collective) abort it on this rank
    alone."""
    if comm == MPI.COMM_NULL:
        return
    group = _NCCL_GROUPS.pop(comm.handle, None)
    if group is not None and abort:
        group.abort()
    elif group is not None:
        group.destroy()


def release_all() -> None:
    """Abort every NCCL communicator still held (at exit, before MPI finalises): abort, not
    destroy, because the ranks need not all reach exit together (a rank that raised)."""
    while _NCCL_GROUPS:
        _, group = _NCCL_GROUPS.popitem()
        group.abort()
