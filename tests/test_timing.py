"""The comm clock, the step timer and the summaries, on a fake clock (serial)."""

from types import SimpleNamespace

import numpy as np
import pytest

import hpctrain.device.clock as clock_module
import hpctrain.record.timing as timing
from hpctrain.device.clock import CommClock
from hpctrain.layout.moves import AllGatherMove, IdentityMove
from hpctrain.record.timing import (
    LOSS,
    RECORD_FIELDS,
    LayerTimes,
    StepTimer,
    StepTimes,
    format_table,
    median_times,
)


class FakeTime:
    """perf_counter that moves only when told to."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock_time(monkeypatch):
    fake = FakeTime()
    monkeypatch.setattr(timing, "perf_counter", fake)
    monkeypatch.setattr(clock_module, "perf_counter", fake)
    return fake


def test_disabled_clock_records_nothing_and_never_syncs(clock_time):
    syncs = []
    clock = CommClock(sync=lambda: syncs.append(1))
    with clock.comm():
        clock_time.advance(1.0)
    assert clock.seconds == 0.0 and syncs == []


def test_enabled_clock_sums_blocks_and_counts_nested_blocks_once(clock_time):
    syncs = []
    clock = CommClock(sync=lambda: syncs.append(1))
    clock.enabled = True
    with clock.comm():
        clock_time.advance(0.5)
        with clock.comm():  # e.g. a redistribution calling an all-gather
            clock_time.advance(0.25)
    with clock.comm():
        clock_time.advance(2.0)
    assert clock.seconds == pytest.approx(2.75)
    assert len(syncs) == 4  # start and end of each outermost block


def test_clock_counts_a_block_left_by_an_exception(clock_time):
    clock = CommClock()
    clock.enabled = True
    with pytest.raises(RuntimeError), clock.comm():
        clock_time.advance(0.5)
        raise RuntimeError("peer vanished")
    with clock.comm():
        clock_time.advance(0.25)
    assert clock.seconds == pytest.approx(0.75)


def test_clock_disabled_inside_a_block_still_closes_it(clock_time):
    clock = CommClock()
    clock.enabled = True
    with clock.comm():
        clock_time.advance(1.0)
        clock.enabled = False
    clock.enabled = True
    with clock.comm():
        clock_time.advance(1.0)
    assert clock.seconds == pytest.approx(2.0)


def fake_backend():
    syncs = []
    return SimpleNamespace(clock=CommClock(), sync=lambda: syncs.append(1), syncs=syncs)


def test_step_timer_splits_compute_comm_and_redistribution(clock_time):
    backend = fake_backend()
    times = StepTimes.blank(["conv1", "fc1"])
    gather, identity = SimpleNamespace(move=AllGatherMove), SimpleNamespace(move=IdentityMove)
    with StepTimer(backend, times) as timer:
        assert backend.clock.enabled
        clock_time.advance(0.5)  # data: in the step, in no row
        timer.forward_move(0, identity)  # not timed: the data time stays out of every row
        clock_time.advance(2.0)
        with backend.clock.comm():  # a halo wait inside the layer
            clock_time.advance(0.25)
        timer.forward_layer(0)
        with backend.clock.comm():
            clock_time.advance(0.125)
        clock_time.advance(0.0625)  # a move's own bookkeeping is still redistribution
        timer.forward_move(1, gather)
        clock_time.advance(1.0)
        timer.forward_layer(1)
        clock_time.advance(0.5)
        timer.forward_layer(LOSS)
        with backend.clock.comm():
            clock_time.advance(3.0)
        timer.backward_layer(1)
        clock_time.advance(0.75)
        timer.backward_move(1, gather)
        timer.finish_step()
    assert not backend.clock.enabled
    conv1, fc1 = times.layers
    assert conv1.forward_compute == pytest.approx(2.5)  # the 0.5 s of data, then 2 s
    assert conv1.forward_layer_comm == pytest.approx(0.25)
    assert conv1.forward_redistribution == 0.0
    assert fc1.forward_redistribution == pytest.approx(0.1875)
    assert (fc1.forward_compute, fc1.forward_layer_comm) == (pytest.approx(1.0), 0.0)
    assert times.loss.forward_compute == pytest.approx(0.5)
    assert (fc1.backward_compute, fc1.backward_layer_comm) == (0.0, pytest.approx(3.0))
    assert fc1.backward_redistribution == pytest.approx(0.75)
    assert fc1.forward_comm == pytest.approx(0.1875) and fc1.backward_comm == pytest.approx(3.75)
    assert times.step == pytest.approx(8.1875)
    assert sum(row.total for row in times.rows) == pytest.approx(times.step)
    assert backend.syncs  # every reading waits for the device


def test_step_timer_without_a_record_does_nothing(clock_time):
    backend = fake_backend()
    with StepTimer(backend, None) as timer:
        assert not backend.clock.enabled
        timer.forward_move(0, SimpleNamespace(kind="alltoall"))
        timer.forward_layer(0)
        timer.backward_layer(0)
        timer.finish_step()
    assert backend.syncs == [] and backend.clock.seconds == 0.0


def test_nested_step_timers_restore_the_clock(clock_time):
    backend = fake_backend()
    times = StepTimes.blank(["a"])
    with StepTimer(backend, times):
        with StepTimer(backend, times):
            pass
        assert backend.clock.enabled
    assert not backend.clock.enabled


def numbered(names, start):
    """A record whose times are start, start + 1, … in ``to_array`` order."""
    template = StepTimes.blank(names)
    return template.from_array(start + np.arange(template.to_array().size, dtype=float))


def test_array_round_trip_and_dict():
    times = numbered(["conv1", "relu1"], 1.0)
    again = times.from_array(times.to_array())
    assert again == times
    width = len(RECORD_FIELDS)
    assert times.layers[1].forward_compute == 1.0 + width
    assert times.loss.name == "loss" and times.step == 1.0 + 3 * width
    d = times.as_dict()
    assert list(d["layers"]) == ["conv1", "relu1"]
    assert d["layers"]["relu1"]["forward_compute"] == 1.0 + width
    assert d["loss"]["backward_redistribution"] == times.loss.backward_redistribution
    assert d["step"] == times.step
    with pytest.raises(ValueError, match="do not fit"):
        times.from_array(np.zeros(3))


def test_median_is_taken_per_field():
    steps = [numbered(["a", "b"], s) for s in (5.0, 1.0, 100.0)]
    middle = median_times(steps)
    assert middle == numbered(["a", "b"], 5.0)
    assert median_times(steps[:2]) == numbered(["a", "b"], 3.0)  # even count: the mean of two
    with pytest.raises(ValueError):
        median_times([])


def test_table_prints_milliseconds_per_layer_loss_and_total():
    times = StepTimes([LayerTimes("conv1", 0.001, 0.002, 0.003, 0.004, 0.005, 0.006),
                       LayerTimes("a_long_layer", 0.010)], step=0.1)
    lines = format_table(times).splitlines()
    assert lines[0].split() == ["layer", "fwd", "compute", "fwd", "comm", "bwd", "compute",
                                "bwd", "comm", "redistribution"]
    assert [line.split()[0] for line in lines[1:-1]] == ["conv1", "a_long_layer", "loss",
                                                         "total"]
    # conv1: fwd comm = 2 + 3 ms, bwd comm = 5 + 6 ms, redistribution = 2 + 6 ms
    assert lines[1].split()[1:] == ["1.000", "5.000", "4.000", "11.000", "8.000"]
    assert lines[4].split()[1:] == ["11.000", "5.000", "4.000", "11.000", "8.000"]
    assert "whole step 100.000 ms" in lines[-1] and "rows add up to 31.000 ms" in lines[-1]
    assert len({len(line) for line in lines[:-1]}) == 1  # aligned columns
