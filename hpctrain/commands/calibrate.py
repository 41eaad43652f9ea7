"""``python -m hpctrain calibrate``: measure this machine's α–β constants and FLOP rate.

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

Past ``--max-bytes`` a second sweep, sizes doubling up to ``--far-bytes``, finds where a message
outgrows the caches and the bandwidth falls (:func:`fit_knee`): the line is bent there to a
second slope, stored as the fit's ``knee`` and ``far_beta``.

Timing: two warm-up calls, a barrier, then ``repeats`` calls each timed with ``perf_counter``,
the caches evicted before each (untimed: :mod:`hpctrain.device.caches`);
each call's time is the maximum over all ranks and the median over calls is kept. On one rank,
or with one rank per node, nothing is sent inside a node, so the top level holds ``alpha`` = 1 µs
and ``beta`` = 1e-10 s/B (10 GB/s), placeholders that no plan ever multiplies by a message.
``flops`` is the median FLOP/s of one rank on a square float32 GEMM, all ranks computing at once
(so cores shared by oversubscribed ranks count as shared). ``overlap`` is the share of a gradient
bucket's all-reduce that moves while the ranks compute (:func:`measure_overlap`).

Rank 0 prints a line, flushed, as each phase starts (:class:`Progress`): on two nodes of
oversubscribed ranks the whole takes minutes, and the table comes only at the end.
"""

from __future__ import annotations

import argparse
import math
import re
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from hpctrain.comm.nodes import LAUNCH_IN_BLOCKS, unblocked
from hpctrain.commands.flags import (
    add_collectives_option,
    add_precision_option,
    add_threads_option,
)
from hpctrain.commands.probes import PROBE_NETS, fit_to_probe_steps, parse_probe_nets
from hpctrain.cost.collectives import terms
from hpctrain.cost.machine import (
    Fit,
    Machine,
    Network,
    is_saved_profile,
    local_profile,
    save_machine,
)
from hpctrain.device.caches import evict_caches
from hpctrain.errors import ArgumentParser, UserError
from hpctrain.io.files import can_create_in
from hpctrain.io.units import bytes_from
from hpctrain.layout.partition import factorisations
from hpctrain.plan.stepfit import FLOOR, StepFit
from hpctrain.record.refit import PricedPlan

DEFAULT_ALPHA = 1e-6  # s per message: the top level on one rank, where nothing is sent
DEFAULT_BETA = 1e-10  # s per byte (10 GB/s), likewise
MIN_A = 1e-9  #: smallest intercept a fit may return (s), keeping α > 0 when noise pulls it below 0
MIN_B = 1e-14  #: smallest slope a fit may return (s/B, 100 TB/s), keeping β > 0 likewise
MIN_BYTES = 64  #: smallest message of a sweep, small enough that α dominates its time
ITEM = 4  # bytes of one float32, the element every benchmark moves
WARMUP = 2
QUICK = {"max_bytes": 64 * 1024, "sizes": 4, "repeats": 3, "gemm_size": 512, "far_bytes": 0}
DEFAULTS = {"max_bytes": 4 * 1024 * 1024, "sizes": 8, "repeats": 10, "gemm_size": 1024,
            "far_bytes": 64 * 1024 * 1024}
OVERLAP_GEMM_SIZE = 256  # short GEMMs, so that Test comes often, as between layers
OVERLAP_PROBE_BYTES = 1 << 20  # a bucket's sum large enough that its bytes, not α, dominate
GPU_GEMM_SIZE = 4096  # a GPU needs a larger GEMM than a CPU core to reach its sustained rate
class CalibrateError(UserError):
    """A calibrate option with a value that cannot be used."""


# ---------------------------------------------------------------------------------------------
# Pure maths: sizes, the model's terms, the fit


def parse_bytes(text: str, option: str = "--max-bytes") -> int:
    """Bytes from ``'4194304'``, ``'64KiB'``, ``'4M'`` or ``'1 GiB'`` (binary units, any case).

    Raises :class:`CalibrateError` naming ``option`` and ``text`` when it is not such a size.
    """
    size = bytes_from(text)
    if size is None:
        raise CalibrateError(f"{option} {text!r} is not a size; write e.g. 4194304, 64KiB "
                             f"or 4MiB")
    return int(size)


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


def fit_knee(a: float, b: float, sizes: Sequence[float], times: Sequence[float],
             start: float) -> tuple[float, float]:
    """``(knee, s)``: past the size ``knee`` each byte costs ``s``, where the line ``a + b·n``
    fitted below ``start`` no longer holds.

    The times at ``sizes`` (all above ``start``) are priced ``a + b·min(n, K) + s·max(0, n − K)``.
    The knee K is ``start`` or one of ``sizes`` but the last, and ``s`` (at least
    :data:`MIN_B`) minimises the relative squared error of the times past K; the K whose pricing
    has the smallest relative squared error over every time wins. On a network whose bandwidth
    does not fall with size, ``s`` comes out near ``b``.
    """
    n = np.asarray(sizes, dtype=np.float64)
    t = np.asarray(times, dtype=np.float64)
    best = (math.inf, float(start), b)
    for knee in [float(start), *n[:-1]]:
        past = n > knee
        w2 = 1.0 / t[past] ** 2
        d = n[past] - knee
        slope = max(MIN_B, float(np.sum(w2 * d * (t[past] - a - b * knee)) / np.sum(w2 * d * d)))
        error = float(np.sum(((bent_line(a, b, knee, slope, n) - t) / t) ** 2))
        if error < best[0]:
            best = (error, knee, slope)
    return best[1], best[2]


def bent_line(a: float, b: float, knee: float, slope: float, sizes: Any) -> np.ndarray:
    """``a + b·min(n, knee) + slope·max(0, n − knee)`` at each size n: the price of a fit
    (:meth:`~hpctrain.cost.machine.Fit.seconds`) with the line's own a and b as its α and β."""
    line = Fit(a, b, knee, slope)
    return np.array([line.seconds(1.0, float(n)) for n in sizes])


def fit_line(sizes: Sequence[float], times: Sequence[float]) -> tuple[float, float]:
    """``(a, b)`` minimising Σ((a + b·nᵢ − tᵢ)/tᵢ)², with a ≥ :data:`MIN_A`, b ≥ :data:`MIN_B`.

    The error is relative so a 64-byte message (microseconds) weighs as much as a 4 MiB one
    (milliseconds): an absolute fit would let the large messages set ``a`` and lose the latency.
    When the unconstrained optimum has ``a`` or ``b`` below its floor (noise at a size where the
    term is negligible), that parameter is held at its floor and the other refitted alone.

    Parameters
    ----------
    sizes : message sizes nᵢ in bytes, at least two distinct.
    times : measured seconds tᵢ > 0, one per size.
    """
    n = np.asarray(sizes, dtype=np.float64)
    t = np.asarray(times, dtype=np.float64)
    if n.ndim != 1 or n.shape != t.shape:
        raise ValueError(f"fit_line needs one time per size, got {n.shape} and {t.shape}")
    if np.unique(n).size < 2:
        raise ValueError(f"fit_line needs at least two distinct sizes, got {n.tolist()}")
    if not (np.all(np.isfinite(t)) and np.all(t > 0)):
        raise ValueError(f"fit_line needs positive finite times, got {t.tolist()}")
    w = 1.0 / t
    # columns of equal magnitude keep the least-squares problem well conditioned
    scale = float(n.max())
    design = np.stack([w, w * n / scale], axis=1)
    (a, b_scaled), *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)
    a, b = float(a), float(b_scaled) / scale
    w2 = w * w
    if a < MIN_A:
        a = MIN_A
        b = float(np.sum(w2 * n * (t - a)) / np.sum(w2 * n * n))
    if b < MIN_B:
        b = MIN_B
        a = max(MIN_A, float(np.sum(w2 * (t - b * n)) / np.sum(w2)))
    return a, b


def worst_residual(sizes: Sequence[float], times: Sequence[float], a: float, b: float,
                   knee: float = math.inf, slope: float = 0.0) -> float:
    """``max |price(nᵢ) − tᵢ| / tᵢ``: how far the fit (the line ``a + b·n``, bent at ``knee`` to
    ``slope``) strays from the worst measured point."""
    n = np.asarray(sizes, dtype=np.float64)
    t = np.asarray(times, dtype=np.float64)
    return float(np.max(np.abs(bent_line(a, b, knee, slope, n) - t) / t))


def fit_collective(collective: str, p: int, sizes: Sequence[float],
                   times: Sequence[float]) -> Fit:
    """α and β of ``collective`` on ``p`` ranks from times measured at ``sizes`` (bytes).

    The line ``t = a + b·n`` is fitted by :func:`fit_line`; :func:`line_to_fit` turns it into
    α and β such that the cost model reproduces the fitted line.
    """
    return line_to_fit(collective, p, *fit_line(sizes, times))


def line_to_fit(collective: str, p: int, a: float, b: float, knee: float = math.inf,
                slope: float = 0.0) -> Fit:
    """α = a/m and β = b/c, with ``(m, c)`` the model's terms
    (:func:`~hpctrain.cost.collectives.terms`); past ``knee`` bytes of message (c·knee bytes of
    byte terms), far β = slope/c."""
    m, c = terms(collective, p)
    if math.isfinite(knee):
        return Fit(a / m, b / c, c * knee, slope / c)
    return Fit(a / m, b / c)


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


def placement_problem(ranks_per_node: int, nodes: int, even: bool, blocked: bool) -> str:
    """Why calibrate cannot measure levels on this placement (empty when it can): the ranks
    must fill equal nodes in blocks, node n holding ranks n·R … n·R + R − 1."""
    how = unblocked(even, blocked)
    if not how:
        return ""
    return (f"calibrate needs ranks to fill nodes in blocks of R (node n holding ranks n*R to "
            f"n*R+R-1), but on these {nodes} nodes {how}; {LAUNCH_IN_BLOCKS}")


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


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="python -m hpctrain calibrate",
        description="Measure the latency (alpha) and inverse bandwidth (beta) of the all-gather, "
                    "reduce-scatter, all-reduce, all-to-all and halo messages the training code "
                    "sends, on every communicator size the planner can use at this number of "
                    "processes, and the FLOP rate of one rank; write them as a machine profile. "
                    "Launch with the process count and placement you will train with, e.g. "
                    "'mpiexec -n 4 python -m hpctrain calibrate'.")
    parser.add_argument("--out", default=str(local_profile()), metavar="PATH",
                        help="profile to write, atomically (default: %(default)s, in "
                             "$XDG_CONFIG_HOME/hpctrain or ~/.config/hpctrain: --machine local, "
                             "which the planner reads when no machine is named)")
    parser.add_argument("--name", default="local",
                        help="name stored in the profile (default: %(default)s)")
    parser.add_argument("--max-bytes", default=None, metavar="BYTES",
                        help="largest message of each sweep, in bytes or with KiB/MiB/GiB; "
                             "larger is more accurate for bandwidth and slower "
                             f"(default: {DEFAULTS['max_bytes'] // 1024**2}MiB, "
                             f"{QUICK['max_bytes'] // 1024}KiB with --quick)")
    parser.add_argument("--far-bytes", default=None, metavar="BYTES",
                        help="largest message of a second sweep past the caches, sizes "
                             "doubling from 2x --max-bytes, where the bandwidth of large "
                             "messages is fitted (a gradient of tens of MiB moves at it); 0 for "
                             f"none (default: {DEFAULTS['far_bytes'] // 1024**2}MiB, none with "
                             "--quick)")
    parser.add_argument("--sizes", type=int, default=None, metavar="N",
                        help=f"message sizes per sweep, log-spaced from {MIN_BYTES} bytes to "
                             f"--max-bytes (default: {DEFAULTS['sizes']}, {QUICK['sizes']} with "
                             f"--quick)")
    parser.add_argument("--repeats", type=int, default=None, metavar="K",
                        help=f"timed calls per size, median kept (default: "
                             f"{DEFAULTS['repeats']}, {QUICK['repeats']} with --quick)")
    parser.add_argument("--gemm-size", type=int, default=None, metavar="N",
                        help=f"side of the square float32 GEMM timed for flops (default: "
                             f"{DEFAULTS['gemm_size']} on cpu, {GPU_GEMM_SIZE} on gpu, "
                             f"{QUICK['gemm_size']} with --quick)")
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                        help="where the buffers and the GEMM live; on gpu, messages move as "
                             "--collectives says, exactly as in training (NCCL, or MPI staged "
                             "through host memory unless HPCTRAIN_CUDA_AWARE_MPI=1), and the "
                             "GEMM rate is also timed in tf32, bf16 and fp16 for the "
                             "profile's flops_tf32, flops_bf16 and flops_fp16; --precision is "
                             "what the probe nets train in (default: %(default)s)")
    parser.add_argument("--quick", action="store_true",
                        help="a rough profile in seconds: fewer, smaller sizes and repeats "
                             "(explicit options still win)")
    parser.add_argument("--probe-nets", default=None, metavar="NETS",
                        help="after the collectives and the GEMM, train a few steps of every "
                             "plan compare-plans compares on these nets (NAME[:IMAGE_SIZE],...) "
                             "and fit the profile to their per-layer times; none to skip "
                             f"(default: {PROBE_NETS}, none with --quick)")
    parser.add_argument("--from-log", nargs="+", default=None, metavar="LOG",
                        help="measure nothing: refit the profile --machine to the per-layer "
                             "times of these run logs (train --log, compare-plans --log), "
                             "compute per layer kind and the links' alpha and beta by least "
                             "squares, and write it to --out")
    parser.add_argument("--machine", default=None,
                        help="with --from-log, the profile to refit: a name or a .toml path "
                             "(default: local when calibrated, else default)")
    add_collectives_option(parser)
    add_precision_option(parser)
    add_threads_option(parser)
    return parser


@dataclass(frozen=True)
class Settings:
    """Checked calibrate options."""

    out: Path
    name: str
    max_bytes: int
    sizes: int
    repeats: int
    gemm_size: int
    device: str
    far_bytes: int = 0


def _settings(args: argparse.Namespace) -> Settings:
    """Options with --quick and the device defaults applied; raises CalibrateError on bad ones."""
    base = QUICK if args.quick else DEFAULTS
    max_bytes = base["max_bytes"] if args.max_bytes is None else parse_bytes(args.max_bytes)
    if not 1024 <= max_bytes <= 1024**3:
        raise CalibrateError(f"--max-bytes {args.max_bytes} must be between 1KiB and 1GiB")
    far_bytes = (base["far_bytes"] if args.far_bytes is None
                 else parse_bytes(args.far_bytes, "--far-bytes"))
    if not (far_bytes == 0 or 2 * max_bytes <= far_bytes <= 4 * 1024**3):
        raise CalibrateError(f"--far-bytes {args.far_bytes} must be 0 or between twice "
                             f"--max-bytes ({2 * max_bytes} bytes) and 4GiB")
    sizes = base["sizes"] if args.sizes is None else args.sizes
    if not 2 <= sizes <= 64:
        raise CalibrateError(f"--sizes {sizes} must be between 2 and 64 (a line needs two "
                             f"points)")
    repeats = base["repeats"] if args.repeats is None else args.repeats
    if not 1 <= repeats <= 10000:
        raise CalibrateError(f"--repeats {repeats} must be between 1 and 10000")
    gemm_size = args.gemm_size
    if gemm_size is None:
        gemm_size = base["gemm_size"] if args.quick or args.device == "cpu" else GPU_GEMM_SIZE
    if not 16 <= gemm_size <= 32768:
        raise CalibrateError(f"--gemm-size {gemm_size} must be between 16 and 32768")
    # the name is written between double quotes in TOML: keep it to characters needing no escape
    if not re.fullmatch(r"[A-Za-z0-9_.+-]+", args.name):
        raise CalibrateError(f"--name {args.name!r} must be letters, digits and _ . + - only")
    return Settings(Path(args.out), args.name, max_bytes, sizes, repeats, gemm_size, args.device,
                    far_bytes)


def _unwritable(out: Path) -> str:
    """Why rank 0 could not write ``out`` (empty when it can): checked before measuring."""
    if out.is_dir():
        return f"--out {out} is a directory; give a file path such as {out / 'local.toml'}"
    if out.is_symlink() or (out.exists() and not out.is_file()):
        return f"--out {out} is not a regular file; give the path of a new or a profile file"
    if out.exists() and not is_saved_profile(out):
        return (f"--out {out} exists and is not a profile hpctrain wrote; hpctrain replaces "
                f"only files it wrote: give a new path, or move the file aside")
    parent = out.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    problem = f"--out {out}: cannot create files in {parent}; give --out a writable path"
    return "" if parent.is_dir() and can_create_in(parent) else problem


# ---------------------------------------------------------------------------------------------
# Measurement


def _time_calls(world: Any, call: Callable[[], None], repeats: int, sync: Callable[[], None],
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


def _benchmark(collective: str, comm: Any, backend: Any, n_bytes: int
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


class Progress:
    """Rank 0's line as each phase of the measurement starts, flushed at once, with the
    seconds since the start: on two nodes of oversubscribed ranks calibrate takes minutes, and
    a job that prints nothing until its end cannot be told from one that hangs.

    Example: ``calibrate: [12 s] between nodes: allreduce on groups of 2 nodes``.
    """

    def __init__(self, rank: int) -> None:
        self.rank, self.started = rank, time.perf_counter()

    def __call__(self, phase: str) -> None:
        """Say that ``phase`` starts (rank 0 alone; the others are silent)."""
        if self.rank == 0:
            print(f"calibrate: [{time.perf_counter() - self.started:.0f} s] {phase}", flush=True)


def _silent(phase: str) -> None:
    """No progress lines: :func:`measure` and :func:`measure_levels` called from code."""


def _ranks(sizes: Sequence[int], unit: str = "ranks") -> str:
    """``[2, 4]`` as 'groups of 2, 4 ranks': how a progress line names the sizes timed."""
    return f"groups of {', '.join(map(str, sizes))} {unit}"


def _sweep(collective: str, p: int, comm: Any, world: Any, backend: Any, settings: Settings,
           level: str = "node", active: bool = True, per_node: int = 1) -> Measured:
    """Time ``collective`` on ``comm`` (this rank's group of size ``p``) at every message size:
    a line fitted to the sweep up to --max-bytes, bent at a knee to fit the sweep beyond.

    Collective over ``world``; a rank that is not ``active`` only waits while the others are
    timed (its group stays silent), and every rank returns the same result."""
    sizes, times = [], []

    def time_at(targets: list[int]) -> None:
        for target in targets:
            n_bytes, call = _benchmark(collective, comm, backend, target)
            if n_bytes in sizes:  # rounding to whole elements per rank merged two sizes
                continue
            sizes.append(n_bytes)
            times.append(_time_calls(world, call if active else _idle, settings.repeats,
                                     backend.sync, lambda: evict_caches(backend.device)))
            del call  # a large message's buffers go before the next are made

    time_at(message_sizes(settings.max_bytes, settings.sizes))
    near = len(sizes)  # the line is fitted to these; the knee to those past them
    time_at(far_sizes(settings.max_bytes, settings.far_bytes))
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
        return 2.0 * size**3 / _time_calls(world, lambda: matmul(xp, a, b), repeats,
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
    GPU under NCCL it is queued on the compute stream behind the GEMMs, so what hides is what
    NCCL hides there.
    """
    from mpi4py import MPI

    from hpctrain.comm.transport import group_of

    if world.Get_size() == 1:
        return 0.0
    xp, group = backend.xp, group_of(backend, world)
    buffer = xp.ones(OVERLAP_PROBE_BYTES // ITEM, np.float32)
    a = xp.ones((size, size), np.float32)
    b = xp.full((size, size), 0.5, np.float32)

    def gemms(count: int, request: Any = None) -> None:
        for _ in range(count):
            a @ b
            backend.sync()
            if request is not None:
                request.test()

    def alone() -> None:
        group.start_allreduce(buffer).wait()

    sum_time = _time_calls(world, alone, repeats, backend.sync)
    gemm_time = _time_calls(world, lambda: gemms(1), repeats, backend.sync)
    count = world.allreduce(max(1, round(sum_time / gemm_time)), op=MPI.MAX)

    def overlapped() -> None:
        request = group.start_allreduce(buffer)
        gemms(count, request)
        request.wait()

    compute_time = _time_calls(world, lambda: gemms(count), repeats, backend.sync)
    both_time = _time_calls(world, overlapped, repeats, backend.sync)
    return min(1.0, max(0.0, (sum_time + compute_time - both_time) / sum_time))


def measure(world: Any, backend: Any, settings: Settings,
            progress: Callable[[str], None] = _silent) -> list[Measured]:
    """Every (collective, p) of :func:`communicator_sizes`, on the real sub-communicators;
    ``progress`` is told as each collective starts (see :class:`Progress`)."""
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
                results.append(_sweep(collective, pr, comm, world, backend, settings))
        if wanted["allreduce"]:
            progress(f"allreduce on {_ranks(wanted['allreduce'])}")
        for pc in wanted["allreduce"]:
            comm = world if pc == size else grids.get((size // pc, pc)).batch_comm
            results.append(_sweep("allreduce", pc, comm, world, backend, settings))
        if wanted["alltoall"]:
            progress(f"alltoall on {_ranks(wanted['alltoall'])}")
        for p in wanted["alltoall"]:
            results.append(_sweep("alltoall", p, world, world, backend, settings))
        if wanted["halo"]:
            progress(f"halo messages on a chain of {size} ranks")
            chain = grids.get((size, 1)).model_comm
            results.append(_sweep("halo", 2, chain, world, backend, settings))
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


def measure_levels(world: Any, node: Any, backend: Any, settings: Settings,
                   progress: Callable[[str], None] = _silent
                   ) -> tuple[list[Measured], Sharing]:
    """Both levels of a job on several nodes (see the module's text): the fits inside a node,
    keyed by ranks, and between nodes, keyed by nodes, and the NIC sharing; ``progress`` is
    told as each collective of each level starts (see :class:`Progress`).

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
                results.append(_sweep(collective, k, comm, world, backend, settings))
        if per_node > 1:
            progress(f"inside a node: alltoall and halo messages on {per_node} ranks")
            results.append(_sweep("alltoall", per_node, node, world, backend, settings))
            chain = grids.get((per_node, nodes)).model_comm  # the node's ranks, in order
            results.append(_sweep("halo", 2, chain, world, backend, settings))
    across = world.Split(color=local, key=index)  # one rank per node: R of them, m ranks each
    between = level_sizes(nodes)
    groups = {m: across if m == nodes else across.Split(color=index // m, key=index)
              for m in between["allgather"]}
    alone = local == 0  # one rank per node talks; the others wait
    try:
        for collective in ("allgather", "reduce_scatter", "allreduce"):
            progress(f"between nodes: {collective} on {_ranks(between[collective], 'nodes')}")
            for m in between[collective]:
                results.append(_sweep(collective, m, groups[m], world, backend, settings,
                                      "network", alone))
        progress(f"between nodes: alltoall and halo messages on {nodes} nodes")
        results.append(_sweep("alltoall", nodes, across, world, backend, settings, "network",
                              alone))
        halo = _sweep("halo", 2, across, world, backend, settings, "network", alone)
        results.append(halo)
        sharing = Sharing(per_node)
        if per_node > 1:
            progress(f"between nodes: NIC sharing, 1 then {per_node} ranks of each node "
                     f"talking across")
            n_bytes, call = _benchmark("halo", across, backend, max(halo.sizes))
            sharing = Sharing(per_node, n_bytes,
                              _time_calls(world, call if alone else _idle, settings.repeats,
                                          backend.sync),
                              _time_calls(world, call, settings.repeats, backend.sync))
    finally:
        for comm in groups.values():
            if comm is not across:
                comm.Free()
        across.Free()
    if per_node > 1:
        results += _measure_shapes(world, per_node, backend, settings, progress)
    return results, sharing


def _measure_shapes(world: Any, per_node: int, backend: Any, settings: Settings,
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
            results.append(_sweep("allreduce", k * nodes, comm, world, backend, settings,
                                  "shape", per_node=k))
        for m in level_sizes(nodes)["allgather"]:
            comm = grids.get((per_node * m, size // (per_node * m))).model_comm
            for collective in ("allgather", "reduce_scatter"):
                results.append(_sweep(collective, per_node * m, comm, world, backend, settings,
                                      "shape", per_node=per_node))
    return results


def find_nodes(world: Any) -> Any:
    """This rank's node communicator; :class:`CalibrateError` on every rank at once when the
    ranks do not fill equal nodes in blocks (collective)."""
    from mpi4py import MPI

    from hpctrain.comm.nodes import placement

    node = world.Split_type(MPI.COMM_TYPE_SHARED, key=world.Get_rank())
    where = placement(world, node)
    problem = placement_problem(where.ranks_per_node, where.nodes, where.even, where.blocked)
    if problem:  # every rank learnt the same placement: all raise together
        node.Free()
        raise CalibrateError(problem)
    return node


def build_machine(settings: Settings, results: Sequence[Measured], flops: float, threads: int,
                  overlap: float, ranks_per_node: int, sharing: Sharing | None) -> Machine:
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
    return Machine(settings.name, halo.alpha, halo.beta, flops, settings.device, fits,
                   threads=threads, overlap=round(overlap, 2), ranks_per_node=ranks_per_node,
                   network=network)


def format_table(results: Sequence[Measured], flops: float, device: str,
                 precision_flops: dict[str, float] | None = None) -> str:
    """The fits, one line per (collective, p), and the FLOP rates (float32, and on a GPU each
    tensor-core precision's); with a level column when some were measured between nodes."""
    levels = any(m.level != "node" for m in results)
    level = (lambda name: f"{name:<9}") if levels else (lambda name: "")
    width = max([3, *(len(m.where) for m in results)])
    lines = [f"{level('level')}{'collective':<15}{'p':>{width}}{'alpha (us)':>13}"
             f"{'1/beta (GB/s)':>15}{'knee (MiB)':>12}{'past it (GB/s)':>16}{'worst resid':>13}"]
    for m in results:
        far = (f"{m.fit.knee / 2**20:>12.3g}{1 / m.fit.far_beta / 1e9:>16.3f}"
               if math.isfinite(m.fit.knee) else f"{'-':>12}{'-':>16}")
        lines.append(f"{level(m.level)}{m.collective:<15}{m.where:>{width}}"
                     f"{m.fit.alpha * 1e6:>13.2f}"
                     f"{1 / m.fit.beta / 1e9:>15.3f}{far}{m.residual:>13.1%}"
                     f"{' *' * m.floored}")
    if not results:
        lines.append("(one rank: no messages to time)")
    if levels:
        lines.append("p: ranks of one node at the node level, nodes (one rank on each) at the "
                     "network level, KxM (K ranks on each of M nodes, whole groups) for a shape")
    if any(m.floored for m in results):
        lines.append("* alpha or beta held at its floor: the times did not follow a line "
                     "(a noisy machine?); rerun, or raise --repeats")
    lines.append(f"flops: {flops / 1e9:.1f} GFLOP/s per rank (float32 GEMM, {device})")
    lines += [f"flops_{name}: {rate / 1e9:.1f} GFLOP/s per rank ({name} GEMM, {device})"
              for name, rate in (precision_flops or {}).items()]
    return "\n".join(lines)


def run(argv: list[str], comm: Any) -> int:
    """Parse ``argv``, calibrate on every rank of ``comm``, write the profile from rank 0.

    Returns 0. Raises :class:`CalibrateError` (a :class:`~hpctrain.errors.UserError`) on every
    rank for a bad option or ranks not placed in blocks, before any message is timed.
    """
    from hpctrain.comm.agree import on_root
    from hpctrain.device.backend import make_backend
    from hpctrain.device.threads import configure_threads

    args = build_parser().parse_args(argv)
    if args.from_log:
        return refit_from_logs(args, argv, comm)
    if args.machine is not None:
        raise CalibrateError("--machine names the profile to refit with --from-log; a "
                             "calibration measures its own")
    settings = _settings(args)
    probes = parse_probe_nets(args.probe_nets if args.probe_nets is not None else
                              "none" if args.quick else PROBE_NETS)
    rank, size = comm.Get_rank(), comm.Get_size()
    # only rank 0 writes, so only its view of the file system counts; share its verdict so every
    # rank raises the same error together
    problem = comm.bcast(_unwritable(settings.out) if rank == 0 else None, root=0)
    if problem:
        raise CalibrateError(problem)
    node = find_nodes(comm)
    per_node = node.Get_size()
    nodes = size // per_node
    threads = configure_threads(comm, args.threads)  # the GEMM rate is per rank at these threads
    backend = make_backend(settings.device, "fp32", comm, args.collectives)
    started = time.perf_counter()
    progress = Progress(rank)
    where = f" ({nodes} nodes of {per_node})" if nodes > 1 else ""
    progress(f"{size} ranks{where}: each collective timed at {settings.sizes} message sizes up "
             f"to {settings.max_bytes} B, median of {settings.repeats} calls" if size > 1 else
             "1 rank: no messages to time")
    sharing: Sharing | None = None
    try:
        if nodes == 1:
            results = measure(comm, backend, settings, progress)
        else:
            results, sharing = measure_levels(comm, node, backend, settings, progress)
    finally:
        node.Free()
    progress(f"FLOP rate: float32 GEMM of {settings.gemm_size}x{settings.gemm_size}")
    flops = measure_flops(comm, backend, settings.gemm_size, settings.repeats)
    if settings.device == "gpu":
        progress("FLOP rates on tensor cores: tf32, bf16 and fp16 GEMMs")
    precision_flops = measure_precision_flops(comm, backend, settings.gemm_size,
                                              settings.repeats)
    if size > 1:
        progress("overlap: a gradient sum in flight beside GEMMs")
    overlap = measure_overlap(comm, backend, OVERLAP_GEMM_SIZE, settings.repeats)
    machine = replace(build_machine(settings, results, flops, threads.threads, overlap, per_node,
                                    sharing), precision_flops=precision_flops)
    machine_measured = machine
    command = " ".join(["python -m hpctrain calibrate", *argv])
    far = far_sizes(settings.max_bytes, settings.far_bytes)
    far_note = f", {len(far)} up to {far[-1]} B past a knee" if far else ""
    comment = f"written by '{command}' on {size} processes{where}\n"
    comment += (f"on {socket.gethostname()} at {time.strftime('%Y-%m-%d %H:%M:%S')}: "
                f"{settings.sizes} sizes from {MIN_BYTES} B to {settings.max_bytes} B"
                f"{far_note}, median of {settings.repeats} calls, GEMM {settings.gemm_size}")
    # rank 0 writes; a failed write (OutputError) is raised on every rank
    on_root(comm, lambda: save_machine(machine, settings.out, comment))
    stepped = None
    if probes:  # the profile just written predicts the probe plans it is fitted to
        stepped = fit_to_probe_steps(settings.out, machine, probes, settings.device,
                                     args.threads, comm, progress, args.precision,
                                     args.collectives)
        on_root(comm, lambda: save_machine(stepped[0], settings.out, comment + (
            f"\nthen fitted to the training steps of {stepped[1].plans} probe plans")))
        machine = stepped[0]
    elapsed = time.perf_counter() - started
    if rank == 0:
        print(f"threads: {threads.describe()}")
        print(format_table(results, flops, settings.device, precision_flops))
        if sharing is None:
            print(f"one node ({per_node} rank{'s' if per_node > 1 else ''}): measured the node "
                  f"level only; calibrate on 2 or more nodes to measure the network between "
                  f"them")
        else:
            print(sharing.describe())
        print(f"overlap: {machine.overlap:.2f} of a gradient sum in flight moves while the "
              f"ranks compute (used with --overlap)")
        if stepped is not None:
            print(describe_fit(stepped[1], stepped[2], before=machine_measured,
                               what="the probe plans"))
        print(f"calibrated {size} rank{'s' if size > 1 else ''}{where} in {elapsed:.1f} s; wrote "
              f"{settings.out}", flush=True)
    comm.Barrier()  # on return the profile exists for every rank that shares rank 0's files
    return 0


def refit_from_logs(args: argparse.Namespace, argv: list[str], comm: Any) -> int:
    """``calibrate --from-log``: the profile ``--machine`` refitted to the logs' per-layer
    times, written to ``--out`` by rank 0; what changed, printed."""
    from hpctrain.comm.agree import on_root
    from hpctrain.cost.machine import load_machine
    from hpctrain.record.measured import read_measured_plans
    from hpctrain.record.refit import refit

    out = Path(args.out)
    problem = comm.bcast(_unwritable(out) if comm.Get_rank() == 0 else None, root=0)
    if problem:
        raise CalibrateError(problem)
    machine = load_machine(args.machine)
    plans = [p for path in args.from_log for p in read_measured_plans(Path(path))]
    names = ", ".join(Path(path).name for path in args.from_log)
    fitted, step_fit, found = refit(plans, machine, f"the per-layer times of {len(plans)} "
                                                    f"measured plans ({names})")
    fitted = replace(fitted, name=args.name)
    command = " ".join(["python -m hpctrain calibrate", *argv])
    comment = (f"written by '{command}' at {time.strftime('%Y-%m-%d %H:%M:%S')}: "
               f"{machine.name} refitted to {len(plans)} measured plans")
    on_root(comm, lambda: save_machine(fitted, out, comment))
    if comm.Get_rank() == 0:
        print(f"refitted {machine.name} to {step_fit.layers} layer times of {len(plans)} "
              f"plans ({names})")
        print(describe_fit(step_fit, found, machine, "these plans"))
        print(f"wrote {out}", flush=True)
    comm.Barrier()
    return 0


def describe_fit(step_fit: StepFit, found: list[PricedPlan], before: Machine, what: str) -> str:
    """What a fit to training steps changed, and the iteration errors of the plans fitted
    (on ``before``, then fitted), in lines."""
    from hpctrain.model.kinds import BEYOND_CACHE
    from hpctrain.record.refit import errors

    x = step_fit.links
    lines = [f"fitted to {step_fit.layers} layer times of {step_fit.plans} plans: alpha x "
             f"{x[0]:.3g}, beta x {x[1]:.3g} inside a node"
             + (f"; alpha x {x[2]:.3g}, beta x {x[3]:.3g} between nodes"
                if before.levelled else "")
             + (f" (x {FLOOR:g}: the least a fit gives, where the steps measured too little to "
                f"tell)" if FLOOR in x else "")]
    lines.append(f"work touching more than {step_fit.cache_bytes / 2**20:.3g} MiB per rank ran "
                 f"as from memory: its factors are fitted apart ('{BEYOND_CACHE.strip()}')"
                 if step_fit.cache_bytes else "one set of compute factors fits work of every "
                                              "size")
    lines += [f"compute of {kind}: forward x {f:.3g}, backward x {b:.3g}"
              for kind, (f, b) in sorted(step_fit.compute.items())]
    was, now = np.abs(errors(found, before)), np.abs(errors(found, before, step_fit))
    lines.append(f"iteration prediction error of {what}: median {np.median(was):.1%} before, "
                 f"{np.median(now):.1%} after (fitted on them: validate on other nets with "
                 f"compare-plans)")
    return "\n".join(lines)
