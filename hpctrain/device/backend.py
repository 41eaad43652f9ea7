"""Array backend: one code path on ``xp``, NumPy on the CPU or CuPy on a GPU."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import numpy as np

from hpctrain.device.clock import CommClock
from hpctrain.device.precision import (
    Precision,
    precision_of_dtype,
    resolve_precision,
    tensor_products,
)
from hpctrain.errors import UserError

DTYPES = {"float32": np.float32, "float64": np.float64}


@dataclass(frozen=True)
class Backend:
    """The array module, the compute dtype, and how arrays reach MPI.

    ``cuda_aware`` says the MPI library reads device memory directly; otherwise GPU arrays are
    staged through host memory around each MPI call (the PyPI ``mpich`` wheel is not CUDA-aware;
    set ``HPCTRAIN_CUDA_AWARE_MPI=1`` with an MPI that is).

    ``precision`` (:mod:`hpctrain.device.precision`) says what ``dtype`` is for: the dtype of
    activations, the weights' copy the kernels use, gradients and messages. Under a mixed
    precision (bf16, fp16) master weights and optimizer state are in ``precision.master``.
    Left out, it is the plain precision of ``dtype``.

    ``collectives`` says how the ranks' arrays move (:mod:`hpctrain.comm.transport`): ``mpi``
    (through ``to_mpi``/``empty_mpi``/``from_mpi``), or on a GPU ``nccl``, which reads and
    writes device memory on the compute stream.

    ``clock`` adds up the seconds every communication primitive spends moving data (while
    enabled; see :class:`~hpctrain.device.clock.CommClock`). It is the one mutable part: the backend
    reaches every primitive, so the primitives need no other handle to report their time.
    """

    xp: ModuleType
    dtype: Any
    device: str = "cpu"
    cuda_aware: bool = False
    clock: CommClock = field(default_factory=CommClock, compare=False, repr=False)
    precision: Precision | None = None
    collectives: str = "mpi"  # what moves device arrays: 'mpi' or 'nccl' (hpctrain.comm)

    def __post_init__(self) -> None:
        if self.precision is None:
            object.__setattr__(self, "precision", precision_of_dtype(self.dtype))
        if self.device == "gpu":  # device events time the movement: the host never waits
            self.clock.use_device_events(self.xp.cuda)

    def to_mpi(self, a: Any) -> Any:
        """A contiguous buffer MPI can read, its contents final."""
        if self.device == "gpu" and not self.cuda_aware:
            return self.xp.asnumpy(a)  # synchronises with the stream
        a = self.xp.ascontiguousarray(a)
        if self.device == "gpu":  # MPI reads device memory outside our stream: let it finish
            self.xp.cuda.get_current_stream().synchronize()
        return a

    def empty_mpi(self, shape: tuple[int, ...], dtype: Any = None) -> Any:
        """A buffer MPI can write into; ``from_mpi`` moves it back to the device. Give the
        dtype of the array it receives (batch norm's float32 statistics under 16-bit storage);
        ``dtype`` (the storage dtype) only when left out."""
        dtype = self.dtype if dtype is None else dtype
        if self.device == "gpu" and not self.cuda_aware:
            return np.empty(shape, dtype)
        return self.xp.empty(shape, dtype)

    def from_mpi(self, a: Any) -> Any:
        if self.device == "gpu" and not self.cuda_aware:
            return self.xp.asarray(a)
        return a

    def to_numpy(self, a: Any) -> np.ndarray:
        return self.xp.asnumpy(a) if self.device == "gpu" else np.asarray(a)

    def device_memory_held(self) -> float | None:
        """Bytes of device memory CuPy's default pool holds (None on the CPU)."""
        if self.device != "gpu":
            return None
        return float(self.xp.get_default_memory_pool().total_bytes())

    def sync(self) -> None:
        """Wait for queued device work, so timers measure it."""
        if self.device == "gpu":
            self.xp.cuda.Device().synchronize()  # the current device


COLLECTIVES = ("auto", "nccl", "mpi")
"""What ``--collectives`` takes (auto: nccl on GPUs where CuPy has NCCL and it can run the
ranks as placed, else mpi)."""

NCCL_SHARES_DEVICES = 23003
"""The first NCCL (2.30.3, as ``get_version()`` codes it) that lets ranks share a GPU, with
``NCCL_MULTI_RANK_GPU_ENABLE=1``: older ones refuse a communicator whose ranks share a
device (ncclInvalidUsage)."""


def _nccl_module(cupy: ModuleType) -> Any | None:
    """CuPy's NCCL module (``cupy.cuda.nccl``) where it works, else None."""
    nccl = getattr(cupy.cuda, "nccl", None)
    if nccl is None:
        try:
            import importlib

            nccl = importlib.import_module(f"{cupy.__name__}.cuda.nccl")
        except ImportError:
            return None
    return nccl if getattr(nccl, "available", True) else None


def nccl_version_text(code: int) -> str:
    """NCCL's version code as major.minor.patch: 23003 is 2.30.3 (from 2.9 on, major·10000 +
    minor·100 + patch), 2708 is 2.7.8 (before, major·1000 + minor·100 + patch)."""
    if code >= 10000:
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return f"{code // 1000}.{code // 100 % 10}.{code % 100}"


def nccl_shares_devices(version: int, environ: Any = None) -> bool:
    """Whether NCCL of ``version`` (its code) runs ranks that share a GPU: from 2.30.3 on,
    with ``NCCL_MULTI_RANK_GPU_ENABLE=1`` in ``environ`` (default: this process's)."""
    environ = os.environ if environ is None else environ
    return version >= NCCL_SHARES_DEVICES and environ.get("NCCL_MULTI_RANK_GPU_ENABLE") == "1"


def shared_gpu_refusal(version: int, ranks_per_node: int, n_gpus: int) -> str:
    """Why ``--collectives nccl`` cannot run ``ranks_per_node`` ranks on ``n_gpus`` GPUs with
    NCCL of ``version`` (its code), in one line with the fix."""
    return (f"--collectives nccl with {ranks_per_node} ranks on a node of {n_gpus} "
            f"GPU{'s' if n_gpus > 1 else ''}: ranks share a GPU, which NCCL "
            f"{nccl_version_text(version)} refuses; choose --collectives mpi, or NCCL >= 2.30.3 "
            f"with NCCL_MULTI_RANK_GPU_ENABLE=1")


def _node_ranks(comm: Any) -> tuple[int, int]:
    """This rank's rank among the ranks of its node and their number (``Split_type``, which
    works under any launcher); (0, 1) without ``comm``."""
    if comm is None:
        return 0, 1
    from mpi4py import MPI

    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return node.Get_rank(), node.Get_size()
    finally:
        node.Free()


def choose_collectives(collectives: str, nccl: Any, comm: Any, ranks_per_node: int,
                       n_gpus: int) -> str:
    """The transport of ``--collectives`` (auto, nccl, mpi) on a GPU, given CuPy's NCCL module
    (None where it has none) and ``ranks_per_node`` ranks on a node of ``n_gpus`` GPUs.

    Ranks that share a GPU (more ranks on a node than GPUs) get NCCL only where it lets them
    (:func:`nccl_shares_devices`): auto then picks MPI, and says so on rank 0; ``nccl`` is
    refused. Whether ranks share is agreed over ``comm`` (collective, one small all-reduce),
    so that every rank picks the same transport, or every rank refuses: a node whose ranks
    share a GPU would otherwise fail inside NCCL's set-up while its peers wait in it.
    """
    if collectives == "mpi":
        return "mpi"
    version = 0 if nccl is None else int(nccl.get_version())
    missing, shared = nccl is None, ranks_per_node > n_gpus
    allowed = not shared or nccl_shares_devices(version)
    if comm is not None and comm.Get_size() > 1:
        from mpi4py import MPI

        # every rank takes part, NCCL or not; the worst node speaks for all
        worst = np.array([missing, shared, not allowed, ranks_per_node, -n_gpus],
                         dtype=np.int64)
        comm.Allreduce(MPI.IN_PLACE, worst, op=MPI.MAX)
        missing, shared, allowed = bool(worst[0]), bool(worst[1]), not worst[2]
        ranks_per_node, n_gpus = int(worst[3]), int(-worst[4])
    if missing:
        if collectives == "nccl":
            raise UserError("--collectives nccl but this CuPy has no NCCL (cupy.cuda.nccl); "
                            "install NCCL for CuPy or choose --collectives mpi")
        return "mpi"
    rank = 0 if comm is None else comm.Get_rank()
    if collectives == "nccl":
        if not allowed:
            raise UserError(shared_gpu_refusal(version, ranks_per_node, n_gpus))
        return "nccl"
    if shared and rank == 0:
        why = (f"{ranks_per_node} ranks share {n_gpus} GPU{'s' if n_gpus > 1 else ''} on a "
               f"node and NCCL {nccl_version_text(version)}")
        if allowed:
            print(f"collectives: nccl ({why} lets them with NCCL_MULTI_RANK_GPU_ENABLE=1)",
                  flush=True)
        else:
            print(f"collectives: mpi ({why} refuses that without NCCL >= 2.30.3 and "
                  f"NCCL_MULTI_RANK_GPU_ENABLE=1)", flush=True)
    return "nccl" if allowed else "mpi"


def make_backend(device: str = "cpu", dtype: str = "float32", comm: Any = None,
                 collectives: str = "auto") -> Backend:
    """Backend for ``device`` ('cpu' or 'gpu') and ``dtype``, a precision name of
    :mod:`hpctrain.device.precision` (auto, fp32, tf32, bf16, fp16, fp64; float32 and float64
    are fp32 and fp64); on GPU bind GPU local_rank % n_gpus. ``collectives`` (auto, nccl,
    mpi) picks how arrays move (:func:`choose_collectives`): auto is nccl on a GPU where CuPy
    has NCCL, unless ranks share a GPU that NCCL would refuse, else mpi.

    The local rank is this process's rank among those on the same node, found with
    ``Split_type(COMM_TYPE_SHARED)`` so it works under any launcher.
    """
    if device not in ("cpu", "gpu"):
        raise UserError(f"unknown device {device!r}; choose cpu or gpu")
    if collectives not in COLLECTIVES:
        raise UserError(f"unknown collectives {collectives!r}; choose {', '.join(COLLECTIVES)}")
    if collectives == "nccl" and device != "gpu":
        raise UserError("--collectives nccl moves device memory: it needs --device gpu "
                        "(choose --collectives auto or mpi on the CPU)")
    precision = resolve_precision(dtype, device)
    if device == "cpu":
        tensor_products(precision.name == "tf32")
        return Backend(np, precision.storage, "cpu", precision=precision)
    try:
        import cupy
    except ImportError as err:
        raise UserError("--device gpu needs CuPy; install it with 'pip install cupy-cuda13x' "
                        "(CUDA 13; cupy-cuda12x for CUDA 12)") from err
    try:
        n_gpus = cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError:  # no driver, or no device
        n_gpus = 0
    if n_gpus < 1:
        # visibility can differ per rank (CUDA_VISIBLE_DEVICES set per task): not a UserError
        raise RuntimeError("--device gpu but no GPU is visible to this process")
    local_rank, ranks_per_node = _node_ranks(comm)
    cupy.cuda.Device(local_rank % n_gpus).use()
    cuda_aware = os.environ.get("HPCTRAIN_CUDA_AWARE_MPI", "0") == "1"
    tensor_products(precision.name == "tf32", cupy)
    chosen = choose_collectives(collectives, _nccl_module(cupy), comm, ranks_per_node, n_gpus)
    return Backend(cupy, precision.storage, "gpu", cuda_aware, precision=precision,
                   collectives=chosen)
