"""Unpack wheels where pip cannot install them (a device machine without pip's index), and check
that what they hold imports: an unpacked wheel skips pip's checks (its platform tag, its
dependencies), so one that does not fit the machine is found here, by name, not later as a
missing kernel in the middle of a benchmark.

    python bench/wheels.py TARGET WHEEL...

Exits 1, naming the wheel, the module and the error, when a top-level module of a wheel does
not import with TARGET first on the path (each wheel's ``*.dist-info/top_level.txt``, else its
top-level names)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path


def top_level_modules(wheel: Path) -> list[str]:
    """The modules a wheel installs at the top: its ``top_level.txt``, else the top-level
    packages and modules among its files (the metadata folders left out)."""
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        listed = [n for n in names if n.endswith(".dist-info/top_level.txt")]
        if listed:
            return [line.strip() for line in archive.read(listed[0]).decode().splitlines()
                    if line.strip()]
    found = set()
    for name in names:
        first = name.split("/", 1)[0]
        if first.endswith((".dist-info", ".data")):
            continue
        found.add(first[:-3] if first.endswith(".py") else first)
    return sorted(found)


def unpack(target: Path, wheels: list[Path]) -> list[str]:
    """Unzip each of ``wheels`` into ``target`` and try each top-level module in a fresh
    interpreter; the failures, one line each (empty: every module imports)."""
    target.mkdir(parents=True, exist_ok=True)
    failures = []
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(target)
        for module in top_level_modules(wheel):
            result = subprocess.run(
                [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(target)!r}); "
                                       f"import {module}"], capture_output=True, text=True)
            if result.returncode != 0:
                error = (result.stderr.strip().splitlines() or ["no message"])[-1]
                failures.append(f"{wheel.name}: unpacked into {target} without pip, but "
                                f"'import {module}' fails: {error}")
    return failures


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: python bench/wheels.py TARGET WHEEL...", file=sys.stderr)
        return 2
    failures = unpack(Path(argv[0]), [Path(w) for w in argv[1:]])
    for line in failures:
        print(f"ERROR: {line}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
