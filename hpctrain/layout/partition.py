"""Pure maths of splits: block ranges, factorisations and halo plans. No MPI here.

Every split in hpctrain uses the same block rule: part k of n items split into ``parts`` is
``[k*n // parts, (k+1)*n // parts)``. Sizes differ by at most one, and the rule nests: when
``parts_coarse`` divides ``parts_fine``, coarse block j is exactly the union of fine blocks
``j*m … (j+1)*m - 1`` with ``m = parts_fine // parts_coarse``, because
``floor(j*m*n / parts_fine) = floor(j*n / parts_coarse)``. That is what makes the batch split of
a 1×P grid a refinement of the batch split of any Pr×Pc grid, so moving between them is an
all-gather rather than a general all-to-all.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from hpctrain.errors import UserError
from hpctrain.kernels.resize import Resampling
from hpctrain.kernels.sliding import out_size


class SplitError(UserError):
    """A split that would leave a rank empty, or a halo no neighbour can supply."""


def block_range(n: int, parts: int, index: int) -> tuple[int, int]:
    """Half-open range ``[start, stop)`` of block ``index`` when ``n`` items are cut ``parts`` ways.

    Example: ``n=10, parts=4`` gives blocks [0,2) [2,5) [5,7) [7,10).
    """
    if not 0 <= index < parts:
        raise ValueError(f"block index {index} outside 0..{parts - 1}")
    return index * n // parts, (index + 1) * n // parts


class BlockRanges(Sequence):
    """All blocks of ``n`` items cut ``parts`` ways, in order, as a sequence of ``(start, stop)``
    that stores none of them: any block is found in O(1) (:func:`block_range`). It equals, and
    hashes like, the tuple of its blocks; the hash, the one O(parts) operation, is made once.

    A planner makes thousands of layouts with P up to thousands of ranks, and asks of most of
    them only the largest block: materialising every block of every split took a large share
    of a plan at P = 4096.
    """

    __slots__ = ("n", "parts", "_hash")

    def __init__(self, n: int, parts: int) -> None:
        self.n, self.parts, self._hash = n, parts, None

    def __len__(self) -> int:
        return self.parts

    def __getitem__(self, index: int | slice
                    ) -> tuple[int, int] | tuple[tuple[int, int], ...]:
        if isinstance(index, slice):
            return tuple(self[k] for k in range(*index.indices(self.parts)))
        k = index + self.parts if index < 0 else index
        if not 0 <= k < self.parts:
            raise IndexError(f"block {index} of {self.parts}")
        return k * self.n // self.parts, (k + 1) * self.n // self.parts

    def __iter__(self) -> Iterator[tuple[int, int]]:
        n, parts = self.n, self.parts
        return ((k * n // parts, (k + 1) * n // parts) for k in range(parts))

    def largest(self) -> int:
        """The size of the largest block, ``ceil(n / parts)``."""
        return -(-self.n // self.parts)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, BlockRanges):  # the blocks determine (n, parts) and back
            return (self.n, self.parts) == (other.n, other.parts)
        if isinstance(other, tuple):
            return len(other) == self.parts and all(a == b for a, b in zip(self, other))
        return NotImplemented

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(tuple(self))
        return self._hash

    def __repr__(self) -> str:
        return f"BlockRanges(n={self.n}, parts={self.parts})"


@lru_cache(maxsize=4096)
def block_ranges(n: int, parts: int) -> BlockRanges:
    """All blocks of ``n`` items cut ``parts`` ways, in order (see :class:`BlockRanges`).
    Cached, so that layouts of the same split share one object and compare in O(1)."""
    return BlockRanges(n, parts)


def _empty_block(n: int, parts: int, what: str) -> str:
    # "cut", not "use a grid": the same words serve an RxC grid and a degree per axis
    return (f"{what} of size {n} cannot be split {parts} ways (a rank would be empty); cut it "
            f"at most {n} way{'s' if n > 1 else ''}")


def check_split(n: int, parts: int, what: str, layer: str) -> None:
    """Refuse a split that leaves some block empty, naming the layer and the sizes."""
    if parts > n:
        raise SplitError(f"layer {layer}: {_empty_block(n, parts, what)}")


def factorisations(p: int) -> list[tuple[int, int]]:
    """Every (Pr, Pc) with Pr*Pc = p, Pr ascending: 6 -> [(1,6), (2,3), (3,2), (6,1)]."""
    low = [r for r in range(1, math.isqrt(p) + 1) if p % r == 0]  # O(√p): p may be thousands
    return [(r, p // r) for r in low + [p // r for r in reversed(low) if r * r != p]]


@lru_cache(maxsize=256)
def ordered_factorisations(p: int, count: int) -> tuple[tuple[int, ...], ...]:
    """Every way to write ``p`` as a product of ``count`` factors in order: the degrees of a
    split of p ranks over ``count`` axes. 4 into 2 -> (1, 4), (2, 2), (4, 1); 4096 = 2¹² into 5
    gives C(16, 4) = 1820."""
    if count == 1:
        return ((p,),)
    return tuple((a, *rest) for a, b in factorisations(p)
                 for rest in ordered_factorisations(b, count - 1))


@dataclass(frozen=True)
class Window:
    """A sliding window along one axis: kernel size, stride, and zero padding before and after
    (``after`` None: as much as ``before``; TensorFlow's ``same`` for an even kernel pads one more
    after), and its dilation: taps ``dilation`` apart, so that a window spans
    dilation·(kernel − 1) + 1 entries (its ``span``), which is what its rows, output size and
    halos count."""

    kernel: int
    stride: int = 1
    before: int = 0
    after: int | None = None
    dilation: int = 1

    def __post_init__(self) -> None:
        if self.after is None:  # one spelling per window: it keys caches
            object.__setattr__(self, "after", self.before)

    @property
    def span(self) -> int:
        """Entries from the window's first tap to its last."""
        return self.dilation * (self.kernel - 1) + 1

    def out_size(self, n_in: int) -> int:
        return out_size(n_in, self.span, self.stride, self.before, self.after)

    def rows_needed(self, out_start: int, out_stop: int) -> tuple[int, int]:
        """Input rows that outputs [start, stop) read; beyond the image means padding."""
        first = out_start * self.stride - self.before
        return first, (out_stop - 1) * self.stride - self.before + self.span

    def __str__(self) -> str:
        pads = f"{self.before}" if self.after == self.before else f"{self.before}+{self.after}"
        dilated = f" dilated {self.dilation}" if self.dilation != 1 else ""
        return f"{self.kernel}/{self.stride}/{pads}{dilated}"


@dataclass(frozen=True)
class TransposedWindow:
    """What a transposed convolution reads along one axis: input entry i reaches the outputs
    i·s − before + a·D for its taps a = 0 … K − 1 (:mod:`hpctrain.kernels.deconv`); the outputs
    kept drop ``before`` entries of the full (n − 1)·s + D·(K − 1) + 1 and ``after`` at its end
    (PyTorch's padding p and output padding q: before = p, after = p − q, which may be
    negative: outputs no input reaches). Its rows, output size and halos are counted as a
    :class:`Window`'s; rows it reads beyond the image are zeros, as padding is."""

    kernel: int
    stride: int = 1
    before: int = 0
    after: int = 0
    dilation: int = 1

    @property
    def span(self) -> int:
        """Entries from a window's first tap to its last."""
        return self.dilation * (self.kernel - 1) + 1

    def out_size(self, n_in: int) -> int:
        return (n_in - 1) * self.stride + self.span - self.before - self.after

    def crop(self, rows: tuple[int, int], out: tuple[int, int]) -> tuple[int, int]:
        """(first, size) of the outputs ``out`` = [start, stop) in the full output of the input
        rows ``rows`` = [start, stop) (:mod:`hpctrain.kernels.deconv`): input row r reaches
        output r·s − before first."""
        return out[0] - (rows[0] * self.stride - self.before), out[1] - out[0]

    def rows_needed(self, out_start: int, out_stop: int) -> tuple[int, int]:
        """Input rows that reach outputs [start, stop): i with
        o − span < i·s − before ≤ o for some o in the range."""
        s = self.stride
        first = -((self.span - 1 - out_start - self.before) // s)  # ⌈(o₀ + before − span + 1)/s⌉
        return first, max(first, (out_stop - 1 + self.before) // s + 1)

    def __str__(self) -> str:
        dilated = f" dilated {self.dilation}" if self.dilation != 1 else ""
        return (f"transposed {self.kernel}/{self.stride}, cropped {self.before}+{self.after}"
                f"{dilated}")


@lru_cache(maxsize=4096)  # options are frozen: a planner asks for each layer's many times
def windows_of(options: Any) -> tuple[Window, ...] | tuple[Resampling, ...] | tuple[
        TransposedWindow, ...]:
    """The window along every spatial axis of a window layer's resolved ``options`` (kernel,
    stride and pad one per axis; dilated where they have a ``dilation``, as a convolution's
    may), or what stands for one: the resampling of an upsampling layer, the transposed
    window of a transposed convolution (options that know their own windows)."""
    o = options
    if hasattr(o, "windows"):
        return tuple(o.windows())
    dilation = getattr(o, "dilation", None) or (1,) * len(o.kernel)
    return tuple(Window(k, s, *p, dilation=d)
                 for k, s, p, d in zip(o.kernel, o.stride, o.pad, dilation, strict=True))


AnyWindow = Window | Resampling | TransposedWindow


@dataclass(frozen=True)
class HaloPlan:
    """What one rank of a height-split (domain-parallel) window layer holds, needs and exchanges.

    Rows are global input-row indices. The rank owns input rows ``own`` and output rows ``out``;
    the window over ``out`` reads rows ``need`` (clipped to the image; the rest is padding, of
    ``pad_top``/``pad_bottom`` rows). It receives ``recv_top`` rows from the rank above and
    ``recv_bottom`` from the rank below, and sends ``send_top`` to the rank above and
    ``send_bottom`` to the rank below. ``interior`` is the output rows computable from owned rows
    (and image padding) alone, so the layer can compute them while the halos are in flight.
    Empty ranges are ``(x, x)``.
    """

    own: tuple[int, int]
    out: tuple[int, int]
    need: tuple[int, int]
    pad_top: int
    pad_bottom: int
    recv_top: tuple[int, int]
    recv_bottom: tuple[int, int]
    send_top: tuple[int, int]
    send_bottom: tuple[int, int]
    interior: tuple[int, int]


def _needed_clipped(window: AnyWindow, out: tuple[int, int],
                    n_in: int) -> tuple[int, int, int, int]:
    lo, hi = window.rows_needed(*out)
    # outputs that read only rows beyond the image (a transposed window's output padding)
    # read none of it: an empty range at its edge
    first = min(max(lo, 0), n_in)
    return first, max(min(hi, n_in), first), max(0, -lo), max(0, hi - n_in)


def halo_plans(n_in: int, parts: int, window: AnyWindow, layer: str,
               axis: str = "height") -> tuple[HaloPlan, ...]:
    """Halo plans for all ``parts`` row blocks of a height-``n_in`` input under ``window``
    (``axis``: what a refusal calls the split axis, a volume's depth).

    Input rows and output rows are both block-split ``parts`` ways. A rank may take halo rows only
    from its direct neighbours; a window that would need rows two ranks away is refused, naming
    ``layer``.
    """
    plans, refusal = _halo_plans(n_in, parts, window)
    if refusal:
        raise SplitError(f"layer {layer}: {refusal.format(axis=axis)}")
    return plans


def halo_row_counts(n_in: int, parts: int, window: AnyWindow, layer: str,
                    axis: str = "height"
                    ) -> tuple[frozenset[tuple[int, int]], frozenset[tuple[int, int]]]:
    """The distinct (top, bottom) numbers of halo rows the ranks of :func:`halo_plans`
    receive, and those they send: a few, however many ranks, and all a halo exchange's cost
    depends on."""
    halo_plans(n_in, parts, window, layer, axis)  # refuses, naming the layer
    return _halo_row_counts(n_in, parts, window)


@lru_cache(maxsize=4096)
def _halo_row_counts(n_in: int, parts: int, window: AnyWindow
                     ) -> tuple[frozenset[tuple[int, int]], frozenset[tuple[int, int]]]:
    def rows(*ranges: tuple[int, int]) -> tuple[int, ...]:
        return tuple(hi - lo for lo, hi in ranges)

    plans, _ = _halo_plans(n_in, parts, window)
    return (frozenset(rows(p.recv_top, p.recv_bottom) for p in plans),
            frozenset(rows(p.send_top, p.send_bottom) for p in plans))


@lru_cache(maxsize=4096)
def _halo_plans(n_in: int, parts: int, window: AnyWindow
                ) -> tuple[tuple[HaloPlan, ...], str]:
    """(:func:`halo_plans`, "") or ((), why they cannot be made). Cached apart from the layer,
    which only a refusal names: placement, the feasibility checks, the cost model and the
    layer ask for the same plans, for many layers of one shape, and they take O(parts)."""
    n_out = window.out_size(n_in)
    if n_out < 1:
        return (), f"input {{axis}} {n_in} is smaller than the window {window}"
    for n, what in ((n_in, "input {axis}"), (n_out, "output {axis}")):
        if parts > n:
            return (), _empty_block(n, parts, what)
    own = block_ranges(n_in, parts)
    out = block_ranges(n_out, parts)
    need = [_needed_clipped(window, o, n_in) for o in out]
    recvs = []
    for k in range(parts):
        (a, b, _, _), (h0, h1) = need[k], own[k]
        top = (a, min(h0, b)) if a < h0 else (h0, h0)
        bottom = (max(h1, a), b) if b > h1 else (h1, h1)
        for (r0, r1), nb, side in ((top, k - 1, "above"), (bottom, k + 1, "below")):
            if r1 > r0 and not (0 <= nb < parts and own[nb][0] <= r0 and r1 <= own[nb][1]):
                held = own[nb][1] - own[nb][0] if 0 <= nb < parts else 0
                return (), (f"row block {k} of {parts} needs {r1 - r0} halo rows from {side} "
                            f"but that neighbour holds {held} ({{axis}} {n_in} split {parts} "
                            f"ways, window {window}); use "
                            f"fewer splits of the {{axis}} or a larger input")
        recvs.append((top, bottom))
    plans = []
    for k in range(parts):
        a, b, pad_top, pad_bottom = need[k]
        h0, h1 = own[k]
        send_top = recvs[k - 1][1] if k > 0 else (h0, h0)
        send_bottom = recvs[k + 1][0] if k + 1 < parts else (h1, h1)
        interior = _interior_rows(window, out[k], own[k], n_in)
        plans.append(HaloPlan(own[k], out[k], (a, b), pad_top, pad_bottom, *recvs[k],
                              send_top, send_bottom, interior))
    return tuple(plans), ""


def _interior_rows(window: AnyWindow, out: tuple[int, int], own: tuple[int, int],
                   n_in: int) -> tuple[int, int]:
    """Output rows in ``out`` whose window lies in ``own`` or in the image's zero padding."""
    lo_ok = -window.before if own[0] == 0 else own[0]
    hi_ok = n_in + window.after if own[1] == n_in else own[1]
    first = next((o for o in range(*out) if window.rows_needed(o, o + 1)[0] >= lo_ok), out[1])
    last = first
    for o in range(first, out[1]):
        if window.rows_needed(o, o + 1)[1] > hi_ok:
            break
        last = o + 1
    return (first, last) if last > first else (out[0], out[0])
