"""A raw mpi4py Allreduce of given sizes: the bandwidth hpctrain's layers are held against.

    mpiexec -n 4 python bench/raw_collective.py --bytes 1000000 4000000 --out raw.json

Each size: float32 buffers, all ranks together, warm-up then the median of the repeats of the
fastest rank's time (as the layers are reported: the transfer itself, not waits for late ranks).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
from mpi4py import MPI


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", type=int, nargs="+", required=True)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    results = {}
    for nbytes in args.bytes:
        buf = np.ones(max(nbytes // 4, 1), dtype=np.float32)
        times = []
        for _ in range(args.repeats + 2):
            comm.Barrier()
            start = time.perf_counter()
            comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
            times.append(time.perf_counter() - start)
        fastest = comm.allreduce(statistics.median(times[2:]), op=MPI.MIN)
        results[str(nbytes)] = fastest
    if comm.Get_rank() == 0:
        with open(args.out, "w") as f:
            json.dump({"procs": comm.Get_size(), "allreduce_seconds": results}, f)


if __name__ == "__main__":
    main()
