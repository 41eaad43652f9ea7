"""The CuPy stand-in refuses what CuPy refuses and counts what makes a GPU wait: the GPU tests
beside this one are only as strict as it is."""

import numpy as np
import pytest

from tests.gpu_standin import SCALAR, SYNC, TO_DEVICE, TO_HOST


def test_a_device_array_never_becomes_a_numpy_array_implicitly(standin_cupy):
    cp = standin_cupy
    a = cp.arange(6, dtype=cp.float32).reshape(2, 3)
    with pytest.raises(TypeError, match="Implicit conversion"):
        np.asarray(a)
    with pytest.raises(TypeError, match="Unsupported type"):
        a + np.ones(3, np.float32)  # a host operand, as CuPy's ufuncs refuse it
    with pytest.raises(TypeError, match="Unsupported type"):
        np.ones(3, np.float32) * a
    with pytest.raises(TypeError, match="Unsupported type"):
        cp.concatenate([a, np.ones((1, 3), np.float32)])
    with pytest.raises(TypeError):
        cp.asarray([a, a])  # a list of device arrays: stack them instead
    # math stays on the device, a reduction included
    assert isinstance(np.exp(a) * 2.0 + np.float32(1), cp.ndarray)
    assert isinstance(a.sum(), cp.ndarray) and a.sum().shape == ()
    assert isinstance(a[0, 0], cp.ndarray)
    assert standin_cupy.counters.waits() == 0


def test_copies_and_waits_are_counted_with_their_bytes_and_place(standin_cupy):
    cp, counters = standin_cupy, standin_cupy.counters
    a = cp.asarray(np.zeros(4, np.float64))  # host to device: 32 bytes
    assert counters.events[TO_DEVICE] == 1 and counters.bytes[TO_DEVICE] == 32
    assert cp.asarray(a) is not None and counters.events[TO_DEVICE] == 1  # already there
    host = cp.asnumpy(a)
    assert isinstance(host, np.ndarray) and counters.bytes[TO_HOST] == 32
    assert float(a.sum()) == 0.0 and int(a[1]) == 0 and not bool(a.any())
    assert a[0].item() == 0.0 and f"{a.max():.1f}" == "0.0"
    assert counters.events[SCALAR] == 5
    cp.cuda.get_current_stream().synchronize()
    cp.cuda.Device().synchronize()
    assert not hasattr(cp.cuda, "get_current_device")  # CuPy has none
    assert counters.events[SYNC] == 2 and counters.waits() == 8
    assert counters.places[TO_HOST, f"test_gpu_standin.py:{_line_of('host = cp.asnumpy(a)')}"]


def _line_of(text: str) -> int:
    with open(__file__) as source:
        return next(n for n, line in enumerate(source, 1) if text in line)


def test_calls_that_wait_in_cupy_wait_here(standin_cupy):
    cp, counters = standin_cupy, standin_cupy.counters
    x = cp.asarray(np.array([0, 2, 2, 5]))
    counters.reset()
    counts = cp.bincount(x, minlength=8)  # CuPy checks for negatives and reads the largest
    assert counts.shape == (8,) and counters.events[SCALAR] == 2
    counters.reset()
    picked = x[x > 1]  # a boolean mask: CuPy reads how many entries it keeps
    assert picked.shape == (3,) and counters.events[SCALAR] == 1
    counters.reset()
    sums = cp.zeros(8)
    cp.add.at(sums, x, cp.ones(4))  # a scatter-add waits for nothing
    assert float(sums[2]) == 2.0 and counters.events[SCALAR] == 1


def test_mpi_reads_device_memory_only_when_it_is_cuda_aware(standin_cupy):
    a = standin_cupy.zeros(3)
    assert not hasattr(a, "__cuda_array_interface__")
    standin_cupy.counters.cuda_aware_mpi = True
    interface = a.__cuda_array_interface__
    assert interface["shape"] == (3,) and interface["strides"] is None


def test_the_device_and_its_count(standin_cupy):
    cuda = standin_cupy.cuda
    assert cuda.runtime.getDeviceCount() == 1
    with pytest.raises(cuda.runtime.CUDARuntimeError):
        cuda.Device(1).use()
    standin_cupy.counters.devices = 2
    with cuda.Device(1):
        assert cuda.Device().id == 1
    assert cuda.Device().id == 0


def test_events_time_the_stream_and_give_their_times_only_once_waited_for(standin_cupy):
    cp, counters = standin_cupy, standin_cupy.counters
    start, end, never = cp.cuda.Event(), cp.cuda.Event(), cp.cuda.Event()
    start.record()
    cp.zeros(4).sum()
    end.record(cp.cuda.get_current_stream())
    assert counters.waits() == 0  # recording waits for nothing
    with pytest.raises(cp.cuda.runtime.CUDARuntimeError, match="NotReady"):
        cp.cuda.get_elapsed_time(start, end)  # not known to be done: the host has not waited
    end.synchronize()
    assert counters.events[SYNC] == 1
    assert cp.cuda.get_elapsed_time(start, end) >= 0.0  # milliseconds; start is done too
    with pytest.raises(cp.cuda.runtime.CUDARuntimeError, match="InvalidResourceHandle"):
        cp.cuda.get_elapsed_time(start, never)
    end.record()  # recorded again: its new time is not known until a wait, or a query
    with pytest.raises(cp.cuda.runtime.CUDARuntimeError, match="NotReady"):
        cp.cuda.get_elapsed_time(start, end)
    assert end.done and cp.cuda.get_elapsed_time(start, end) >= 0.0
    end.record()
    cp.asnumpy(cp.zeros(1))  # any wait for the stream
    assert cp.cuda.get_elapsed_time(start, end) >= 0.0
    untimed = cp.cuda.Event(disable_timing=True)
    untimed.record()
    untimed.synchronize()
    with pytest.raises(cp.cuda.runtime.CUDARuntimeError, match="disable_timing"):
        cp.cuda.get_elapsed_time(start, untimed)


def test_a_pointer_finds_the_memory_of_its_buffer(standin_cupy):
    cp = standin_cupy
    a, b = cp.arange(6, dtype=cp.float32), cp.zeros((2, 3), dtype=cp.float64)
    assert isinstance(a.data.ptr, int) and a.data.ptr != b.data.ptr
    assert a.data.ptr == a.data.ptr  # stable while the buffer lives
    assert a[2:].data.ptr == a.data.ptr + 8  # a view: offset by its byte offset
    assert b[1].data.ptr == b.data.ptr + 24
    found = cp.buffer_at(a[2:].data.ptr, 8)
    assert isinstance(found, cp.ndarray) and found.dtype == np.uint8 and found.shape == (8,)
    assert cp.asnumpy(found.view(cp.float32)).tolist() == [2.0, 3.0]
    cp.buffer_at(b.data.ptr)[:8] = cp.asarray(np.ones(1, np.float64)).view(cp.uint8)
    assert float(b[0, 0]) == 1.0  # writes reach the array
    assert cp.buffer_at(b.data.ptr).shape == (48,)  # to the end of the buffer
    with pytest.raises(ValueError, match="past the end"):
        cp.buffer_at(a.data.ptr, 25)
    gone = cp.zeros(1000).data.ptr  # the buffer is freed at once
    with pytest.raises(ValueError, match="no live device buffer"):
        cp.buffer_at(gone)
    with pytest.raises(ValueError, match="no live device buffer"):
        cp.buffer_at(np.zeros(3).ctypes.data)  # host memory
