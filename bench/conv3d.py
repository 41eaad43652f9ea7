"""3-D convolution, forward and backward: hpctrain's kernels against PyTorch's Conv3d on the CPU.

CosmoFlow's first volume layers, float32, batch 1, a 2×2×2 kernel at stride 1 with TensorFlow's
``same`` padding (one entry after each axis, none before): the 64³ layer (16 → 32 channels) and
the 32³ layer (32 → 64). Both in this one process on one thread (the thread variables are set
before NumPy loads; PyTorch is told too). A step is the forward and the backward of the input
and weight gradients (and the bias's); each is timed alone after a warm-up and the median of
``--repeat`` steps is reported. hpctrain runs in the order its rule picks and, for comparison,
in the other order of the windows (:mod:`hpctrain.kernels.conv`). PyTorch pads explicitly
(``F.pad``, as its own ``padding="same"`` does for an even kernel) inside the timed forward.
The header names NumPy's BLAS and the kernels it chose for this CPU (``OPENBLAS_CORETYPE``
overrides them). Prints the table and writes it to ``--out``.

With ``--orders``, instead: hpctrain alone in both orders of the windows on the volume
shapes behind :func:`~hpctrain.kernels.sliding.prefer_channels_last`'s rule for volumes. With
``--slabs``: hpctrain's backward alone by the size of the slabs its input gradient goes in
(:data:`~hpctrain.kernels.conv.SLAB_BYTES`).

    python bench/conv3d.py --repeat 7
    python bench/conv3d.py --orders --repeat 5 --out runs/bench/conv3d-orders.txt
    python bench/conv3d.py --slabs --repeat 9 --out runs/bench/conv3d-slabs.txt
"""

from __future__ import annotations

import os

for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_name] = "1"

import argparse  # noqa: E402  (the thread variables must be set before NumPy loads)
import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

# name: (channels in, channels out, edge of the cube)
LAYERS = {"64^3": (16, 32, 64), "32^3": (32, 64, 32)}
KERNEL, STRIDE, PADS = (2, 2, 2), (1, 1, 1), ((0, 1), (0, 1), (0, 1))
# --orders: (batch, channels in, channels out, edge of the cube, kernel edge), stride 1, "same"
ORDER_SHAPES = [(1, 16, 32, 64, 2), (1, 32, 64, 32, 2), (4, 32, 64, 32, 2), (1, 64, 128, 16, 2),
                (4, 64, 128, 16, 2), (16, 64, 128, 16, 2), (4, 128, 256, 8, 2),
                (16, 128, 256, 8, 2), (8, 256, 256, 4, 2), (1, 4, 16, 64, 3), (4, 8, 16, 32, 3),
                (2, 16, 32, 32, 3), (4, 32, 64, 16, 3), (8, 64, 128, 8, 3), (16, 128, 128, 4, 3)]


def median_seconds(step: Callable[[], tuple[float, float]], repeat: int
                   ) -> tuple[float, float]:
    """Median forward and backward seconds of ``repeat`` steps after one warm-up step."""
    step()
    forward, backward = zip(*(step() for _ in range(repeat)), strict=True)
    return statistics.median(forward), statistics.median(backward)


def hpctrain_step(x: np.ndarray, w: np.ndarray, b: np.ndarray, dy: np.ndarray,
                  channels_last: bool | None, pads: tuple[tuple[int, int], ...] = PADS
                  ) -> Callable[[], tuple[float, float]]:
    from hpctrain.kernels.conv import conv_backward, conv_forward

    dw = np.empty_like(w)  # kept across steps, as the layer's gradient is

    def step() -> tuple[float, float]:
        start = time.perf_counter()
        _, cache = conv_forward(np, x, w, b, STRIDE, pads, channels_last)
        middle = time.perf_counter()
        conv_backward(np, dy, w, cache, STRIDE, need_dx=True, dw_out=dw)
        return middle - start, time.perf_counter() - middle

    return step


def blas() -> str:
    """NumPy's BLAS and the kernels it picked for this CPU, as threadpoolctl reports them."""
    from threadpoolctl import threadpool_info

    found = [f"{i.get('internal_api')} {i.get('version')} ({i.get('architecture')} kernels)"
             for i in threadpool_info() if i.get("user_api") == "blas"]
    return ", ".join(found) or "unknown BLAS"


def orders_table(repeat: int, rng: np.random.Generator) -> list[str]:
    """hpctrain's step in both orders of the windows on :data:`ORDER_SHAPES`."""
    from hpctrain.kernels.sliding import prefer_channels_last

    lines = [f"hpctrain Conv forward + backward, float32, 1 thread, stride 1, same padding, "
             f"median of {repeat} steps; NumPy BLAS: {blas()}",
             f"{'N':>3} {'C':>4} {'O':>4} {'edge':>5} {'kernel':>6} {'C/Wo':>6} "
             f"{'major ms':>9} {'last ms':>8} {'last/major':>10} {'rule':>6}"]
    for n, c, o, edge, k in ORDER_SHAPES:
        x = rng.standard_normal((n, c, edge, edge, edge), dtype=np.float32)
        w = rng.standard_normal((o, c, k, k, k), dtype=np.float32)
        b = np.zeros(o, dtype=np.float32)
        dy = rng.standard_normal((n, o, edge, edge, edge), dtype=np.float32)
        pads = ((k // 2 - (1 - k % 2), k // 2),) * 3  # TensorFlow's "same"
        major, last = (sum(median_seconds(hpctrain_step(x, w, b, dy, order, pads), repeat))
                       for order in (False, True))
        rule = "last" if prefer_channels_last(c, (k, k, k), edge) else "major"
        lines.append(f"{n:>3} {c:>4} {o:>4} {f'{edge}^3':>5} {f'{k}x{k}x{k}':>6} "
                     f"{c / edge:6.2f} {major * 1e3:9.1f} {last * 1e3:8.1f} "
                     f"{last / major:10.2f} {rule:>6}")
    lines.append("last/major < 1: channels-last faster; rule: the order prefer_channels_last "
                 "picks")
    return lines


def torch_step(x: np.ndarray, w: np.ndarray, b: np.ndarray, dy: np.ndarray
               ) -> Callable[[], tuple[float, float]]:
    import torch
    from torch.nn import functional

    conv = torch.nn.Conv3d(w.shape[1], w.shape[0], KERNEL, STRIDE)
    with torch.no_grad():
        conv.weight.copy_(torch.from_numpy(w))
        conv.bias.copy_(torch.from_numpy(b))
    tx, tdy = torch.from_numpy(x).requires_grad_(), torch.from_numpy(dy)
    pad = tuple(v for pair in reversed(PADS) for v in pair)  # F.pad: the last axis first

    def step() -> tuple[float, float]:
        tx.grad = conv.weight.grad = conv.bias.grad = None
        start = time.perf_counter()
        y = conv(functional.pad(tx, pad))
        middle = time.perf_counter()
        y.backward(tdy)
        return middle - start, time.perf_counter() - middle

    return step


def slabs_table(repeat: int, rng: np.random.Generator) -> list[str]:
    """hpctrain's backward (dX, dW, db) channel-major by :data:`~hpctrain.kernels.conv.
    SLAB_BYTES`, on the two CosmoFlow layers and a 16³ one at batch 4."""
    from hpctrain.kernels import conv

    sizes = [2**19, 2**20, 2**21, 2**22, 2**23, 2**24, 2**40]  # the last: a sample at a time
    lines = [f"hpctrain Conv backward, channel-major, float32, 1 thread, kernel 2x2x2, "
             f"median of {repeat} steps, ms, by slab MiB (whole: a sample at a time); "
             f"NumPy BLAS: {blas()}",
             f"{'N':>3} {'C->O':>8} {'edge':>5} "
             + " ".join(f"{'whole' if b == sizes[-1] else b / 2**20:>6}" for b in sizes)]
    kept = conv.SLAB_BYTES
    try:
        for n, c, o, edge in [(1, 16, 32, 64), (1, 32, 64, 32), (4, 64, 128, 16)]:
            x = rng.standard_normal((n, c, edge, edge, edge), dtype=np.float32)
            w = rng.standard_normal((o, c, *KERNEL), dtype=np.float32)
            dy = rng.standard_normal((n, o, edge, edge, edge), dtype=np.float32)
            _, cache = conv.conv_forward(np, x, w, None, STRIDE, PADS, False)
            dw = np.empty_like(w)
            times = []
            for size in sizes:
                conv.SLAB_BYTES = size
                seconds = []
                for _ in range(repeat + 1):
                    start = time.perf_counter()
                    conv.conv_backward(np, dy, w, cache, STRIDE, need_dx=True, dw_out=dw)
                    seconds.append(time.perf_counter() - start)
                times.append(statistics.median(seconds[1:]))
            lines.append(f"{n:>3} {f'{c}->{o}':>8} {f'{edge}^3':>5} "
                         + " ".join(f"{t * 1e3:6.1f}" for t in times))
    finally:
        conv.SLAB_BYTES = kept
    lines.append(f"hpctrain's SLAB_BYTES: {kept / 2**20:g} MiB")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", nargs="+", choices=sorted(LAYERS), default=list(LAYERS))
    parser.add_argument("--repeat", type=int, default=7, help="timed steps each (default: 7)")
    parser.add_argument("--orders", action="store_true",
                        help="hpctrain alone, both orders of the windows on more volume shapes")
    parser.add_argument("--slabs", action="store_true",
                        help="hpctrain's backward alone, by the size of its input-gradient slabs")
    parser.add_argument("--out", default="runs/bench/conv3d.txt")
    args = parser.parse_args()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    if args.orders or args.slabs:
        write(out, orders_table(args.repeat, rng) if args.orders
              else slabs_table(args.repeat, rng))
        return

    import torch

    from hpctrain.kernels.sliding import out_size, prefer_channels_last

    torch.set_num_threads(1)
    lines = [f"Conv3d forward + backward (dX, dW, db), kernel 2x2x2, stride 1, pads "
             f"(0, 1) per axis, float32, batch 1, 1 thread; median of {args.repeat} steps; "
             f"torch {torch.__version__}; NumPy BLAS: {blas()}",
             f"{'layer':<6} {'C->O':>7} {'hpctrain':<14} {'fwd ms':>8} {'bwd ms':>8} "
             f"{'step ms':>8} {'torch fwd':>9} {'torch bwd':>9} {'torch step':>10} "
             f"{'ratio':>6}"]
    ratios = []
    for name in args.layers:
        c, o, edge = LAYERS[name]
        x = rng.standard_normal((1, c, edge, edge, edge), dtype=np.float32)
        w = (rng.standard_normal((o, c, *KERNEL), dtype=np.float32) / np.sqrt(8 * c)).astype(
            np.float32)
        b = rng.standard_normal(o, dtype=np.float32)
        dy = rng.standard_normal((1, o, edge, edge, edge), dtype=np.float32)
        theirs = median_seconds(torch_step(x, w, b, dy), args.repeat)
        rule = prefer_channels_last(c, KERNEL, out_size(edge, KERNEL[-1], 1, *PADS[-1]))
        for channels_last in (rule, not rule):
            ours = median_seconds(hpctrain_step(x, w, b, dy, channels_last), args.repeat)
            ratio = sum(ours) / sum(theirs)
            order = ("channels-last" if channels_last else "channel-major") \
                + ("*" if channels_last == rule else "")
            if channels_last == rule:
                ratios.append(ratio)
            lines.append(f"{name:<6} {f'{c}->{o}':>7} {order:<14} {ours[0] * 1e3:8.1f} "
                         f"{ours[1] * 1e3:8.1f} {sum(ours) * 1e3:8.1f} {theirs[0] * 1e3:9.1f} "
                         f"{theirs[1] * 1e3:9.1f} {sum(theirs) * 1e3:10.1f} {ratio:6.2f}")
    lines.append("ratio: hpctrain step / torch step (< 1: hpctrain faster; target <= 2.0); "
                 "*: the order hpctrain's rule picks (prefer_channels_last), the other for "
                 "comparison")
    lines.append(f"worst ratio in the order the rule picks: {max(ratios):.2f}")
    write(out, lines)


def write(out: Path, lines: list[str]) -> None:
    table = "\n".join(lines)
    print(table)
    out.write_text(table + "\n")
    print(f"written: {out}")


if __name__ == "__main__":
    main()
