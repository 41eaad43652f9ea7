"""Collective checks: every rank learns the verdict, so all ranks pass or fail together."""

import numpy as np

from hpctrain.commands.verify import relative_error
from hpctrain.layers.base import BuildContext
from hpctrain.layout.layout import relative_slices
from hpctrain.model.kinds import KINDS
from hpctrain.model.kinds.base import LayerSpec
from hpctrain.run.checkpoint import CheckpointError


def all_agree(comm, ok: bool) -> bool:
    return bool(comm.allreduce(int(not ok)) == 0)


def check_close(comm, got, want, what: str, tol: float = 1e-12) -> None:
    """On rank 0 compare ``got`` with ``want`` (None elsewhere); assert on every rank."""
    err = relative_error(np.asarray(got), np.asarray(want)) if comm.Get_rank() == 0 else 0.0
    err = comm.bcast(err, root=0)
    assert err <= tol, f"{what}: relative error {err:.2e} > {tol:.0e}"


def raises_everywhere(comm, call, *fragments, error=CheckpointError):
    """``call()`` raises ``error`` on every rank, the same message, naming each fragment."""
    try:
        call()
        message = None
    except error as err:
        message = str(err)
    messages = comm.allgather(message)
    assert all(m is not None for m in messages), f"no {error.__name__} on some rank: {messages}"
    assert len(set(messages)) == 1, f"ranks disagree: {messages}"
    for fragment in fragments:
        assert str(fragment) in message, f"{fragment!r} not in {message!r}"
    return message


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


def sum_gradients(backend, layer) -> None:
    """What the network does after a layer's backward: sum its parameter gradients over the
    ranks holding the same shard."""
    from hpctrain.comm.gradients import GradientReducer

    sums = GradientReducer(backend)
    sums.start()
    sums.add(layer.grad_comm, layer.params)
    sums.finish()


def make_layer(kind, options, fed, mode, grid, grids, backend, key=0, split=None):
    """A layer of ``kind`` (options as in a net file) built through its kind, fed on ``fed``
    (a weighted kind reads only its shape) in ``mode`` on ``grid``, or under ``split`` (a
    :class:`~hpctrain.layout.layout.Split`)."""
    from hpctrain.plan.plans import LayerPlan

    kind_of = KINDS[kind]
    spec = LayerSpec(f"{kind}T", kind, kind_of.parse({k: str(v) for k, v in options.items()},
                                                     "test"), ("input",))
    spec = kind_of.resolve(spec, (fed.shape[1:],), "test")
    out_shape = (fed.shape[0], *kind_of.out_shape(spec, (fed.shape[1:],), "test"))
    entry = LayerPlan(mode, grid, split) if split is not None else LayerPlan(mode, grid)
    mode, grid = entry.mode, entry.grid
    inputs, output = kind_of.layouts(spec, (fed,), out_shape, entry.split_of(len(out_shape)))
    kind_of.check(spec, inputs, output)
    context = BuildContext(mode, grid, inputs, output, grids, backend, key,
                           grids.world.Get_rank())
    return kind_of.build(spec, context)
