"""Convolutions through cuDNN Frontend graphs (hpctrain/kernels/cudnn_conv.py).

Everywhere: where CuPy, a GPU or cuDNN is missing the module says why and nothing is built,
and a convolution layer on NumPy never asks for cuDNN. With a GPU: the forward, data gradient,
weight gradient and bias gradient against the im2col kernels (hpctrain/kernels/conv.py) on the
host in float64, for images and volumes, strides and (before, after) paddings that differ, in
float64, strict float32 (no TF32: the tolerance would catch it), TF32 and bfloat16.
"""

from __future__ import annotations

import numpy as np
import pytest

from hpctrain.device.precision import PRECISIONS
from hpctrain.kernels import cudnn_conv
from hpctrain.kernels.conv import conv_backward, conv_forward


def gpu_ready() -> str | None:
    """Why the GPU tests cannot run here, or None."""
    return cudnn_conv.unavailable()


def test_key_shapes_follow_the_forward_formula() -> None:
    key = cudnn_conv.key_of((2, 5, 11, 10), (6, 5, 3, 2), (2, 3), ((0, 2), (1, 0)),
                            np.dtype(np.float32), PRECISIONS["fp32"])
    y, _ = conv_forward(np, np.zeros((2, 5, 11, 10), np.float32),
                        np.zeros((6, 5, 3, 2), np.float32), None, (2, 3), ((0, 2), (1, 0)))
    assert key.y_shape == y.shape
    assert key.dtype == "float32" and not key.tensor_cores
    assert cudnn_conv.key_of((1, 1, 4, 4), (1, 1, 1, 1), (1, 1), ((0, 0), (0, 0)),
                             np.float32, PRECISIONS["tf32"]).tensor_cores


def test_missing_gpu_or_cudnn_is_a_reason_not_an_error() -> None:
    reason = cudnn_conv.unavailable()
    if reason is None:
        pytest.skip("cuDNN graphs run here: nothing to fall back from")
    assert isinstance(reason, str) and reason
    assert cudnn_conv.unavailable() == reason  # asked once, kept
    key = cudnn_conv.key_of((1, 1, 4, 4), (1, 1, 3, 3), (1, 1), ((1, 1), (1, 1)), np.float32,
                            None)
    with pytest.raises(cudnn_conv.ConvRefused, match=reason[:20]):
        cudnn_conv.graphs_for(key)


def test_a_network_on_numpy_never_asks_for_cudnn(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU network's convolutions stay im2col: cuDNN is neither loaded nor asked."""
    from mpi4py import MPI

    from hpctrain.comm.grid import GridSet
    from hpctrain.data.synthetic import SyntheticData
    from hpctrain.device.backend import Backend
    from hpctrain.model.net import parse_net
    from hpctrain.plan.plans import LayerPlan
    from hpctrain.run.network import Network

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("cuDNN asked for on the CPU")

    monkeypatch.setattr(cudnn_conv, "unavailable", refuse)
    monkeypatch.setattr(cudnn_conv, "graphs_for", refuse)
    net = parse_net("input channels=3 size=8 classes=4\nconv out=5 kernel=3 pad=1\nrelu\n"
                    "flatten\nlinear out=4\n", "tiny")
    backend = Backend(np, np.float32)
    with GridSet(MPI.COMM_SELF) as grids:
        network = Network(net, [LayerPlan("batch", (1, 1))] * len(net.layers), 2, grids,
                          backend)
        loss, _ = network.train_step(SyntheticData.for_net(backend, net, 2), 0)
    assert np.isfinite(loss)
    assert not network.layers[0].use_cudnn


def test_a_layer_routes_its_bands_through_the_kernel_it_ran(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With cuDNN graphs "available" (here NumPy im2col under the cuDNN kernel's names, on an
    array module named cupy) a network's convolutions call them with the whole block's
    padding, backward takes the cache the forward made, and every gradient is the im2col
    network's."""
    import types

    from mpi4py import MPI

    from hpctrain.comm.grid import GridSet
    from hpctrain.data.synthetic import SyntheticData
    from hpctrain.device.backend import Backend
    from hpctrain.model.net import parse_net
    from hpctrain.plan.plans import LayerPlan
    from hpctrain.run.network import Network

    calls: list[tuple] = []

    def fake_graphs(key: cudnn_conv.ConvKey) -> str:
        calls.append(("build", key.x_shape, key.pads))
        return "graphs"

    def fake_forward(x, w, b, stride, pads, precision):
        calls.append(("forward", x.shape, pads))
        key = cudnn_conv.key_of(x.shape, w.shape, stride, pads, x.dtype, precision)
        y, _ = conv_forward(np, x, w, b, stride, pads)
        return y, cudnn_conv.CudnnCache(x, cudnn_conv.ConvGraphs(key, None, None, None))

    def fake_backward(dy, w, cache, need_dx=True, dw_out=None, need_db=True):
        key = cache.graphs.key
        calls.append(("backward", need_dx, need_db))
        _, im2col = conv_forward(np, cache.x, w, None, key.stride, key.pads)
        dx, dw, db = conv_backward(np, dy, w, im2col, key.stride, need_dx, dw_out)
        return dx, dw, db if need_db else None

    monkeypatch.setattr(cudnn_conv, "unavailable", lambda: None)
    monkeypatch.setattr(cudnn_conv, "graphs_for", fake_graphs)
    monkeypatch.setattr(cudnn_conv, "cudnn_conv_forward", fake_forward)
    monkeypatch.setattr(cudnn_conv, "cudnn_conv_backward", fake_backward)
    named_cupy = types.ModuleType("cupy")
    named_cupy.__getattr__ = lambda name: getattr(np, name)
    net = parse_net("input channels=3 size=10 classes=4\nconv out=5 kernel=3 stride=2 pad=1\n"
                    "relu\nconv out=6 kernel=2 pad=same bias=0\nflatten\nlinear out=4\n",
                    "tiny")
    grads = []
    for xp in (np, named_cupy):
        backend = Backend(xp, np.float64)
        with GridSet(MPI.COMM_SELF) as grids:
            network = Network(net, [LayerPlan("batch", (1, 1))] * len(net.layers), 2, grids,
                              backend)
            network.train_step(SyntheticData.for_net(backend, net, 2), 0)
            grads.append([np.array(p.grad) for p in network.params])
            uses = [layer.use_cudnn for layer in network.layers if hasattr(layer, "use_cudnn")]
    assert uses == [True, True]
    # set-up builds each layer's block as the forward then runs it: the same pads, the rows
    # the windows read (conv1 reads no row past the last: none padded after it)
    builds = [c[1:] for c in calls if c[0] == "build"]
    forwards = [c[1:] for c in calls if c[0] == "forward"]
    assert builds == forwards == [((2, 3, 10, 10), ((1, 0), (1, 1))),
                                  ((2, 5, 5, 5), ((0, 1),) * 2)]
    # the first layer reads the batch (no dX); the second has no bias (no db)
    assert [c[1:] for c in calls if c[0] == "backward"] == [(True, False), (False, True)]
    for ours, theirs in zip(*grads, strict=True):
        np.testing.assert_allclose(theirs, ours, rtol=1e-13, atol=1e-15)


# -- on a GPU -----------------------------------------------------------------------------------

CASES = {
    "3x3 same": ((2, 3, 9, 8), (4, 3, 3, 3), (1, 1), ((1, 1), (1, 1))),
    "1x1 stride 2": ((2, 8, 8, 8), (16, 8, 1, 1), (2, 2), ((0, 0), (0, 0))),
    "7x7 stride 2": ((2, 3, 20, 18), (8, 3, 7, 7), (2, 2), ((3, 3), (3, 3))),
    "band pads": ((2, 5, 11, 10), (6, 5, 3, 2), (2, 3), ((0, 2), (1, 0))),
    "volume same 2x2x2": ((1, 4, 8, 8, 8), (8, 4, 2, 2, 2), (1, 1, 1), ((0, 1),) * 3),
    "volume strided": ((2, 3, 7, 6, 5), (4, 3, 3, 3, 3), (2, 1, 2),
                       ((1, 1), (1, 0), (0, 1))),
}
SYMMETRIC = {name for name, (*_, pads) in CASES.items() if all(b == a for b, a in pads)}
TOLERANCE = {"fp64": 1e-11, "fp32": 2e-5, "tf32": 8e-3, "bf16": 4e-2}


def relative(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got.astype(np.float64) - want).max() / max(np.abs(want).max(), 1e-30))


@pytest.mark.parametrize("precision", sorted(TOLERANCE))
@pytest.mark.parametrize("case", sorted(CASES))
def test_against_im2col(case: str, precision: str) -> None:
    why = gpu_ready()
    if why is not None:
        pytest.skip(f"needs a GPU with cuDNN: {why}")
    import cupy

    x_shape, w_shape, stride, pads = CASES[case]
    p = PRECISIONS[precision]
    dtype = np.dtype(p.storage)
    rng = np.random.default_rng(7)
    # the stored values, and the float64 reference computed from exactly those
    x, w = (rng.standard_normal(s).astype(dtype) for s in (x_shape, w_shape))
    b = rng.standard_normal(w_shape[0]).astype(dtype)
    want_y, cache = conv_forward(np, x.astype(np.float64), w.astype(np.float64),
                                 b.astype(np.float64), stride, pads)
    dy = rng.standard_normal(want_y.shape).astype(dtype)
    want_dx, want_dw, want_db = conv_backward(np, dy.astype(np.float64), w.astype(np.float64),
                                              cache, stride)
    try:
        y, gpu_cache = cudnn_conv.cudnn_conv_forward(cupy.asarray(x), cupy.asarray(w),
                                                     cupy.asarray(b), stride, pads, p)
    except cudnn_conv.ConvRefused as refused:
        if case in SYMMETRIC and precision != "fp64":
            raise
        pytest.xfail(f"cuDNN refuses it (the layer uses im2col): {refused}")
    dw_out = cupy.empty(w_shape, dtype=dtype)
    dx, dw, db = cudnn_conv.cudnn_conv_backward(cupy.asarray(dy), cupy.asarray(w), gpu_cache,
                                                True, dw_out)
    assert dw is dw_out
    assert y.dtype == dx.dtype == dw.dtype == db.dtype == dtype
    errors = {name: relative(cupy.asnumpy(got), want) for name, got, want in
              (("y", y, want_y), ("dx", dx, want_dx), ("dw", dw, want_dw),
               ("db", db, want_db))}
    assert max(errors.values()) < TOLERANCE[precision], (case, precision, errors)
    # a second call runs the kept graphs, and no dX when it is not needed
    again, _ = cudnn_conv.cudnn_conv_forward(cupy.asarray(x), cupy.asarray(w), None, stride,
                                             pads, p)
    assert relative(cupy.asnumpy(again), want_y - b.astype(np.float64).reshape(
        1, -1, *(1,) * (len(x_shape) - 2))) < TOLERANCE[precision]
    none, _, no_db = cudnn_conv.cudnn_conv_backward(cupy.asarray(dy), cupy.asarray(w),
                                                    gpu_cache, False, need_db=False)
    assert none is None and no_db is None


def test_a_band_view_is_taken_as_its_rows() -> None:
    """A band of rows is a view of the input (rows.py slices it): the kernel reads the rows the
    view shows, not the memory after its first element."""
    why = gpu_ready()
    if why is not None:
        pytest.skip(f"needs a GPU with cuDNN: {why}")
    import cupy

    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 12, 7))
    w = rng.standard_normal((4, 3, 3, 3))
    pads = ((1, 0), (1, 1))
    want, _ = conv_forward(np, x[:, :, 4:9], w, None, (1, 1), pads)
    got, _ = cudnn_conv.cudnn_conv_forward(cupy.asarray(x)[:, :, 4:9], cupy.asarray(w), None,
                                           (1, 1), pads, PRECISIONS["fp64"])
    assert relative(cupy.asnumpy(got), want) < 1e-11


def test_the_benchmark_lets_go_of_one_nets_graphs_before_the_next(monkeypatch) -> None:
    """``bench/gpu_step.py`` measures each net's peak device memory in turn: the graphs and
    the workspace the last net's convolutions built are let go first, or they would count in
    the next net's peak."""
    import sys
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "bench"))
    import gpu_step

    class Pool:  # CuPy's empty() for the workspace, counting what it holds
        uint8 = np.uint8

        @staticmethod
        def empty(n, dtype):
            return np.empty(n, dtype)

    device = cudnn_conv._Device.__new__(cudnn_conv._Device)
    device.cupy, device.workspace = Pool, np.empty(2**20, np.uint8)
    monkeypatch.setitem(cudnn_conv._DEVICES, 0, device)
    monkeypatch.setitem(cudnn_conv._GRAPHS, ("some", "key"), object())
    gpu_step.free_device_memory("cpu")
    assert not cudnn_conv._GRAPHS and device.workspace.size == 0
    del sys.modules["gpu_step"]


class _Recorder:
    """A stand-in for the cuDNN Frontend module: its graph records which numerical notes were
    deselected, the rest of the building answers as the frontend does."""

    class data_type:  # noqa: N801 - the frontend's names
        FLOAT, DOUBLE, HALF, BFLOAT16 = "float", "double", "half", "bfloat16"

    class numerical_note:  # noqa: N801
        TENSOR_CORE, DOWN_CONVERT_INPUTS = "tensor core", "down-convert inputs"

    class heur_mode:  # noqa: N801
        A, FALLBACK = "a", "fallback"

    def __init__(self) -> None:
        self.deselected: list[list[str]] = []

    def pygraph(self, **_: object) -> object:
        recorder = self

        class Tensor:
            def set_output(self, _):
                return self

            set_data_type = set_dim = set_stride = set_output

        class Graph:
            def tensor(self, **_):
                return Tensor()

            conv_fprop = conv_dgrad = conv_wgrad = tensor

            def validate(self):
                pass

            build_operation_graph = validate

            def create_execution_plans(self, _):
                pass

            def deselect_numeric_notes(self, notes):
                recorder.deselected.append(list(notes))

            def get_execution_plan_count(self):
                return 1

            def build_plan_at_index(self, _):
                pass

            def get_workspace_size(self):
                return 0

        return Graph()


@pytest.mark.parametrize("precision,expected", [
    ("fp32", {"down-convert inputs", "tensor core"}),
    ("tf32", {"down-convert inputs"}),
    ("bf16", {"down-convert inputs"}),
])
def test_down_converting_engines_are_never_taken(precision: str, expected: set) -> None:
    """As PyTorch's engine filter: engines that convert their inputs down are deselected under
    every precision (tf32 too), and tensor-core engines under strict fp32 alone."""
    p = PRECISIONS[precision]
    key = cudnn_conv.key_of((2, 3, 8, 8), (4, 3, 3, 3), (1, 1), ((1, 1), (1, 1)),
                            np.dtype(p.storage), p)
    recorder = _Recorder()
    cudnn_conv._build(recorder, None, key, "forward")
    assert [set(notes) for notes in recorder.deselected] == [expected]


def test_a_band_that_starts_off_alignment_is_copied_before_cudnn_binds_it(standin_cupy) -> None:
    """A band of rows of one sample and one channel is a contiguous view starting where its
    first row does (rows of 7 float32, 28 bytes: off 16-byte alignment); cuDNN binds a copy,
    and an aligned contiguous array as it is."""
    cupy = standin_cupy
    x = cupy.asarray(np.arange(84, dtype=np.float32).reshape(1, 1, 12, 7))
    band = x[:, :, 1:5]
    assert band.flags.c_contiguous and band.data.ptr % cudnn_conv.ALIGNMENT
    bound = cudnn_conv.bindable(cupy, band)
    assert bound.data.ptr % cudnn_conv.ALIGNMENT == 0
    assert np.array_equal(cupy.asnumpy(bound), np.arange(84, dtype=np.float32).reshape(
        1, 1, 12, 7)[:, :, 1:5])
    assert cudnn_conv.bindable(cupy, x).data.ptr == x.data.ptr  # no copy
