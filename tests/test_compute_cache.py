"""The compute-time cache: a timing is reused only under the conditions it was taken in."""

import json

import numpy as np
import pytest

from hpctrain.cost.compute import LocalWork, MeasuredCompute, code_version, timing_context
from hpctrain.device.backend import Backend

WORK = LocalWork("relu", (2, 3, 4, 4))


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
    context = timing_context(backend, 4, 16, "openblas 0.3.27 (pthreads)")
    for part in ("float32", "4 threads", "16 ranks per node", "openblas 0.3.27", code_version()):
        assert part in context
    assert context.startswith("cpu ")  # the processor's model name follows
    assert timing_context(backend, 1, 16, "openblas") != timing_context(backend, 2, 16, "openblas")
    assert code_version().startswith("hpctrain ") and "+" in code_version()


def test_a_timing_is_reused_under_the_same_conditions_only(tmp_path):
    cache = tmp_path / "times.json"
    backend = Backend(np, np.float32)
    one, four = (timing_context(backend, t, 1, "blas") for t in (1, 4))
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


def test_timings_of_other_code_are_dropped_when_the_cache_is_rewritten(tmp_path):
    cache = tmp_path / "times.json"
    stale = "cpu x|float32|1 threads|1 ranks per node|blas|hpctrain 0.0.1+000000000000|relu|..."
    cache.write_text(json.dumps({stale: [1.0, 1.0]}))
    backend = Backend(np, np.float32)
    compute = MeasuredCompute(backend, context=timing_context(backend, 1, 1, "blas"),
                              cache=cache, repeats=2)
    compute.times([WORK])
    kept = json.loads(cache.read_text())
    assert stale not in kept and len(kept) == 1 and code_version() in next(iter(kept))


def test_the_first_two_calls_are_never_samples(monkeypatch):
    # A kernel's first call pays for fresh memory, its second for the heap glibc grows once the
    # first large free raises its mmap threshold: neither is what a training step pays.
    from hpctrain.cost import compute

    now = [0.0]
    monkeypatch.setattr(compute.time, "perf_counter", lambda: now[0])
    durations = [5.0, 3.0, 0.02, 0.02]
    calls = []

    def kernel() -> str:
        now[0] += durations[len(calls)]
        calls.append(1)
        return "output"

    timer = MeasuredCompute(Backend(np, np.float32), repeats=4)
    seconds, output = timer._time(kernel)
    # the second call's 3 s say one sample fits the budget: the third call is it
    assert seconds == pytest.approx(0.02) and output == "output" and len(calls) == 3
