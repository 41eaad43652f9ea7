"""A study's tables as HDF5 datasets, one per column with its units, and what made the file."""

from __future__ import annotations

import shlex

import numpy as np


def units(key: str) -> str | None:
    """The units of a column: seconds, a pure number, or none (labels, flags, counts)."""
    if key.startswith("speedup") or key == "iterations_per_epoch":
        return "1"
    if key.endswith("_per_epoch") or key == "iteration_time":
        return "s"
    return None


def write_table(group, table: dict[str, list]) -> None:
    """One dataset per column of ``table`` in ``group``: text, flags, counts or floats, by the
    column's first value, each with its :func:`units` where it has some."""
    import h5py

    for key, values in table.items():
        if values and isinstance(values[0], str):
            data = np.array(values, dtype=h5py.string_dtype("utf-8"))
        elif values and isinstance(values[0], bool):
            data = np.array(values, dtype=bool)
        elif values and isinstance(values[0], int):
            data = np.array(values, dtype=np.int64)
        else:
            data = np.array(values, dtype=np.float64)
        dataset = group.create_dataset(key, data=data)
        if units(key) is not None:
            dataset.attrs["units"] = units(key)


def command_line(argv: list[str]) -> str:
    """The ``simulate`` line that made a file, as a shell would take it."""
    return shlex.join(["python", "-m", "hpctrain", "simulate", *argv])


def planned_provenance(argv: list[str], description: str) -> dict[str, str]:
    """What made a file of a study the planner prices by FLOP rate: the version, the command,
    the compute model and the study's note."""
    from hpctrain import __version__

    return {"hpctrain_version": __version__,
            "command": command_line(argv),
            "compute_model": "FLOP model at the machine's rate, per largest local block, with "
                             "the optimizer's update",
            "description": description}

