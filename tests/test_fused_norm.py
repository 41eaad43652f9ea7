"""The fused GPU batch norm (:mod:`hpctrain.kernels.fused_norm`) against the generic kernels.

On the CPU its six CuPy kernels are replaced by NumPy functions computing what each kernel's
expression says, so the orchestration (the shift, the messages, the shapes, μ and σ², ΔX) is
checked here; on a GPU the real kernels are compared too (skipped without one).
"""

import numpy as np
import pytest

import hpctrain.kernels.fused_norm as fused
from hpctrain.kernels.norm import batchnorm_backward, batchnorm_forward


def numpy_kernels(xp):
    f32 = np.float32

    def reduction(fn):
        return lambda *args, axis: fn(*(np.asarray(a, f32) for a in args)).sum(axis=axis,
                                                                               dtype=f32)

    def elementwise(fn):
        return lambda *args: fn(*(np.asarray(a, f32) for a in args)).astype(args[0].dtype)

    return {"shifted": reduction(lambda x, k: x - k),
            "squares": reduction(lambda x, k: (x - k) ** 2),
            "normalise": elementwise(lambda x, mean, scale, beta: (x - mean) * scale + beta),
            "grad": reduction(lambda dy: dy),
            "grad_xhat": reduction(lambda dy, x, mean, inv_std: dy * ((x - mean) * inv_std)),
            "input_grad": elementwise(lambda dy, x, mean, inv_std, scale, mdy, mdyx:
                                      scale * (dy - mdy - (x - mean) * inv_std * mdyx))}


def compare(xp, kernels_of, monkeypatch, shift_given, dtype=np.float32):
    monkeypatch.setattr(fused, "_kernels", kernels_of)

    def host(a):
        return (np.asarray(a) if xp is np else xp.asnumpy(a)).astype(np.float32)

    rng = np.random.default_rng(5)
    x = xp.asarray((rng.standard_normal((4, 3, 5, 6)) * 2 + 3).astype(dtype))
    gamma = xp.asarray(rng.standard_normal(3).astype(np.float32))
    beta = xp.asarray(rng.standard_normal(3).astype(np.float32))
    counts = xp.asarray([[4 * 5 * 6]], np.float32)
    shift = xp.asarray(np.array([2.5, 3.5, 3.0], np.float32)) if shift_given else None
    messages = []

    def reduce(a):
        messages.append(a.shape)
        return a

    y, cache, mean, var = fused.fused_batchnorm_forward(xp, x, gamma, beta, 1e-5, counts, reduce,
                                                        shift)
    want_y, want_cache, want_mean, want_var = batchnorm_forward(
        xp, x.astype(np.float32), gamma, beta, 1e-5, counts, lambda a: a, shift)
    assert messages == ([(2, 1, 3)] if shift_given else [(1, 3), (1, 3)])
    assert y.dtype == x.dtype and mean.shape == var.shape == (1, 3)
    tol = 1e-5 if dtype == np.float32 else 1e-2
    assert np.allclose(host(mean), host(want_mean), rtol=tol)
    assert np.allclose(host(var), host(want_var), rtol=tol * 10)
    assert np.allclose(host(y), host(want_y), atol=tol * 10)
    dy = xp.asarray(rng.standard_normal(x.shape).astype(dtype))
    dx, local, total = fused.fused_batchnorm_backward(xp, dy, cache, counts, reduce)
    want_dx, _, want_total = batchnorm_backward(xp, dy.astype(np.float32), want_cache, counts,
                                                lambda a: a)
    assert dx.dtype == x.dtype and total.shape == (2, 1, 3)
    assert np.allclose(host(total), host(want_total), rtol=tol * 10, atol=tol * 10)
    assert np.allclose(host(dx), host(want_dx), atol=tol * 10)


@pytest.mark.parametrize("shift_given", [False, True], ids=["first-step", "shifted"])
def test_the_fused_kernels_compute_the_generic_batch_norm(monkeypatch, shift_given):
    compare(np, numpy_kernels, monkeypatch, shift_given)


def test_numpy_and_a_stand_in_take_the_generic_kernels(standin_cupy):
    assert not fused.fused_available(np) and not fused.fused_available(standin_cupy)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("shift_given", [False, True], ids=["first-step", "shifted"])
def test_the_real_gpu_kernels_compute_the_generic_batch_norm(real_cupy, monkeypatch, shift_given,
                                                             dtype):
    cupy = real_cupy
    from hpctrain.device.precision import bfloat16

    compare(cupy, fused._kernels, monkeypatch, shift_given,
            np.float32 if dtype == "float32" else bfloat16)
