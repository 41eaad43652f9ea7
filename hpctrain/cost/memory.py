"""A rank's memory: how the estimate counts bytes, what a rank may use, what it used, and the
check of a plan before it allocates.

The estimate is the cost model's, per layer (:mod:`hpctrain.plan.pricing`, from what each kind
says it keeps and allocates, :meth:`hpctrain.model.kinds.base.Kind.memory`, given a
:class:`Footprint`); a plan's peak is :attr:`hpctrain.plan.planner.PlannedNetwork.memory`: what
every layer keeps plus the largest of their transients. The planner's ``--mem-per-rank`` cap
and this check use the same numbers. The limit is ``--mem-per-rank`` when given, else the
node's available memory shared among the ranks on the node. Ranks on different nodes may see
different limits, so the verdict is agreed (the smallest headroom over all ranks): no rank goes
on alone.
"""

from __future__ import annotations

import os
import resource
import sys
from dataclasses import dataclass
from typing import Any

from hpctrain.cost.work import LocalWork
from hpctrain.device.precision import PRECISIONS, Precision
from hpctrain.errors import UserError
from hpctrain.io.units import format_bytes

BOOL_BYTES = 1  # a mask entry
# Bytes of one entry of batch norm's statistics messages: they are summed and sent in the
# master dtype, float32 under every precision but fp64 (whose 8 bytes are its storage size)
STATISTICS_BYTES = 4
# Bytes per entry the counter RNG holds while it draws a block (uint64 indices and mixing
# temporaries, float64 before the cast), the block itself included: measured with tracemalloc on
# SyntheticData.images and dropout_mask (36.5 and 32.0).
RANDOM_BYTES = 32


@dataclass(frozen=True)
class Footprint:
    """What a layer's memory estimate knows, on the busiest rank (bytes unless said).

    ``x``/``y``: its (first) input and output blocks; ``loose_input``: ``{"input": x}`` when the
    input array is not kept anyway (it is alive in the caller while the layer runs), else empty;
    ``forward_only``: the step is a forward pass alone (:meth:`phases`).
    A weight gradient is written into an array kept across steps (resident, counted with the
    parameters), so a backward allocates none.
    """

    x: float
    y: float
    work: LocalWork | None
    itemsize: int
    loose_input: dict[str, float]
    height_split: bool
    forward_only: bool = False  # a forward pass alone (predict): no backward allocates

    def phases(self, forward: dict[str, float], backward: dict[str, float]
               ) -> dict[str, float]:
        """What the layer allocates for a moment: the larger of its forward's and its
        backward's allocations (:func:`larger`), or its forward's alone in a forward pass."""
        return forward if self.forward_only else larger(forward, backward)


OPTIMIZER_STATE = {"sgd": ("momentum",), "lars": ("momentum",),
                   "adamw": ("exp_avg", "exp_avg_sq"), "lamb": ("exp_avg", "exp_avg_sq")}
"""The arrays each ``--optimizer`` keeps per parameter, in the master dtype: SGD's and LARS's
velocity, AdamW's and LAMB's two moments (PyTorch's names)."""


def parameter_bytes(entries: int, precision: Precision, optimizer: str = "sgd",
                    accumulate: int = 1) -> dict[str, float]:
    """What a parameter shard of ``entries`` values costs on every rank, by name: the weights
    the kernels use and their gradient (the gradient all-reduce's flat buffer when there is
    one) in the storage dtype, the state of ``optimizer`` (:data:`OPTIMIZER_STATE`) and its
    scratch buffer in the master dtype, and under a mixed precision (bf16, fp16) the master
    weights. A step of ``accumulate`` > 1 micro-batches (``--accumulate``) also keeps the
    running sum of their gradients, in the master dtype (16-bit gradients are added in float32),
    beside the gradient each micro-batch's backward makes.

    >>> from hpctrain.device.precision import PRECISIONS
    >>> sorted(parameter_bytes(10, PRECISIONS["bf16"]).items())  # doctest: +NORMALIZE_WHITESPACE
    [('gradients', 20), ('master weights', 40), ('momentum', 40), ('optimizer scratch', 40),
     ('parameters', 20)]
    >>> sorted(parameter_bytes(10, PRECISIONS["fp32"], "adamw").items())
    ... # doctest: +NORMALIZE_WHITESPACE
    [('exp_avg', 40), ('exp_avg_sq', 40), ('gradients', 40), ('optimizer scratch', 40),
     ('parameters', 40)]
    >>> parameter_bytes(10, PRECISIONS["bf16"], accumulate=4)["accumulated gradients"]
    40
    """
    stored, master = entries * precision.itemsize, entries * precision.master_itemsize
    parts = {"parameters": stored}
    if precision.mixed:
        parts["master weights"] = master
    parts["gradients"] = stored
    if accumulate > 1:
        parts["accumulated gradients"] = master
    parts |= dict.fromkeys(OPTIMIZER_STATE[optimizer], master)
    parts["optimizer scratch"] = master
    return parts


def precision_of(value: Precision | int) -> Precision:
    """``value`` when it is a :class:`~hpctrain.device.precision.Precision`; a number of bytes
    per stored value is read as the precision that stores values of that size (8: fp64, 4:
    fp32, 2: bf16, whose bytes are fp16's too), as a run log written before precisions
    recorded only its dtype."""
    if isinstance(value, Precision):
        return value
    sizes = {p.itemsize: p for p in (PRECISIONS["bf16"], PRECISIONS["fp32"], PRECISIONS["fp64"])}
    if value not in sizes:
        raise ValueError(f"no precision stores {value}-byte values; give one of "
                         f"{', '.join(PRECISIONS)}")
    return sizes[value]


def larger(*phases: dict[str, float]) -> dict[str, float]:
    """The phase (forward, backward, a move) that allocates the most, by its parts."""
    return max(phases, key=lambda parts: sum(parts.values()))


class MemoryRefused(UserError):
    """The plan needs more memory per rank than the rank may use."""


def available_bytes() -> float:
    """Memory the node can give without swapping: MemAvailable of /proc/meminfo, else the free
    physical pages (``os.sysconf``)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def resident_bytes() -> float:
    """This process's resident set now (/proc/self/statm), else its peak so far."""
    try:
        with open("/proc/self/statm") as statm:
            return float(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return peak_resident_bytes()


def peak_resident_bytes() -> float:
    """This process's largest resident set so far (``ru_maxrss``: KiB on Linux, bytes on
    macOS)."""
    peak = float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    return peak if sys.platform == "darwin" else peak * 1024


def memory_limit(comm: Any, mem_per_rank: float | None, ranks_on_node: int
                 ) -> tuple[float, str]:
    """(bytes, where they come from) a rank may use: ``--mem-per-rank``, else the node's
    available memory ÷ the ranks on the node; the smallest over the ranks of ``comm``
    (collective)."""
    if mem_per_rank is not None:
        return mem_per_rank, "--mem-per-rank"
    from mpi4py import MPI

    share = comm.allreduce(available_bytes() / max(ranks_on_node, 1), op=MPI.MIN)
    return share, (f"the memory available per rank (MemAvailable / {ranks_on_node} rank(s) "
                   f"on the node)")


def check_memory(planned: Any, limit: float, source: str) -> None:
    """Refuse ``planned`` (a :class:`~hpctrain.plan.planner.PlannedNetwork`) when its peak per rank
    exceeds ``limit``, naming the largest consumer and what would fit. The same on every rank:
    the estimate depends on the plan alone and ``limit`` is agreed (:func:`memory_limit`)."""
    need = planned.memory
    if need <= limit:
        return
    layer, what, size = planned.biggest()
    raise MemoryRefused(
        f"the plan needs {format_bytes(need)} per rank but {source} is {format_bytes(limit)}; "
        f"{layer} {what} alone takes {format_bytes(size)}: use a smaller --batch or "
        f"--image-size, more processes, or --grid auto with --mem-per-rank")


def baseline_bytes() -> float:
    """The resident set of the interpreter with NumPy, mpi4py and h5py loaded, before the
    network is built: what a run's peak is measured from."""
    import mpi4py  # noqa: F401
    import numpy  # noqa: F401

    try:
        import h5py  # noqa: F401
    except ImportError:
        pass
    return resident_bytes()


def measured_peak(comm: Any, baseline: float, device_held: float | None = None
                  ) -> tuple[float, str]:
    """The largest, over the ranks of ``comm``, of what a rank's arrays took at their peak,
    and what was measured (collective). On the CPU: the peak resident set above ``baseline``.
    On a GPU, ``device_held``: the device memory CuPy's pool holds, which keeps every block it
    allocated for reuse, so its size is the high-water mark of the arrays (the host's resident
    set says nothing of the device's arrays)."""
    from mpi4py import MPI

    if device_held is not None:
        return (comm.allreduce(device_held, op=MPI.MAX),
                "device memory CuPy's pool holds, its high-water mark")
    return (comm.allreduce(peak_resident_bytes() - baseline, op=MPI.MAX),
            "resident set above the interpreter's")
