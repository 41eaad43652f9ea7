"""Compute time of one rank's local kernels: measured on the device, or from a FLOP rate.

A :class:`~hpctrain.cost.work.LocalWork` is what one rank computes for one layer under a
candidate grid: the operation (a layer kind, the optimizer's update, the input batch) and the
exact local shapes (the largest block, since the slowest rank sets the pace); its operation says
how to run and count it. :class:`MeasuredCompute` runs the real forward and backward kernels at
those shapes (warm-up calls until two agree, then the median of 3 to 5 samples of the
slowest rank, within a time budget) and caches the result on disk under a key that holds
everything that changes a timing (:class:`TimingContext`: the device, dtype, threads per rank,
ranks per node, BLAS library, how freed memory is handled, and the hpctrain version with a hash
of the timed code), so a second plan of the same net is instant and a timing taken under other
conditions is never used. Each entry also keeps when it was taken and the share of its cores
the ranks got meanwhile (:mod:`hpctrain.cost.conditions`): a timing taken while another process
ran is timed again the next time it is needed, and a plan priced with such timings says so.
``--retime`` times every kernel a plan needs afresh. The cache is this checkout's own
(:func:`default_cache_path`): two checkouts share timings only where ``HPCTRAIN_CACHE_DIR``
says so.
When P ranks plan together they time each kernel at the same moment, so the times include the
contention of training (shared cores, memory bandwidth). :class:`FlopModel` stands in when planning
for a machine we are not on.
"""

from __future__ import annotations

import copy
import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from hpctrain.cost.conditions import QUIET_SHARE, cpu_share, share_allowed
from hpctrain.cost.work import Kernels, LocalWork
from hpctrain.device.caches import evict_caches, eviction_bytes
from hpctrain.errors import OutputError
from hpctrain.io.files import replace_atomically

SAMPLE_BUDGET = 0.15  # seconds of timed calls per kernel and direction, roughly
SHARE_SECONDS = 0.05  # the busy loop that checks the ranks' share of their cores, per timing
SHARE_FIELD = 4  # a cache entry: forward, backward, seconds spent, when taken, share of cores
MIN_SAMPLES = 3  # the fewest samples, so that their median sets one slow call aside
# Calls before the samples: at least WARM_UPS, then until two calls in a row agree within
# STEADY of the faster, at most MOST_WARM_UPS, and no more once WARM_UP_BUDGET seconds went
# into them. The first call pays for fresh memory, BLAS threads and, on a GPU, kernel
# compilation. Under glibc's own malloc the second is still slow on the CPU (AlexNet's conv1
# forward: 50, 58, then 18-24 ms): the first free of a large array raises its mmap threshold, so
# the second call grows the heap and faults its pages in; a kernel whose arrays take a new peak
# of the process's memory is slow for longer (a 3-D convolution's 221 MB of columns: 358, 465,
# 168, then 70 ms). With freed memory kept (hpctrain.device.allocator) the second call reuses
# the first one's memory.
WARM_UPS = 2
MOST_WARM_UPS = 6
STEADY = 0.25
WARM_UP_BUDGET = 1.0


class FlopModel:
    """Time = FLOPs / rate, with the rate of a machine profile."""

    def __init__(self, flops_per_second: float) -> None:
        self.rate = flops_per_second

    def times(self, works: Sequence[LocalWork]) -> dict[LocalWork, tuple[float, float]]:
        return {w: tuple(f / self.rate for f in w.flops()) for w in works}


@lru_cache(maxsize=8)
def code_version(modules: tuple[str, ...]) -> str:
    """'hpctrain VERSION+HASH': the version and a hash of the source of ``modules`` (those whose
    code runs inside a timing: :data:`hpctrain.model.operations.TIMED_MODULES`)."""
    import hashlib
    import importlib

    from hpctrain import __version__

    digest = hashlib.sha256()
    for name in modules:
        digest.update(Path(importlib.import_module(name).__file__).read_bytes())
    return f"hpctrain {__version__}+{digest.hexdigest()[:12]}"


def device_name(backend: Any) -> str:
    """The processor the kernels run on: the GPU's name, or the CPU's model name."""
    if backend.device == "gpu":
        props = backend.xp.cuda.runtime.getDeviceProperties(backend.xp.cuda.Device().id)
        return f"gpu {props['name'].decode()}"
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return f"cpu {line.split(':', 1)[1].strip()}"
    except OSError:
        pass
    import platform

    return f"cpu {platform.machine()}"


@dataclass(frozen=True)
class TimingContext:
    """Under what conditions kernels are timed: part of every cache key, so that a timing taken
    under other conditions is never used."""

    device: str  # the processor (device_name)
    dtype: str
    threads: int  # per rank
    ranks_on_node: int
    blas: str  # the BLAS library and its version
    allocator: str  # how freed memory is handled (hpctrain.device.allocator)
    code: str  # the version of the timed code (code_version)

    def key(self) -> str:
        return (f"{self.device}|{self.dtype}|{self.threads} threads|{self.ranks_on_node} ranks "
                f"per node|{self.blas}|{self.allocator}|{self.code}")


def timing_context(backend: Any, threads: int, ranks_on_node: int, blas: str, allocator: str,
                   code: str) -> TimingContext:
    """The conditions of timing on ``backend`` (its device and precision) under ``threads``
    per rank, ``ranks_on_node`` ranks per node, the BLAS ``blas`` and the allocator's handling
    ``allocator``, of the code ``code``."""
    return TimingContext(device_name(backend), timed_dtype(backend), threads, ranks_on_node,
                         blas, allocator, code)


def timed_dtype(backend: Any) -> str:
    """The dtype part of a timing's key: the storage dtype's name ('float32', 'float64') for a
    plain precision, else the dtype and the precision ('float32 tf32', 'bfloat16 bf16'): tf32
    stores float32 as fp32 does, but its products run on tensor cores."""
    name = np.dtype(backend.dtype).name
    precision = getattr(backend, "precision", None)
    if precision is None or precision.name in ("fp32", "fp64"):
        return name
    return f"{name} {precision.name}"


def default_cache_path() -> Path:
    """The kernel timings' cache: ``$HPCTRAIN_CACHE_DIR/compute-times.json`` where set (a
    cache shared on purpose), else one of this checkout's own under the user's cache directory
    (``~/.cache/hpctrain/CHECKOUT/``, CHECKOUT a hash of where the package lies): another
    checkout, with other local changes or none, never reads this one's timings."""
    shared = os.environ.get("HPCTRAIN_CACHE_DIR")
    if shared:
        return Path(shared) / "compute-times.json"
    import hashlib

    package = Path(__file__).resolve().parent.parent
    checkout = hashlib.sha256(str(package).encode()).hexdigest()[:16]
    root = Path(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"))
    return root / "hpctrain" / checkout / "compute-times.json"


def _random(xp: Any, rng: np.random.Generator, shape: tuple[int, ...], dtype: Any) -> Any:
    """Values in [-0.5, 0.5): a kernel's speed does not depend on them, so a block of up to 64 Ki
    random values is repeated to fill the shape (drawing every value took a third of the
    timing of a plan)."""
    size = math.prod(shape)
    # drawn in float32 (or float64) and rounded: NumPy draws no 16-bit floats
    draw = np.float64 if np.dtype(dtype) == np.float64 else np.float32
    block = (rng.random(min(size, 1 << 16), dtype=draw) - 0.5).astype(dtype)
    return xp.asarray(np.resize(block, size).reshape(shape))


def _kernels(xp: Any, work: LocalWork, dtype: Any, rng: np.random.Generator) -> Kernels:
    """``forward()`` of ``work`` on random data, and ``backward_of(forward's output)`` giving
    its ``backward()``, as its operation makes them: the backward needs what a forward saved,
    so the forward timed first hands its output over and no extra forward runs."""
    def random(shape: tuple[int, ...]) -> Any:
        return _random(xp, rng, shape, dtype)

    return work.op.kernels(xp, work, dtype, random)


def _read_cache(path: Path | None) -> dict[str, list[float]]:
    if path is None or not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # an unreadable cache is measured again and rewritten


class TimingProgress:
    """A line on a terminal while kernels are timed: how many of those needed are timed, and
    about how long the rest will take, rewritten in place and wiped when the last is timed.

    Timing a cold cache takes from nothing to minutes (an Inception-v3 plan times hundreds of
    kernels), so the line appears once timing has taken ``after`` seconds and is estimated to
    take ``after`` more; a quick timing prints nothing. The time left is the time so far per
    kernel timed, times the kernels left: each kernel's timing is mostly its warm-up calls and
    its budget of samples, whatever its size (from FLOPs, as
    :meth:`MeasuredCompute.seconds_to_time` estimates, the first small kernels timed made a
    minute's timing of ResNet-50's kernels look like hours). Nothing is written where
    ``stream`` is not a terminal (a pipe, a log file): a plan's output stays the plan.

    Example: ``timing kernels: 41 of 113, about 0:37 left``.
    """

    def __init__(self, stream: TextIO | None, total: int, after: float = 1.0,
                 every: float = 0.2) -> None:
        self.stream = stream if stream is not None and stream.isatty() else None
        self.total, self.done = total, 0
        self.after, self.every = after, every
        self.start = time.monotonic()
        self.shown_at, self.width = -math.inf, 0

    def advance(self) -> None:
        """Count one more kernel timed, and show the line where it is due."""
        self.done += 1
        now = time.monotonic()
        if self.stream is None or self.done >= self.total or now - self.shown_at < self.every:
            return
        spent = now - self.start
        left = spent * (self.total - self.done) / self.done
        if spent < self.after or (self.width == 0 and left < self.after):
            return
        line = f"timing kernels: {self.done} of {self.total}, about {_clock(left)} left"
        self.stream.write("\r" + line.ljust(self.width))
        self.stream.flush()
        self.shown_at, self.width = now, len(line)

    def finish(self) -> None:
        """Wipe the line, if one was shown."""
        if self.stream is not None and self.width:
            self.stream.write("\r" + " " * self.width + "\r")
            self.stream.flush()
            self.width = 0


def _clock(seconds: float) -> str:
    """3725 -> '1:02:05'; 65 -> '1:05'."""
    minutes, secs = divmod(int(seconds + 0.5), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class MeasuredCompute:
    """Forward and backward seconds of each work, timed on this device and cached on disk.

    Parameters
    ----------
    backend : where and in what dtype to run (a :class:`~hpctrain.device.backend.Backend`).
    comm : the ranks that time together (every rank times the same kernel at the same moment,
        and the slowest sets the time); None for this process alone.
    context : the conditions of the timing (:func:`timing_context`), part of every key; None:
        no conditions (the timings are for this object alone, with no cache).
    cache : the JSON cache file; None for no cache. Entries timed by other hpctrain code than
        ``context``'s are dropped when it is rewritten.
    step_bytes : what a training step keeps on each rank (None: more than the caches hold):
        what a step touches between two calls of a kernel decides whether they find its data
        in cache, so each sample evicts as much (:func:`~hpctrain.device.caches.eviction_bytes`),
        and the amount is part of every key.
    progress : where rank 0 shows a :class:`TimingProgress` line while it times kernels
        (standard output by default: only on a terminal); None: nowhere.
    """

    def __init__(self, backend: Any, comm: Any = None, context: TimingContext | None = None,
                 cache: Path | None = None, repeats: int = 5,
                 step_bytes: float | None = None, retime: bool = False,
                 progress: TextIO | None = sys.stdout) -> None:
        self.backend, self.comm, self.repeats = backend, comm, repeats
        self.progress = progress if comm is None or comm.Get_rank() == 0 else None
        self.context, self.cache = context, cache if context is not None else None
        self.evict = eviction_bytes(step_bytes) if backend.device == "cpu" else 0
        conditions = f"{context.key()}|" if context is not None else "|"
        self.prefix = f"{conditions}evict {self.evict}|"  # a timing holds the cache state it saw
        self.timed = 0  # kernels timed by this object (not found in the cache)
        self.known: dict[str, list[float]] = {}
        if comm is None or comm.Get_rank() == 0:
            self.known = _read_cache(cache)
        if comm is not None:  # rank 0's view of the cache and its conditions, so that every
            # rank times the same kernels (a rank launched with other settings would look up
            # other keys, time other kernels and wait at the others' barriers)
            self.prefix, self.known = comm.bcast((self.prefix, self.known), root=0)
        # timings not to use again: every one with retime, else those taken while the ranks got
        # less of their cores than a quiet node gives
        self.stale = (set(self.known) if retime else
                      {key for key, entry in self.known.items()
                       if len(entry) > SHARE_FIELD and entry[SHARE_FIELD] < QUIET_SHARE})
        self.busy_timed, self.least_share = 0, 1.0  # kernels this object timed busy, how busy

    def _time(self, fn: Callable[[], Any]) -> tuple[float, Any]:
        """Seconds of ``fn`` on the slowest rank, every rank running it at the same moment
        (the median over samples of each sample's slowest rank), and what the last warm-up
        returned.

        Training waits for the slowest rank at every collective, so a layer costs the expected
        maximum over ranks of its time, not any one rank's typical time: when two ranks' calls
        jitter independently, the maximum lies above either's median.

        Warm-up calls (never samples): ``WARM_UPS`` at least, more while the last two
        disagree (see ``STEADY``), so the samples see the kernel as training's later steps do.
        The samples fit a budget of about ``SAMPLE_BUDGET`` seconds, ``MIN_SAMPLES`` of them at
        least and ``repeats`` at most: planning times every candidate's kernels, and a long
        kernel varies little from call to call. Their median, not their mean: on a virtual
        machine one call in ten or so takes two to four times the others (the host faulting a
        page in, another guest's burst), and a kernel timed once is priced with that one timing
        in every plan that has it. Timed twice, the kernels of the probe nets' plans differed
        by a time-weighted mean ``|log|`` of the ratio of 0.145 under this rule, and of 0.239
        under two warm-ups and the mean of as few as one sample (``bench/kernel_timing.py``);
        0.097 with freed memory kept (:mod:`hpctrain.device.allocator`), whose kernels no longer
        fault their outputs' pages in afresh on every call. All ranks decide alike (each call's
        time is the slowest rank's) so that their barriers pair up.
        """
        calls, spent, previous = 0, 0.0, math.inf
        while True:
            start = time.perf_counter()
            output = fn()
            self.backend.sync()
            warm = self._slowest(time.perf_counter() - start)
            calls, spent = calls + 1, spent + warm
            steady = abs(warm - previous) <= STEADY * min(warm, previous)
            if calls >= MOST_WARM_UPS or (calls >= WARM_UPS and (steady
                                                                  or spent > WARM_UP_BUDGET)):
                break
            previous = warm
        repeats = max(1, min(self.repeats,
                             max(MIN_SAMPLES, int(SAMPLE_BUDGET / max(warm, 1e-9)))))
        samples = np.empty(repeats)
        for k in range(repeats):
            evict_caches(self.backend.device, self.evict)  # as a step leaves them
            if self.comm is not None:
                self.comm.Barrier()
            start = time.perf_counter()
            fn()
            self.backend.sync()
            samples[k] = time.perf_counter() - start
        if self.comm is not None:  # sample k of every rank ran at the same moment
            from mpi4py import MPI

            self.comm.Allreduce(MPI.IN_PLACE, samples, MPI.MAX)
        return float(np.median(samples)), output

    def _slowest(self, seconds: float) -> float:
        """``seconds`` of the slowest rank (this process's alone without ``comm``)."""
        if self.comm is None:
            return seconds
        from mpi4py import MPI

        return self.comm.allreduce(seconds, op=MPI.MAX)

    def _share(self) -> float:
        """The least share of what its cores allow that any rank gets now
        (:func:`~hpctrain.cost.conditions.cpu_share`; a rank allowed a whole core on a node of
        as many cores as ranks, else cores / ranks)."""
        from hpctrain.device.cpus import affinity  # only where kernels are timed

        ranks = self.context.ranks_on_node if self.context is not None else 1
        share = cpu_share(SHARE_SECONDS) / share_allowed(len(affinity()), ranks)
        if self.comm is None:
            return share
        from mpi4py import MPI

        return float(self.comm.allreduce(share, op=MPI.MIN))

    def conditions_lines(self) -> list[str]:
        """What a plan priced with these timings should say of how they were taken."""
        if not self.busy_timed:
            return []
        return [f"warning: {self.busy_timed} kernels were timed while a rank got "
                f"{self.least_share:.0%} of its cores (another process ran): the plan may "
                f"mislead; plan again on a quiet node, and they are timed again"]

    def _stale(self, work: LocalWork) -> bool:
        key = self.prefix + work.key()
        return key not in self.known or key in self.stale

    def times(self, works: Sequence[LocalWork]) -> dict[LocalWork, tuple[float, float]]:
        todo = sorted({w for w in works if self._stale(w)}, key=LocalWork.key)
        if todo:
            # the eviction buffer's pages faulted in first: a kernel's first sample after they
            # were took three times its others (a new peak of the process's memory)
            evict_caches(self.backend.device, self.evict)
            rng = np.random.default_rng(0)
            self.timed += len(todo)
            share, taken = self._share(), round(time.time())
            if share < QUIET_SHARE:
                self.busy_timed += len(todo)
                self.least_share = min(self.least_share, share)
            progress = TimingProgress(self.progress, len(todo))
            try:
                for work in todo:
                    self._time_work(work, rng, taken, share)
                    progress.advance()
            finally:
                progress.finish()
            self._save()
        return {w: tuple(self.known[self.prefix + w.key()][:2]) for w in works}

    def _time_work(self, work: LocalWork, rng: np.random.Generator, taken: int,
                   share: float) -> None:
        """Time ``work``'s forward and backward into :attr:`known`, noting it was ``taken``
        (seconds since the epoch) while the ranks got ``share`` of their cores."""
        start = time.perf_counter()
        forward, backward_of = _kernels(self.backend.xp, work, self.backend.dtype, rng)
        forward_seconds, output = self._time(forward)
        backward_seconds, _ = self._time(backward_of(output))
        # what timing it took, set-up included: the slowest rank's, as the times are
        spent = self._slowest(time.perf_counter() - start)
        # already the slowest rank's, the same on every rank (see _time)
        key = self.prefix + work.key()
        self.known[key] = [forward_seconds, backward_seconds, spent, taken, round(share, 3)]
        self.stale.discard(key)

    def seconds_to_time(self, works: Sequence[LocalWork], timed: Sequence[LocalWork]) -> float:
        """About how long :meth:`times` would take over ``works``, from what timing the kernels
        of ``timed`` took (those in the cache; the others count nothing): zero for each of
        ``works`` in the cache; for each other, what ``_calls_seconds`` says its calls
        take at the rate the kernels of ``timed`` ran at (the FLOPs they did over the seconds
        they took), times how far timing those kernels took longer than the same sum says of
        them (first calls fault fresh memory in, the random inputs are drawn, each sample
        evicts the caches first), where the cache recorded it. The same on every rank: the
        cache and the timings are."""
        found = [(w, self.known[self.prefix + w.key()]) for w in dict.fromkeys(timed)
                 if self.prefix + w.key() in self.known]
        flops = sum(sum(w.flops()) for w, _ in found)
        seconds = sum(entry[0] + entry[1] for _, entry in found)
        if flops <= 0 or seconds <= 0:
            return math.inf  # no rate to go by: as if it took too long
        rate = flops / seconds
        spent = [(entry[2], self._calls_seconds(entry[:2])) for _, entry in found
                 if len(entry) > 2]
        overhead = max(1.0, sum(s for s, _ in spent) / sum(c for _, c in spent)) if spent else 1.0
        total = 0.0
        for work in dict.fromkeys(works):
            if self.prefix + work.key() not in self.known:
                total += overhead * self._calls_seconds([f / rate for f in work.flops()])
        return total

    def seconds_spent(self, works: Sequence[LocalWork]) -> float:
        """The seconds the timing of ``works`` took, set-up included, where the cache recorded
        it; the calls alone (``_calls_seconds``) for the others it holds; nothing for
        what it does not hold. The same on every rank."""
        total = 0.0
        for work in dict.fromkeys(works):
            entry = self.known.get(self.prefix + work.key())
            if entry is not None:
                total += entry[2] if len(entry) > 2 else self._calls_seconds(entry[:2])
        return total

    def _calls_seconds(self, seconds: Sequence[float]) -> float:
        """The seconds of the calls :meth:`_time` makes to time a kernel whose forward and
        backward take ``seconds``: per direction, the warm-up calls and the samples that fill
        the sample budget (``MIN_SAMPLES`` at least, ``repeats`` at most); a kernel that
        takes longer to settle makes more."""
        return sum(WARM_UPS * call
                   + min(self.repeats * call, max(SAMPLE_BUDGET, MIN_SAMPLES * call))
                   for call in seconds)

    def again(self) -> MeasuredCompute:
        """A timing under the same conditions, on the same ranks, that knows no times and keeps
        none: every kernel asked of it is timed afresh, at that moment."""
        found = copy.copy(self)
        found.known, found.cache, found.timed, found.stale = {}, None, 0, set()
        found.busy_timed, found.least_share = 0, 1.0
        return found

    def _save(self) -> None:
        if self.cache is None or (self.comm is not None and self.comm.Get_rank() != 0):
            return
        current = self.context.code  # timings of other code can never be used again
        text = json.dumps({k: v for k, v in self.known.items() if current in k}, indent=0,
                          sort_keys=True)
        try:  # atomic: a crash leaves the old cache or the new one
            replace_atomically(self.cache, lambda tmp: tmp.write_text(text))
        except OutputError:
            pass  # a read-only home only costs re-measuring next time


class MedianCompute:
    """Each kernel at the median of its forward and of its backward times over several
    timings (objects with ``times``, such as :meth:`MeasuredCompute.again` of one another),
    taken at several moments: a slow moment of the machine while one of them ran sets no
    kernel's time (of two timings, their mean). Asked for a kernel one of them has not timed,
    that one times it now."""

    def __init__(self, timings: Sequence[Any]) -> None:
        self.timings = list(timings)

    def times(self, works: Sequence[LocalWork]) -> dict[LocalWork, tuple[float, float]]:
        each = [timing.times(works) for timing in self.timings]
        return {w: tuple(float(np.median([found[w][d] for found in each])) for d in (0, 1))
                for w in works}
