"""What ``calibrate`` times, as training runs it: the collectives, the GEMM rates, the share of a
gradient sum that moves during compute, and how many ranks of a node talk across at once; and the
machine profile made of them.

Every rank takes part. For each collective the training code issues, on each communicator size it
can meet, a sweep of log-spaced message sizes is timed and a line ``t = a + b·n`` is fitted; ``a``
and ``b`` are then divided by the message and byte terms of the formula in
:mod:`hpctrain.cost.collectives`, so the planner's prediction at a measured size is the fitted
line itself:

- allgather: the training primitive's forward (:class:`hpctrain.comm.collectives.AllGather`,
  an ``Allgatherv`` with its transposes and buffers) on activations split over channels, n/p
  bytes per rank; α⌈log₂p⌉ + β(p−1)/p·n, n = the gathered bytes.
- reduce_scatter: the same primitive's backward (its ``Reduce_scatter``);
  α⌈log₂p⌉ + β(p−1)/p·n, n = the bytes each rank contributes.
- allreduce: ``Allreduce`` in place of n bytes of float32; 2(α⌈log₂p⌉ + β(p−1)/p·n).
- alltoall: ``Alltoallv`` with equal counts to every other rank and none to itself;
  α(p−1) + β·n, n = the bytes each rank receives.
- halo, stored under p = 2: ``Isend``/``Irecv`` to both neighbours on a non-periodic chain, then
  ``Waitall``; interior ranks send to and receive from both neighbours at once, as a
  domain-parallel layer does, and one such exchange is fitted as one message, α + β·n, n = the
  bytes of one message (looked up with ``machine.link("halo", 2)``).

The ranks must fill nodes in blocks, R on each (node n holds world ranks n·R … n·R + R − 1, as
:mod:`hpctrain.cost.nodes` assumes); any other placement is refused on every rank at once. The
profile records ``ranks_per_node`` = R and has one level or two:

**One node** (R = P): the collectives run on the real sub-communicators of every Pr×Pc
factorisation of the world: all-gather and reduce-scatter on ``model_comm`` (size Pr),
all-reduce on ``batch_comm`` (size Pc) and on the world, all-to-all on the world, the halo on
the model communicator of the P×1 grid (a chain of every rank). Fits are keyed by communicator
size. There is no ``[network]``: calibrating on two nodes or more measures it.

**Several nodes** (m = P/R ≥ 2), two levels:

- *the node*, fits keyed by the ranks k of a node: all-gather, reduce-scatter and all-reduce on
  the model communicators of the grids (k, P/k) for every k ≥ 2 dividing R (k consecutive ranks,
  never crossing a node; every group of every node at once); all-to-all on the node's ranks
  (keyed by R); the halo on the chain of the node's ranks (the model communicator of the grid
  (R, P/R)). The profile's top-level ``alpha`` and ``beta`` are this halo fit.
- *the network*, fits keyed by the number of nodes m′: the communicators of one rank per node
  (``Split(color=node rank, key=node index)``), and for every m′ ≥ 2 dividing m their groups of
  m′ consecutive nodes. Only local rank 0's groups run, so one rank per node talks alone; the
  others wait at the barrier of every timing. All-gather, reduce-scatter and all-reduce on each
  m′, all-to-all on the m nodes, the halo on the chain of the nodes (stored under 2). The
  network's ``alpha`` and ``beta`` are this halo fit.
- *NIC sharing*: the largest halo message between nodes is timed with one rank per node (t₁)
  and with all R ranks of every node talking across at once, each on its own communicator of
  one rank per node (t_R). ``nics`` = R·t₁/t_R within [1, R]: the ranks of a node that talk
  across at full speed together (:mod:`hpctrain.cost.collectives` slows the bytes of s > nics
  ranks by s/nics). With one rank per node it is 1, not measured.

Past ``max_bytes`` a second sweep, sizes doubling up to ``far_bytes`` (:class:`Sweep`), finds where
a message outgrows the caches and the bandwidth falls (:func:`~hpctrain.cost.fits.fit_knee`): the
line is bent there to a second slope, stored as the fit's ``knee`` and ``far_beta``.

Timing: two warm-up calls, a barrier, then ``repeats`` calls each timed with ``perf_counter``,
the caches evicted before each (untimed: :mod:`hpctrain.device.caches`);
each call's time is the maximum over all ranks and the median over calls is kept. On one rank,
or with one rank per node, nothing is sent inside a node, so the top level holds ``alpha`` = 1 µs
and ``beta`` = 1e-10 s/B (10 GB/s), placeholders that no plan ever multiplies by a message.
``flops`` is the median FLOP/s of one rank on a square float32 GEMM, all ranks computing at once
(so cores shared by oversubscribed ranks count as shared). ``overlap`` is the share of a gradient
bucket's all-reduce that moves while the ranks compute (:func:`measure_overlap`).

A phase's start is told to a ``progress`` callable (rank 0 of ``calibrate`` prints it): on two
nodes of oversubscribed ranks the whole takes minutes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hpctrain.cost.fits import MIN_A, MIN_B, fit_knee, fit_line, line_to_fit, worst_residual
from hpctrain.cost.machine import Fit, Machine, Network
from hpctrain.device.caches import evict_caches
from hpctrain.layout.partition import factorisations

DEFAULT_ALPHA = 1e-6  # s per message: the top level on one rank, where nothing is sent
DEFAULT_BETA = 1e-10  # s per byte (10 GB/s), likewise
MIN_BYTES = 64  #: smallest message of a sweep, small enough that α dominates its time
ITEM = 4  # bytes of one float32, the element every benchmark moves
WARMUP = 2
OVERLAP_GEMM_SIZE = 256  # short GEMMs, so that Test comes often, as between layers
OVERLAP_PROBE_BYTES = 1 << 20  # a bucket's sum large enough that its bytes, not α, dominate


def message_sizes(max_bytes: int, count: int) -> list[int]:
    """``count`` sizes from :data:`MIN_BYTES` to ``max_bytes``, evenly spaced in log n.

    Example: ``message_sizes(65536, 4)`` is ``[64, 645, 6502, 65536]``.
    """
    return [int(round(n)) for n in np.geomspace(MIN_BYTES, max_bytes, count)]


def far_sizes(max_bytes: int, far_bytes: int) -> list[int]:
    """Sizes doubling from 2·``max_bytes`` up to ``far_bytes``: the sweep past the caches.

    Example: ``far_sizes(4 MiB, 64 MiB)`` is 8, 16, 32 and 64 MiB; none when ``far_bytes`` is
    not above ``max_bytes``.
    """
    sizes = []
    n = 2 * max_bytes
    while n <= far_bytes:
        sizes.append(n)
        n *= 2
    return sizes

def communicator_sizes(world_size: int) -> dict[str, list[int]]:
    """The communicator sizes p > 1 each collective meets on ``world_size`` ranks.

    All-gather and reduce-scatter run over Pr, all-reduce over Pc and over the world (ΔW of
    batch- and domain-parallel layers), all-to-all over the world, for every Pr·Pc = P; the halo
    message is keyed by 2 whenever P > 1. Example: P = 4 gives allgather [2, 4], reduce_scatter
    [2, 4], allreduce [2, 4], alltoall [4], halo [2]; P = 1 gives no sizes at all.
    """
    shapes = factorisations(world_size)
    rows = sorted({pr for pr, _ in shapes if pr > 1})
    cols = sorted({pc for _, pc in shapes if pc > 1} | ({world_size} - {1}))
    world = [world_size] if world_size > 1 else []
    return {"allgather": rows, "reduce_scatter": rows, "allreduce": cols, "alltoall": world,
            "halo": [2] if world_size > 1 else []}


def level_sizes(count: int) -> dict[str, list[int]]:
    """The sizes each collective is measured on at one level of ``count`` ranks of a node (or
    nodes of the machine), when the job spans several nodes.

    All-gather, reduce-scatter and all-reduce on every k ≥ 2 dividing ``count`` (groups of k
    consecutive ranks, or nodes, never straddling a node's edge), all-to-all on ``count``, the
    halo keyed by 2. Example: 4 gives allgather [2, 4], reduce_scatter [2, 4], allreduce [2, 4],
    alltoall [4], halo [2]; 1 (one rank per node) gives no sizes at all.
    """
    groups = [k for k, _ in factorisations(count) if k > 1]
    return {"allgather": groups, "reduce_scatter": groups, "allreduce": groups,
            "alltoall": [count] if count > 1 else [], "halo": [2] if count > 1 else []}


def nics_from_times(alone: float, together: float, ranks_per_node: int) -> float:
    """How many ranks of a node talk across at full speed at once: R·t₁/t_R within [1, R].

    ``alone`` (t₁) is a message's time with one rank per node talking, ``together`` (t_R) with
    all R. ν NICs slow each of R ranks by max(1, R/ν), so t_R = t₁·R/ν when R > ν. Example: 4
    ranks, 10 µs alone, 20 µs together: 2 NICs. 1 with one rank per node (nothing shares).
    """
    if ranks_per_node <= 1 or not (alone > 0 and together > 0):
        return 1.0
    return min(float(ranks_per_node), max(1.0, ranks_per_node * alone / together))


# ---------------------------------------------------------------------------------------------
# Command line


@dataclass(frozen=True)
class Sweep:
    """How each collective is swept: ``sizes`` message sizes from :data:`MIN_BYTES` to
    ``max_bytes``, then sizes doubling up to ``far_bytes`` past the caches (0: none), each timed
    ``repeats`` times."""

    max_bytes: int
    sizes: int
    repeats: int
    far_bytes: int = 0


def time_calls(world: Any, call: Callable[[], None], repeats: int, sync: Callable[[], None],
               evict: Callable[[], None] | None = None) -> float:
    """Median over ``repeats`` calls of the slowest rank's time of one call, in seconds.

    Every rank of ``world`` must call this together, each with its own ``call``. ``evict``,
    when given, runs before each call, untimed: the messages' sweeps evict the caches, as in
    training every collective follows layers whose data pushed MPI's buffers out of them
    (:mod:`hpctrain.device.caches`).
    """
    from mpi4py import MPI

    for _ in range(WARMUP):
        call()
    sync()
    world.Barrier()
    times = np.empty(repeats)
    for k in range(repeats):
        if evict is not None:
            evict()
            world.Barrier()
        start = time.perf_counter()
        call()
        sync()
        times[k] = time.perf_counter() - start
    world.Allreduce(MPI.IN_PLACE, times, MPI.MAX)
    return float(np.median(times))


def collective_call(collective: str, comm: Any, backend: Any, n_bytes: int
                    ) -> tuple[int, Callable[[], None]]:
    """The message size as the cost model counts it, and one call of ``collective`` on ``comm``.

    Every call goes through the transport training uses (:mod:`hpctrain.comm.transport`): on a
    GPU, NCCL on the device, or MPI with its host staging (or CUDA-aware), as ``--collectives``
    says, so what is timed is what a step pays.
    """
    from hpctrain.comm.transport import group_of

    xp, p = backend.xp, comm.Get_size()
    if collective in ("allgather", "reduce_scatter"):
        # through the training primitive (hpctrain.comm.collectives.AllGather), on activations
        # split over channels, so that its transposes and buffers are part of the time:
        # n = the gathered bytes (all-gather), the bytes each rank contributes (reduce-scatter)
        from hpctrain.comm.collectives import AllGather

        count = max(1, round(n_bytes / (ITEM * p)))  # entries of each rank's block
        inner = 16 if count >= 128 else 1  # a 4x4 feature map
        batch = 8 if count >= 8 * inner else 1
        channels = max(1, count // (batch * inner))
        primitive = AllGather(backend, comm, 1, tuple((k * channels, (k + 1) * channels)
                                                      for k in range(p)))
        if collective == "allgather":
            x = xp.ones((batch, channels, inner), np.float32)
            return ITEM * batch * channels * inner * p, lambda: primitive.forward(x)
        x = xp.ones((batch, channels * p, inner), np.float32)
        return ITEM * batch * channels * inner * p, lambda: primitive.backward(x)
    group = group_of(backend, comm)  # MPI, staged or CUDA-aware, or NCCL (--collectives)
    if collective == "allreduce":  # n = the vector summed in place
        count = max(1, round(n_bytes / ITEM))
        x = xp.zeros(count, np.float32)  # summed in place on every call: zeros stay finite
        return ITEM * count, lambda: group.allreduce(x)
    if collective == "alltoall":  # n = the bytes each rank receives, from every other rank
        count = max(1, round(n_bytes / (ITEM * (p - 1))))
        me = comm.Get_rank()
        counts = [0 if r == me else count for r in range(p)]
        displs = [sum(counts[:r]) for r in range(p)]
        x = xp.ones(count * (p - 1), np.float32)
        # every other rank's stretch, as the general move of a redistribution sends them
        stretches = [(r, displs[r], displs[r] + counts[r]) for r in range(p) if r != me]

        def call() -> None:
            group.start_exchange(x, stretches, count * (p - 1), stretches, 20).wait()

        return ITEM * count * (p - 1), call
    if collective == "halo":  # n = one message; interior ranks exchange with both neighbours
        count = max(1, round(n_bytes / ITEM))
        me = comm.Get_rank()
        peers = [r for r in (me - 1, me + 1) if 0 <= r < p]
        # one message of ``count`` entries to each neighbour, and one from each
        x = xp.ones(count * len(peers), np.float32)
        stretches = [(r, k * count, (k + 1) * count) for k, r in enumerate(peers)]

        def call() -> None:
            group.start_exchange(x, stretches, count * len(peers), stretches, 21).wait()

        return ITEM * count, call
    raise ValueError(f"unknown collective {collective!r}")


@dataclass(frozen=True)
class Measured:
    """One collective on one communicator size: the sweep, its fit and how well it fits."""

    collective: str
    p: int
    sizes: tuple[int, ...]
    times: tuple[float, ...]
    fit: Fit
    residual: float
    floored: bool = False  # a or b hit its floor: the times did not grow along a line
    # "node": p ranks (of one node, with levels); "network": p nodes, one rank on each;
    # "shape": p ranks, per_node on each of p / per_node nodes
    level: str = "node"
    per_node: int = 1

    @property
    def where(self) -> str:
        """How the table shows the group (p, or KxM for a shape)."""
        return f"{self.per_node}x{self.p // self.per_node}" if self.level == "shape" else str(
            self.p)


def _idle() -> None:
    """The call of a rank that waits while others are timed."""


def _silent(phase: str) -> None:
    """No progress lines: :func:`measure` and :func:`measure_levels` called from code."""


def _ranks(sizes: Sequence[int], unit: str = "ranks") -> str:
    """``[2, 4]`` as 'groups of 2, 4 ranks': how a progress line names the sizes timed."""
    return f"groups of {', '.join(map(str, sizes))} {unit}"


def time_sweep(collective: str, p: int, comm: Any, world: Any, backend: Any, sweep: Sweep,
               level: str = "node", active: bool = True, per_node: int = 1) -> Measured:
    """Time ``collective`` on ``comm`` (this rank's group of size ``p``) at every message size:
    a line fitted to the sweep up to ``sweep.max_bytes``, bent at a knee to fit the sweep beyond.

    Collective over ``world``; a rank that is not ``active`` only waits while the others are
    timed (its group stays silent), and every rank returns the same result."""
    sizes, times = [], []

    def time_at(targets: list[int]) -> None:
        for target in targets:
            n_bytes, call = collective_call(collective, comm, backend, target)
            if n_bytes in sizes:  # rounding to whole elements per rank merged two sizes
                continue
            sizes.append(n_bytes)
            times.append(time_calls(world, call if active else _idle, sweep.repeats,
                                    backend.sync, lambda: evict_caches(backend.device)))
            del call  # a large message's buffers go before the next are made

    time_at(message_sizes(sweep.max_bytes, sweep.sizes))
    near = len(sizes)  # the line is fitted to these; the knee to those past them
    time_at(far_sizes(sweep.max_bytes, sweep.far_bytes))
    a, b = fit_line(sizes[:near], times[:near])
    knee, slope = math.inf, 0.0
    if near < len(sizes):
        knee, slope = fit_knee(a, b, sizes[near:], times[near:], sizes[near - 1])
    return Measured(collective, p, tuple(sizes), tuple(times),
                    line_to_fit(collective, p, a, b, knee, slope),
                    worst_residual(sizes, times, a, b, knee, slope),
                    bool(a == MIN_A or b == MIN_B), level, per_node)


def measure_flops(world: Any, backend: Any, size: int, repeats: int,
                  precision: str = "fp32") -> float:
    """FLOP/s of one rank on a ``size × size`` GEMM in ``precision`` (fp32: strict float32;
    tf32: float32 on tensor cores; bf16, fp16: 16-bit inputs, float32 sums), all ranks at
    once (2·size³ per call), through the product training uses
    (:func:`hpctrain.kernels.products.matmul`)."""
    from hpctrain.device.precision import PRECISIONS, tensor_products, tensor_products_on
    from hpctrain.kernels.products import matmul

    xp, dtype = backend.xp, PRECISIONS[precision].storage
    a = xp.ones((size, size), dtype)
    b = xp.full((size, size), 0.5, dtype)
    before = tensor_products_on()
    tensor_products(precision == "tf32", xp)
    try:
        return 2.0 * size**3 / time_calls(world, lambda: matmul(xp, a, b), repeats,
                                          backend.sync)
    finally:
        tensor_products(before, xp)


def measure_precision_flops(world: Any, backend: Any, size: int, repeats: int
                            ) -> dict[str, float]:
    """The profile's ``flops_tf32``, ``flops_bf16`` and ``flops_fp16`` on a GPU, by name:
    :func:`measure_flops` in each. Nothing on the CPU, which has no tensor cores: there a
    16-bit product is widened to float32 and the planner prices it at ``flops``."""
    if backend.device != "gpu":
        return {}
    from hpctrain.cost.machine import PRECISION_FLOPS

    return {p: measure_flops(world, backend, size, repeats, p) for p in PRECISION_FLOPS}


def measure_overlap(world: Any, backend: Any, size: int, repeats: int) -> float:
    """The share of an all-reduce's time that moves while the ranks compute, as training overlaps
    it (``--overlap``): the profile's ``overlap``.

    A bucket of gradients (1 MiB, ``OVERLAP_PROBE_BYTES``) on the
    world, three ways: ``Iallreduce`` then ``Wait`` (t_c); k GEMMs of ``size``², k chosen so
    they take about t_c (t_g); and the ``Iallreduce`` started, the GEMMs each followed by a
    ``Test``, as the reducer tests between layers, then ``Wait`` (t_b). The share is
    (t_c + t_g − t_b) / t_c, within [0, 1]: 0 where the sum moves only inside MPI calls, 1
    where it moves entirely during the GEMMs. 0 on one rank, where nothing is sent.

    The sum goes through the transport training uses (:mod:`hpctrain.comm.transport`): on a
    GPU under NCCL it runs on a stream of its own beside the GEMMs, as the gradient sums of a
    run with ``--overlap`` do. Each GEMM is followed by a wait for the compute stream alone
    (the host's view of a layer ending), never for the whole device, which would wait for the
    sum too.
    """
    from mpi4py import MPI

    from hpctrain.comm.transport import group_of

    if world.Get_size() == 1:
        return 0.0
    xp, group = backend.xp, group_of(backend, world)
    buffer = xp.ones(OVERLAP_PROBE_BYTES // ITEM, np.float32)
    a = xp.ones((size, size), np.float32)
    b = xp.full((size, size), 0.5, np.float32)

    def layer_done() -> None:
        if backend.device == "gpu":
            xp.cuda.get_current_stream().synchronize()

    def gemms(count: int, request: Any = None) -> None:
        for _ in range(count):
            a @ b
            layer_done()
            if request is not None:
                request.test()

    def alone() -> None:
        group.start_allreduce(buffer).wait()

    sum_time = time_calls(world, alone, repeats, backend.sync)
    gemm_time = time_calls(world, lambda: gemms(1), repeats, backend.sync)
    count = world.allreduce(max(1, round(sum_time / gemm_time)), op=MPI.MAX)

    def overlapped() -> None:
        request = group.start_allreduce(buffer)
        gemms(count, request)
        request.wait()

    compute_time = time_calls(world, lambda: gemms(count), repeats, backend.sync)
    both_time = time_calls(world, overlapped, repeats, backend.sync)
    return min(1.0, max(0.0, (sum_time + compute_time - both_time) / sum_time))


def measure(world: Any, backend: Any, sweep: Sweep,
            progress: Callable[[str], None] = _silent) -> list[Measured]:
    """Every (collective, p) of :func:`communicator_sizes`, on the real sub-communicators;
    ``progress`` is told as each collective starts (``calibrate`` prints it)."""
    from hpctrain.comm.grid import GridSet

    size = world.Get_size()
    wanted = communicator_sizes(size)
    results = []
    with GridSet(world) as grids:
        for collective in ("allgather", "reduce_scatter"):
            if wanted[collective]:
                progress(f"{collective} on {_ranks(wanted[collective])}")
            for pr in wanted[collective]:
                comm = grids.get((pr, size // pr)).model_comm
                results.append(time_sweep(collective, pr, comm, world, backend, sweep))
        if wanted["allreduce"]:
            progress(f"allreduce on {_ranks(wanted['allreduce'])}")
        for pc in wanted["allreduce"]:
            comm = world if pc == size else grids.get((size // pc, pc)).batch_comm
            results.append(time_sweep("allreduce", pc, comm, world, backend, sweep))
        if wanted["alltoall"]:
            progress(f"alltoall on {_ranks(wanted['alltoall'])}")
        for p in wanted["alltoall"]:
            results.append(time_sweep("alltoall", p, world, world, backend, sweep))
        if wanted["halo"]:
            progress(f"halo messages on a chain of {size} ranks")
            chain = grids.get((size, 1)).model_comm
            results.append(time_sweep("halo", 2, chain, world, backend, sweep))
    return results


@dataclass(frozen=True)
class Sharing:
    """NIC sharing: one halo message of ``n_bytes`` between nodes, timed with one rank per node
    talking (``alone``) and with all ``ranks_per_node`` of them (``together``)."""

    ranks_per_node: int
    n_bytes: int = 0
    alone: float = 0.0
    together: float = 0.0

    @property
    def nics(self) -> float:
        """The profile's ``nics``, to two decimals."""
        return round(nics_from_times(self.alone, self.together, self.ranks_per_node), 2)

    def describe(self) -> str:
        if self.ranks_per_node == 1:
            return "nics: 1 (one rank per node: NIC sharing was not measured)"
        return (f"nics: {self.nics:g} of {self.ranks_per_node} ranks per node talk across at "
                f"full speed at once ({self.n_bytes} B between nodes: {self.alone * 1e6:.1f} us "
                f"with one rank per node, {self.together * 1e6:.1f} us with all "
                f"{self.ranks_per_node})")


def measure_levels(world: Any, node: Any, backend: Any, sweep: Sweep,
                   progress: Callable[[str], None] = _silent
                   ) -> tuple[list[Measured], Sharing]:
    """Both levels of a job on several nodes (see the module's text): the fits inside a node,
    keyed by ranks, and between nodes, keyed by nodes, and the NIC sharing; ``progress`` is
    told as each collective of each level starts (``calibrate`` prints it).

    ``node`` is this rank's node communicator (``Split_type(COMM_TYPE_SHARED)``): R ranks, the
    nodes filled in blocks. Example: P = 4 on two nodes of 2: ranks 0, 1 on node 0 and 2, 3 on
    node 1; the node level times groups {0, 1} and {2, 3} at once; the network level times
    {0, 2} alone while 1 and 3 wait, then {0, 2} and {1, 3} together for the NIC sharing.
    """
    from hpctrain.comm.grid import GridSet

    size, per_node = world.Get_size(), node.Get_size()
    nodes, local, index = size // per_node, node.Get_rank(), world.Get_rank() // per_node
    results = []
    inside = level_sizes(per_node)
    with GridSet(world) as grids:
        for collective in ("allgather", "reduce_scatter", "allreduce"):
            if inside[collective]:
                progress(f"inside a node: {collective} on {_ranks(inside[collective])}")
            for k in inside[collective]:  # k consecutive ranks: model groups of the grid k×P/k
                comm = grids.get((k, size // k)).model_comm
                results.append(time_sweep(collective, k, comm, world, backend, sweep))
        if per_node > 1:
            progress(f"inside a node: alltoall and halo messages on {per_node} ranks")
            results.append(time_sweep("alltoall", per_node, node, world, backend, sweep))
            chain = grids.get((per_node, nodes)).model_comm  # the node's ranks, in order
            results.append(time_sweep("halo", 2, chain, world, backend, sweep))
    across = world.Split(color=local, key=index)  # one rank per node: R of them, m ranks each
    between = level_sizes(nodes)
    groups = {m: across if m == nodes else across.Split(color=index // m, key=index)
              for m in between["allgather"]}
    alone = local == 0  # one rank per node talks; the others wait
    try:
        for collective in ("allgather", "reduce_scatter", "allreduce"):
            progress(f"between nodes: {collective} on {_ranks(between[collective], 'nodes')}")
            for m in between[collective]:
                results.append(time_sweep(collective, m, groups[m], world, backend, sweep,
                                          "network", alone))
        progress(f"between nodes: alltoall and halo messages on {nodes} nodes")
        results.append(time_sweep("alltoall", nodes, across, world, backend, sweep, "network",
                                  alone))
        halo = time_sweep("halo", 2, across, world, backend, sweep, "network", alone)
        results.append(halo)
        sharing = Sharing(per_node)
        if per_node > 1:
            progress(f"between nodes: NIC sharing, 1 then {per_node} ranks of each node "
                     f"talking across")
            n_bytes, call = collective_call("halo", across, backend, max(halo.sizes))
            sharing = Sharing(per_node, n_bytes,
                              time_calls(world, call if alone else _idle, sweep.repeats,
                                         backend.sync),
                              time_calls(world, call, sweep.repeats, backend.sync))
    finally:
        for comm in groups.values():
            if comm is not across:
                comm.Free()
        across.Free()
    if per_node > 1:
        results += _measure_shapes(world, per_node, backend, sweep, progress)
    return results, sharing


def _measure_shapes(world: Any, per_node: int, backend: Any, sweep: Sweep,
                    progress: Callable[[str], None] = _silent) -> list[Measured]:
    """Whole groups with several ranks on each of several nodes, every group at once as
    training runs them: the all-reduce of each batch group (Pr dividing R, Pr < R: R/Pr ranks
    on each of the m nodes) and the all-gather and reduce-scatter of each model group wider
    than a node (R·m′ consecutive ranks, m′ ≥ 2 dividing m). Whatever algorithm the MPI library
    runs for these shapes, node-aware or not, is in the fit."""
    from hpctrain.comm.grid import GridSet

    size = world.Get_size()
    nodes = size // per_node
    results = []
    progress(f"whole groups across nodes: allreduce, allgather and reduce_scatter on "
             f"groups of several ranks on each of {nodes} nodes")
    with GridSet(world) as grids:
        for pr in (pr for pr, _ in factorisations(per_node) if pr < per_node):
            comm = grids.get((pr, size // pr)).batch_comm
            k = per_node // pr
            results.append(time_sweep("allreduce", k * nodes, comm, world, backend, sweep,
                                      "shape", per_node=k))
        for m in level_sizes(nodes)["allgather"]:
            comm = grids.get((per_node * m, size // (per_node * m))).model_comm
            for collective in ("allgather", "reduce_scatter"):
                results.append(time_sweep(collective, per_node * m, comm, world, backend,
                                          sweep, "shape", per_node=per_node))
    return results


def build_machine(name: str, device: str, results: Sequence[Measured], flops: float,
                  threads: int, overlap: float, ranks_per_node: int, sharing: Sharing | None
                  ) -> Machine:
    """The profile: the node-level fits at the top, with the node's halo fit as ``alpha`` and
    ``beta`` (placeholders when nothing moved inside a node); with ``sharing`` (a job on several
    nodes) the network-level fits, halo fit and NICs as ``[network]``."""
    fits: dict[str, dict[int, Fit]] = {}
    net_fits: dict[str, dict[int, Fit]] = {}
    shapes: dict[str, dict[tuple[int, int], Fit]] = {}
    for m in results:
        if m.level == "shape":
            shapes.setdefault(m.collective, {})[m.per_node, m.p // m.per_node] = m.fit
        else:
            (net_fits if m.level == "network" else fits).setdefault(m.collective, {})[m.p] = m.fit
    halo = fits.get("halo", {}).get(2, Fit(DEFAULT_ALPHA, DEFAULT_BETA))
    network = None
    if sharing is not None:
        link = net_fits["halo"][2]
        network = Network(link.alpha, link.beta, sharing.nics, net_fits, shapes)
    return Machine(name, halo.alpha, halo.beta, flops, device, fits,
                   threads=threads, overlap=round(overlap, 2), ranks_per_node=ranks_per_node,
                   network=network)
