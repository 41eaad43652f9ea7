"""The compute-time cache: a timing is reused only under the conditions it was taken in."""

import io
import json

import numpy as np
import pytest

from hpctrain.cost.compute import MeasuredCompute, TimingProgress, code_version, timing_context
from hpctrain.cost.work import LocalWork
from hpctrain.device.backend import Backend
from hpctrain.model.kinds import KINDS
from hpctrain.model.operations import TIMED_MODULES, UPDATE

WORK = LocalWork(KINDS["relu"], (2, 3, 4, 4))
CODE = code_version(TIMED_MODULES)


def counting(compute: MeasuredCompute) -> list:
    """Record each kernel ``compute`` times (every ``_time`` call)."""
    calls = []
    timed = compute._time

    def count(fn):
        calls.append(fn)
        return timed(fn)

    compute._time = count
    return calls


def test_the_key_holds_every_condition_that_changes_a_timing():
    backend = Backend(np, np.float32)
    key = timing_context(backend, 4, 16, "openblas 0.3.27 (pthreads)", "freed memory kept",
                         CODE).key()
    for part in ("float32", "4 threads", "16 ranks per node", "openblas 0.3.27",
                 "freed memory kept", CODE):
        assert part in key
    assert key.startswith("cpu ")  # the processor's model name follows
    assert (timing_context(backend, 1, 16, "openblas", "kept", CODE).key()
            != timing_context(backend, 2, 16, "openblas", "kept", CODE).key())
    assert (timing_context(backend, 1, 16, "openblas", "kept", CODE).key()
            != timing_context(backend, 1, 16, "openblas", "as it is", CODE).key())
    assert CODE.startswith("hpctrain ") and "+" in CODE


def test_a_timing_is_reused_under_the_same_conditions_only(tmp_path):
    cache = tmp_path / "times.json"
    backend = Backend(np, np.float32)
    one, four = (timing_context(backend, t, 1, "blas", "kept", CODE) for t in (1, 4))
    first = MeasuredCompute(backend, context=one, cache=cache, repeats=2)
    calls = counting(first)
    first.times([WORK])
    assert len(calls) == 2  # forward and backward
    again = MeasuredCompute(backend, context=one, cache=cache, repeats=2)
    calls = counting(again)
    assert again.times([WORK]) == first.times([WORK]) and calls == []
    other = MeasuredCompute(backend, context=four, cache=cache, repeats=2)
    calls = counting(other)
    other.times([WORK])
    assert len(calls) == 2  # other threads per rank: timed afresh, never borrowed
    assert len(json.loads(cache.read_text())) == 2


def test_a_timing_evicts_what_a_step_keeps_and_is_kept_under_that_state(tmp_path, monkeypatch):
    # A step that keeps 3 MiB on a rank leaves its kernels' data in a larger cache: their
    # timings evict 1.5x that, not the whole cache, and are never reused for a larger step.
    from hpctrain.cost import compute
    from hpctrain.device.caches import eviction_bytes

    written = []
    monkeypatch.setattr(compute, "evict_caches", lambda device, nbytes: written.append(nbytes))
    monkeypatch.setattr("hpctrain.device.caches.last_level_cache_bytes", lambda: 64 << 20)
    cache = tmp_path / "times.json"
    backend = Backend(np, np.float32)
    context = timing_context(backend, 1, 1, "blas", "kept", CODE)
    small = MeasuredCompute(backend, context=context, cache=cache, repeats=2, step_bytes=3 << 20)
    small.times([WORK])
    assert set(written) == {3 * (3 << 20) // 2}
    written.clear()
    # far beyond the cache: all of it
    large = MeasuredCompute(backend, context=context, cache=cache, repeats=2, step_bytes=1 << 40)
    calls = counting(large)
    large.times([WORK])
    assert len(calls) == 2 and set(written) == {3 * (64 << 20) // 2}
    assert len(json.loads(cache.read_text())) == 2  # one entry per cache state
    assert eviction_bytes(None) == 3 * (64 << 20) // 2  # a step not known: all of it


@pytest.mark.parametrize("name", ["smallcnn", "resdigits"])  # a chain, a graph with batch norm
def test_the_step_a_plan_keeps_is_the_serial_memory_over_the_ranks(name):
    from hpctrain.cost.compute import FlopModel
    from hpctrain.cost.machine import load_machine
    from hpctrain.model.net import load_net
    from hpctrain.plan.planner import plan_network
    from hpctrain.plan.pricing import CostModel, step_bytes

    net, machine = load_net(name), load_machine("default")
    for procs in (1, 2, 4):
        model = CostModel(net, 16, procs, machine, FlopModel(1e9))
        one = plan_network(CostModel(net, 16, 1, machine, FlopModel(1e9)))
        kept = sum(c.memory for c in [one.data, *one.layers, one.loss])
        least = step_bytes(net, 16, procs, machine)
        assert least == pytest.approx(kept / procs)
        assert plan_network(model).memory >= least  # a lower bound, never above


def test_timings_of_other_code_are_dropped_when_the_cache_is_rewritten(tmp_path):
    cache = tmp_path / "times.json"
    stale = "cpu x|float32|1 threads|1 ranks per node|blas|hpctrain 0.0.1+000000000000|relu|..."
    cache.write_text(json.dumps({stale: [1.0, 1.0]}))
    backend = Backend(np, np.float32)
    context = timing_context(backend, 1, 1, "blas", "kept", CODE)
    compute = MeasuredCompute(backend, context=context, cache=cache, repeats=2)
    compute.times([WORK])
    kept = json.loads(cache.read_text())
    assert stale not in kept and len(kept) == 1 and CODE in next(iter(kept))


def scripted_kernel(monkeypatch, durations):
    """A kernel whose calls take ``durations`` seconds in turn on a clock of its own, and the
    list its calls are counted in."""
    from hpctrain.cost import compute

    now = [0.0]
    monkeypatch.setattr(compute.time, "perf_counter", lambda: now[0])
    calls = []

    def kernel() -> str:
        now[0] += durations[len(calls)]
        calls.append(1)
        return "output"

    return kernel, calls


def test_the_first_two_calls_are_never_samples(monkeypatch):
    # A kernel's first call pays for fresh memory; under glibc's own malloc its second pays for
    # the heap glibc grows once the first large free raises its mmap threshold: neither is what a
    # training step pays.
    kernel, calls = scripted_kernel(monkeypatch, [0.5] + [0.02] * 6)
    timer = MeasuredCompute(Backend(np, np.float32), repeats=4)
    seconds, output = timer._time(kernel)
    # the third call agrees with the second: warm; the 0.02 s calls fit every sample asked for
    assert seconds == pytest.approx(0.02) and output == "output" and len(calls) == 3 + 4


def test_warm_up_lasts_until_two_calls_agree_and_the_median_sets_a_slow_sample_aside(
        monkeypatch):
    # a 3-D convolution's calls as this machine ran them: slow until its memory settled, then
    # one sample in three slowed by the host
    kernel, calls = scripted_kernel(monkeypatch, [0.036, 0.047, 0.017, 0.007, 0.0072, 0.007,
                                                  0.066, 0.0071])
    seconds, _ = MeasuredCompute(Backend(np, np.float32), repeats=3)._time(kernel)
    # five warm-up calls (0.007 and 0.0072 agree), then the three samples asked for
    assert len(calls) == 5 + 3 and seconds == pytest.approx(0.0071)


def test_warm_up_stops_at_its_limits(monkeypatch):
    from hpctrain.cost.compute import MOST_WARM_UPS, WARM_UP_BUDGET

    never_steady = [0.001 * 2 ** k for k in range(MOST_WARM_UPS)] + [0.01] * 3
    kernel, calls = scripted_kernel(monkeypatch, never_steady)
    MeasuredCompute(Backend(np, np.float32), repeats=3)._time(kernel)
    assert len(calls) == MOST_WARM_UPS + 3
    # calls that take the whole budget between them: two, then the samples
    slow = WARM_UP_BUDGET
    kernel, calls = scripted_kernel(monkeypatch, [slow, 2 * slow / 3] + [slow] * 3)
    MeasuredCompute(Backend(np, np.float32), repeats=3)._time(kernel)
    assert len(calls) == 2 + 3


def test_the_code_version_covers_every_timed_operation_and_kernel():
    import pkgutil

    import hpctrain.kernels

    for module in pkgutil.iter_modules(hpctrain.kernels.__path__):
        assert f"hpctrain.kernels.{module.name}" in TIMED_MODULES
    # a kind's own module and the bases it inherits its kernels from
    for name in ("hpctrain.model.kinds.maxpool", "hpctrain.model.kinds.window",
                 "hpctrain.model.kinds.base", "hpctrain.model.operations"):
        assert name in TIMED_MODULES


def test_the_update_is_timed_as_the_optimizer_runs_it():
    # the timed update runs the optimizer's kernel: the same numbers on the same arrays
    from hpctrain.layers.base import Parameter
    from hpctrain.run.optimizer import SGD

    values = np.random.default_rng(0).random(7000, dtype=np.float32)
    made = []

    def random(shape):
        made.append(values.reshape(shape).copy())
        return made[-1]

    work = LocalWork(UPDATE, (7000,))
    forward, backward_of = UPDATE.kernels(np, work, np.float32, random)
    step = backward_of(forward())
    shard = Parameter("w", values.copy(), (7000,))
    shard.grad = np.ones(7000, np.float32)  # one array, overwritten in place, as the timed one
    optimizer = SGD([shard], 0.01, 0.9, 5e-4)
    for _ in range(3):
        step()
        optimizer.step()
    assert np.array_equal(made[0], shard.value)
    assert UPDATE.flops(work) == (0.0, 5.0 * 7000)


def test_every_rank_keys_its_timings_by_rank_0s_conditions():
    # ranks launched with other settings (threads, malloc) would otherwise look up other keys,
    # time other kernels and wait at each other's barriers
    class SecondRank:
        def Get_rank(self):
            return 1

        def bcast(self, value, root=0):
            assert root == 0
            _, known = value
            return "rank 0's conditions|", known

    backend = Backend(np, np.float32)
    context = timing_context(backend, 1, 1, "blas", "kept", CODE)
    compute = MeasuredCompute(backend, comm=SecondRank(), context=context)
    assert compute.prefix == "rank 0's conditions|"


def test_a_timing_again_times_every_kernel_afresh_and_keeps_none(tmp_path):
    cache = tmp_path / "times.json"
    backend = Backend(np, np.float32)
    context = timing_context(backend, 1, 1, "blas", "kept", CODE)
    first = MeasuredCompute(backend, context=context, cache=cache, repeats=2)
    first.times([WORK])
    kept = cache.read_text()
    again = first.again()
    calls = counting(again)
    times = again.times([WORK])
    assert len(calls) == 2 and again.timed == 1  # forward and backward, timed now
    assert set(times) == {WORK} and all(t > 0 for t in times[WORK])
    assert cache.read_text() == kept and again.prefix == first.prefix
    assert first.timed == 1  # the first timing is left as it was


def test_the_median_timing_takes_each_kernel_and_direction_apart():
    from hpctrain.cost.compute import MedianCompute

    class Fixed:
        def __init__(self, forward, backward):
            self.found = (forward, backward)

        def times(self, works):
            return {w: self.found for w in works}

    median = MedianCompute([Fixed(1.0, 9.0), Fixed(3.0, 2.0), Fixed(2.0, 4.0)])
    assert median.times([WORK]) == {WORK: (2.0, 4.0)}


def test_a_timing_taken_on_a_busy_machine_is_timed_again_and_the_plan_says_so(tmp_path,
                                                                               monkeypatch):
    """Each cache entry keeps when it was taken and the share of its cores the ranks got. One
    taken while another process ran (a share below a quiet node's) is timed again the next
    time it is needed, and the compute that timed it says so; a quiet one is reused; --retime
    times every kernel again."""
    import time

    from hpctrain.cost import compute
    from hpctrain.cost.conditions import QUIET_SHARE

    cache = tmp_path / "times.json"
    backend = Backend(np, np.float32)
    context = timing_context(backend, 1, 1, "blas", "kept", CODE)
    monkeypatch.setattr(compute, "cpu_share", lambda seconds=0.0: 0.3)
    busy = MeasuredCompute(backend, context=context, cache=cache, repeats=2)
    busy.times([WORK])
    (entry,) = json.loads(cache.read_text()).values()
    assert entry[4] == 0.3 < QUIET_SHARE and abs(entry[3] - time.time()) < 600
    assert busy.conditions_lines() and "1 kernels were timed while a rank got 30%" in (
        busy.conditions_lines()[0])
    monkeypatch.setattr(compute, "cpu_share", lambda seconds=0.0: 1.0)
    quiet = MeasuredCompute(backend, context=context, cache=cache, repeats=2)
    calls = counting(quiet)
    quiet.times([WORK])
    assert len(calls) == 2 and quiet.conditions_lines() == []  # timed again, quietly
    reused = MeasuredCompute(backend, context=context, cache=cache, repeats=2)
    calls = counting(reused)
    reused.times([WORK])
    assert calls == []
    retimed = MeasuredCompute(backend, context=context, cache=cache, repeats=2, retime=True)
    calls = counting(retimed)
    retimed.times([WORK])
    retimed.times([WORK])  # once afresh, then from what it timed
    assert len(calls) == 2


def test_the_cache_is_this_checkouts_own_unless_shared_on_purpose(monkeypatch, tmp_path):
    from hpctrain.cost import compute

    monkeypatch.delenv("HPCTRAIN_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    mine = compute.default_cache_path()
    assert mine.parent.parent == tmp_path / "hpctrain" and mine.name == "compute-times.json"
    monkeypatch.setattr(compute, "__file__", str(tmp_path / "other" / "hpctrain" / "cost" / "x"))
    assert compute.default_cache_path() != mine  # another checkout: another cache
    monkeypatch.setenv("HPCTRAIN_CACHE_DIR", str(tmp_path / "shared"))
    assert compute.default_cache_path() == tmp_path / "shared" / "compute-times.json"


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def test_timing_shows_its_progress_on_a_terminal_only_and_wipes_it(monkeypatch):
    """Kernels timed of those needed and the time left, rewritten in place once timing takes
    long enough (here at once), then wiped; nothing in a pipe or where it ends quickly."""
    works = [LocalWork(KINDS["relu"], (2, 3, 4, n)) for n in (4, 8, 12)]
    clock = iter(range(100))
    monkeypatch.setattr("hpctrain.cost.compute.time.monotonic", lambda: float(next(clock)))
    screen = Terminal()
    progress = TimingProgress(screen, len(works), after=1.0, every=0.0)
    for _ in works:
        progress.advance()
    progress.finish()
    shown = screen.getvalue().split("\r")
    assert shown[1].startswith("timing kernels: 1 of 3, about 0:02 left")  # 1 s a kernel
    assert shown[2].startswith("timing kernels: 2 of 3, about 0:01 left")
    assert shown[-2].strip() == "" and shown[-1] == ""  # wiped, the cursor at the line's start
    pipe = io.StringIO()
    progress = TimingProgress(pipe, len(works), after=0.0, every=0.0)
    for _ in works:
        progress.advance()
    progress.finish()
    assert pipe.getvalue() == ""
    quick = Terminal()
    progress = TimingProgress(quick, len(works), after=1000.0, every=0.0)
    for _ in works:
        progress.advance()
    progress.finish()
    assert quick.getvalue() == ""


def test_measured_compute_shows_its_progress_while_it_times(monkeypatch):
    """Each kernel timed moves the line on (a clock a second on per reading: timing is slow),
    and the line is wiped before the times are returned."""
    clock = iter(range(1000))
    monkeypatch.setattr("hpctrain.cost.compute.time.monotonic", lambda: float(next(clock)))
    screen = Terminal()
    compute = MeasuredCompute(Backend(np, np.float32), repeats=1, progress=screen)
    compute.times([LocalWork(KINDS["relu"], (2, 3, 4, n)) for n in (4, 8, 12)])
    assert "timing kernels: 2 of 3, about " in screen.getvalue()
    assert screen.getvalue().endswith("\r")
