"""The NCCL stand-in on one process: what it computes and what it refuses (the multi-rank
checks are in tests/mpi/test_gpu_nccl.py), and how ``--collectives`` picks a transport for
ranks that share a GPU.

Some refusals are NCCL's or CuPy's own (an id that is not bytes, a rank out of range, ranks
sharing a device, a communicator used on another device or after it was released); the rest
are the stand-in's own checks where NCCL would not report but hang, overrun or read garbage
(host memory, a datatype other than the buffer's, a count past its end, a send outside a
group); each test says which.
"""

import numpy as np
import pytest
from ml_dtypes import bfloat16

from hpctrain.device.backend import choose_collectives, nccl_shares_devices, nccl_version_text
from hpctrain.errors import UserError
from tests import nccl_standin as nccl


@pytest.fixture
def one(standin_nccl):
    """A communicator of this one process, and the CuPy stand-in."""
    return nccl.NcclCommunicator(1, nccl.get_unique_id(), 0), standin_nccl


def test_the_standin_is_cupy_nccl_under_the_fixture(standin_nccl):
    assert standin_nccl.cuda.nccl is nccl
    assert isinstance(standin_nccl.cuda.get_current_stream().ptr, int)
    assert isinstance(nccl.get_unique_id(), bytes) and len(nccl.get_unique_id()) == 128


def test_the_id_is_bytes_as_cupy_14_gives_and_a_tuple_is_refused(standin_nccl):
    """CuPy 14's check (its ``NcclCommunicator`` takes the bytes ``get_unique_id`` gives)."""
    uid = nccl.get_unique_id()
    with pytest.raises(nccl.NcclError, match="not tuple"):
        nccl.NcclCommunicator(1, tuple(uid), 0)
    comm = nccl.NcclCommunicator(1, uid, 0)
    assert comm.rank_id() == 0


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
    """The stand-in's own check: NCCL takes a lone send and deadlocks when both peers send."""
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
    """The stand-in's own checks, where NCCL would fault or read past the buffer; the
    pointer and stream types are CuPy's (its arguments are ints)."""
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
    """NCCL's refusals (a CUDA error on another device; ncclInvalidArgument for a rank out of
    range or an id it did not make); a destroyed communicator is a use after free in NCCL."""
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
        nccl.NcclCommunicator(1, bytes(128), 0)


def test_destroy_and_abort_are_recorded(standin_nccl):
    first = nccl.NcclCommunicator(1, nccl.get_unique_id(), 0)
    second = nccl.NcclCommunicator(1, nccl.get_unique_id(), 0)
    first.destroy()
    second.abort()
    assert nccl.ended == [("destroy", 0, 1), ("abort", 0, 1)]
    with pytest.raises(nccl.NcclError, match="destroyed"):
        second.size()


def test_nccl_versions_read_as_nccl_writes_them():
    assert nccl_version_text(23003) == "2.30.3"
    assert nccl_version_text(22105) == "2.21.5"
    assert nccl_version_text(2708) == "2.7.8"
    assert not nccl_shares_devices(23003, {})
    assert not nccl_shares_devices(22105, {"NCCL_MULTI_RANK_GPU_ENABLE": "1"})
    assert nccl_shares_devices(23003, {"NCCL_MULTI_RANK_GPU_ENABLE": "1"})


def test_ranks_sharing_a_gpu_get_mpi_from_auto_and_a_refusal_from_nccl(monkeypatch, capsys):
    """Two ranks on a node of one GPU: NCCL before 2.30.3 refuses the communicator, so auto
    picks MPI and says why, and ``--collectives nccl`` is refused in one line naming the
    version and the fix. Ranks on GPUs of their own get NCCL and hear nothing."""
    monkeypatch.delenv("NCCL_MULTI_RANK_GPU_ENABLE", raising=False)
    monkeypatch.setattr(nccl, "VERSION", 22105)
    assert choose_collectives("auto", nccl, None, 2, 2) == "nccl"
    assert capsys.readouterr().out == ""
    assert choose_collectives("auto", nccl, None, 2, 1) == "mpi"
    said = capsys.readouterr().out
    assert said.startswith("collectives: mpi (") and "2.21.5" in said and said.count("\n") == 1
    with pytest.raises(UserError) as refused:
        choose_collectives("nccl", nccl, None, 2, 1)
    message = str(refused.value)
    assert "\n" not in message and "NCCL 2.21.5" in message
    assert "--collectives mpi" in message and "NCCL_MULTI_RANK_GPU_ENABLE=1" in message
    assert choose_collectives("mpi", nccl, None, 2, 1) == "mpi"
    # 2.30.3 shares a GPU only when asked to
    monkeypatch.setattr(nccl, "VERSION", 23003)
    assert choose_collectives("auto", nccl, None, 2, 1) == "mpi"
    monkeypatch.setenv("NCCL_MULTI_RANK_GPU_ENABLE", "1")
    capsys.readouterr()
    assert choose_collectives("auto", nccl, None, 2, 1) == "nccl"
    assert capsys.readouterr().out.startswith("collectives: nccl (")
    assert choose_collectives("nccl", nccl, None, 2, 1) == "nccl"
