"""Halo bytes per rank of CosmoFlow's first convolution cut along 1, 2 and 3 axes, from the cost
model's own accounting (axis by axis, each exchange carrying the halos already received),
against the surface-to-volume formula: a rank's block b₁×b₂×b₃ extended by the halo hᵢ along
each cut axis receives Π(bᵢ + hᵢ) − Π bᵢ entries per channel and sample, edges and corners
included. Pure arithmetic, no MPI:

    python bench/halos.py [--size 512] [--procs 64 512 4096]
"""

from __future__ import annotations

import argparse
import math

from hpctrain.layout.layout import Layout, Split
from hpctrain.model.kinds import KINDS
from hpctrain.model.kinds.window import busiest_halo, halo_axes
from hpctrain.model.net import load_net


def cube_degrees(procs: int, axes: int) -> tuple[int, ...]:
    """``procs`` cut as evenly as powers of two allow over ``axes`` axes, the first largest."""
    degrees = [1] * axes
    k = 0
    while math.prod(degrees) < procs:
        degrees[k % axes] *= 2
        k += 1
    return tuple(degrees)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=512, help="volume side (default 512)")
    parser.add_argument("--procs", type=int, nargs="+", default=[64, 512, 4096])
    args = parser.parse_args()
    net = load_net("cosmoflow", args.size)
    spec = net.layers[0]
    shape = (1, *net.input_shape)
    itemsize = 4
    print(f"CosmoFlow {args.size}^3, first convolution ({spec.name}: kernel 2, pad same), "
          f"one sample of {shape[1]} channels, float32: halo MiB received per rank")
    print(f"{'P':>6} {'axes':>5} {'split d x h x w':>16} {'block':>16} {'model MiB':>10} "
          f"{'formula MiB':>12} {'halo/block':>11}")
    for procs in args.procs:
        for axes in (1, 2, 3):
            degrees = cube_degrees(procs, axes) + (1,) * (3 - axes)
            if any(d > n for d, n in zip(degrees, shape[2:], strict=True)):
                continue
            layout = Layout.of_split(shape, Split((1, 1, *degrees)), cut=(2, 3, 4))
            try:
                KINDS[spec.kind].check(spec, (layout,), layout)
            except ValueError:
                continue
            model = sum(plane * max(sum(pair) for pair in received)
                        for _, plane, (received, _) in halo_axes(spec, layout))
            block = layout.largest_block
            extended = list(block)
            for axis in layout.cut_axes:
                p = busiest_halo(spec, layout, axis)
                extended[axis] = p.need[1] - p.need[0]
            formula = math.prod(extended) - math.prod(block)
            to_mib = itemsize / 2**20
            print(f"{procs:>6} {axes:>5} {'x'.join(map(str, degrees)):>16} "
                  f"{'x'.join(map(str, block[2:])):>16} {model * to_mib:>10.2f} "
                  f"{formula * to_mib:>12.2f} {formula / math.prod(block):>11.4f}")


if __name__ == "__main__":
    main()
