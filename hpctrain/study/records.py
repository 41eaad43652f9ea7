"""A study's tables as HDF5 datasets, one per column with its units, and what made the file."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence

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



def sweep(study, nets: Sequence, machines: Sequence, choices: Sequence[str],
          procs: Sequence[int], least_batch: int, precision: str,
          row: Callable[..., dict[str, object]]) -> None:
    """Fill a study's ``machines``, ``precisions`` (``precision`` resolved per machine's
    device) and ``tables[machine, net, statistics]``, one column per key of ``row(net,
    machine, batch, procs, statistics, precision)`` and one entry per P of ``procs`` at B =
    max(``least_batch``, P), for each batch-norm choice of ``choices`` (only the first for a
    net without batch norm)."""
    from hpctrain.device.precision import resolve_precision

    for machine in machines:
        study.machines[machine.name] = machine
        chosen = study.precisions[machine.name] = resolve_precision(precision, machine.device)
        for net in nets:
            normed = any(layer.kind == "batchnorm" for layer in net.layers)
            for statistics in choices if normed else choices[:1]:
                table: dict[str, list] = {}
                for p in procs:
                    found = row(net, machine, max(least_batch, p), p, statistics, chosen)
                    for key, value in found.items():
                        table.setdefault(key, []).append(value)
                study.tables[machine.name, net.name, statistics] = table


def write_sweep(out, name: str, study, note: str, columns: str, units: dict[str, str]):
    """A :func:`sweep` study's tables into ``out`` (an open HDF5 file) under ``name``:
    ``name/<machine>/<net>_<statistics>``, one dataset per column, ``units`` naming the units
    of columns beyond :func:`units`' own; the group ``name`` is returned."""
    top = out.create_group(name)
    top.attrs["description"] = note
    top.attrs["columns"] = columns
    for (machine, net, statistics), table in study.tables.items():
        where = top.require_group(machine)
        where.attrs["machine_levels"] = study.machines[machine].describe()
        where.attrs["overlap"] = study.machines[machine].overlap
        where.attrs["precision"] = study.precisions[machine].name
        group = where.create_group(f"{net}_{statistics}")
        group.attrs.update({"net": net, "statistics": statistics,
                            "batch_rule": f"B = max({study.least_batch}, P)"})
        write_table(group, table)
        for key, unit in units.items():
            group[key].attrs["units"] = unit
    return top
