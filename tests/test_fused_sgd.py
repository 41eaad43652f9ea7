"""The fused GPU update (one kernel per shard) against the update an operation at a time.

On the CPU the CuPy kernel is replaced by a NumPy function computing its body, so the
arguments, the first step's velocity and the 16-bit copy are checked here; on a GPU the real
kernel is compared too (skipped without one)."""

import numpy as np
import pytest

import hpctrain.kernels.sgd as sgd
from hpctrain.device.precision import bfloat16


def numpy_kernel(with_copy):
    def update(g, lr, momentum, decay, unscale, first, w, v, copy=None):
        grad = g.astype(w.dtype) * unscale + decay * w
        v[...] = grad if first else momentum * v + grad
        w -= lr * v
        if with_copy:
            copy[...] = w
    return update


def steps(xp, fused, grad_dtype, monkeypatch):
    """(w, v, copy) after three updates, fused or one operation at a time."""
    if fused and xp is np:
        monkeypatch.setattr(sgd, "_fused_kernels",
                            lambda _: (numpy_kernel(False), numpy_kernel(True)))
    rng = np.random.default_rng(4)
    w = xp.asarray(rng.standard_normal(1000).astype(np.float32))
    copy = xp.asarray(np.zeros(1000, grad_dtype)) if grad_dtype != np.float32 else None
    v = None
    for _ in range(3):
        g = xp.asarray(rng.standard_normal(1000).astype(grad_dtype))
        if fused:
            v = sgd._fused_update(xp, w, g, v, 0.1, 0.9, 5e-4, 0.5, copy)
        else:
            v = sgd.sgd_update(np, w, g, v, 0.1, 0.9, 5e-4, sgd.Scratch(), 0.5, copy)
    return w, v, copy


@pytest.mark.parametrize("grad_dtype", [np.float32, bfloat16], ids=["fp32", "bf16-master"])
def test_the_fused_update_is_the_update(monkeypatch, grad_dtype):
    fused = steps(np, True, grad_dtype, monkeypatch)
    plain = steps(np, False, grad_dtype, monkeypatch)
    for a, b in zip(fused, plain):
        if a is not None:
            assert np.allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=1e-6)
    if grad_dtype is bfloat16:
        assert np.array_equal(fused[2], fused[0].astype(bfloat16))


class KernelsThatFailFor16Bits:
    """An ``xp`` whose fused kernels run on float32 weights but fail to compile with a bfloat16
    copy, as ml_dtypes' type can in an older CUDA."""

    ElementwiseKernel = object  # the name sgd_update looks for

    def __init__(self):
        self.cuda = type("cuda", (), {"get_current_stream": staticmethod(
            lambda: type("stream", (), {"synchronize": staticmethod(lambda: None)})())})

    ones = staticmethod(np.ones)
    empty = staticmethod(np.empty)
    empty_like = staticmethod(np.empty_like)


def test_a_16_bit_kernel_that_fails_leaves_the_float32_update_fused(monkeypatch, capsys):
    """The probe runs per copy: bfloat16's failure is said once and that update runs one
    operation at a time, while float32 weights keep the fused kernel."""
    def kernels(_):
        def plain(*args):
            return numpy_kernel(False)(*args)

        def with_copy(*args):
            if args[-1].dtype == bfloat16:
                raise RuntimeError("nvrtc: error: identifier \"__nv_bfloat16\" is undefined")
            return numpy_kernel(True)(*args)
        return plain, with_copy

    monkeypatch.setattr(sgd, "_fused_kernels", kernels)
    sgd._fused_runs.cache_clear()
    xp = KernelsThatFailFor16Bits()
    try:
        assert sgd._fused_runs(xp, None)
        assert not sgd._fused_runs(xp, "bfloat16")
        assert sgd._fused_runs(xp, "float16")
    finally:
        sgd._fused_runs.cache_clear()
    said = capsys.readouterr().out
    assert said.count("does not run") == 1 and "weights with a bfloat16 copy" in said


@pytest.mark.parametrize("grad_dtype", [np.float32, bfloat16], ids=["fp32", "bf16-master"])
def test_the_real_gpu_kernel_is_the_update(real_cupy, monkeypatch, grad_dtype):
    cupy = real_cupy
    fused = steps(cupy, True, grad_dtype, monkeypatch)
    plain = steps(np, False, grad_dtype, monkeypatch)
    for a, b in zip(fused, plain):
        if a is not None:
            got = cupy.asnumpy(a).astype(np.float32)
            assert np.allclose(got, np.asarray(b, np.float32), rtol=1e-5, atol=1e-6)
