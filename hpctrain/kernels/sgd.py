"""The SGD update of one parameter shard, in place: g ← g + λ·w;  v ← μ·v + g;  w ← w − lr·v.

Element-wise, so a shard's update is the serial one restricted to the shard. The optimizer
(:class:`hpctrain.run.optimizer.SGD`) applies it to every shard, and the compute model times it
(:data:`hpctrain.model.operations.UPDATE`): the same code both times.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache
from typing import Any

import numpy as np

#: entries per block of the CPU update; w, g, v and scratch in float32 take 1 MiB, which stays in
#: a core's L2 or its share of L3. Measured cold over 24 M parameters: 42.5 ms against 52.6 ms
#: whole; blocks of 4 Ki entries lose (80 ms) to the Python call per operation
CPU_BLOCK = 1 << 16


class Scratch:
    """Reusable flat buffers for the update's temporaries: one per array module and dtype, grown
    when a larger block comes."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[str, str], Any] = {}

    def like(self, xp: Any, w: Any) -> Any:
        """A scratch array of ``w``'s shape and dtype (a view of the kept buffer)."""
        key = (xp.__name__, np.dtype(w.dtype).str)
        buffer = self._buffers.get(key)
        if buffer is None or buffer.size < w.size:
            buffer = self._buffers[key] = xp.empty(w.size, dtype=w.dtype)
        return buffer[:w.size].reshape(w.shape)


def sgd_update(xp: Any, w: Any, g: Any, v: Any | None, lr: float, momentum: float,
               weight_decay: float, scratch: Scratch, unscale: float = 1.0,
               copy: Any = None) -> Any | None:
    """Update ``w`` in place from its gradient ``g`` and velocity ``v``; the velocity to keep.

    ``v`` is None before the first step with momentum: μ·0 + g is g, so the first velocity is
    the gradient itself, in a new array that is returned. Without momentum ``v`` is neither read
    nor changed, and returned as it came. ``g`` may be overwritten (a 16-bit gradient's
    unscaling); it is rebuilt by the next backward.

    The operations are those of g = ∇ + λ·w; v = μ·v + g; w = w − lr·v, in that order, without a
    temporary array per operation. A step over tens of millions of parameters is memory-bound:
    done an operation at a time over whole arrays it reads and writes each of w, g, v about four
    times. On the CPU it goes a block of :data:`CPU_BLOCK` entries at a time instead, every
    operation on a block while the block is in cache, so each array crosses the memory bus about
    once (the numbers are the same: every entry sees the same operations in the same order). On
    a GPU whole arrays, since each operation is a kernel launch — or, on CuPy with momentum,
    one fused kernel for the whole update (``_fused_update``).

    ``g`` may be 16-bit with ``w`` the float32 master weights: it is widened first, and
    multiplied by ``unscale`` (1 / fp16's loss scale); ``copy``, when given, receives the
    updated ``w`` rounded to its dtype (the kernels' 16-bit weights).
    """
    first = bool(momentum) and v is None
    if (momentum and xp is not np and hasattr(xp, "ElementwiseKernel")
            and _fused_runs(xp, None if copy is None else np.dtype(copy.dtype).name)):
        return _fused_update(xp, w, g, v, lr, momentum, weight_decay, unscale, copy)
    if g.dtype != w.dtype:
        g = g.astype(w.dtype)
    if unscale != 1.0:
        g *= w.dtype.type(unscale)
    if first:
        v = xp.empty_like(w)
    velocity = v if momentum else None
    temporary = None
    for wb, gb, vb in _blocks(xp, w, g, velocity):
        if temporary is None or temporary.shape != wb.shape:  # the first and the last block
            temporary = scratch.like(xp, wb)
        _update(xp, wb, gb, vb, temporary, lr, momentum, weight_decay, first)
    if copy is not None:
        copy[...] = w
    return v


@cache
def _fused_runs(xp: Any, copy: str | None) -> bool:
    """Whether the fused update compiles and runs here for weights with a 16-bit copy of dtype
    ``copy`` (None: float32 alone), tried once on a tiny shard; else that update runs one
    operation at a time, as said once. Each is tried on its own: a bfloat16 kernel that does
    not compile (ml_dtypes' type in an older CUDA) leaves the float32 update fused."""
    try:
        w, g = xp.ones(4, np.float32), xp.ones(4, np.float32)
        narrow = None if copy is None else xp.empty(4, _dtype_named(copy))
        _fused_update(xp, w, g, None, 0.1, 0.9, 0.0, 1.0, narrow)
        xp.cuda.get_current_stream().synchronize()
    except Exception as err:  # a compiler's or driver's error: any of them means "not here"
        weights = "float32 weights" if copy is None else f"weights with a {copy} copy"
        print(f"SGD: the fused GPU update of {weights} does not run ({type(err).__name__}: "
              f"{str(err).splitlines()[0] if str(err) else ''}); one operation at a time "
              f"instead", flush=True)
        return False
    return True


def _dtype_named(name: str) -> Any:
    """The dtype ``name`` (bfloat16 through ml_dtypes)."""
    from hpctrain.device.precision import bfloat16

    return bfloat16 if name == "bfloat16" else np.dtype(name)


@cache
def _fused_kernels(xp: Any) -> tuple[Any, Any]:
    """The update as one CuPy kernel: without and with the 16-bit copy of the weights."""
    body = ("W grad = (W)g * unscale + decay * w;"
            "v = first ? grad : momentum * v + grad;"
            "w = w - lr * v;")
    params = "G g, W lr, W momentum, W decay, W unscale, bool first"
    return (xp.ElementwiseKernel(params, "W w, W v", body, "hpctrain_sgd"),
            xp.ElementwiseKernel(params, "W w, W v, C copy", body + "copy = (C)w;",
                                 "hpctrain_sgd_copy"))


def _fused_update(xp: Any, w: Any, g: Any, v: Any | None, lr: float, momentum: float,
                  weight_decay: float, unscale: float, copy: Any) -> Any:
    """:func:`sgd_update` with momentum on CuPy: one kernel reads g, w and v and writes w, v
    (and the 16-bit copy), where the operations one at a time would launch six or more. A
    parameter shard is often small (a bias, a batch norm's γ), so the launches, not the bytes,
    are what a step's update costs there."""
    first = v is None
    if first:
        v = xp.empty_like(w)
    plain, with_copy = _fused_kernels(xp)
    t = w.dtype.type
    args = (g, t(lr), t(momentum), t(weight_decay), t(unscale), first)
    if copy is None:
        plain(*args, w, v)
    else:
        with_copy(*args, w, v, copy)
    return v


def _update(xp: Any, w: Any, g: Any, v: Any, scratch: Any, lr: float, momentum: float,
            weight_decay: float, first: bool) -> None:
    """The step on one block: w, g, v and a scratch array of the same shape. The decayed
    gradient goes into the scratch array, not back into g: g is read once and never written,
    one pass fewer over memory (λ·w + g is g + λ·w, the same number)."""
    if weight_decay:
        xp.multiply(w, weight_decay, out=scratch)
        g = xp.add(scratch, g, out=scratch)
    if momentum:
        if first:
            v[...] = g
        else:
            v *= momentum
            v += g
        g = v
    w -= xp.multiply(g, lr, out=scratch)


def _blocks(xp: Any, w: Any, g: Any, v: Any) -> Iterator[tuple[Any, Any, Any]]:
    """(w, g, v) whole, or on the CPU in blocks of :data:`CPU_BLOCK` entries (flat views of
    contiguous arrays); ``v`` may be None (no momentum)."""
    arrays = [w, g] if v is None else [w, g, v]
    if xp is not np or not all(a.flags.c_contiguous for a in arrays):
        yield w, g, v
        return
    w, g = w.reshape(-1), g.reshape(-1)
    v = None if v is None else v.reshape(-1)
    for start in range(0, w.size, CPU_BLOCK):
        part = slice(start, start + CPU_BLOCK)
        yield w[part], g[part], None if v is None else v[part]
