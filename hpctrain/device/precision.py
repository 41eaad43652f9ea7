"""Numerical precision of a run: the dtype arrays are stored and sent in, the dtype of the master
weights and optimizer state, and whether products may use tensor cores.

- ``fp64``: float64 throughout.
- ``fp32``: float32 throughout, strict float32 products.
- ``tf32``: float32 storage; products read their inputs at TF32.
- ``bf16``: bfloat16 activations, kernel weights, gradients and messages; float32 master
  weights and optimizer state; products of bf16 inputs with float32 sums.
- ``fp16``: as bf16 with float16, and dynamic loss scaling.

Under ``bf16`` and ``fp16`` a kernel reads and writes 16-bit arrays but accumulates in float32
(a product's sums, batch norm's statistics, the loss); the optimizer updates float32 master
weights with float32 momentum and copies them into the 16-bit weights the kernels use, as
PyTorch's mixed precision (autocast with an fp32 model) does. fp16's range is narrow (largest
65504, smallest normal 6e-5), so its loss is multiplied by a scale that falls on an overflow and
grows after a run of clean steps (:mod:`hpctrain.run.loss_scale`).

``tf32`` rounds the inputs of products to TF32 (10 bits of mantissa, float32's range), as
NVIDIA's tensor cores read float32: on a GPU the libraries do it; on the CPU the inputs are
rounded before a float32 product, so the CPU computes the same kind of numbers, slowly.

On a GPU the default is ``tf32``: float32 storage with convolutions on tensor cores is what
PyTorch does unless told otherwise (``torch.backends.cudnn.allow_tf32`` is on by default), and
mixed precision is asked for (``bf16``, the common choice on Ampere and later; ``fp16`` with
loss scaling for older GPUs). On the CPU the default is ``fp32``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from hpctrain.errors import UserError

_UNSET = object()
_bfloat16: Any = _UNSET


def bfloat16_type() -> Any:
    """ml_dtypes' bfloat16 (NumPy has none; ml_dtypes, a dependency, gives NumPy and CuPy
    one), imported at its first use: the import takes most of a second, which a command that
    never makes a bfloat16 array (``plan`` of an fp32 run) does not pay. None without the
    package."""
    global _bfloat16
    if _bfloat16 is _UNSET:
        try:
            from ml_dtypes import bfloat16
        except ImportError:  # pragma: no cover - the package installs it
            bfloat16 = None
        _bfloat16 = bfloat16
    return _bfloat16


def __getattr__(name: str) -> Any:
    """``bfloat16``, the module's attribute, as :func:`bfloat16_type` gives it."""
    if name == "bfloat16":
        return bfloat16_type()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class Precision:
    """What a precision name means for storage, master weights and products (module doc)."""

    name: str
    storage: Any  # NumPy dtype class: arrays between kernels, gradients, messages
    master: Any  # NumPy dtype class: master weights and optimizer state
    tensor_cores: bool = False  # products read their inputs at reduced precision
    loss_scaling: bool = False  # dynamic loss scaling (fp16)

    @cached_property  # a planner asks for it for every layer it prices
    def itemsize(self) -> int:
        """Bytes of one stored (and sent) value."""
        return np.dtype(self.storage).itemsize

    @property
    def master_itemsize(self) -> int:
        """Bytes of one master weight, or one entry of the optimizer's state."""
        return np.dtype(self.master).itemsize

    @property
    def mixed(self) -> bool:
        """Whether kernels use a 16-bit copy of float32 master weights."""
        return np.dtype(self.storage) != np.dtype(self.master)


class _Precisions(Mapping):
    """The precisions by name, each made when first looked up (bf16's storage type imports
    ml_dtypes: :func:`bfloat16_type`)."""

    def __init__(self, makers: dict[str, Callable[[], Precision]]) -> None:
        self._makers, self._made = makers, {}

    def __getitem__(self, name: str) -> Precision:
        if name not in self._made:
            self._made[name] = self._makers[name]()
        return self._made[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._makers)

    def __len__(self) -> int:
        return len(self._makers)


PRECISIONS: Mapping[str, Precision] = _Precisions({
    "fp64": lambda: Precision("fp64", np.float64, np.float64),
    "fp32": lambda: Precision("fp32", np.float32, np.float32),
    "tf32": lambda: Precision("tf32", np.float32, np.float32, tensor_cores=True),
    "bf16": lambda: Precision("bf16", bfloat16_type(), np.float32, tensor_cores=True),
    "fp16": lambda: Precision("fp16", np.float16, np.float32, tensor_cores=True,
                              loss_scaling=True),
})
"""Every precision by name."""

RUN_PRECISIONS = ("auto", "fp32", "tf32", "bf16", "fp16", "fp64", "float32", "float64")
"""What ``--precision`` takes (auto: tf32 on a GPU, fp32 on the CPU)."""

_DTYPE_NAMES = {"float32": "fp32", "float64": "fp64"}  # the older --dtype spelling


def resolve_precision(name: str, device: str = "cpu") -> Precision:
    """The :class:`Precision` of ``--precision NAME`` on ``device``: auto is tf32 on a GPU and
    fp32 on the CPU; 'float32' and 'float64' are read as fp32 and fp64."""
    name = _DTYPE_NAMES.get(name, name)
    if name == "auto":
        name = "tf32" if device == "gpu" else "fp32"
    if name not in PRECISIONS:
        raise UserError(f"unknown precision {name!r}; choose one of {', '.join(RUN_PRECISIONS)}")
    if name == "bf16" and bfloat16_type() is None:
        raise UserError("--precision bf16 needs the ml_dtypes package: pip install ml_dtypes")
    if name == "bf16" and device == "gpu" and _numpy_version() < GPU_BF16_NUMPY:
        floor = ".".join(map(str, GPU_BF16_NUMPY))
        raise UserError(f"--precision bf16 on a GPU needs NumPy {floor} or later (CuPy's "
                        f"bfloat16 arrays, through ml_dtypes); this is NumPy {np.__version__}: "
                        f"pip install 'numpy>={floor}', or use --precision tf32 or fp16")
    return PRECISIONS[name]


GPU_BF16_NUMPY = (2, 1, 2)
"""The least NumPy that CuPy 14's bfloat16 arrays (ml_dtypes' dtype in CuPy's kernels) run
with; with an older one they fail inside CuPy, at the first array made."""


def _numpy_version() -> tuple[int, ...]:
    """NumPy's release as numbers: (2, 1, 2) for '2.1.2' or '2.1.2rc1', (2, 0) for '2.0'."""
    found = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", np.__version__)
    return tuple(int(n) for n in found.groups() if n is not None) if found else (0,)


_TENSOR_PRODUCTS = False  # float32 products read TF32 inputs (the backend's precision says)


def tensor_products(on: bool, xp: Any = np) -> None:
    """Let float32 products use tensor cores (TF32) or not, for this process
    (:func:`hpctrain.kernels.products.matmul` reads it); on a GPU also set CuPy's cuBLAS
    compute type for float32, a setting of the process as this one is."""
    global _TENSOR_PRODUCTS
    _TENSOR_PRODUCTS = bool(on)
    if xp is np:
        return
    try:  # CuPy's setting of cuBLAS's compute type (CUPY_TF32=1 at import does the same)
        from cupy._core import _routines_linalg as linalg

        linalg.set_compute_type(xp.float32, linalg.COMPUTE_TYPE_TF32 if on
                                else linalg.COMPUTE_TYPE_DEFAULT)
    except (ImportError, AttributeError):  # a CuPy without it, or the test stand-in
        pass


def tensor_products_on() -> bool:
    """Whether float32 products read their inputs at TF32 (:func:`tensor_products`)."""
    return _TENSOR_PRODUCTS


def precision_of_dtype(dtype: Any) -> Precision:
    """The plain precision whose storage is ``dtype`` (float32 → fp32, float64 → fp64, …)."""
    for p in ("fp32", "fp64", "bf16", "fp16"):
        if PRECISIONS[p].storage is not None and np.dtype(PRECISIONS[p].storage) == np.dtype(dtype):
            return PRECISIONS[p]
    raise ValueError(f"no precision stores {dtype}")
