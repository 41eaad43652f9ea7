"""The reliability suite's harness: hpctrain launched as a user launches it, on 2 ranks, and
what the user and the file system see afterwards.

A case runs ``mpiexec -n 2 python -m hpctrain ARGS`` in a directory of its own and checks:
the exit status, that standard error holds exactly one line naming the bad value, that every
rank was out within the time limit, and that nothing outside the run's own outputs changed
(every entry under the watched directories is compared by type, size, mode and mtime, without
following links).
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.test_training_app import env, mpiexec

LIMIT = 20.0  # seconds: every rank must be out by then


@dataclass
class Outcome:
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def error_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.strip()]


def launch(*args: str, cwd: Path, procs: int = 2, extra_env: dict | None = None,
           timeout: float = 60) -> Outcome:
    """Run hpctrain on ``procs`` ranks from ``cwd`` with a private compute-time cache."""
    environment = {**env(cwd), **(extra_env or {})}
    start = time.perf_counter()
    result = subprocess.run([mpiexec(), "-n", str(procs), sys.executable, "-m", "hpctrain",
                             *args], capture_output=True, text=True, timeout=timeout,
                            env=environment, cwd=cwd)
    return Outcome(result.returncode, result.stdout, result.stderr,
                   time.perf_counter() - start)


def snapshot(*roots: Path) -> dict[Path, tuple]:
    """Every entry under ``roots`` (the roots too): (type, size, mode, mtime_ns), links not
    followed, so a replaced device, FIFO or link shows up as changed."""
    seen: dict[Path, tuple] = {}
    for root in roots:
        for path in [root, *(root.rglob("*") if root.is_dir() and not root.is_symlink()
                             else [])]:
            try:
                info = os.lstat(path)
            except FileNotFoundError:
                continue
            seen[path] = (stat.S_IFMT(info.st_mode), info.st_size, info.st_mode,
                          info.st_mtime_ns)
    return seen


def changed_outside(before: dict[Path, tuple], after: dict[Path, tuple],
                    outputs: tuple[Path, ...] = ()) -> list[Path]:
    """Entries created, removed or changed, except under the run's own ``outputs``."""
    def ours(path: Path) -> bool:
        return any(path == out or out in path.parents for out in outputs)

    paths = set(before) | set(after)
    return sorted(p for p in paths if before.get(p) != after.get(p) and not ours(p))


def assert_refused(outcome: Outcome, message: str, code: int = 2) -> None:
    """Exit ``code``, one line on standard error containing ``message``, within the limit."""
    assert outcome.returncode == code, (outcome.returncode, outcome.stdout, outcome.stderr)
    assert len(outcome.error_lines) == 1, outcome.stderr
    assert message in outcome.error_lines[0], outcome.error_lines[0]
    assert outcome.seconds < LIMIT, f"took {outcome.seconds:.1f} s"
