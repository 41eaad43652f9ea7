"""A bigger-P smoke test: ``verify`` on 16 ranks (oversubscribed) under a plan that uses grids
4×4, 8×2, 2×8, a 16-way domain split and pure batch, launched as a user launches it."""

import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_training_app import env, mpiexec

WIDE = Path(__file__).resolve().parent / "wide"

pytestmark = pytest.mark.skipif(mpiexec() is None, reason="no mpiexec")


def test_verify_on_16_ranks_matches_one_process(tmp_path):
    result = subprocess.run(
        [mpiexec(), "-n", "16", sys.executable, "-m", "hpctrain", "verify",
         "--net", str(WIDE / "wide.net"), "--grid", str(WIDE / "wide-p16.plan"), "--batch", "16"],
        capture_output=True, text=True, timeout=120, env=env(tmp_path), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    verdict = result.stdout.strip().splitlines()[-1]
    assert verdict.endswith("PASS") and "tolerance 1e-09" in verdict
    for grid in ("domain 16x1", "model 4x4", "model 8x2", "model 2x8", "batch 1x16"):
        assert grid in result.stdout
