"""HDF5 run logs: what was planned, what was predicted, what was measured.

One file per run, written by rank 0 only, atomically (to a temporary file beside it, then
renamed), so a crash leaves the previous log or the new one, never half of one. Layout::

    /                      attrs: command, net, processes, batch, machine, plan (text)
    /steps/loss            (steps,)  mean loss of each step
    /steps/seconds         (steps,)  wall time of each step (forward, loss, backward, optimizer)
    /layers/name           (L,)      layer names in network order, then "loss"
    /layers/predicted/F    (L,)      predicted seconds of field F
    /layers/measured/F     (L,)      measured seconds of field F: median over the steps after
                                     the first, then the largest over ranks
    /layers/measured_fastest_rank/F  the same, the smallest over ranks
    /iteration             attrs: predicted, measured (median step seconds, slowest rank)

with F one of forward_compute, backward_compute, forward_layer_comm, backward_layer_comm,
forward_redistribution, backward_redistribution (see :class:`hpctrain.timing.LayerTimes`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from hpctrain.files import replace_atomically
from hpctrain.planner import PlannedNetwork
from hpctrain.timing import TIME_FIELDS, StepTimes


def predicted_fields(planned: PlannedNetwork) -> dict[str, np.ndarray]:
    """The prediction per layer (and the loss), in the measured fields' terms."""
    rows = [*planned.layers, planned.loss]
    return {
        "forward_compute": np.array([c.compute[0] for c in rows]),
        "backward_compute": np.array([c.compute[1] for c in rows]),
        "forward_layer_comm": np.array([c.comm[0] for c in rows]),
        "backward_layer_comm": np.array([c.comm[1] for c in rows]),
        "forward_redistribution": np.array([c.redistribution[0] for c in rows]),
        "backward_redistribution": np.array([c.redistribution[1] for c in rows]),
    }


def measured_fields(times: StepTimes) -> dict[str, np.ndarray]:
    rows = [*times.layers, times.loss]
    return {f: np.array([getattr(r, f) for r in rows]) for f in TIME_FIELDS}


def communication(fields: dict[str, np.ndarray]) -> np.ndarray:
    """Per layer: its own communication and the redistribution feeding it, both directions."""
    return sum(fields[f] for f in ("forward_layer_comm", "backward_layer_comm",
                                   "forward_redistribution", "backward_redistribution"))


def write_timings(group: Any, planned: PlannedNetwork, measured: StepTimes,
                  fastest_rank: StepTimes, iteration_measured: float) -> None:
    """Predicted and measured per-layer times into an open h5py group."""
    names = [c.layer for c in planned.layers] + ["loss"]
    group.create_dataset("layers/name", data=np.array(names, dtype="S"))
    for kind, values in (("predicted", predicted_fields(planned)),
                         ("measured", measured_fields(measured)),
                         ("measured_fastest_rank", measured_fields(fastest_rank))):
        for name, data in values.items():
            group.create_dataset(f"layers/{kind}/{name}", data=data).attrs["units"] = "s"
    iteration = group.require_group("iteration")
    iteration.attrs["predicted"] = planned.iteration_time
    iteration.attrs["measured"] = iteration_measured
    iteration.attrs["units"] = "s"


def write_hdf5(path: Path, fill: Callable[[Any], None]) -> None:
    """Create the HDF5 file ``path`` with ``fill(h5file)``; replace it only when complete."""
    import h5py

    def write(tmp: Path) -> None:
        with h5py.File(tmp, "w") as h5:
            fill(h5)

    replace_atomically(path, write)
