"""A strict stand-in for CuPy's NCCL (``cupy.cuda.nccl``) over mpi4py, for the CuPy stand-in of
:mod:`tests.gpu_standin`: the multi-rank ``--device gpu`` path with ``--collectives nccl`` runs
on a machine without a GPU, and fails where NCCL would.

What it models:

- ``get_unique_id()`` gives 128 bytes, as CuPy 14's does; they carry the world rank of the
  process that made it and a serial number of that process, as NCCL's carries the root's
  address. ``NcclCommunicator(ndev, unique_id, rank)`` takes those bytes (a tuple of ints, as
  older CuPy gave, is refused, as CuPy 14 refuses it) and is collective over the ``ndev``
  processes given the same id, and only over them: each tells the root its rank, node and
  device (on a private duplicate of ``COMM_WORLD``), the root sends back every member's world
  rank, and the members make their MPI communicator with ``Create_group``, which no other
  process takes part in. Its ranks are the NCCL ranks.
- Two members on one device of one node are refused on every member (ncclInvalidUsage), as
  NCCL before 2.30.3 refuses them, unless :data:`VERSION` is at least 23003 (2.30.3) and
  ``NCCL_MULTI_RANK_GPU_ENABLE=1``. :func:`install` gives every rank of a node its own device
  (``getDeviceCount`` answers the node's number of ranks); a test of ranks that share one
  sets ``counters.devices`` back to 1 before it makes its backend.
- Buffers are device pointers (``a.data.ptr``) found with :func:`tests.gpu_standin.buffer_at`:
  a NumPy array, or an address in no live device buffer, is refused, and so is a datatype
  other than the array's own (a ``bfloat16`` array sent as ``NCCL_FLOAT16``, say) or a count
  that runs past the buffer's end.
- Every collective checks that all ranks of the communicator called the same collective with
  the same count and datatype (an extra ``MPI.Allreduce``; NCCL would hang or read garbage).
- ``send`` and ``recv`` are refused outside ``groupStart()``/``groupEnd()`` (a lone blocking
  pair deadlocks as soon as both peers send first); inside, every operation is queued and run
  at ``groupEnd()``: the messages posted together, each with a header that the receiver checks
  against its own count and datatype.
- A communicator is tied to the device current when it was made, and to its process: used
  with another device current, after ``destroy()`` or ``abort()``, or with a rank other than
  its own, it refuses. Every ``destroy()`` and ``abort()`` is recorded in :data:`ended`, so a
  test can check which way a communicator was released, and on which ranks.
- Sums of ``float16`` and ``bfloat16`` go round a ring as NCCL's do: each hop adds in float32
  and rounds back, P − 1 roundings in all.

A stream argument is a pointer (an int), as CuPy passes it, of a stream the CuPy stand-in made.
On the current stream a collective runs at once, as the stand-in's kernels do. On a stream of
its own (a collective beside the compute stream's kernels) it is checked and run against the
other ranks at once, from its send buffer as it is when queued, but its result is written to
the receive buffer only when that stream's queue runs (:class:`tests.gpu_standin.Stream`):
once something orders it, as a GPU would have it done by then. Code that reads the result
without an event that orders it reads the buffer as it was, and its numbers are wrong. Two
checks there are the stand-in's own, not NCCL's (a GPU would race or serialise, silently):
the stream must be non-blocking (a blocking stream is ordered with the null stream, so nothing
runs beside it), and since its last collective it must have waited for an event recorded on
the current stream (else the collective could read its send buffer before the kernels that
write it have run). Point-to-point messages run on the current stream only.
"""

from __future__ import annotations

import itertools
import os
import struct
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
from mpi4py import MPI

try:
    from ml_dtypes import bfloat16
except ImportError:  # pragma: no cover - a dependency of hpctrain
    bfloat16 = None

available = True

# ncclDataType_t and ncclRedOp_t, with NCCL's values
NCCL_INT8, NCCL_UINT8, NCCL_INT32, NCCL_UINT32 = 0, 1, 2, 3
NCCL_INT64, NCCL_UINT64, NCCL_FLOAT16, NCCL_FLOAT32 = 4, 5, 6, 7
NCCL_FLOAT64, NCCL_BFLOAT16 = 8, 9
NCCL_CHAR, NCCL_INT, NCCL_HALF, NCCL_FLOAT, NCCL_DOUBLE = 0, 2, 6, 7, 8
NCCL_SUM, NCCL_PROD, NCCL_MAX, NCCL_MIN, NCCL_AVG = 0, 1, 2, 3, 4

_DTYPES = {NCCL_INT8: np.int8, NCCL_UINT8: np.uint8, NCCL_INT32: np.int32,
           NCCL_UINT32: np.uint32, NCCL_INT64: np.int64, NCCL_UINT64: np.uint64,
           NCCL_FLOAT16: np.float16, NCCL_FLOAT32: np.float32, NCCL_FLOAT64: np.float64}
if bfloat16 is not None:
    _DTYPES[NCCL_BFLOAT16] = bfloat16

_MAGIC = 0x4E43  # marks an id this module made
_ID_BYTES = 128
_ID_HEAD = struct.Struct("<HiI")  # the magic, the root's world rank, its serial number
_BOOT_TAGS = 16000  # serial numbers wrap: join requests on 2·s, replies on 2·s + 1
_HEADER, _DATA = 1, 2  # tags of a message's header and data on a communicator


class NcclError(RuntimeError):
    """What NCCL (through CuPy) would report, or where it would hang or corrupt memory."""


_state: dict[str, Any] = {"boot": None, "depth": 0, "queued": [], "cupy": None,
                          "node_size": None}
_serial = itertools.count()

VERSION = 22105
"""What ``get_version()`` answers (2.21.5): set it (with ``monkeypatch``) to model another NCCL."""

SHARES_DEVICES = 23003  # the first NCCL that lets ranks share a GPU, when asked to

ended: list[tuple[str, int, int]] = []
"""Each ``destroy()`` and ``abort()`` since :func:`install`: (which, NCCL rank, size)."""


def install(monkeypatch: Any, cupy_standin: Any) -> Any:
    """Make this module the stand-in CuPy's ``cuda.nccl``, for one test. Collective over
    ``COMM_WORLD`` the first time, which every rank reaches at the same test."""
    if _state["boot"] is None:
        _state["boot"] = MPI.COMM_WORLD.Dup()
        node = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED)
        _state["node_size"] = node.Get_size()
        node.Free()
    _state["cupy"] = cupy_standin
    _state["depth"], _state["queued"] = 0, []
    ended.clear()
    # a device per rank, as a node of GPUs runs: a test of ranks sharing one says so
    cupy_standin.counters.devices = _state["node_size"]
    module = sys.modules[__name__]
    monkeypatch.setattr(cupy_standin.cuda, "nccl", module, raising=False)
    return module


def _cupy() -> Any:
    if _state["cupy"] is None:
        raise NcclError("the NCCL stand-in is not installed (tests.nccl_standin.install)")
    return _state["cupy"]


def get_version() -> int:
    return VERSION


def get_build_version() -> int:
    return VERSION


def get_unique_id() -> bytes:
    """128 bytes, as CuPy 14 gives: this process's world rank and a serial number of its own."""
    serial = next(_serial) % _BOOT_TAGS
    head = _ID_HEAD.pack(_MAGIC, MPI.COMM_WORLD.Get_rank(), serial)
    return head + bytes(_ID_BYTES - len(head))


def groupStart() -> None:  # noqa: N802 - CuPy's name
    _state["depth"] += 1


def groupEnd() -> None:  # noqa: N802 - CuPy's name
    if _state["depth"] == 0:
        raise NcclError("groupEnd() without groupStart()")
    _state["depth"] -= 1
    if _state["depth"] == 0:
        queued, _state["queued"] = _state["queued"], []
        requests, checks = [], []
        for post in queued:  # in the order they were called
            found = post()
            if found is not None:
                requests += found[0]
                checks += found[1]
        MPI.Request.Waitall(requests)
        for check in checks:
            check()


def _run(post: Callable[[], Any]) -> None:
    """Run an operation now, or at ``groupEnd()`` inside a group."""
    if _state["depth"]:
        _state["queued"].append(post)
        return
    found = post()
    if found is not None:
        MPI.Request.Waitall(found[0])
        for check in found[1]:
            check()


def _stream_at(what: str, stream: Any) -> Any:
    """The CuPy stand-in's stream whose pointer ``stream`` is."""
    if isinstance(stream, bool) or not isinstance(stream, int):
        raise NcclError(f"{what}: a stream is given by its pointer (an int), not "
                        f"{type(stream).__name__}")
    try:
        return _cupy().stream_at(stream)
    except _cupy().cuda.runtime.CUDARuntimeError as err:
        raise NcclError(f"{what}: {err}") from None


def _device_array(ptr: Any, count: int, datatype: int, what: str) -> np.ndarray:
    """The memory of ``count`` entries of ``datatype`` at device address ``ptr``, as a NumPy
    view (the stand-in device's memory is host memory)."""
    if isinstance(ptr, bool) or not isinstance(ptr, int):
        raise NcclError(f"{what}: NCCL takes a device pointer (a.data.ptr), not "
                        f"{type(ptr).__name__}")
    if datatype not in _DTYPES:
        raise NcclError(f"{what}: unknown NCCL datatype {datatype}")
    if count < 0:
        raise NcclError(f"{what}: negative count {count}")
    dtype = np.dtype(_DTYPES[datatype])
    cupy = _cupy()
    try:
        raw = cupy.buffer_at(ptr, count * dtype.itemsize)
    except ValueError as err:
        raise NcclError(f"{what}: {err} (host memory, or a freed device buffer)") from None
    owner = _owner_dtype(cupy, ptr)
    if owner is not None and owner != dtype and count:
        raise NcclError(f"{what}: a buffer of {owner} passed as NCCL datatype {datatype} "
                        f"({dtype})")
    return raw._host.view(dtype)


def _owner_dtype(cupy: Any, ptr: int) -> np.dtype | None:
    """The dtype of the device buffer holding ``ptr``."""
    for ref in list(getattr(cupy, "_BUFFERS", {}).values()):
        owner = ref()
        if owner is not None and owner.ctypes.data <= ptr < owner.ctypes.data + max(
                owner.nbytes, 1):
            return owner.dtype
    return None


def _summed(values: np.ndarray, comm: MPI.Comm, scatter: bool) -> np.ndarray:
    """Σ over ``comm`` of ``values`` (each rank's block of it, ``scatter``). 16-bit floats go
    round a ring: each hop adds its own values in float32 and rounds the partial sum back,
    P − 1 roundings, as NCCL's ring makes them (the order here is rank order)."""
    size = comm.Get_size()
    if not (values.dtype.itemsize == 2 and values.dtype.kind in "fV"):
        if scatter:
            out = np.empty(values.size // size, values.dtype)
            comm.Reduce_scatter_block(values, out, MPI.SUM)
        else:
            out = np.empty_like(values)
            comm.Allreduce(values, out, MPI.SUM)
        return out
    every = np.empty((size, values.size), values.dtype)
    comm.Allgather(values.view(np.uint16), every.view(np.uint16))
    total = every[0]
    for k in range(1, size):
        total = (total.astype(np.float32) + every[k].astype(np.float32)).astype(values.dtype)
    if scatter:
        block = values.size // size
        rank = comm.Get_rank()
        return total[rank * block:(rank + 1) * block].copy()
    return total


class NcclCommunicator:
    """One rank's NCCL communicator (CuPy's ``cupy.cuda.nccl.NcclCommunicator``)."""

    def __init__(self, ndev: int, commId: Any, rank: int) -> None:  # noqa: N803 - CuPy's
        boot = _state["boot"]
        if boot is None:
            raise NcclError("the NCCL stand-in is not installed (tests.nccl_standin.install)")
        if not isinstance(commId, bytes):
            raise NcclError(f"NcclCommunicator: the id is the bytes get_unique_id() gives, not "
                            f"{type(commId).__name__} (CuPy 14 refuses a tuple)")
        if len(commId) != _ID_BYTES or _ID_HEAD.unpack_from(commId)[0] != _MAGIC:
            raise NcclError("NcclCommunicator: not an id from get_unique_id()")
        if not 0 <= rank < ndev:
            raise NcclError(f"NcclCommunicator: rank {rank} outside 0..{ndev - 1}")
        _, root, serial = _ID_HEAD.unpack_from(commId)
        me = MPI.COMM_WORLD.Get_rank()
        # where this member runs: NCCL before 2.30.3 refuses two members on one device
        where = (MPI.Get_processor_name(), _cupy().counters.current_device)
        sharing = VERSION >= SHARES_DEVICES and os.environ.get("NCCL_MULTI_RANK_GPU_ENABLE") == "1"
        if rank == 0:
            if me != root:
                raise NcclError(f"NcclCommunicator: rank 0 is world rank {me}, but the id was "
                                f"made by world rank {root}: rank 0 must make the id")
            members: list[int | None] = [None] * ndev
            members[0] = me
            places = {where: 0}
            problem = None
            for _ in range(ndev - 1):
                their_rank, world, their_ndev, there = boot.recv(source=MPI.ANY_SOURCE,
                                                                 tag=2 * serial)
                if their_ndev != ndev:
                    problem = f"ranks disagree on the size: {their_ndev} and {ndev}"
                elif members[their_rank] is not None:
                    problem = f"rank {their_rank} joined twice"
                else:
                    members[their_rank] = world
                if there in places and not sharing and problem is None:
                    problem = (f"ncclInvalidUsage: ranks {places[there]} and {their_rank} "
                               f"share device {there[1]} of {there[0]} (NCCL {VERSION})")
                places.setdefault(there, their_rank)
            reply = problem or members
            for world in members[1:]:
                if world is not None:
                    boot.send(reply, dest=world, tag=2 * serial + 1)
        else:
            boot.send((rank, me, ndev, where), dest=root, tag=2 * serial)
            reply = boot.recv(source=root, tag=2 * serial + 1)
        if isinstance(reply, str):
            raise NcclError(f"NcclCommunicator: {reply}")
        group = boot.Get_group().Incl(reply)
        self._mpi = boot.Create_group(group, tag=serial)
        group.Free()
        if self._mpi.Get_rank() != rank:
            raise NcclError("NcclCommunicator: MPI ranks do not follow NCCL ranks")
        self._rank, self._size, self._process = rank, ndev, me
        self._device = _cupy().counters.current_device

    # what CuPy's communicator answers
    def rank_id(self) -> int:
        self._check("rank_id")
        return self._rank

    def size(self) -> int:
        self._check("size")
        return self._size

    def device_id(self) -> int:
        self._check("device_id")
        return self._device

    def destroy(self) -> None:
        """NCCL's destroy is collective: every rank of the communicator must call it (the
        stand-in records the call and frees its own communicator; it cannot see the others)."""
        self._end("destroy")

    def abort(self) -> None:
        """NCCL's abort is local: one rank may call it while the others are in a collective."""
        self._end("abort")

    def _end(self, which: str) -> None:
        ended.append((which, self._rank, self._size))
        if self._mpi is not None:
            self._mpi.Free()
            self._mpi = None

    def _check(self, what: str) -> MPI.Comm:
        if self._mpi is None:
            raise NcclError(f"{what} on a destroyed communicator")
        if MPI.COMM_WORLD.Get_rank() != self._process:
            raise NcclError(f"{what}: communicator of world rank {self._process} used on "
                            f"world rank {MPI.COMM_WORLD.Get_rank()}")
        current = _cupy().counters.current_device
        if current != self._device:
            raise NcclError(f"{what}: communicator of device {self._device} used with device "
                            f"{current} current")
        return self._mpi

    def _collective(self, what: str, stream: Any, *fields: int) -> MPI.Comm:
        """Check that every rank calls ``what`` with the same ``fields`` (count, datatype, …)."""
        comm = self._check(what)
        _stream_at(what, stream)
        code = sum(ord(c) << (8 * (i % 6)) for i, c in enumerate(what)) % (1 << 40)
        mine = np.array([code, *fields], dtype=np.int64)
        both = np.concatenate([mine, -mine])
        comm.Allreduce(MPI.IN_PLACE, both, MPI.MAX)
        if not np.array_equal(both[:len(mine)], -both[len(mine):]):
            raise NcclError(f"{what}: ranks disagree on the call or its (count, datatype, ...) "
                            f"{tuple(fields)}")
        return comm

    def _deliver(self, what: str, stream: Any, write: Callable[[], None]) -> None:
        """Write a collective's result: now on the current stream, else when ``stream``'s queue
        runs (see the module's notes), after the stand-in's checks of a side stream."""
        queue = _stream_at(what, stream)
        if queue.ptr != _cupy().cuda.get_current_stream().ptr:
            if not queue.non_blocking:
                raise NcclError(f"{what} on a blocking stream beside the current one: it is "
                                f"ordered with the null stream, so nothing overlaps it "
                                f"(make it with non_blocking=True; the stand-in's own check)")
            if queue.waited <= getattr(queue, "_nccl_tick", 0):
                raise NcclError(f"{what} on a side stream that has not waited for the current "
                                f"stream since its last collective: it may read its buffer "
                                f"before the kernels writing it have run (record an event on "
                                f"the current stream and wait_event it; the stand-in's own "
                                f"check)")
            queue._nccl_tick = _cupy().next_tick()
        queue.defer(write)

    def _sum_only(self, what: str, op: int) -> None:
        if op != NCCL_SUM:
            raise NcclError(f"{what}: the stand-in sums only (op {op})")

    # collectives
    def allReduce(self, sendbuf: int, recvbuf: int, count: int, datatype: int,  # noqa: N802
                  op: int, stream: Any) -> None:
        def post() -> None:
            comm = self._collective("allReduce", stream, count, datatype, op)
            self._sum_only("allReduce", op)
            send = _device_array(sendbuf, count, datatype, "allReduce send")
            recv = _device_array(recvbuf, count, datatype, "allReduce recv")
            total = _summed(send.copy(), comm, scatter=False)
            self._deliver("allReduce", stream, lambda: recv.__setitem__(..., total))

        _run(post)

    def reduceScatter(self, sendbuf: int, recvbuf: int, recvcount: int,  # noqa: N802
                      datatype: int, op: int, stream: Any) -> None:
        def post() -> None:
            comm = self._collective("reduceScatter", stream, recvcount, datatype, op)
            self._sum_only("reduceScatter", op)
            send = _device_array(sendbuf, recvcount * self._size, datatype, "reduceScatter send")
            recv = _device_array(recvbuf, recvcount, datatype, "reduceScatter recv")
            total = _summed(send.copy(), comm, scatter=True)
            self._deliver("reduceScatter", stream, lambda: recv.__setitem__(..., total))

        _run(post)

    def allGather(self, sendbuf: int, recvbuf: int, count: int, datatype: int,  # noqa: N802
                  stream: Any) -> None:
        def post() -> None:
            comm = self._collective("allGather", stream, count, datatype)
            send = _device_array(sendbuf, count, datatype, "allGather send")
            recv = _device_array(recvbuf, count * self._size, datatype, "allGather recv")
            every = np.empty(recv.nbytes, np.uint8)
            comm.Allgather(send.copy().view(np.uint8), every)
            self._deliver("allGather", stream, lambda: recv.view(np.uint8).__setitem__(..., every))

        _run(post)

    def broadcast(self, sendbuf: int, recvbuf: int, count: int, datatype: int,
                  root: int, stream: Any) -> None:
        def post() -> None:
            comm = self._collective("broadcast", stream, count, datatype, root)
            recv = _device_array(recvbuf, count, datatype, "broadcast recv")
            sent = np.empty(recv.nbytes, np.uint8)
            if self._rank == root:
                sent[...] = _device_array(sendbuf, count, datatype, "broadcast send").view(
                    np.uint8)
            comm.Bcast(sent, root=root)
            self._deliver("broadcast", stream, lambda: recv.view(np.uint8).__setitem__(..., sent))

        _run(post)

    def bcast(self, buff: int, count: int, datatype: int, root: int, stream: Any) -> None:
        self.broadcast(buff, buff, count, datatype, root, stream)

    # point to point: inside a group only
    def _peer(self, what: str, peer: int, stream: Any) -> MPI.Comm:
        comm = self._check(what)
        if _state["depth"] == 0:
            raise NcclError(f"{what} outside groupStart()/groupEnd(): a blocking send meets a "
                            f"blocking send and both wait (put the pair in one group)")
        if not 0 <= peer < self._size:
            raise NcclError(f"{what}: peer {peer} outside 0..{self._size - 1}")
        if _stream_at(what, stream).ptr != _cupy().cuda.get_current_stream().ptr:
            raise NcclError(f"{what}: the stand-in runs point-to-point messages on the current "
                            f"stream only")
        return comm

    def send(self, sendbuf: int, count: int, datatype: int, peer: int, stream: Any) -> None:
        comm = self._peer("send", peer, stream)
        data = _device_array(sendbuf, count, datatype, "send")

        def post() -> tuple[list, list]:
            header = np.array([count, datatype], dtype=np.int64)
            # the data as it is now: NCCL reads it in stream order, before later kernels
            payload = data.copy().view(np.uint8)
            return ([comm.Isend(header, dest=peer, tag=_HEADER),
                     comm.Isend(payload, dest=peer, tag=_DATA)], [lambda: (header, payload)])

        _run(post)

    def recv(self, recvbuf: int, count: int, datatype: int, peer: int, stream: Any) -> None:
        comm = self._peer("recv", peer, stream)
        data = _device_array(recvbuf, count, datatype, "recv")

        def post() -> tuple[list, list]:
            header = np.empty(2, dtype=np.int64)
            payload = np.empty(data.nbytes, dtype=np.uint8)
            requests = [comm.Irecv(header, source=peer, tag=_HEADER),
                        comm.Irecv(payload, source=peer, tag=_DATA)]

            def check() -> None:
                if tuple(header) != (count, datatype):
                    raise NcclError(f"recv of {count} of datatype {datatype} from rank {peer} "
                                    f"met a send of {header[0]} of datatype {header[1]}")
                data.view(np.uint8)[...] = payload

            return requests, [check]

        _run(post)
