"""Depthwise convolutions on the CPU: hpctrain's kernel against PyTorch's, layer by layer, and
the choice between its two orders of the windows.

The layers: every depthwise layer of MobileNet v2 (3×3) at 64² and batch 16, the cases the rule
of :func:`hpctrain.kernels.sliding.depthwise_channels_last` was chosen on; and, held out of that
choice, EfficientNet-B0's 5×5 depthwise layers at 64² and MobileNet v2's at 224², batch 4.
Float32, one thread on both sides, forward and backward (the input gradient and the weight's)
timed apart, the median of ``--repeat`` runs after one warm-up.

Default: per layer, hpctrain (the order its rule picks) and PyTorch, and their ratio.
``--orders``: per layer, the two orders (channel-major, channels-last) forward plus backward,
their ratio, and whether the rule picked the faster. Prints a table and writes it to ``--out``.

    python bench/depthwise.py --repeat 5
    python bench/depthwise.py --orders --repeat 5
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from hpctrain.kernels.conv import conv_backward, conv_forward
from hpctrain.kernels.sliding import depthwise_channels_last

# (name, batch, channels, size, kernel, stride): the layers the rule was chosen on …
FITTED = [(f"mobilenet_v2 {c}ch {h}² s{s}", 16, c, h, 3, s) for c, h, s in (
    (32, 32, 1), (96, 32, 2), (144, 16, 1), (144, 16, 2), (192, 8, 1), (192, 8, 2),
    (384, 4, 1), (576, 4, 1), (576, 4, 2), (960, 2, 1))]
# … and held out of it: other kernels, sizes and batches
HELD_OUT = [(f"efficientnet_b0 {c}ch {h}² 5x5 s{s}", 16, c, h, 5, s) for c, h, s in (
    (144, 16, 2), (240, 8, 1), (480, 4, 1), (672, 4, 2), (1152, 2, 1))] + [
    (f"mobilenet_v2@224 {c}ch {h}² s{s}", 4, c, h, 3, s) for c, h, s in (
        (32, 112, 1), (96, 112, 2), (144, 56, 1), (192, 28, 1), (384, 14, 1), (576, 14, 1),
        (960, 7, 1))]


def timed(call, repeat: int) -> float:
    call()
    found = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        found.append(time.perf_counter() - start)
    return statistics.median(found)


def ours(batch, c, h, k, s, repeat, channels_last=None):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, c, h, h)).astype(np.float32)
    w = rng.standard_normal((c, 1, k, k)).astype(np.float32)
    pads = ((k // 2, k // 2),) * 2
    y, cache = conv_forward(np, x, w, None, (s, s), pads, channels_last, groups=c)
    dy = np.ones_like(y)
    forward = timed(lambda: conv_forward(np, x, w, None, (s, s), pads, channels_last, groups=c),
                    repeat)
    backward = timed(lambda: conv_backward(np, dy, w, cache, (s, s)), repeat)
    return forward, backward, y.shape[-1]


def pytorch(batch, c, h, k, s, repeat):
    import torch

    torch.set_num_threads(1)
    x = torch.randn(batch, c, h, h, requires_grad=True)
    w = torch.randn(c, 1, k, k, requires_grad=True)

    def forward():
        return torch.nn.functional.conv2d(x, w, None, s, k // 2, 1, c)

    y = forward()
    dy = torch.ones_like(y)
    with torch.no_grad():
        seconds_forward = timed(forward, repeat)
    backward = timed(lambda: torch.autograd.grad(y, (x, w), dy, retain_graph=True), repeat)
    return seconds_forward, backward


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--orders", action="store_true",
                        help="compare hpctrain's two orders of the windows, not PyTorch")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", default="runs/bench/depthwise.txt")
    args = parser.parse_args()
    lines = []
    with threadpool_limits(1):
        for group, cases in (("fitted", FITTED), ("held out", HELD_OUT)):
            for name, batch, c, h, k, s in cases:
                if args.orders:
                    major = ours(batch, c, h, k, s, args.repeat, False)
                    last = ours(batch, c, h, k, s, args.repeat, True)
                    ratio = (last[0] + last[1]) / (major[0] + major[1])
                    picked = depthwise_channels_last(c)
                    right = (ratio < 1) == picked or abs(ratio - 1) < 0.1
                    lines.append(f"{group:9} {name:36} C/Wo {c / major[2]:6.1f}  channel-major "
                                 f"{1e3 * sum(major[:2]):7.2f} ms  channels-last "
                                 f"{1e3 * sum(last[:2]):7.2f} ms  last/major {ratio:5.2f}  "
                                 f"rule: {'last ' if picked else 'major'} "
                                 f"{'ok' if right else 'WRONG'}")
                else:
                    f, b, _ = ours(batch, c, h, k, s, args.repeat)
                    tf, tb = pytorch(batch, c, h, k, s, args.repeat)
                    lines.append(f"{group:9} {name:36} forward {1e3 * f:6.2f} ms (torch "
                                 f"{1e3 * tf:6.2f}, {f / tf:5.2f}x)  backward {1e3 * b:6.2f} ms "
                                 f"(torch {1e3 * tb:6.2f}, {b / tb:5.2f}x)")
                print(lines[-1], flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
