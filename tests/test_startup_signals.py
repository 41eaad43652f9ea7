"""A SIGTERM while the run starts up, as Slurm or a user sends it to the launcher: every rank
stops before the first step with status 0 and says so, never a traceback.

Only a signal that reaches a rank before its interpreter has run hpctrain's first line (about
0.15 s after launch on a loaded 2-core machine) is the launcher's to report: MPICH's mpiexec
then exits with status 15, as the README's "Exit status" says.
"""

import os
import signal
import time

import pytest

from tests.test_training_app import mpiexec, start

pytestmark = pytest.mark.skipif(mpiexec() is None, reason="no mpiexec")

CLEAN = "stopped by SIGTERM before training; nothing was trained or saved"
LAUNCHER_STATUS = 15  # MPICH's mpiexec when a rank ended by SIGTERM


@pytest.mark.parametrize("delay", [0.05, 0.2, 0.5])
def test_a_sigterm_while_starting_up_stops_every_rank_cleanly(tmp_path, delay):
    process = start(2, "--net", "smallcnn", "--steps", "100000", "--batch", "8", "--checkpoint-dir",
                    "ckpt", "--log", "run.h5", tmp_path=tmp_path)
    try:
        time.sleep(delay)
        os.kill(process.pid, signal.SIGTERM)
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert "Traceback" not in out + err and "error" not in err, err
    if delay >= 0.5 or process.returncode == 0:  # by then every rank records the signal
        assert process.returncode == 0, (out, err)
        assert "stopped by SIGTERM" in out, out
        if CLEAN in out:  # before the first step (a fast machine may have begun training)
            assert "step 1/" not in out
            assert not list((tmp_path / "ckpt").glob("step-*.h5"))  # none trained, none saved
    else:  # before the interpreter ran our first line: the launcher's status
        assert process.returncode == LAUNCHER_STATUS, (out, err)
