"""Collective checks: every rank learns the verdict, so all ranks pass or fail together."""

import numpy as np

from hpctrain.layout import relative_slices
from hpctrain.verify import relative_error


def all_agree(comm, ok: bool) -> bool:
    return bool(comm.allreduce(int(not ok)) == 0)


def check_close(comm, got, want, what: str, tol: float = 1e-12) -> None:
    """On rank 0 compare ``got`` with ``want`` (None elsewhere); assert on every rank."""
    err = relative_error(np.asarray(got), np.asarray(want)) if comm.Get_rank() == 0 else 0.0
    err = comm.bcast(err, root=0)
    assert err <= tol, f"{what}: relative error {err:.2e} > {tol:.0e}"


def global_random(shape, seed):
    """The same global tensor on every rank."""
    return np.random.default_rng(seed).standard_normal(shape)


def host(a):
    """A NumPy copy of a NumPy or CuPy array."""
    return a.get() if hasattr(a, "get") else np.asarray(a)


def local_dot(comm, a, b) -> float:
    """Σ over ranks of ⟨a, b⟩ of local buffers: the inner product the adjoint tests use."""
    return comm.allreduce(float((host(a) * host(b)).sum()))


def block(backend, x, layout, rank):
    """This rank's block of the global NumPy tensor ``x``, on the backend's device."""
    whole = tuple((0, n) for n in x.shape)
    return backend.xp.asarray(np.ascontiguousarray(x[relative_slices(layout.box(rank), whole)]))
