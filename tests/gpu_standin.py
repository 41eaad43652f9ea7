"""A strict stand-in for the part of CuPy that hpctrain calls, computing with NumPy on the host.

On a GPU, code that passes on NumPy can still fail or crawl: CuPy refuses to turn a device
array into a NumPy array implicitly (``np.asarray(a)`` raises ``TypeError``), refuses NumPy
arrays as operands of its functions, and every ``.item()``, ``float()``, ``int()``, ``bool()``
or host copy waits for the device. This module reproduces those rules so that the ``--device
gpu`` path can be run and its host traffic counted on a machine without a GPU:

- :class:`ndarray` wraps a NumPy array. Arithmetic, indexing and every function of this module
  compute on the wrapped array and return stand-in arrays (a reduction gives a 0-d array, as
  CuPy does, not a NumPy scalar). ``np.asarray(a)`` and a NumPy array as an operand raise
  ``TypeError`` as they do under CuPy.
- :func:`asnumpy` (and ``a.get()``) is the one way to the host: a device-to-host copy and a
  synchronisation. :func:`asarray` and :func:`array` of host data are host-to-device copies.
- A scalar read (``float(a)``, ``int(a)``, ``bool(a)``, ``a.item()``, ``a.tolist()``, formatting)
  is a synchronisation and a device-to-host copy of what it reads.
- ``cuda.get_current_stream().synchronize()`` and ``cuda.Device().synchronize()`` (the
  current device) are synchronisations. Kernels run at once on the null stream; work a
  library queues on a stream of its own (:meth:`Stream.defer`) waits there until an event
  orders it (:class:`Stream`), so a read that a real GPU could run before it sees stale
  memory here too. Only names CuPy has are offered: a call CuPy
  lacks (``cuda.get_current_device``, say) fails here as it would on a GPU.
- ``cuda.Event()`` records the host clock when it is recorded (everything here is computed at
  once, so that is when the device reaches it) and ``cuda.get_elapsed_time(start, end)`` gives
  the milliseconds between two; ``event.synchronize()`` is a synchronisation. As on a GPU, the
  elapsed time of an event not recorded, or not yet known to be done, is refused: the host must
  have waited for it (any wait after its record) or seen ``event.done``.
- ``a.data.ptr`` is the address of an array's first element, unique to its buffer while the
  buffer lives (a view's is offset by its byte offset), and :func:`buffer_at` finds the device
  memory at an address, as a library handed raw pointers (NCCL) would.

Every such event is added to :data:`counters` with the place in hpctrain that caused it, so a
test can assert a budget per training step and name the line that broke it. The counters also
hold the bytes of device buffers alive and their largest sum, which
``get_default_memory_pool().total_bytes()`` answers as CuPy's pool does (it keeps freed blocks,
so it holds the high-water mark).

A device array reaches MPI only through ``__cuda_array_interface__``, which the stand-in offers
only while :data:`counters` says the MPI library is CUDA-aware: without it, a device array
handed to mpi4py fails, as it would (far less clearly) on a GPU with an MPI that is not.
"""

from __future__ import annotations

import builtins
import itertools
import sys
import weakref
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from time import perf_counter
from types import SimpleNamespace
from typing import Any

import numpy as np

_HERE = str(Path(__file__).resolve())
_PACKAGE = str(Path(__file__).resolve().parent.parent / "hpctrain")

# the event kinds a budget counts
SYNC = "sync"  # an explicit wait for the stream or the device
TO_HOST = "to_host"  # asnumpy / get: a device-to-host copy (waits for the stream)
SCALAR = "scalar"  # float(), int(), bool(), item(), tolist(), format: a wait and a small copy
TO_DEVICE = "to_device"  # asarray / array / setitem of host data: a host-to-device copy


@dataclass
class Counters:
    """What the device was asked for since the last :meth:`reset`.

    ``events`` counts each kind; ``bytes`` the bytes each kind of copy moved; ``places`` each
    (kind, 'file:line') of the hpctrain line (or, outside hpctrain, the first caller outside
    this module) that asked. ``cuda_aware_mpi`` decides whether device arrays offer MPI a
    pointer (see the module docstring); ``devices`` is what ``getDeviceCount`` answers.
    """

    events: Counter = field(default_factory=Counter)
    bytes: Counter = field(default_factory=Counter)
    places: Counter = field(default_factory=Counter)
    cuda_aware_mpi: bool = False
    devices: int = 1
    current_device: int = 0
    live_bytes: int = 0  # device arrays alive now, each buffer once (views not counted)
    peak_bytes: int = 0  # their largest sum: what CuPy's pool holds, as it keeps freed blocks
    live: set = field(default_factory=set)  # ids of the buffers alive
    waited: int = 0  # the tick of the last wait: every event recorded before it is done

    def reset(self) -> None:
        self.events.clear()
        self.bytes.clear()
        self.places.clear()

    def waits(self) -> int:
        """Every event that blocks the host until the device has caught up."""
        return self.events[SYNC] + self.events[TO_HOST] + self.events[SCALAR]

    def snapshot(self) -> dict[str, int]:
        """Counts and bytes of each kind, e.g. ``{'to_host': 2, 'to_host_bytes': 64, ...}``."""
        found = {kind: self.events[kind] for kind in (SYNC, TO_HOST, SCALAR, TO_DEVICE)}
        found.update({f"{kind}_bytes": self.bytes[kind] for kind in (TO_HOST, SCALAR, TO_DEVICE)})
        return found


counters = Counters()


def _allocated(host: np.ndarray) -> None:
    """Count a new device buffer (not a view, nor a buffer already wrapped) until it is
    freed."""
    if not isinstance(host, np.ndarray) or host.base is not None or id(host) in counters.live:
        return
    counters.live.add(id(host))
    counters.live_bytes += host.nbytes
    counters.peak_bytes = builtins.max(counters.peak_bytes, counters.live_bytes)
    weakref.finalize(host, _freed, id(host), host.nbytes)


def _freed(key: int, nbytes: int) -> None:
    counters.live.discard(key)
    counters.live_bytes -= nbytes


class MemoryPool:
    """CuPy's pool of device memory: it keeps freed blocks for reuse, so what it holds is the
    high-water mark of the arrays."""

    def used_bytes(self) -> int:
        return counters.live_bytes

    def total_bytes(self) -> int:
        return counters.peak_bytes

    def free_all_blocks(self) -> None:
        counters.peak_bytes = counters.live_bytes


_POOL = MemoryPool()


def get_default_memory_pool() -> MemoryPool:
    return _POOL


def _caller() -> str:
    """'file:line' of the innermost hpctrain frame asking, else of the first frame outside
    this module."""
    frame = sys._getframe(2)
    outside = None
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(_PACKAGE):
            return f"hpctrain{name[len(_PACKAGE):]}:{frame.f_lineno}"
        if outside is None and name != _HERE:
            outside = f"{Path(name).name}:{frame.f_lineno}"
        frame = frame.f_back
    return outside or "?"


_TICKS = itertools.count(1)  # orders event records and waits


def _count(kind: str, nbytes: int = 0) -> None:
    if kind in (SYNC, TO_HOST, SCALAR):  # the host has caught up with the stream
        counters.waited = next(_TICKS)
    counters.events[kind] += 1
    counters.bytes[kind] += int(nbytes)
    counters.places[kind, _caller()] += 1


def _refuse_host(value: Any) -> None:
    raise TypeError(f"Unsupported type {type(value)}: a NumPy array is not a device array "
                    f"(copy it with asarray first)")


def _unwrap(value: Any) -> Any:
    """The NumPy arrays inside ``value`` (lists, tuples and dicts followed); a NumPy array
    given as an operand is refused, as CuPy refuses it."""
    if isinstance(value, ndarray):
        return value._host
    if isinstance(value, np.ndarray):
        _refuse_host(value)
    if isinstance(value, list | tuple):
        return type(value)(_unwrap(v) for v in value)
    if isinstance(value, dict):
        return {k: _unwrap(v) for k, v in value.items()}
    return value


def _wrap(value: Any) -> Any:
    """Results as device arrays: a NumPy scalar becomes a 0-d array, as a CuPy reduction gives."""
    if isinstance(value, np.ndarray):
        return ndarray(value)
    if isinstance(value, np.generic):
        return ndarray(np.asarray(value))
    if isinstance(value, tuple):
        return tuple(_wrap(v) for v in value)
    if isinstance(value, list):
        return [_wrap(v) for v in value]
    return value


def _call(function: Any, args: tuple, kwargs: dict) -> Any:
    out = kwargs.get("out")
    result = function(*_unwrap(args), **_unwrap(kwargs))
    if isinstance(out, ndarray):  # the very array given, as CuPy returns it
        return out
    return _wrap(result)


def _device_function(function: Any) -> Any:
    if isinstance(function, np.ufunc):
        return DeviceUfunc(function)

    def on_device(*args: Any, **kwargs: Any) -> Any:
        return _call(function, args, kwargs)

    on_device.__name__ = getattr(function, "__name__", "function")
    return on_device


class DeviceUfunc:
    """A NumPy ufunc on device arrays, with CuPy's ``at`` (an unbuffered scatter, no wait)."""

    def __init__(self, ufunc: np.ufunc) -> None:
        self.ufunc = ufunc
        self.__name__ = ufunc.__name__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _call(self.ufunc, args, kwargs)

    def at(self, a: ndarray, indices: Any, b: Any = None) -> None:
        if not isinstance(a, ndarray):
            _refuse_host(a)
        args = (indices,) if b is None else (indices, b)
        self.ufunc.at(a._host, *_unwrap(args))


class ndarray:  # CuPy's name for its array type
    """A device array: a NumPy array only this module's functions may read or convert."""

    __slots__ = ("_host",)
    __array_priority__ = 100.0  # NumPy defers binary operators to ours

    def __init__(self, host: np.ndarray) -> None:
        self._host = host
        _allocated(host)

    # what CuPy forbids
    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        raise TypeError("Implicit conversion to a NumPy array is not allowed. Please use "
                        "`.get()` to construct a NumPy array explicitly.")

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        return _call(getattr(ufunc, method), inputs, kwargs)

    def __array_function__(self, function: Any, types: Any, args: tuple, kwargs: dict) -> Any:
        return _call(function, args, kwargs)

    @property
    def __cuda_array_interface__(self) -> dict:
        if not counters.cuda_aware_mpi:
            raise AttributeError("device memory offered to an MPI that is not CUDA-aware")
        host = self._host
        return {"shape": host.shape, "typestr": host.dtype.str,
                "data": (host.ctypes.data, not host.flags.writeable),
                "strides": None if host.flags.c_contiguous else host.strides, "version": 2}

    @property
    def data(self) -> MemoryPointer:
        """The device pointer of the first element (CuPy's ``MemoryPointer``); its buffer
        can then be found by :func:`buffer_at`."""
        return MemoryPointer(_register(self._host), counters.current_device)

    # attributes that need no device work
    shape = property(lambda self: self._host.shape)
    dtype = property(lambda self: self._host.dtype)
    ndim = property(lambda self: self._host.ndim)
    size = property(lambda self: self._host.size)
    nbytes = property(lambda self: self._host.nbytes)
    itemsize = property(lambda self: self._host.itemsize)
    strides = property(lambda self: self._host.strides)
    flags = property(lambda self: self._host.flags)
    T = property(lambda self: ndarray(self._host.T))

    def __len__(self) -> int:
        return len(self._host)

    def __iter__(self) -> Any:
        return (_wrap(row) for row in self._host)

    # reads that wait for the device
    def _read(self) -> np.ndarray:
        _count(SCALAR, self._host.nbytes)
        return self._host

    def item(self) -> Any:
        return self._read().item()

    def tolist(self) -> Any:
        return self._read().tolist()

    def __float__(self) -> float:
        return float(self._read())

    def __int__(self) -> int:
        return int(self._read())

    def __index__(self) -> int:
        return self._read().__index__()

    def __bool__(self) -> bool:
        return bool(self._read())

    def __format__(self, spec: str) -> str:
        return format(self._read(), spec)

    def __repr__(self) -> str:
        return f"device {self._read()!r}"

    def get(self, stream: Any = None) -> np.ndarray:
        return asnumpy(self)

    # indexing: host index arrays are copied to the device, as CuPy does
    def __getitem__(self, index: Any) -> Any:
        return _wrap(self._host[_index(index)])

    def __setitem__(self, index: Any, value: Any) -> None:
        if isinstance(value, np.ndarray):
            _count(TO_DEVICE, value.nbytes)
        else:
            value = _unwrap(value)
        self._host[_index(index)] = value

    def __getattr__(self, name: str) -> Any:
        if name in _METHODS:
            return _device_function(getattr(self._host, name))
        raise AttributeError(f"the CuPy stand-in's ndarray has no {name!r}; add it if CuPy's "
                             f"has it")


class MemoryPointer:
    """An address in device memory: ``ptr`` (an int), as CuPy's ``a.data`` gives."""

    __slots__ = ("ptr", "device_id")

    def __init__(self, ptr: int, device_id: int) -> None:
        self.ptr, self.device_id = ptr, device_id

    def __int__(self) -> int:
        return self.ptr


# the buffers whose address has been asked for: id of the owning NumPy array -> its weakref
_BUFFERS: dict[int, weakref.ref] = {}


def _register(host: np.ndarray) -> int:
    """The address of ``host``'s first element, its buffer (the array that owns the memory)
    now findable by :func:`buffer_at` while it lives."""
    owner = host
    while isinstance(owner.base, np.ndarray):
        owner = owner.base
    key = id(owner)
    if key not in _BUFFERS:
        _BUFFERS[key] = weakref.ref(owner, lambda _, key=key: _BUFFERS.pop(key, None))
    return host.ctypes.data


def buffer_at(ptr: int, nbytes: int | None = None) -> ndarray:
    """The device memory at address ``ptr`` (from ``a.data.ptr``, possibly offset), as a 1-d
    ``uint8`` device array sharing it: ``nbytes`` long, or to the end of its buffer. Writes to
    it are writes to the array it belongs to. An address in no live buffer, or a range past the
    buffer's end, raises ``ValueError`` (on a GPU, an illegal memory access)."""
    for ref in list(_BUFFERS.values()):
        owner = ref()
        if owner is None:
            continue
        start = owner.ctypes.data
        if start <= ptr < start + builtins.max(owner.nbytes, 1):
            raw = owner.reshape(-1, order="A").view(np.uint8)  # an owner is contiguous
            offset = ptr - start
            end = owner.nbytes if nbytes is None else offset + int(nbytes)
            if end > owner.nbytes:
                raise ValueError(f"{nbytes} bytes at {ptr:#x} run past the end of its buffer "
                                 f"({owner.nbytes - offset} bytes left)")
            return ndarray(raw[offset:end])
    raise ValueError(f"no live device buffer holds address {ptr:#x}")


def _index(index: Any) -> Any:
    parts = index if isinstance(index, tuple) else (index,)
    for part in parts:
        if isinstance(part, np.ndarray):
            _count(TO_DEVICE, part.nbytes)
        elif isinstance(part, ndarray) and part.dtype == np.bool_:
            # CuPy reads the number of True entries back to size the result
            _count(SCALAR, np.dtype(np.intp).itemsize)
    unwrapped = tuple(p._host if isinstance(p, ndarray) else p for p in parts)
    return unwrapped if isinstance(index, tuple) else unwrapped[0]


# ndarray methods, computed on the host array, results wrapped
_METHODS = frozenset({
    "all", "any", "argmax", "argmin", "astype", "clip", "copy", "cumsum", "dot", "fill",
    "flatten", "max", "mean", "min", "prod", "ravel", "repeat", "reshape", "round", "squeeze",
    "std", "sum", "swapaxes", "take", "transpose", "var", "view",
})


def _operator(name: str, ufunc: Any, reflected: bool = False, inplace: bool = False) -> None:
    def apply(self: ndarray, other: Any) -> Any:
        if inplace:
            return _call(ufunc, (self, other), {"out": self})
        return _call(ufunc, (other, self) if reflected else (self, other), {})

    setattr(ndarray, name, apply)


for _name, _ufunc in [("add", np.add), ("sub", np.subtract), ("mul", np.multiply),
                      ("truediv", np.true_divide), ("floordiv", np.floor_divide),
                      ("mod", np.remainder), ("pow", np.power), ("matmul", np.matmul),
                      ("and", np.bitwise_and), ("or", np.bitwise_or), ("xor", np.bitwise_xor),
                      ("lshift", np.left_shift), ("rshift", np.right_shift)]:
    _operator(f"__{_name}__", _ufunc)
    _operator(f"__r{_name}__", _ufunc, reflected=True)
    _operator(f"__i{_name}__", _ufunc, inplace=True)
for _name, _ufunc in [("lt", np.less), ("le", np.less_equal), ("gt", np.greater),
                      ("ge", np.greater_equal), ("eq", np.equal), ("ne", np.not_equal)]:
    _operator(f"__{_name}__", _ufunc)
ndarray.__hash__ = None  # type: ignore[assignment]  (an array with __eq__ is unhashable)
ndarray.__neg__ = lambda self: _call(np.negative, (self,), {})  # type: ignore[method-assign]
ndarray.__pos__ = lambda self: _call(np.positive, (self,), {})  # type: ignore[method-assign]
ndarray.__abs__ = lambda self: _call(np.absolute, (self,), {})  # type: ignore[method-assign]
ndarray.__invert__ = lambda self: _call(np.invert, (self,), {})  # type: ignore[method-assign]


# copies between host and device
def asnumpy(a: Any, stream: Any = None, order: str = "C", out: Any = None) -> np.ndarray:
    """The device array ``a`` copied to a new NumPy array (a NumPy ``a`` is returned as is)."""
    if not isinstance(a, ndarray):
        return np.asarray(a, order=order)
    _count(TO_HOST, a._host.nbytes)
    return np.array(a._host, order=order, copy=True)


def _to_device(obj: Any, dtype: Any, copy: bool) -> ndarray:
    if isinstance(obj, ndarray):
        host = obj._host.astype(dtype, copy=copy) if dtype is not None else obj._host
        return ndarray(host.copy() if copy and host is obj._host else host)
    if builtins.any(isinstance(v, ndarray) for v in (obj if isinstance(obj, list | tuple) else [])):
        raise TypeError("Implicit conversion to a NumPy array is not allowed: a list of device "
                        "arrays (use stack)")
    host = np.array(obj, dtype=dtype, copy=True)
    _count(TO_DEVICE, host.nbytes)
    return ndarray(host)


def asarray(a: Any, dtype: Any = None, order: Any = None) -> ndarray:
    """``a`` on the device: a device array as is, host data copied (counted)."""
    return _to_device(a, dtype, copy=False)


def array(obj: Any, dtype: Any = None, copy: bool = True, order: Any = None) -> ndarray:
    return _to_device(obj, dtype, copy=copy)


def ascontiguousarray(a: Any, dtype: Any = None) -> ndarray:
    if not isinstance(a, ndarray):
        _refuse_host(a)
    return ndarray(np.ascontiguousarray(a._host, dtype=dtype))


def bincount(x: ndarray, weights: Any = None, minlength: int | None = None) -> ndarray:
    """CuPy's bincount, which reads two values back (any negative entry, the largest) to check
    its input and size its output: two waits for the device."""
    if (x < 0).any():
        raise ValueError("The first argument of bincount must be non-negative")
    size = int(x.max()) + 1
    if minlength is not None:
        size = builtins.max(size, int(minlength))
    return _call(np.bincount, (x,), {"weights": weights, "minlength": size})


def get_array_module(*args: Any) -> Any:
    return sys.modules[__name__] if builtins.any(isinstance(a, ndarray) for a in args) else np


# the device and its streams
class CUDARuntimeError(RuntimeError):
    pass


class Stream:
    """A CUDA stream (``cupy.cuda.Stream``), by its ``ptr``: 0 for the null stream.

    The stand-in device runs every kernel at once, in the host's order: that is the null stream,
    the current one, whose queue is always empty. Work queued on another stream (a library's
    writes, handed to :meth:`defer`: the NCCL stand-in's results) waits in that stream's queue
    until something orders it: :meth:`synchronize`, an event recorded after it that another
    stream waits for (:meth:`wait_event`) or the host waits for (``event.synchronize()``), or
    ``Device().synchronize()``. Until then it has not happened: a read not ordered after it
    sees the memory as it was, as a race on a GPU may; a query (``event.done``) says the device
    is still busy, which a GPU may say too.

    ``non_blocking`` is kept: a stream made without it is ordered with the null stream on a GPU
    (the legacy default stream waits for it and it for the default stream), which a library
    that wants work beside the null stream's must know (:func:`stream_at` callers check it)."""

    def __init__(self, null: bool = False, non_blocking: bool = False,
                 ptds: bool = False) -> None:
        self.ptr = 0 if null else next(_STREAM_POINTERS)
        self.non_blocking = bool(non_blocking)
        self._queue: list[tuple[int, Any]] = []  # (serial, work) not yet run
        self._serial = 0  # works queued so far
        self.waited = 0  # the record tick of the last event this stream was made to wait for
        _STREAMS[self.ptr] = self

    def defer(self, work: Any) -> None:
        """Queue ``work`` (a function of nothing) on this stream; the null stream runs it now."""
        if self.ptr == 0:
            work()
            return
        self._serial += 1
        self._queue.append((self._serial, work))

    def _run_to(self, mark: int) -> None:
        """Run the work queued up to serial ``mark``, in order."""
        while self._queue and self._queue[0][0] <= mark:
            self._queue.pop(0)[1]()

    def _busy_at(self, mark: int) -> bool:
        return bool(self._queue) and self._queue[0][0] <= mark

    def wait_event(self, event: Event) -> None:
        """Later work on this stream waits for ``event``: what its stream queued before it
        runs first."""
        if not event._tick:
            raise CUDARuntimeError("wait_event: an event never recorded")
        event._stream._run_to(event._mark)
        self.waited = builtins.max(self.waited, event._tick)

    def record(self, event: Event | None = None) -> Event:
        event = Event() if event is None else event
        event.record(self)
        return event

    def synchronize(self) -> None:
        self._run_to(self._serial)
        _count(SYNC)

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


_STREAM_POINTERS = itertools.count(0x5000, 0x10)
_STREAMS: dict[int, Stream] = {}  # every stream made, by pointer (a handful per process)
_STREAM = Stream(null=True)


def stream_at(ptr: int) -> Stream:
    """The stream whose ``ptr`` is ``ptr`` (a library is handed the pointer alone)."""
    try:
        return _STREAMS[ptr]
    except KeyError:
        raise CUDARuntimeError(f"cudaErrorInvalidResourceHandle: no stream at {ptr:#x}") from None


def next_tick() -> int:
    """A tick after every event recorded so far (a library marks its own calls with it)."""
    return next(_TICKS)


def _run_every_stream() -> None:
    for stream in list(_STREAMS.values()):
        stream._run_to(stream._serial)


class Event:
    """A CUDA event: :meth:`record` it on a stream, and the device marks the moment it has
    run everything queued there before it. On the null stream that is the host clock at the
    record; on another stream, the moment its queue up to the record has run."""

    def __init__(self, block: bool = False, disable_timing: bool = False,
                 interprocess: bool = False) -> None:
        self.timing = not disable_timing
        self._tick = 0  # 0: never recorded
        self._seen_done = -1  # the record whose completion ``done`` reported
        self._time = 0.0
        self._stream, self._mark = _STREAM, 0

    def record(self, stream: Stream | None = None) -> None:
        if stream is not None and not isinstance(stream, Stream):
            raise TypeError(f"record on a stream, not {type(stream).__name__}")
        self._stream = _STREAM if stream is None else stream
        self._mark = self._stream._serial
        self._tick = next(_TICKS)
        self._time = perf_counter()

    def synchronize(self) -> None:
        """Wait for the device to reach the event."""
        self._stream._run_to(self._mark)
        _count(SYNC)

    @property
    def done(self) -> bool:
        """Whether the device has reached the event (a query, not a wait): on the null stream
        always; on another, once what was queued before it has run."""
        if self._stream._busy_at(self._mark):
            return False
        self._seen_done = self._tick
        return True

    def _known_done(self) -> bool:
        return self._tick < counters.waited or self._seen_done == self._tick


def get_elapsed_time(start_event: Event, end_event: Event) -> float:
    """Milliseconds from ``start_event`` to ``end_event``, both recorded and done."""
    for event in (start_event, end_event):
        if not event._tick:
            raise CUDARuntimeError("cudaErrorInvalidResourceHandle: an event never recorded")
        if not event.timing:
            raise CUDARuntimeError("cudaErrorInvalidResourceHandle: an event made with "
                                   "disable_timing=True")
        if not event._known_done():
            raise CUDARuntimeError("cudaErrorNotReady: the host has not waited for the event "
                                   "(synchronize it, or a later one) since it was recorded")
    return (end_event._time - start_event._time) * 1e3


class Device:
    def __init__(self, device: int | None = None) -> None:
        self.id = counters.current_device if device is None else int(device)
        if not 0 <= self.id < counters.devices:
            raise CUDARuntimeError(f"cudaErrorInvalidDevice: device {self.id}")
        self._previous: list[int] = []

    def use(self) -> None:
        counters.current_device = self.id

    def synchronize(self) -> None:
        _run_every_stream()
        _count(SYNC)

    def __enter__(self) -> Device:
        self._previous.append(counters.current_device)
        self.use()
        return self

    def __exit__(self, *exc: object) -> None:
        counters.current_device = self._previous.pop()


def _device_count() -> int:
    return counters.devices


def _properties(device: int) -> dict[str, Any]:
    return {"name": b"Stand-in GPU (NumPy)", "totalGlobalMem": 16 << 30,
            "multiProcessorCount": 1}


cuda = SimpleNamespace(
    Device=Device,
    Event=Event,
    MemoryPointer=MemoryPointer,
    Stream=Stream,
    get_elapsed_time=get_elapsed_time,
    get_current_stream=lambda: _STREAM,
    runtime=SimpleNamespace(getDeviceCount=_device_count, getDeviceProperties=_properties,
                            CUDARuntimeError=CUDARuntimeError),
)

lib = SimpleNamespace(stride_tricks=SimpleNamespace(
    as_strided=_device_function(np.lib.stride_tricks.as_strided)))

# types and constants, CuPy's being NumPy's
dtype = np.dtype
float16, float32, float64 = np.float16, np.float32, np.float64
int8, int16, int32, int64, intp = np.int8, np.int16, np.int32, np.int64, np.intp
uint8, uint16, uint32, uint64 = np.uint8, np.uint16, np.uint32, np.uint64
bool_ = np.bool_
inf, nan, newaxis, pi = np.inf, np.nan, np.newaxis, np.pi

# functions made on the device (no host data read); the ufuncs and routines of NumPy's names
_FUNCTIONS = (
    "abs", "absolute", "add", "all", "any", "arange", "argmax", "argmin",
    "broadcast_to", "ceil", "clip", "concatenate", "cos", "cumsum", "divide", "dot", "einsum",
    "empty", "empty_like", "equal", "exp", "expand_dims", "floor", "floor_divide", "full",
    "full_like", "greater", "greater_equal", "isfinite", "isinf", "isnan", "less",
    "less_equal", "linspace", "log", "log1p", "logical_and", "logical_not", "logical_or",
    "matmul", "max", "maximum", "mean", "min", "minimum", "moveaxis", "multiply", "negative",
    "not_equal", "ones", "ones_like", "pad", "power", "prod", "ravel", "remainder", "reshape",
    "right_shift", "left_shift", "bitwise_and", "bitwise_or", "bitwise_xor", "sign", "sin",
    "split", "sqrt", "square", "squeeze", "stack", "subtract", "sum", "swapaxes", "take",
    "tanh", "tensordot", "transpose", "true_divide", "var", "vdot", "where", "zeros",
    "zeros_like",
)
for _name in _FUNCTIONS:
    globals()[_name] = _device_function(getattr(np, _name))


def __getattr__(name: str) -> Any:
    raise AttributeError(f"the CuPy stand-in has no {name!r}; add it if CuPy has it")
