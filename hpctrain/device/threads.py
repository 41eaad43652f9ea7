"""Threads per rank: each rank's BLAS and OpenMP pools sized to the cores that are its own.

A BLAS library starts one thread per core of the node by default, so P ranks on a node run
P × cores threads on its cores and every kernel slows down several times (and the compute times
the planner measures with it are wrong). hpctrain decides instead, before any heavy work, by the
first rule that applies:

1. ``--threads N``;
2. an explicit count in ``OMP_NUM_THREADS`` (or ``OPENBLAS_NUM_THREADS``, ``MKL_NUM_THREADS``):
   the user's word;
3. the CPU affinity mask, when the launcher bound the rank (fewer CPUs in the mask than the
   machine has): its CPUs, shared among the ranks of the node bound to the same mask;
4. ``SLURM_CPUS_PER_TASK``;
5. the node's CPUs ÷ the ranks on the node (from the shared-memory communicator);

and never fewer than 1. Worked example: 4 ranks on a 2-core machine, nothing set: rule 5 gives
2 // 4 = 0, so 1 thread each; the same launch on a 64-core node with 16 ranks gives 4.

The limit is applied with ``threadpoolctl`` to every BLAS and OpenMP pool loaded in the process.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hpctrain.device.allocator import keep_freed_memory
from hpctrain.device.cpus import affinity

THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


@dataclass(frozen=True)
class NodeShare:
    """What a rank sees of its node: the CPUs it may run on and who else runs there."""

    cpus: int  # CPUs in this rank's affinity mask
    machine_cpus: int  # CPUs of the machine (os.cpu_count)
    ranks_on_node: int
    ranks_on_mask: int  # ranks of the node whose affinity mask equals this rank's

    @property
    def bound(self) -> bool:
        """Whether the launcher (or a cpuset) gave this rank fewer CPUs than the machine has."""
        return self.cpus < self.machine_cpus


@dataclass(frozen=True)
class ThreadChoice:
    """The threads per rank hpctrain set, and why."""

    threads: int
    reason: str  # the rule that decided, in words
    ranks_on_node: int
    blas: str  # the BLAS library and version the threads apply to
    allocator: str  # what keep_freed_memory decided, in words

    def describe(self) -> str:
        plural = "s" if self.threads > 1 else ""
        return (f"{self.threads} thread{plural} per rank ({self.reason}; {self.blas}); "
                f"{self.allocator}")


def _count(text: str | None) -> int | None:
    """A positive thread count from an environment value ('4', or '4,2' for nested OpenMP)."""
    if not text:
        return None
    first = text.split(",")[0].strip()
    return int(first) if first.isdigit() and int(first) > 0 else None


def choose_threads(requested: int | None, environ: Mapping[str, str],
                   share: NodeShare) -> tuple[int, str]:
    """(threads, reason) by the rules of this module's docstring. Pure: no side effects."""
    if requested is not None:  # validated by the option's parser
        return requested, f"--threads {requested}"
    for variable in THREAD_VARIABLES:
        count = _count(environ.get(variable))
        if count is not None:
            return count, f"{variable}={count}"
    if share.bound:
        return (max(1, share.cpus // share.ranks_on_mask),
                f"affinity mask of {share.cpus} CPUs, {share.ranks_on_mask} rank(s) on it")
    count = _count(environ.get("SLURM_CPUS_PER_TASK"))
    if count is not None:
        return count, f"SLURM_CPUS_PER_TASK={count}"
    return (max(1, share.cpus // share.ranks_on_node),
            f"{share.cpus} CPUs / {share.ranks_on_node} rank(s) on the node")


def node_share(comm: Any = None) -> NodeShare:
    """This rank's :class:`NodeShare`; collective over ``comm`` (None: this process alone).

    One ``Split_type(COMM_TYPE_SHARED)`` and an all-gather of the masks among the ranks of the
    node only: the cost grows with the ranks per node, never with P.
    """
    mask = affinity()
    machine = max(os.cpu_count() or len(mask), len(mask))
    if comm is None:
        return NodeShare(len(mask), machine, 1, 1)
    from mpi4py import MPI

    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        masks = node.allgather(mask)
    finally:
        node.Free()
    return NodeShare(len(mask), machine, len(masks), sum(m == mask for m in masks))


def blas_description() -> str:
    """The BLAS threadpoolctl sees, e.g. 'openblas 0.3.29 (pthreads)', or 'no BLAS found'."""
    from threadpoolctl import threadpool_info

    found = [f"{i.get('internal_api')} {i.get('version')} ({i.get('threading_layer')})"
             for i in threadpool_info() if i.get("user_api") == "blas"]
    return ", ".join(sorted(set(found))) or "no BLAS found"


def configure_threads(comm: Any = None, requested: int | None = None,
                      environ: Mapping[str, str] | None = None) -> ThreadChoice:
    """Decide this rank's threads and limit every BLAS/OpenMP pool to them, and keep freed
    memory for reuse (:func:`~hpctrain.device.allocator.keep_freed_memory`) (collective).

    Call before any heavy work: the planner's compute timing and training both run under it.
    """
    import numpy  # noqa: F401  (loads the BLAS, so that threadpoolctl finds and limits it)
    from threadpoolctl import threadpool_limits

    environ = os.environ if environ is None else environ
    share = node_share(comm)
    threads, reason = choose_threads(requested, environ, share)
    threadpool_limits(limits=threads)
    allocator = keep_freed_memory(environ)
    return ThreadChoice(threads, reason, share.ranks_on_node, blas_description(), allocator)
