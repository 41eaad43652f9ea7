"""The optimizers — SGD, AdamW, LARS and LAMB — and global gradient clipping, applied to each
rank's parameter shards.

SGD and AdamW are element-wise: a shard's update is the serial one restricted to the shard, so
each group of parameters may be updated as soon as its gradient's sum arrives, during the
backward (:meth:`Optimizer.during_backward`). LARS and LAMB scale each tensor's step by a
*trust ratio* made of the norms of the whole tensor, and clipping scales every gradient by the
norm of all of them: those steps wait until every sum has arrived (:meth:`Optimizer.step`).

A norm over a tensor cut in shards and copied across replicas is a sum of squares over the
ranks that hold the *first copy* of each block
(:meth:`~hpctrain.layers.base.Parameter.holds_first_copy`): every entry counted once, never once
per replica, under every plan and on groups of ranks (the ranks outside a layer's group hold
nothing and add 0). Each rank adds its own shards' squares, and one all-reduce over the world
sums them for every tensor at once: one collective per step, whatever P and the number of
tensors.

Under a mixed precision the update is made on the float32 master weights with float32 state,
from the 16-bit gradient widened (and divided by the loss scale), and the kernels' 16-bit copy
(``Parameter.value``) is then rounded from the master.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar

import numpy as np

from hpctrain.errors import UserError
from hpctrain.kernels.adaptive import adamw_update, lamb_apply, lamb_moments
from hpctrain.kernels.sgd import Scratch, sgd_update
from hpctrain.layers.base import Parameter

CLIP_EPS = 1e-6  # PyTorch's clip_grad_norm_: the factor is C / (‖g‖ + 1e-6), at most 1


@dataclass(frozen=True)
class OptimizerSettings:
    """What ``--optimizer`` and its flags choose beside the rate, momentum and weight decay.

    ``betas`` and ``eps``: AdamW's and LAMB's moments (``eps`` is also LARS's guard in its
    trust ratio); ``trust``: LARS's trust coefficient η; ``bias_correction``: LAMB divides its
    moments by 1 − β^t (AdamW always does, as PyTorch's); ``decay_norm_bias`` False: the
    parameters of one axis — biases, batch and layer norm's γ and β — get no weight decay, and
    under LARS and LAMB no trust ratio (a step of 1); ``clip``: the largest global gradient
    norm (None: no clipping).
    """

    name: str = "sgd"
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    trust: float = 0.001
    bias_correction: bool = True
    decay_norm_bias: bool = True
    clip: float | None = None

    def check(self) -> None:
        """Refuse settings that cannot train, naming the option."""
        if self.name not in OPTIMIZERS:
            raise UserError(f"--optimizer {self.name} is not one of {', '.join(OPTIMIZERS)}")
        beta1, beta2 = self.betas
        if not (0 <= beta1 < 1 and 0 <= beta2 < 1):
            raise UserError(f"--betas {beta1:g},{beta2:g} must both be in [0, 1)")
        if not self.eps > 0:
            raise UserError(f"--eps {self.eps:g} must be positive")
        if not self.trust > 0:
            raise UserError(f"--trust-coefficient {self.trust:g} must be positive")
        if self.clip is not None and not (self.clip > 0 and math.isfinite(self.clip)):
            raise UserError(f"--clip-grad-norm {self.clip:g} must be a positive number")


def decays(param: Parameter, settings: OptimizerSettings) -> bool:
    """Whether weight decay (and a trust ratio) applies to ``param``: always, unless
    ``--no-decay-norm-bias`` spares the parameters of one axis (biases, norms' γ and β: timm's
    rule)."""
    return settings.decay_norm_bias or len(param.shape) > 1


class ShardNorms:
    """Sums of squares of whole tensors from the shards this rank holds, over the ranks of
    ``comm`` (the world; None: one process holding everything): each rank adds the shards it
    holds the first copy of (:meth:`ShardNorms.local`), then one all-reduce sums them all
    (:meth:`ShardNorms.total`). Which shards are first copies is found once, in O(1) per
    shard."""

    def __init__(self, params: list[Parameter], comm: Any) -> None:
        self.comm = comm
        rank = 0 if comm is None else comm.Get_rank()
        self.first = [p.holds_first_copy(rank) and p.weights.size > 0 for p in params]

    def local(self, k: int, a: Any | None) -> Any | None:
        """Σ x² of this rank's shard ``a`` of parameter ``k``'s tensor, on the device (not
        read yet): None where another rank holds that block's first copy (or ``a`` is None).
        A 16-bit array is summed in float32."""
        if a is None or not self.first[k]:
            return None
        if a.dtype.itemsize < 4:
            a = a.astype(np.float32)
        flat = a.reshape(-1)
        return _array_module(a).vdot(flat, flat)

    def total(self, columns: list[list[Any | None]]) -> np.ndarray:
        """The sums over every rank of :meth:`ShardNorms.local` values (None counts 0), one
        column per quantity and one row per parameter, float64 on every rank: one read from the
        device and one all-reduce for all of them."""
        local = np.zeros((len(columns[0]), len(columns)))
        parts = [(k, j, value) for j, column in enumerate(columns)
                 for k, value in enumerate(column) if value is not None]
        if parts:
            xp = _array_module(parts[0][2])
            values = xp.stack([xp.asarray(value, dtype=np.float64) for _, _, value in parts])
            host = values.get() if hasattr(values, "get") else values  # the one wait
            for (k, j, _), value in zip(parts, host, strict=True):
                local[k, j] = value
        if self.comm is not None and self.comm.Get_size() > 1:
            from mpi4py import MPI

            self.comm.Allreduce(MPI.IN_PLACE, local, op=MPI.SUM)
        return local

    def squares(self, columns: list[list[Any | None]]) -> np.ndarray:
        """:meth:`ShardNorms.total` of the :meth:`ShardNorms.local` sums of the arrays in
        ``columns``."""
        return self.total([[self.local(k, a) for k, a in enumerate(column)]
                           for column in columns])


class Optimizer:
    """What every optimizer does: its state per parameter shard (``state[name][k]``, None
    before the first step), the number of updates made (``steps``; fp16's skipped steps do not
    count), the global gradient norm of the last step when clipping (``grad_norm``), and the
    step itself.

    Parameters
    ----------
    params : every parameter shard of the network on this rank (empty ones too, for a layer on
        a group this rank is not in: every rank lists the same tensors in the same order).
    lr, momentum, weight_decay : the rate (a schedule may give another per step), SGD's and
        LARS's momentum, and the weight decay λ.
    settings : the rest (:class:`OptimizerSettings`).
    comm : the world communicator the norms are summed over (None: one process).
    """

    name: ClassVar[str]
    state_names: ClassVar[tuple[str, ...]]
    #: whether each shard's update needs nothing but its own gradient (may run per bucket)
    elementwise: ClassVar[bool]

    def __init__(self, params: list[Parameter], lr: float, momentum: float = 0.9,
                 weight_decay: float = 0.0, settings: OptimizerSettings | None = None,
                 comm: Any = None) -> None:
        settings = settings or OptimizerSettings(self.name)
        check(lr, momentum, weight_decay)
        settings.check()
        self.params, self.lr, self.momentum, self.weight_decay = params, lr, momentum, weight_decay
        self.settings = settings
        self.state: dict[str, list[Any]] = {name: [None] * len(params)
                                            for name in self.state_names}
        self.steps = 0
        self.grad_norm: float | None = None
        # per shard: whether weight decay and a trust ratio apply, and the decay
        self.adapted = [decays(p, settings) for p in params]
        self.decay = [weight_decay if a else 0.0 for a in self.adapted]
        self._index = {id(p): k for k, p in enumerate(params)}
        self._scratch = Scratch()
        self._norms = ShardNorms(params, comm)

    @property
    def per_bucket(self) -> bool:
        """Whether each group of parameters may be updated as soon as its sum arrives."""
        return self.elementwise and self.settings.clip is None

    def during_backward(self, lr: float) -> Callable[[list[Parameter]], None] | None:
        """Begin a step at rate ``lr`` whose updates run during the backward: the update to
        call on each group of parameters as its gradient's sum arrives, or None where this
        optimizer needs every sum first (LARS, LAMB, clipping): then call
        :meth:`Optimizer.step` after the backward."""
        if not self.per_bucket:
            return None
        self.steps += 1
        return partial(self.step, lr)

    def step(self, lr: float | None = None, params: list[Parameter] | None = None,
             unscale: float = 1.0) -> None:
        """One update of every shard, in place, from the summed gradients times ``unscale``
        (1 / the loss scale); or, for an element-wise optimizer without clipping, of
        ``params`` alone, some of them, as their sums arrive within a step begun by
        :meth:`Optimizer.during_backward`. The gradient buffers are overwritten; the next backward
        rebuilds them."""
        lr = self.lr if lr is None else lr
        if params is not None:
            if not self.per_bucket:
                raise RuntimeError(f"{self.name} needs every gradient before it steps")
            self._update(lr, params, unscale, None)
            return
        self.steps += 1
        squares = None
        if self.settings.clip is not None:
            squares = self._norms.squares([[p.grad for p in self.params]])[:, 0]
            self.grad_norm = math.sqrt(squares.sum()) * unscale
            unscale *= min(1.0, self.settings.clip / (self.grad_norm + CLIP_EPS))
        self._update(lr, self.params, unscale, squares)

    def _update(self, lr: float, params: list[Parameter], unscale: float,
                grad_squares: np.ndarray | None) -> None:
        """The update of ``params`` (``grad_squares``: Σ g² of every parameter's whole raw
        gradient, when clipping made them)."""
        raise NotImplementedError

    def _k(self, p: Parameter) -> int:
        return self._index[id(p)]


def check(lr: float, momentum: float, weight_decay: float) -> None:
    """Refuse a rate, momentum or weight decay that cannot train, naming the option."""
    if not lr > 0:
        raise UserError(f"--lr {lr} must be positive")
    if not 0 <= momentum < 1:
        raise UserError(f"--momentum {momentum} must be in [0, 1)")
    if not weight_decay >= 0:
        raise UserError(f"--weight-decay {weight_decay} must be non-negative")


class SGD(Optimizer):
    """v ← μ·v + (g + λ·w);  w ← w − lr·v (:func:`~hpctrain.kernels.sgd.sgd_update`), as
    ``torch.optim.SGD`` without dampening or Nesterov."""

    name, state_names, elementwise = "sgd", ("momentum",), True
    check = staticmethod(check)

    @property
    def velocity(self) -> list[Any]:
        return self.state["momentum"]

    def _update(self, lr: float, params: list[Parameter], unscale: float,
                grad_squares: np.ndarray | None) -> None:
        velocity = self.state["momentum"]
        for p in params:
            k = self._k(p)
            velocity[k] = sgd_update(_array_module(p.weights), p.weights, p.grad, velocity[k],
                                     lr, self.momentum, self.decay[k], self._scratch, unscale,
                                     copy=_copy(p))


class AdamW(Optimizer):
    """Adam with decoupled weight decay, as ``torch.optim.AdamW``
    (:func:`~hpctrain.kernels.adaptive.adamw_update`)."""

    name, state_names, elementwise = "adamw", ("exp_avg", "exp_avg_sq"), True

    def _update(self, lr: float, params: list[Parameter], unscale: float,
                grad_squares: np.ndarray | None) -> None:
        if self.steps == 0:  # bias correction divides by 1 − β^t
            raise RuntimeError("an AdamW step begins with during_backward (or step())")
        m, v, s = self.state["exp_avg"], self.state["exp_avg_sq"], self.settings
        for p in params:
            k = self._k(p)
            m[k], v[k] = adamw_update(_array_module(p.weights), p.weights, p.grad, m[k], v[k],
                                      lr, s.betas, s.eps, self.decay[k], self.steps,
                                      self._scratch, unscale, _copy(p))


class LARS(Optimizer):
    """Layer-wise adaptive rate scaling (You, Gitman and Ginsburg 2017), as MLPerf's ResNet
    and timm's ``Lars``: for each tensor the trust ratio τ = η·‖w‖ / (‖g‖ + λ·‖w‖ + ε) (1 where
    ‖w‖ or ‖g‖ is 0, or for a parameter spared by ``--no-decay-norm-bias``), then
    v ← μ·v + τ·(g + λ·w);  w ← w − lr·v. The norms are of the whole tensors, summed over the
    shards (:class:`ShardNorms`)."""

    name, state_names, elementwise = "lars", ("momentum",), False

    def _update(self, lr: float, params: list[Parameter], unscale: float,
                grad_squares: np.ndarray | None) -> None:
        adapted = self.adapted
        columns = [[p.weights if a else None for p, a in zip(params, adapted, strict=True)]]
        if grad_squares is None:
            columns.append([p.grad if a else None for p, a in zip(params, adapted, strict=True)])
        squares = self._norms.squares(columns)
        velocity, s = self.state["momentum"], self.settings
        for k, p in enumerate(params):
            trust = 1.0
            if adapted[k]:
                w_norm = math.sqrt(squares[k, 0])
                g_squares = grad_squares[k] if grad_squares is not None else squares[k, 1]
                g_norm = math.sqrt(g_squares) * unscale
                if w_norm > 0 and g_norm > 0:
                    trust = s.trust * w_norm / (g_norm + self.decay[k] * w_norm + s.eps)
            # τ·(u·g + λ·w) = (τ·u)·g + (τ·λ)·w: SGD's update with those factors
            velocity[k] = sgd_update(_array_module(p.weights), p.weights, p.grad, velocity[k],
                                     lr, self.momentum, trust * self.decay[k], self._scratch,
                                     trust * unscale, copy=_copy(p))


class LAMB(Optimizer):
    """Layer-wise adaptive moments (You et al. 2020, Algorithm 2): Adam's moments, the
    direction u = m̂ / (√v̂ + ε) + λ·w, and w ← w − lr·τ·u with the trust ratio τ = ‖w‖ / ‖u‖
    of the whole tensors (1 where either is 0, or for a parameter spared by
    ``--no-decay-norm-bias``); bias correction of m̂ and v̂ unless turned off."""

    name, state_names, elementwise = "lamb", ("exp_avg", "exp_avg_sq"), False

    def _update(self, lr: float, params: list[Parameter], unscale: float,
                grad_squares: np.ndarray | None) -> None:
        m, v, s = self.state["exp_avg"], self.state["exp_avg_sq"], self.settings
        adapted, norms = self.adapted, self._norms
        w_column, u_column = [], []
        for k, p in enumerate(params):
            xp = _array_module(p.weights)
            m[k], v[k], u = lamb_moments(xp, p.weights, p.grad, m[k], v[k], s.betas, s.eps,
                                         self.decay[k], self.steps, s.bias_correction,
                                         self._scratch, unscale)
            w_column.append(norms.local(k, p.weights) if adapted[k] else None)
            # Σ u² now, on the device, before the scratch array is reused
            u_column.append(norms.local(k, u) if adapted[k] else None)
        squares = norms.total([w_column, u_column])
        for k, p in enumerate(params):
            w_norm, u_norm = math.sqrt(squares[k, 0]), math.sqrt(squares[k, 1])
            trust = w_norm / u_norm if adapted[k] and w_norm > 0 and u_norm > 0 else 1.0
            lamb_apply(_array_module(p.weights), p.weights, m[k], v[k], lr, trust, s.betas,
                       s.eps, self.decay[k], self.steps, s.bias_correction, self._scratch,
                       _copy(p))


OPTIMIZERS: dict[str, type[Optimizer]] = {o.name: o for o in (SGD, AdamW, LARS, LAMB)}
"""Every ``--optimizer``, by name."""


def make_optimizer(params: list[Parameter], lr: float, momentum: float, weight_decay: float,
                   settings: OptimizerSettings | None = None, comm: Any = None) -> Optimizer:
    """The optimizer ``settings.name`` (SGD when None) over ``params``."""
    settings = settings or OptimizerSettings()
    if settings.name not in OPTIMIZERS:
        raise UserError(f"--optimizer {settings.name} is not one of {', '.join(OPTIMIZERS)}")
    return OPTIMIZERS[settings.name](params, lr, momentum, weight_decay, settings, comm)


def _copy(p: Parameter) -> Any:
    """The kernels' 16-bit copy to round the updated master into, or None."""
    return None if p.master is None else p.value


def _array_module(a: Any) -> Any:
    """NumPy for a NumPy array (or a NumPy scalar), CuPy for a CuPy one."""
    if isinstance(a, (np.ndarray, np.generic)):
        return np
    import cupy

    return cupy
