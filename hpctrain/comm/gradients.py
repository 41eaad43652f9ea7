"""Parameter gradients summed in buckets during the backward: one all-reduce for many layers.

A layer's weight (and bias) gradient is summed over the ranks that hold the same shard: the
batch communicator (Pc ranks), or every rank in domain mode. Nothing downstream in the backward
reads those sums (only the optimizer does), so gradients need not be summed one layer at a
time: they are packed into a *bucket* per communicator, and a bucket is summed by one
all-reduce once it holds ``bucket_bytes`` (the machine profile's ``bucket_bytes``, 25 MiB by
default, as PyTorch's DistributedDataParallel); whatever is left goes at the end of the
backward. At scale an all-reduce of a layer's gradients is mostly latency (2·⌈log₂ P⌉
messages), so a ResNet-50 pays it 4 times instead of 54.

Whether the sums travel in flight is a choice (``in_flight``, ``--overlap``): a full bucket
starts a non-blocking ``Iallreduce`` and the backward goes on; between layers the network calls
:meth:`GradientReducer.progress`, whose ``Test`` on each request in flight is what makes MPICH
move a large message on (without an asynchronous progress thread, a request nobody tests
advances only inside other MPI calls). Overlap pays only where the MPI library moves data while
the ranks compute — a network card that progresses messages on its own, or a spare core for
MPICH's progress thread (``MPICH_ASYNC_PROGRESS=1``). Where the ranks' own cores do the copying
(shared memory, every core computing), the sums cost the same CPU time either way, MPICH's
``Iallreduce`` is slower than its ``Allreduce`` within a node, and a ``Test`` between layers
moves a large message on by one protocol step only. Without ``in_flight`` a full bucket is
summed by one blocking ``Allreduce`` at once. The buckets still open when the backward ends
start together either way, so the step waits for the slowest of their latencies, not their sum.

When a bucket's sum arrives its parameters get their gradient (views of the bucket) and
``on_reduced`` runs for them: the optimizer, which so updates a layer as soon as its sum is
known. Every rank of a communicator adds the same layers in the same order (every rank runs the
same plan), so the buckets, and the order their collectives start in, agree across it, as MPI
requires; buckets of different communicators are summed in the order they were opened, the
same on every rank, so blocking sums on overlapping communicators cannot wait on each other.
The bucket buffers are kept from step to step: the same buckets come every step.

Under NCCL (:mod:`hpctrain.comm.transport`) a blocking sum is queued on the compute stream
behind the backward's kernels: it has arrived, as far as the host is concerned, once queued,
and the update that reads it is queued after it. A sum in flight goes on a stream of its
communicator's own, after an event marks the gradients made, so it runs on the device beside
the rest of the backward; :meth:`GradientReducer.progress` asks the device (an event query, no
wait) whether it has run, and :meth:`GradientReducer.finish` makes the compute stream wait for
the rest, without waiting on the host. So ``--overlap`` means the same under NCCL as over MPI,
and the planner prices it the same way: the profile's ``overlap`` share of each sum hides
behind the backward below it (``calibrate`` measures that share through the same streams). A
bucket holds
gradients of one dtype; over MPI a 16-bit bucket is summed with the float32-accumulating
operation of :func:`~hpctrain.comm.transport.sum_op`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mpi4py import MPI

from hpctrain.comm.collectives import allreduce_sum
from hpctrain.comm.transport import group_of, wait_any
from hpctrain.cost.machine import BUCKET_BYTES
from hpctrain.device.backend import Backend


@dataclass
class Bucket:
    """Gradients of some parameters, packed into one buffer, summed over ``comm``."""

    comm: MPI.Comm
    params: list[Any] = field(default_factory=list)
    arrays: list[Any] = field(default_factory=list)  # each parameter's unreduced gradient
    nbytes: int = 0
    pending: Any = None  # the sum in flight (:class:`~hpctrain.comm.transport.Pending`)
    label: int = 0  # the first layer whose gradients it holds (for a timeline)
    sent_at: float = 0.0


class GradientReducer:
    """Sums parameter gradients over their communicators while the backward goes on.

    Parameters
    ----------
    backend : arrays and how they reach MPI.
    bucket_bytes : bytes a bucket collects before it is summed
        (:data:`~hpctrain.cost.machine.BUCKET_BYTES` by default; 0: every layer's gradients
        alone, as soon as they are made).
    in_flight : non-blocking sums (True), or one blocking all-reduce per bucket.

    Per step: :meth:`add` as each layer's gradients are ready, :meth:`progress` between
    layers, :meth:`finish` at the end of the backward; after it every parameter added holds its
    summed gradient. ``on_reduced`` (set per step by :meth:`start`) runs for the parameters of
    each bucket as soon as its sum has arrived. ``flights``, when a list, gets (label, sent,
    arrived) of each bucket sent in flight, ``perf_counter`` seconds (for a timeline).
    """

    def __init__(self, backend: Backend, bucket_bytes: int = BUCKET_BYTES,
                 in_flight: bool = True) -> None:
        self.backend, self.in_flight = backend, in_flight
        self.bucket_bytes = bucket_bytes
        # by id of the communicator and dtype, in order of first use
        self._open: dict[tuple[int, Any], Bucket] = {}
        self._in_flight: list[Bucket] = []
        self._buffers: list[Any] = []  # the buffer of the k-th bucket packed in a step
        self._next_buffer = 0
        self._on_reduced: Callable[[list[Any]], None] | None = None
        self.flights: list[tuple[int, float, float]] | None = None

    def start(self, on_reduced: Callable[[list[Any]], None] | None = None) -> None:
        """Begin a step's backward; ``on_reduced(params)`` for each bucket as it is summed."""
        if self._open or self._in_flight:
            raise RuntimeError("a step's gradient sums are still open")
        self._next_buffer, self._on_reduced = 0, on_reduced

    def add(self, comm: MPI.Comm | None, params: list[Any], label: int = 0) -> None:
        """The gradients in ``params`` (``Parameter.grad``), to be summed over ``comm``: packed,
        and sent once their bucket is full. With no communicator, or one of one rank, they are
        the sums already."""
        if comm is None or comm.Get_size() == 1:
            self._reduced(params)
            return
        # a bucket holds one dtype (under mixed precision a layer may hold gradients of two)
        for dtype in dict.fromkeys(p.grad.dtype for p in params):
            key = (id(comm), dtype)
            bucket = self._open.get(key)
            if bucket is None:
                bucket = self._open[key] = Bucket(comm, label=label)
            same = [p for p in params if p.grad.dtype == dtype]
            bucket.params += same
            bucket.arrays += [p.grad for p in same]
            bucket.nbytes += sum(p.grad.nbytes for p in same)
            if bucket.nbytes >= self.bucket_bytes:
                self._send(self._open.pop(key))

    def progress(self) -> None:
        """Let the sums in flight advance, and hand over those that have arrived."""
        if self._in_flight:
            done = [b for b in self._in_flight if b.pending.test()]
            for bucket in done:
                self._in_flight.remove(bucket)
                self._unpack(bucket)

    def finish(self) -> None:
        """Send every bucket still open, and wait for all sums, each handed over on arrival.
        The open buckets start together, non-blocking even without ``in_flight``: the step then
        waits for the slowest of their latencies, not their sum (as the cost model prices them,
        :mod:`hpctrain.plan.buckets`)."""
        for bucket in list(self._open.values()):
            self._send(bucket, at_once=True)
        self._open.clear()
        while self._in_flight:
            with self.backend.clock.comm():  # the wait; the update that follows is compute
                index = wait_any([b.pending for b in self._in_flight])
            self._unpack(self._in_flight.pop(index))

    def _send(self, bucket: Bucket, at_once: bool = False) -> None:
        """Sum ``bucket``: blocking, or (``in_flight`` or ``at_once``) started and left in
        flight."""
        blocking = not (self.in_flight or at_once)
        with self.backend.clock.comm():
            # one gradient is summed where it lies (the layer made it for this step alone);
            # several are packed into the bucket's buffer
            flat = (bucket.arrays[0] if len(bucket.arrays) == 1
                    else self._packed(bucket.arrays))
            bucket.arrays = []
            if blocking:  # (its own clock block nests: counted once)
                summed = allreduce_sum(self.backend, bucket.comm, flat)
            else:
                bucket.pending = group_of(self.backend, bucket.comm).start_allreduce(flat)
        if blocking:
            self._spread(bucket.params, summed)
            return
        bucket.sent_at = time.perf_counter()
        self._in_flight.append(bucket)

    def _packed(self, arrays: list[Any]) -> Any:
        """``arrays`` concatenated into the buffer of this step's next packed bucket."""
        total, dtype = sum(a.size for a in arrays), arrays[0].dtype
        if self._next_buffer == len(self._buffers):
            self._buffers.append(None)
        flat = self._buffers[self._next_buffer]
        if flat is None or flat.size != total or flat.dtype != dtype:
            flat = self._buffers[self._next_buffer] = self.backend.xp.empty(total, dtype=dtype)
        self._next_buffer += 1
        self.backend.xp.concatenate([a.ravel() for a in arrays], out=flat)
        return flat

    def _unpack(self, bucket: Bucket) -> None:
        """A bucket sent in flight has arrived."""
        if self.flights is not None:
            self.flights.append((bucket.label, bucket.sent_at, time.perf_counter()))
        self._spread(bucket.params, bucket.pending.wait())
        bucket.pending = None

    def _spread(self, params: list[Any], summed: Any) -> None:
        """Each parameter's gradient, a view of the bucket's sum, handed over."""
        flat, start = summed.reshape(-1), 0
        for p in params:
            size = p.value.size
            p.grad = flat[start:start + size].reshape(p.value.shape)
            start += size
        self._reduced(params)

    def _reduced(self, params: list[Any]) -> None:
        if self._on_reduced is not None:
            self._on_reduced(params)
