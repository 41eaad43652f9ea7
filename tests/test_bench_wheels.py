"""``bench/wheels.py``, what ``bench/gpu_device.sh`` unpacks wheels with where pip cannot
install them: a wheel whose module does not import here fails the step, by name."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

BENCH = Path(__file__).parents[1] / "bench" / "wheels.py"


def wheel(folder: Path, name: str, body: str, top_level: bool = True) -> Path:
    path = folder / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{name}/__init__.py", body)
        if top_level:
            archive.writestr(f"{name}-1.0.dist-info/top_level.txt", f"{name}\n")
        archive.writestr(f"{name}-1.0.dist-info/METADATA", f"Name: {name}\nVersion: 1.0\n")
    return path


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH), *map(str, args)], capture_output=True,
                          text=True)


def test_wheels_that_import_unpack_quietly(tmp_path):
    good = wheel(tmp_path, "goodpkg", "VALUE = 1\n")
    other = wheel(tmp_path, "otherpkg", "", top_level=False)  # its names read from its files
    result = run(tmp_path / "site", good, other)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "site" / "goodpkg" / "__init__.py").exists()


def test_a_wheel_that_does_not_import_fails_loudly_by_name(tmp_path):
    """As a wheel built for another platform or needing a missing library does."""
    broken = wheel(tmp_path, "brokenpkg", "import a_library_this_machine_lacks\n")
    result = run(tmp_path / "site", wheel(tmp_path, "goodpkg", ""), broken)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "brokenpkg-1.0-py3-none-any.whl" in lines[0]
    assert "'import brokenpkg' fails" in lines[0] and "a_library_this_machine_lacks" in lines[0]
