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
"""What ``--collectives`` takes (auto: nccl on GPUs where CuPy has NCCL, else mpi)."""


def _has_nccl(cupy: ModuleType) -> bool:
    """Whether CuPy has a working NCCL (``cupy.cuda.nccl``)."""
    nccl = getattr(cupy.cuda, "nccl", None)
    if nccl is None:
        try:
            import importlib

            nccl = importlib.import_module(f"{cupy.__name__}.cuda.nccl")
        except ImportError:
            return False
    return bool(getattr(nccl, "available", True))


def make_backend(device: str = "cpu", dtype: str = "float32", comm: Any = None,
                 collectives: str = "auto") -> Backend:
    """Backend for ``device`` ('cpu' or 'gpu') and ``dtype``, a precision name of
    :mod:`hpctrain.device.precision` (auto, fp32, tf32, bf16, fp16, fp64; float32 and float64
    are fp32 and fp64); on GPU bind GPU local_rank % n_gpus. ``collectives`` (auto, nccl,
    mpi) picks how arrays move: auto is nccl on a GPU where CuPy has NCCL, else mpi.

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
        raise UserError(
            "--device gpu needs CuPy; install it with 'pip install cupy-cuda12x'"
        ) from err
    try:
        n_gpus = cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError:  # no driver, or no device
        n_gpus = 0
    if n_gpus < 1:
        # visibility can differ per rank (CUDA_VISIBLE_DEVICES set per task): not a UserError
        raise RuntimeError("--device gpu but no GPU is visible to this process")
    local_rank = 0
    if comm is not None:
        from mpi4py import MPI

        node = comm.Split_type(MPI.COMM_TYPE_SHARED)
        local_rank = node.Get_rank()
        node.Free()
    cupy.cuda.Device(local_rank % n_gpus).use()
    cuda_aware = os.environ.get("HPCTRAIN_CUDA_AWARE_MPI", "0") == "1"
    tensor_products(precision.name == "tf32", cupy)
    nccl = _has_nccl(cupy)
    if collectives == "nccl" and not nccl:
        raise UserError("--collectives nccl but this CuPy has no NCCL (cupy.cuda.nccl); "
                        "install NCCL for CuPy or choose --collectives mpi")
    chosen = "nccl" if collectives == "nccl" or (collectives == "auto" and nccl) else "mpi"
    return Backend(cupy, precision.storage, "gpu", cuda_aware, precision=precision,
                   collectives=chosen)
