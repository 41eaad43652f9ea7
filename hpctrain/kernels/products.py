"""Matrix products and sums under a run's precision (:mod:`hpctrain.device.precision`).

- **16-bit arrays** (bfloat16, float16) are multiplied with float32 sums, as tensor cores do:
  on the CPU both operands are widened to float32 and the result rounded back; on a GPU a 2-D
  product goes to cuBLAS as it is (``cublasGemmEx`` accumulates 16-bit inputs in float32) and a
  batched one is widened first (CuPy 14's batched bfloat16 products are not to be trusted).
- **TF32** (:func:`~hpctrain.device.precision.tensor_products`, set once per process by
  the backend): float32 products
  read their inputs with 10 bits of mantissa. On a GPU cuBLAS does that (CuPy's compute type
  for float32); on the CPU :func:`tf32` rounds the inputs before a float32 product, so the CPU
  computes the same kind of numbers as a GPU's tensor cores.
- **Sums** of 16-bit arrays (a bias gradient, a pooled window) are made in float32.

float32 and float64 arrays take the plain product, bit for bit what they took before.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hpctrain.device.precision import tensor_products_on


def narrow(dtype: Any) -> bool:
    """Whether ``dtype`` is a 16-bit float (bfloat16 or float16), whose sums go in float32."""
    return np.dtype(dtype).itemsize == 2


def widen(a: Any) -> Any:
    """``a`` as float32 if it is 16-bit, else ``a`` itself."""
    return a.astype(np.float32) if narrow(a.dtype) else a


def tf32(xp: Any, a: Any) -> Any:
    """float32 ``a`` rounded to TF32 (the nearest value with 10 bits of mantissa, ties to
    even), as a tensor core reads it; other dtypes as they are."""
    if a.dtype != np.float32:
        return a
    bits = xp.ascontiguousarray(a).view(np.uint32)
    # add half a unit of the 13 dropped bits (less one, plus the kept lowest bit: ties to even)
    rounded = (bits + (np.uint32(0x0FFF) + ((bits >> np.uint32(13)) & np.uint32(1))))
    rounded &= np.uint32(0xFFFFE000)
    finite = xp.isfinite(a)  # Inf and NaN keep their bits
    return xp.where(finite, rounded.view(np.float32), a)


def matmul(xp: Any, a: Any, b: Any, out: Any = None) -> Any:
    """``a @ b`` (written into ``out`` when given) with float32 sums for 16-bit operands and
    TF32 inputs for float32 ones where tensor products are on (see the module doc)."""
    if narrow(a.dtype) or narrow(b.dtype):
        dtype = a.dtype if narrow(a.dtype) else b.dtype
        if xp is not np and a.ndim == 2 and b.ndim == 2 and a.dtype == b.dtype:
            return xp.matmul(a, b, out=out)  # cuBLAS: 16-bit inputs, float32 sums
        product = xp.matmul(widen(a), widen(b))
        if out is None:
            return product.astype(dtype)
        out[...] = product
        return out
    if xp is np and tensor_products_on():
        a, b = tf32(xp, a), tf32(xp, b)
    return xp.matmul(a, b, out=out)


def total(a: Any, axis: Any = None) -> Any:
    """``a.sum(axis)`` in ``a``'s dtype, summed in float32 when ``a`` is 16-bit."""
    if narrow(a.dtype):
        return a.sum(axis=axis, dtype=np.float32).astype(a.dtype)
    return a.sum(axis=axis)
