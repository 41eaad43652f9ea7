"""Per-layer times on the GPU path come from device events read once at the end of a step, not
from a wait for the device at every layer boundary: the strict CuPy stand-in's events (which
mark the host clock when recorded) give the CPU path's numbers, the pool of events is reused,
and a training step on the stand-in fills every row."""

from types import SimpleNamespace

import numpy as np
import pytest

import hpctrain.device.clock as clock_module
import hpctrain.record.timing as timing
from hpctrain.device.clock import CommClock, DeviceEvents
from hpctrain.layout.moves import AllGatherMove, IdentityMove
from hpctrain.record.timing import LOSS, StepTimer, StepTimes
from tests.gpu_standin import SYNC
from tests.test_gpu_training import trained
from tests.test_timing import FakeTime


@pytest.fixture
def fake_time(monkeypatch, standin_cupy):
    """One fake ``perf_counter`` for the timer, the clock and the stand-in's events."""
    fake = FakeTime()
    for module in (timing, clock_module, standin_cupy):
        monkeypatch.setattr(module, "perf_counter", fake)
    return fake


def counting_cuda(cuda):
    """``cuda`` whose ``Event()`` calls are counted in ``made``."""
    made = []

    def event():
        made.append(cuda.Event())
        return made[-1]

    return SimpleNamespace(Event=event, get_elapsed_time=cuda.get_elapsed_time, made=made)


def backend_of(clock):
    syncs = []
    return SimpleNamespace(clock=clock, sync=lambda: syncs.append(1), syncs=syncs)


def a_step(backend, now, spans=None):
    """One step's readings with known durations (as in tests/test_timing.py), a read of the
    data and a comm block inside a layer and inside a move included; its record."""
    times = StepTimes.blank(["conv1", "fc1"])
    times.spans = spans
    gather, identity = SimpleNamespace(move=AllGatherMove), SimpleNamespace(move=IdentityMove)
    clock = backend.clock
    with StepTimer(backend, times) as timer:
        with timer.reading():
            now.advance(0.5)
        with StepTimer(backend, times) as forward:  # the network's forward nests
            forward.forward_move(0, identity)
            now.advance(2.0)
            with clock.comm():  # a halo wait inside the layer
                now.advance(0.25)
                with clock.comm():  # nested: counted once
                    now.advance(0.25)
            forward.forward_layer(0)
            with clock.comm():
                now.advance(0.125)
            now.advance(0.0625)
            forward.forward_move(1, gather)
            now.advance(1.0)
            forward.forward_layer(1)
        now.advance(0.5)
        with StepTimer(backend, times) as backward:
            now.advance(0.5)
            backward.forward_layer(LOSS)
            with clock.comm():
                now.advance(3.0)
            backward.backward_layer(1)
            now.advance(0.75)
            backward.backward_move(1, gather)
        timer.finish_step()
    return times


def test_device_events_give_the_cpu_numbers_with_one_wait(fake_time, standin_cupy):
    on_cpu = backend_of(CommClock())
    on_cpu.clock.intervals = []  # a timeline: the clock keeps each block's interval
    cpu_spans = []
    cpu_times = a_step(on_cpu, fake_time, cpu_spans)
    assert cpu_times.step == 8.9375

    cuda = counting_cuda(standin_cupy.cuda)
    on_device = backend_of(CommClock(events=DeviceEvents(cuda)))
    standin_cupy.counters.reset()
    device_times = a_step(on_device, fake_time)
    assert standin_cupy.counters.events[SYNC] == 1  # the step's end, and no other wait
    assert on_device.syncs == [] and not on_device.clock.enabled
    assert device_times.to_array() == pytest.approx(cpu_times.to_array())
    conv1 = device_times.layers[0]
    assert (conv1.forward_compute, conv1.forward_layer_comm) == (2.0, 0.5)
    assert device_times.data == 0.5 and device_times.step == 8.9375
    assert on_device.clock.seconds == pytest.approx(3.625)  # every block, read at the end

    made = len(cuda.made)
    begun = fake_time.now
    device_spans = []
    device_times = a_step(on_device, fake_time, device_spans)
    assert len(cuda.made) == made  # the events of the step before, reused
    assert device_times.to_array() == pytest.approx(cpu_times.to_array())
    # the timeline on the host clock, as the CPU path's: the first span (conv1 forward) starts
    # after the read
    assert device_spans[0][3] == pytest.approx(begun + 0.5)

    def relative(spans):
        return np.array([(*s[:3], s[3] - spans[0][3], s[4] - spans[0][3]) for s in spans])

    assert relative(device_spans) == pytest.approx(relative(cpu_spans))


def test_a_clock_with_device_events_never_waits_and_marks_each_outermost_block(
        fake_time, standin_cupy):
    clock = CommClock(sync=lambda: pytest.fail("a wait"), events=DeviceEvents(standin_cupy.cuda))
    with clock.comm():  # disabled: nothing recorded
        fake_time.advance(1.0)
    clock.enabled = True
    with clock.comm():
        fake_time.advance(0.5)
        with clock.comm():
            fake_time.advance(0.25)
    assert clock.marks == [(0, 1)] and clock.seconds == 0.0  # read by the step's timer
    assert standin_cupy.counters.waits() == 0
    clock.events.wait()
    assert clock.events.seconds() == [0.0, 0.75]


def test_a_step_abandoned_by_an_error_leaves_its_events_unread(fake_time, standin_cupy):
    backend = backend_of(CommClock(events=DeviceEvents(standin_cupy.cuda)))
    times = StepTimes.blank(["a"])
    with pytest.raises(RuntimeError), StepTimer(backend, times) as timer:
        fake_time.advance(1.0)
        timer.forward_layer(0)
        raise RuntimeError("a peer vanished")
    assert standin_cupy.counters.waits() == 0 and times.pending is None
    assert backend.clock.events.count == 0 and times.layers[0].forward_compute == 0.0
    assert a_step(backend, fake_time).step == pytest.approx(8.9375)  # the next step starts clean


def test_a_gpu_training_step_fills_every_layer_time(standin_cupy, tmp_path, monkeypatch,
                                                    capsys):
    monkeypatch.setenv("HPCTRAIN_CACHE_DIR", str(tmp_path / "cache"))
    argv = ["--net", "smallcnn", "--image-size", "16", "--batch", "4", "--device", "gpu",
            "--compute", "flops", "--threads", "1", "--print-every", "100", "--steps", "3"]
    result = trained(argv, monkeypatch)
    assert len(result.step_times) == 3
    for times, seconds in zip(result.step_times, result.step_seconds, strict=True):
        assert times.pending is None
        for row in times.layers:  # every layer ran kernels (or a reshape) both ways
            assert row.forward_compute > 0.0 and row.backward_compute > 0.0, row
        assert times.loss.forward_compute > 0.0 and times.data > 0.0
        covered = sum(row.total for row in times.rows) + times.data
        assert covered <= times.step <= seconds  # the step's boundaries hold every part
