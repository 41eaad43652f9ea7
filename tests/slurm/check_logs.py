"""Check the run logs and profile written by the Slurm test (tests/slurm/run.sh).

Usage::

    python tests/slurm/check_logs.py [--only DIR ...] [--profile TOML ...] SPEC ...

SPEC is ``PATH.h5:processes=P,steps=S[,batch=B][,resumed]``: the log must exist, be a finished
run (``status`` starts with "finished") on P processes, hold S rows in ``steps/loss`` (consecutive
steps, each loss finite) and, when given, a global batch of B; ``resumed`` asks for a run that
was stopped and continued from a checkpoint (the ``resumed`` attribute). ``--only DIR``: every
``*.h5`` in DIR must be one of the SPECs (a stray ``run.1.h5`` means two runs wrote one log).
``--profile TOML``: a machine profile from ``hpctrain calibrate`` with alpha, beta and flops.

Prints one line per file and exits 1 if anything is wrong.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import h5py
import numpy as np


def parse_spec(spec: str) -> tuple[Path, dict[str, int | bool]]:
    """``a.h5:processes=4,steps=2,resumed`` -> (Path("a.h5"), {"processes": 4, ...})."""
    path, _, fields = spec.rpartition(":")
    if not path or not fields:
        raise SystemExit(f"bad SPEC {spec!r}: want PATH.h5:processes=P,steps=S[,batch=B][,resumed]")
    want: dict[str, int | bool] = {}
    for field in fields.split(","):
        key, eq, value = field.partition("=")
        if key not in ("processes", "steps", "batch", "resumed") or (key == "resumed") == bool(eq):
            raise SystemExit(f"bad field {field!r} in SPEC {spec!r}")
        want[key] = True if key == "resumed" else int(value)
    if "processes" not in want or "steps" not in want:
        raise SystemExit(f"SPEC {spec!r} needs processes= and steps=")
    return Path(path), want


def check_log(path: Path, want: dict[str, int | bool]) -> list[str]:
    """The problems of one run log (empty when it is as wanted)."""
    if not path.is_file():
        return ["missing"]
    problems = []
    with h5py.File(path, "r") as f:
        attrs = f.attrs
        status = str(attrs.get("status", ""))
        if not status.startswith("finished"):
            problems.append(f"status is {status!r}, not 'finished ...'")
        processes = int(attrs.get("processes", -1))
        if processes != want["processes"]:
            problems.append(f"processes = {processes}, want {want['processes']}")
        if "batch" in want and int(attrs.get("batch", -1)) != want["batch"]:
            problems.append(f"batch = {attrs.get('batch')}, want {want['batch']}")
        if want.get("resumed") and "resumed" not in attrs:
            problems.append("no 'resumed' attribute: the run was not continued from a checkpoint")
        if "steps/loss" not in f:
            return problems + ["no steps/loss"]
        loss = f["steps/loss"][:]
        if len(loss) != want["steps"]:
            problems.append(f"steps/loss has {len(loss)} rows, want {want['steps']}")
        elif not np.array_equal(np.diff(f["steps/step"][:]), np.ones(len(loss) - 1)):
            # one row per step, none missing or repeated (a resumed run continues the rows)
            problems.append(f"steps/step is not consecutive: {f['steps/step'][:].tolist()}")
        if not np.all(np.isfinite(loss)):
            problems.append(f"non-finite loss: {loss.tolist()}")
    return problems


def check_profile(path: Path) -> list[str]:
    """The problems of a machine profile written by ``hpctrain calibrate``: what hpctrain's own
    reader refuses in it."""
    from hpctrain.cost.machine import MachineError, parse_machine

    if not path.is_file():
        return ["missing"]
    try:
        parse_machine(path.read_text(), str(path))
    except MachineError as err:
        return [str(err)]
    return []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("specs", nargs="*", metavar="SPEC")
    parser.add_argument("--only", action="append", default=[], type=Path, metavar="DIR")
    parser.add_argument("--profile", action="append", default=[], type=Path, metavar="TOML")
    args = parser.parse_args(argv)

    wanted = dict(parse_spec(spec) for spec in args.specs)
    failures = 0
    for path, want in wanted.items():
        problems = check_log(path, want)
        failures += bool(problems)
        print(
            f"{'FAIL' if problems else 'ok  '} {path}: "
            + ("; ".join(problems) or ", ".join(f"{k}={v}" for k, v in want.items()))
        )
    expected = {p.resolve() for p in wanted}
    for folder in args.only:
        for stray in sorted(p for p in folder.glob("*.h5") if p.resolve() not in expected):
            failures += 1
            print(f"FAIL {stray}: a log no run was expected to write")
    for path in args.profile:
        problems = check_profile(path)
        failures += bool(problems)
        print(f"{'FAIL' if problems else 'ok  '} {path}: " + ("; ".join(problems) or "profile"))
    if failures:
        print(f"check_logs: {failures} problem file(s)", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
