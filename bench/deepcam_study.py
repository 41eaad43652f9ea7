"""What domain parallelism buys DeepCAM: the planner's plan against pure data parallelism at
768x1152, batch 2048, from 64 to 4096 GPUs, on ``perlmutter-gpu`` (A100, 40 GB) and ``dgx-h100``
(80 GB), each under its GPU's memory.

Pure cost model (no MPI, no kernel timing: compute from the machine's FLOP rate at tf32, as
``train`` picks on a GPU), the study of ``simulate --volumes`` (:func:`volumes_table`) run on the
shipped ``deepcam`` net. Prints one markdown table per machine: for each P the auto plan's and
pure batch's iteration time and peak memory per rank, the auto plan's speedup over pure batch,
its first layer's split, and then the modes its layers chose (``summarise_plan``).

    python bench/deepcam_study.py            # both machines, P = 64 … 4096
    python bench/deepcam_study.py --procs 64 256 --machines dgx-h100
"""

from __future__ import annotations

import argparse
import math
import time

from hpctrain.cost.machine import load_machine
from hpctrain.device.precision import PRECISIONS
from hpctrain.io.units import format_bytes
from hpctrain.model.net import load_net
from hpctrain.study.volumes import volumes_table

CAPS = {"perlmutter-gpu": 40 * 2**30, "dgx-h100": 80 * 2**30}  # each GPU's memory
PROCS = (64, 128, 256, 512, 1024, 2048, 4096)
BATCH = 2048


def cell(seconds: float) -> str:
    return "—" if math.isnan(seconds) else f"{seconds * 1e3:.1f} ms"


def size(value: float) -> str:
    return "—" if math.isnan(value) else format_bytes(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", type=int, nargs="+", default=list(PROCS))
    parser.add_argument("--machines", nargs="+", default=list(CAPS), choices=list(CAPS))
    parser.add_argument("--batch", type=int, default=BATCH)
    args = parser.parse_args()
    net = load_net("deepcam", None)
    for name in args.machines:
        start = time.perf_counter()
        table = volumes_table(net, load_machine(name), [(args.batch, p) for p in args.procs],
                              CAPS[name], PRECISIONS["tf32"])
        print(f"\n### {name} (cap {format_bytes(CAPS[name])} per GPU), DeepCAM 16x768x1152, "
              f"B = {args.batch}, tf32 ({time.perf_counter() - start:.0f} s)\n")
        print("| P | auto | memory/GPU | data parallel | memory/GPU | auto / data parallel | "
              "first layer |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: | --- |")
        for k, p in enumerate(table["procs"]):
            speedup = table["auto_speedup_over_batch"][k]
            print(f"| {p} | {cell(table['auto_iteration_time'][k])} | "
                  f"{size(table['auto_memory_per_rank'][k])} | "
                  f"{cell(table['pure_batch_iteration_time'][k])} | "
                  f"{size(table['pure_batch_memory_per_rank'][k])} | "
                  f"{'—' if math.isnan(speedup) else f'{speedup:.2f}x'} | "
                  f"{table['auto_first_layer'][k]} |")
        for k, p in enumerate(table["procs"]):
            chosen = table["auto_summary"][k]
            print(f"P={p} auto: {table['auto_plan'][k] if chosen == 'none' else chosen}")
            if not table["pure_batch_runnable"][k]:
                print(f"P={p} data parallel: {table['pure_batch_plan'][k]}")


if __name__ == "__main__":
    main()
