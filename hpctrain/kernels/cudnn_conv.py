"""Convolution over d spatial axes on a GPU through cuDNN Frontend graphs: the forward
Y = W ⋆ X + b, the data gradient dX = Wᵀ ⋆ dY and the weight gradient dW = dY ⋆ Xᵀ, with the
same contract as :func:`hpctrain.kernels.conv.conv_forward` and
:func:`~hpctrain.kernels.conv.conv_backward` (NCHW or NCDHW CuPy arrays, any stride, a (before,
after) padding per spatial axis, which differ for a band of a split axis).

A graph is built once per :class:`ConvKey` (shapes, stride, padding, dtype, whether tensor cores
may be used) and kept: validated, planned by cuDNN's heuristics (mode A, then the fallback
list), its plan built and pinned; afterwards each call only executes it with the arrays' device
pointers. One cuDNN handle per device, its stream set once to CuPy's current stream when it is
made, and one workspace per device, grown to the largest plan's need.

Precision: the arrays' dtype is the graph's input/output type (float32, bfloat16, float16,
float64); products accumulate in float32 (float64 for float64). The engines cuDNN marks as
converting their inputs down are deselected under every precision, as PyTorch's engine filter
does; under ``fp32`` (no tensor cores) those using tensor cores too, so float32 stays strict;
``tf32``, ``bf16`` and ``fp16`` keep tensor cores. cuDNN may refuse float64 graphs: the layer
then runs im2col.

The bias is added and its gradient summed by CuPy (db in the accumulation dtype, then stored
in the arrays' dtype): one element-wise kernel and one reduction, where a fused bias would
narrow cuDNN's choice of engines.

Layout: hpctrain stores activations channels-first (NCHW), so the graphs declare NCHW strides.
cuDNN's fastest bf16/fp16 kernels read channels-last (NHWC); a graph may take NCHW-ordered
dims with NHWC strides, but only if the arrays are stored so, which would need every kernel
between convolutions (batch norm, pooling, element-wise, the halo exchange) to keep NHWC too.

When cuDNN or the frontend is missing, or cuDNN refuses a shape, :class:`ConvRefused` says
why and the layer uses im2col (:mod:`hpctrain.kernels.conv`) instead.
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys
from dataclasses import dataclass
from math import prod
from typing import Any

import numpy as np

from hpctrain.kernels.products import total

Pads = tuple[tuple[int, int], ...]

_CUDNN_TYPES = {"float32": "FLOAT", "float64": "DOUBLE", "float16": "HALF",
                "bfloat16": "BFLOAT16"}
"""NumPy dtype name → cudnn.data_type member."""


class ConvRefused(Exception):
    """cuDNN graphs cannot run this convolution here; the message says why."""


@dataclass(frozen=True)
class ConvKey:
    """What a convolution's graphs are built for: one per distinct call shape."""

    x_shape: tuple[int, ...]  # (N, C, S1, …, Sd)
    w_shape: tuple[int, ...]  # (O, C, K1, …, Kd)
    stride: tuple[int, ...]
    pads: Pads  # (before, after) per spatial axis
    dtype: str  # NumPy name of the arrays' dtype
    tensor_cores: bool  # products may read TF32 (float32 arrays only)

    @property
    def y_shape(self) -> tuple[int, ...]:
        """(N, O, P1, …, Pd), Pᵢ = ⌊(Sᵢ + beforeᵢ + afterᵢ − Kᵢ)/sᵢ⌋ + 1."""
        n, _, *size = self.x_shape
        o, _, *kernel = self.w_shape
        return (n, o, *((m + before + after - k) // s + 1 for m, k, s, (before, after)
                        in zip(size, kernel, self.stride, self.pads, strict=True)))


@dataclass(frozen=True)
class _Graph:
    """One built graph: its operand tensors in call order and its workspace bytes."""

    graph: Any
    operands: tuple[Any, ...]
    workspace_bytes: int


@dataclass(frozen=True)
class ConvGraphs:
    """The three graphs of one :class:`ConvKey`.

    ``crop``: None when the graphs are built for ``key`` itself. When cuDNN refuses a padding
    whose two sides differ, the graphs are built for the symmetric padding max(before, after)
    on both sides instead, whose output holds ``key``'s as the block ``crop`` (an axis padded
    more after than before starts (after − before)/stride rows later; one padded more before
    ends early): the forward keeps that block, the backward reads dY placed into zeros there.
    """

    key: ConvKey
    forward: _Graph  # (X, W) -> Y
    data_grad: _Graph  # (dY, W) -> dX
    weight_grad: _Graph  # (X, dY) -> dW
    built: ConvKey | None = None  # the symmetric key the graphs run, when ``crop`` is set
    crop: tuple[slice, ...] | None = None

    @property
    def run_y_shape(self) -> tuple[int, ...]:
        """The shape of Y the graphs make and of the dY they read."""
        return (self.built or self.key).y_shape


@dataclass(frozen=True)
class CudnnCache:
    """What the backward needs from the forward: the (contiguous) input and the graphs."""

    x: Any
    graphs: ConvGraphs


class _Device:
    """A device's cuDNN handle (stream set once, at creation, to CuPy's current stream) and
    its workspace, grown as plans need more."""

    def __init__(self, cudnn: Any, cupy: Any) -> None:
        self.cupy = cupy
        self.handle = cudnn.create_handle()
        self.stream = cupy.cuda.get_current_stream().ptr
        cudnn.set_stream(self.handle, self.stream)
        self.workspace = cupy.empty(0, dtype=cupy.uint8)

    def workspace_ptr(self, nbytes: int) -> int:
        if nbytes > self.workspace.size:
            self.workspace = self.cupy.empty(nbytes, dtype=self.cupy.uint8)
        return int(self.workspace.data.ptr)


_STATE: dict[str, Any] = {}  # "cudnn", "cupy", "unavailable": set by _load()
_DEVICES: dict[int, _Device] = {}
_GRAPHS: dict[ConvKey, ConvGraphs | ConvRefused] = {}


def release_graphs() -> None:
    """Let go of every built graph and each device's workspace (the handles stay): what one
    net's convolutions built stays otherwise, in memory, for the next net's. A benchmark
    measuring each net's peak memory in turn calls this between nets."""
    _GRAPHS.clear()
    for device in _DEVICES.values():
        device.workspace = device.cupy.empty(0, dtype=device.cupy.uint8)


def _preload_libcudnn() -> None:
    """Load libcudnn.so.9 from a pip wheel (PyTorch's nvidia-cudnn) when the dynamic linker
    does not find it, so the frontend's own lookup of ``libcudnn.so.9`` succeeds."""
    try:
        ctypes.CDLL("libcudnn.so.9", mode=ctypes.RTLD_GLOBAL)
        return
    except OSError:
        pass
    for root in sys.path:
        for found in sorted(glob.glob(os.path.join(root, "nvidia", "*", "lib", "libcudnn.so.9"))
                            + glob.glob(os.path.join(root, "nvidia", "*", "*", "lib",
                                                     "libcudnn.so.9"))):
            try:
                ctypes.CDLL(found, mode=ctypes.RTLD_GLOBAL)
                return
            except OSError:
                continue


def _load() -> tuple[Any, Any]:
    """(cudnn, cupy), or :class:`ConvRefused` saying why they cannot run (the answer kept)."""
    if "unavailable" in _STATE:
        raise ConvRefused(_STATE["unavailable"])
    if "cudnn" in _STATE:
        return _STATE["cudnn"], _STATE["cupy"]
    try:
        import cupy
    except ImportError as err:
        _STATE["unavailable"] = f"CuPy cannot be imported ({err})"
        raise ConvRefused(_STATE["unavailable"]) from None
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("no device")
    except Exception as err:  # CUDARuntimeError without a driver
        _STATE["unavailable"] = f"no GPU is visible ({err})"
        raise ConvRefused(_STATE["unavailable"]) from None
    _preload_libcudnn()
    try:
        import cudnn
    except Exception as err:  # ImportError, or an OSError from its loader
        _STATE["unavailable"] = (f"the cuDNN Frontend cannot be imported ({err}); "
                                 "pip install nvidia-cudnn-frontend")
        raise ConvRefused(_STATE["unavailable"]) from None
    try:
        cudnn.backend_version()
    except Exception as err:  # RuntimeError: libcudnn not found
        _STATE["unavailable"] = f"the cuDNN library cannot be loaded ({err})"
        raise ConvRefused(_STATE["unavailable"]) from None
    _STATE["cudnn"], _STATE["cupy"] = cudnn, cupy
    return cudnn, cupy


def unavailable() -> str | None:
    """Why cuDNN graphs cannot run in this process, or None when they can."""
    try:
        _load()
    except ConvRefused as err:
        return str(err)
    return None


def _device() -> _Device:
    cudnn, cupy = _load()
    ordinal = cupy.cuda.Device().id
    if ordinal not in _DEVICES:
        try:
            _DEVICES[ordinal] = _Device(cudnn, cupy)
        except Exception as err:
            raise ConvRefused(f"no cuDNN handle on device {ordinal} ({err})") from None
    return _DEVICES[ordinal]


def _dense(shape: tuple[int, ...]) -> list[int]:
    """Row-major (C-contiguous) strides of ``shape``, in elements."""
    return [prod(shape[k + 1:]) for k in range(len(shape))]


def key_of(x_shape: tuple[int, ...], w_shape: tuple[int, ...], stride: tuple[int, ...],
           pads: Pads, dtype: Any, precision: Any) -> ConvKey:
    """The :class:`ConvKey` of a call; ``precision`` an
    :class:`~hpctrain.device.precision.Precision` (None: tensor cores allowed)."""
    name = np.dtype(dtype).name  # ml_dtypes' bfloat16 is "bfloat16"
    tensor_cores = True if precision is None else bool(precision.tensor_cores)
    return ConvKey(tuple(map(int, x_shape)), tuple(map(int, w_shape)),
                   tuple(map(int, stride)), tuple((int(b), int(a)) for b, a in pads), name,
                   tensor_cores)


def _build(cudnn: Any, handle: Any, key: ConvKey, which: str) -> _Graph:
    """Build one graph of ``key``: ``which`` is forward, data_grad or weight_grad."""
    io = getattr(cudnn.data_type, _CUDNN_TYPES[key.dtype])
    compute = cudnn.data_type.DOUBLE if key.dtype == "float64" else cudnn.data_type.FLOAT
    graph = cudnn.pygraph(io_data_type=io, intermediate_data_type=compute,
                          compute_data_type=compute, handle=handle)
    d = len(key.stride)
    conv = {"pre_padding": [before for before, _ in key.pads],
            "post_padding": [after for _, after in key.pads],
            "stride": list(key.stride), "dilation": [1] * d, "compute_data_type": compute}

    def operand(name: str, shape: tuple[int, ...]) -> Any:
        return graph.tensor(name=name, dim=list(shape), stride=_dense(shape), data_type=io)

    def output(t: Any, shape: tuple[int, ...]) -> Any:
        return t.set_output(True).set_data_type(io).set_dim(list(shape)).set_stride(_dense(shape))

    if which == "forward":
        x, w = operand("X", key.x_shape), operand("W", key.w_shape)
        y = output(graph.conv_fprop(image=x, weight=w, name="fprop", **conv), key.y_shape)
        operands = (x, w, y)
    elif which == "data_grad":
        dy, w = operand("DY", key.y_shape), operand("W", key.w_shape)
        dx = output(graph.conv_dgrad(loss=dy, filter=w, name="dgrad", **conv), key.x_shape)
        operands = (dy, w, dx)
    else:
        x, dy = operand("X", key.x_shape), operand("DY", key.y_shape)
        dw = output(graph.conv_wgrad(image=x, loss=dy, name="wgrad", **conv), key.w_shape)
        operands = (x, dy, dw)
    graph.validate()
    graph.build_operation_graph()
    graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    # engines that convert their inputs down (float32 to TF32, 16-bit to 8-bit) are never
    # taken, as PyTorch's engine filter never takes them; strict fp32 takes no tensor cores
    notes = [cudnn.numerical_note.DOWN_CONVERT_INPUTS]
    if key.dtype == "float32" and not key.tensor_cores:
        notes.append(cudnn.numerical_note.TENSOR_CORE)
    graph.deselect_numeric_notes(notes)
    _build_first_plan(graph)  # each plan's support is checked as it is built
    return _Graph(graph, operands, int(graph.get_workspace_size()))


def _build_first_plan(graph: Any) -> None:
    """Build and select (pin) the first plan of the ranked list that builds.

    Each plan is tried on its own: a plan the note filter deselected, or one whose kernel
    does not build for this shape, raises (a refusal for some, a RuntimeError for others),
    and the next is tried; none building is a refusal naming the last reason."""
    reasons = []
    for index in range(graph.get_execution_plan_count()):
        try:
            graph.build_plan_at_index(index)
            return
        except Exception as err:  # the backend's refusal or build failure of this plan
            reasons.append(f"plan {index}: {str(err).splitlines()[0] if str(err) else err!r}")
    raise ConvRefused("no execution plan builds (" + ("; ".join(reasons[-2:]) or "none")
                      + ")")


def graphs_for(key: ConvKey) -> ConvGraphs:
    """The built graphs of ``key`` (built on first use, kept), or :class:`ConvRefused` with
    cuDNN's reason (also kept: a refused shape is not retried). A padding whose sides differ
    that cuDNN refuses runs as the symmetric one, cropped (:class:`ConvGraphs`)."""
    known = _GRAPHS.get(key)
    if isinstance(known, ConvGraphs):
        return known
    if isinstance(known, ConvRefused):
        raise known
    try:
        built = _build_all(key)
    except ConvRefused as refused:
        symmetric = _symmetric(key)
        if symmetric is None:
            _GRAPHS[key] = refused
            raise
        try:
            inner = graphs_for(symmetric)
        except ConvRefused:
            _GRAPHS[key] = refused
            raise refused from None
        built = ConvGraphs(key, inner.forward, inner.data_grad, inner.weight_grad, symmetric,
                           _crop(key, symmetric))
    _GRAPHS[key] = built
    return built


def _build_all(key: ConvKey) -> ConvGraphs:
    """The three graphs of ``key`` as cuDNN builds them, or :class:`ConvRefused`."""
    if key.dtype not in _CUDNN_TYPES:
        raise ConvRefused(f"no cuDNN type for {key.dtype}")
    device = _device()
    cudnn = _STATE["cudnn"]
    try:
        built = ConvGraphs(key, *(_build(cudnn, device.handle, key, which)
                                  for which in ("forward", "data_grad", "weight_grad")))
    except Exception as err:  # cudnnGraphNotSupportedError, RuntimeError, ValueError
        raise ConvRefused(f"cuDNN refused {key.dtype} input {key.x_shape}, weight "
                          f"{key.w_shape}, stride {key.stride}, pads {key.pads}: "
                          f"{str(err).splitlines()[0] if str(err) else type(err).__name__}"
                          ) from None
    device.workspace_ptr(max(g.workspace_bytes for g in
                             (built.forward, built.data_grad, built.weight_grad)))
    return built


def _symmetric(key: ConvKey) -> ConvKey | None:
    """``key`` with max(before, after) on both sides of each axis, when its output holds
    ``key``'s at whole strides (the extra before each axis a multiple of its stride); None
    when the padding is symmetric already, or does not fit."""
    if all(before == after for before, after in key.pads):
        return None
    pads = tuple((max(p), max(p)) for p in key.pads)
    if any((max(p) - p[0]) % s for p, s in zip(key.pads, key.stride, strict=True)):
        return None
    return ConvKey(key.x_shape, key.w_shape, key.stride, pads, key.dtype, key.tensor_cores)


def _crop(key: ConvKey, symmetric: ConvKey) -> tuple[slice, ...]:
    """Where ``key``'s output lies in ``symmetric``'s: per spatial axis from
    (max − before)/stride, as many as ``key`` makes."""
    starts = ((max(p) - p[0]) // s for p, s in zip(key.pads, key.stride, strict=True))
    return (slice(None), slice(None), *(slice(a, a + m) for a, m in
                                        zip(starts, key.y_shape[2:], strict=True)))


def _run(g: _Graph, *arrays: Any) -> None:
    """Execute ``g`` on ``arrays`` (its operands' buffers, in order) on the device's stream.

    Only the pointers are new at each call: the frontend keeps the graph's variant-pack
    template (operand order and declared layouts) from the first call, and the pinned plan."""
    device = _DEVICES[_STATE["cupy"].cuda.Device().id]
    g.graph.execute({t: int(a.data.ptr) for t, a in zip(g.operands, arrays, strict=True)},
                    device.workspace_ptr(g.workspace_bytes), handle=device.handle)


ALIGNMENT = 16
"""The bytes cuDNN's tensors must start on. A band view's first row may not (rows of 7 float32
are 28 bytes), and cuDNN then refuses the plan or reads misaligned (CUDNN_STATUS_BAD_PARAM)."""


def bindable(cupy: Any, a: Any) -> Any:
    """``a`` as cuDNN may bind it: contiguous and starting on :data:`ALIGNMENT` bytes; a copy
    where it is neither (a view of rows is contiguous for one sample and one channel, yet starts
    where its first row does)."""
    a = cupy.ascontiguousarray(a)
    return a if a.data.ptr % ALIGNMENT == 0 else a.copy()


def cudnn_conv_forward(x: Any, w: Any, b: Any | None, stride: tuple[int, ...], pads: Pads,
                       precision: Any = None) -> tuple[Any, CudnnCache]:
    """Y[n, o, p] = Σ_{c, a} W[o, c, a] · Xpad[n, c, p·s + a] + b[o], as
    :func:`hpctrain.kernels.conv.conv_forward`.

    X: (N, C, S1, …, Sd), W: (O, C, K1, …, Kd), b: (O,) or None -> Y: (N, O, P1, …, Pd),
    contiguous, in X's dtype. Raises :class:`ConvRefused` when cuDNN cannot run it.
    """
    cupy = _load()[1]
    x, w = bindable(cupy, x), bindable(cupy, w)  # a band of rows is a view
    graphs = graphs_for(key_of(x.shape, w.shape, stride, pads, x.dtype, precision))
    y = cupy.empty(graphs.run_y_shape, dtype=x.dtype)
    _run(graphs.forward, x, w, y)
    if graphs.crop is not None:
        y = cupy.ascontiguousarray(y[graphs.crop])
    if b is not None:
        y += b.reshape(1, -1, *(1,) * (y.ndim - 2))
    return y, CudnnCache(x, graphs)


def cudnn_conv_backward(dy: Any, w: Any, cache: CudnnCache, need_dx: bool = True,
                        dw_out: Any | None = None, need_db: bool = True
                        ) -> tuple[Any | None, Any, Any | None]:
    """Gradients (dX, dW, db) of :func:`cudnn_conv_forward` given dY: (N, O, P1, …, Pd), as
    :func:`hpctrain.kernels.conv.conv_backward`: dW written into ``dw_out`` when given (a
    contiguous array of W's shape and dtype), db = Σ_{n, p} dY summed in float32 (float64 for
    float64) and stored in dY's dtype (None unless ``need_db``: a layer without a bias skips
    the reduction), dX None unless ``need_dx``."""
    cupy = _load()[1]
    graphs = cache.graphs
    dy, w = bindable(cupy, dy), bindable(cupy, w)
    if dy.dtype != cache.x.dtype or tuple(dy.shape) != graphs.key.y_shape:
        raise ValueError(f"dY {dy.dtype} {tuple(dy.shape)}: the forward made "
                         f"{cache.x.dtype} {graphs.key.y_shape}")
    dw = dw_out if dw_out is not None else cupy.empty(graphs.key.w_shape, dtype=dy.dtype)
    dy_run = dy
    if graphs.crop is not None:  # the symmetric graphs read dY placed into zeros
        dy_run = cupy.zeros(graphs.run_y_shape, dtype=dy.dtype)
        dy_run[graphs.crop] = dy
    _run(graphs.weight_grad, cache.x, dy_run, dw)
    db = None
    if need_db:  # a 16-bit dY summed in float32
        db = total(dy, axis=(0, *range(2, dy.ndim)))
    if not need_dx:
        return None, dw, db
    dx = cupy.empty(graphs.key.x_shape, dtype=dy.dtype)
    _run(graphs.data_grad, dy_run, w, dx)
    return dx, dw, db
