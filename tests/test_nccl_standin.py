"""The NCCL stand-in on one process: what it computes and what it refuses (the multi-rank
checks are in tests/mpi/test_gpu_nccl.py)."""

import numpy as np
import pytest
from ml_dtypes import bfloat16

from tests import nccl_standin as nccl


@pytest.fixture
def one(standin_nccl):
    """A communicator of this one process, and the CuPy stand-in."""
    return nccl.NcclCommunicator(1, nccl.get_unique_id(), 0), standin_nccl


def test_the_standin_is_cupy_nccl_under_the_fixture(standin_nccl):
    assert standin_nccl.cuda.nccl is nccl
    assert isinstance(standin_nccl.cuda.get_current_stream().ptr, int)
    assert len(nccl.get_unique_id()) == 128


def test_collectives_of_one_rank(one):
    comm, cp = one
    assert (comm.rank_id(), comm.size()) == (0, 1)
    a = cp.asarray(np.arange(6, dtype=np.float32))
    b = cp.zeros(6, dtype=np.float32)
    comm.allReduce(a.data.ptr, b.data.ptr, 6, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, 0)
    comm.allGather(a.data.ptr, b.data.ptr, 6, nccl.NCCL_FLOAT32, 0)
    h = cp.asarray(np.full(4, 1.5, dtype=bfloat16))
    comm.allReduce(h.data.ptr, h.data.ptr, 4, nccl.NCCL_BFLOAT16, nccl.NCCL_SUM, 0)
    assert np.array_equal(b.get(), np.arange(6, dtype=np.float32))
    assert h.dtype == bfloat16 and np.all(h.get() == 1.5)


def test_messages_go_inside_a_group_only(one):
    comm, cp = one
    a = cp.asarray(np.arange(4, dtype=np.float64))
    got = cp.zeros(4, dtype=np.float64)
    with pytest.raises(nccl.NcclError, match="outside groupStart"):
        comm.send(a.data.ptr, 4, nccl.NCCL_FLOAT64, 0, 0)
    nccl.groupStart()
    comm.send(a[1:].data.ptr, 3, nccl.NCCL_FLOAT64, 0, 0)  # an offset pointer
    comm.recv(got.data.ptr, 3, nccl.NCCL_FLOAT64, 0, 0)
    nccl.groupEnd()
    assert np.array_equal(got.get(), [1, 2, 3, 0])
    with pytest.raises(nccl.NcclError, match="groupEnd"):
        nccl.groupEnd()


def test_host_memory_wrong_types_and_overruns_are_refused(one):
    comm, cp = one
    host = np.zeros(4, np.float32)
    a = cp.zeros(4, dtype=np.float32)
    with pytest.raises(nccl.NcclError, match="host memory"):
        comm.allReduce(host.ctypes.data, host.ctypes.data, 4, nccl.NCCL_FLOAT32,
                       nccl.NCCL_SUM, 0)
    with pytest.raises(nccl.NcclError, match="device pointer"):
        comm.allReduce(a, a, 4, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, 0)
    with pytest.raises(nccl.NcclError, match="passed as NCCL datatype"):
        comm.allReduce(a.data.ptr, a.data.ptr, 4, nccl.NCCL_BFLOAT16, nccl.NCCL_SUM, 0)
    with pytest.raises(nccl.NcclError, match="past the end"):
        comm.allGather(a.data.ptr, a.data.ptr, 5, nccl.NCCL_FLOAT32, 0)
    with pytest.raises(nccl.NcclError, match="stream"):
        comm.allReduce(a.data.ptr, a.data.ptr, 4, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, None)


def test_a_communicator_is_its_device_and_its_life(one):
    comm, cp = one
    cp.counters.devices, cp.counters.current_device = 2, 1
    with pytest.raises(nccl.NcclError, match="device 0 used with device 1"):
        comm.size()
    cp.counters.current_device = 0
    comm.destroy()
    with pytest.raises(nccl.NcclError, match="destroyed"):
        comm.rank_id()
    with pytest.raises(nccl.NcclError, match="rank 3 outside"):
        nccl.NcclCommunicator(2, nccl.get_unique_id(), 3)
    with pytest.raises(nccl.NcclError, match="get_unique_id"):
        nccl.NcclCommunicator(1, (0,) * 128, 0)
