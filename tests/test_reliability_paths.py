"""The reliability suite, output paths: on 2 ranks, an output path that holds anything but a
file hpctrain wrote is refused in one line with status 2 before any work, and nothing else
changes; two runs given one log never share or move it. (A write that fails mid-run, status
3, is covered under MPI in tests/mpi/test_output_errors.py: no file system here can be made
to fail on cue for a whole job.)"""

import os
import signal
import stat
from pathlib import Path

import h5py
import pytest

from tests.reliability import LIMIT, assert_refused, changed_outside, launch, snapshot
from tests.test_training_app import mpiexec, start, wait_for_step

pytestmark = pytest.mark.skipif(mpiexec() is None, reason="no mpiexec")

DATA = Path(__file__).resolve().parents[1] / "inputs" / "digits.h5"
RUN = ("--net", "smallcnn", "--data", str(DATA), "--batch", "32", "--steps", "3")


@pytest.fixture
def place(tmp_path):
    """A run directory holding a user's file, a directory, a FIFO and a link."""
    (tmp_path / "notes.h5").write_text("a user's file\n")
    (tmp_path / "results").mkdir()
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "link.h5").symlink_to(tmp_path / "notes.h5")
    return tmp_path


def refused(place: Path, message: str, *args: str) -> None:
    """hpctrain ARGS on 2 ranks is refused with ``message``, and changes nothing but its
    compute-time cache."""
    watched = (place, DATA)
    before = snapshot(*watched)
    outcome = launch(*RUN, *args, cwd=place)
    assert_refused(outcome, message)
    assert "step " not in outcome.stdout  # before any work
    assert changed_outside(before, snapshot(*watched), (place / "cache",)) == []


@pytest.mark.parametrize("name, message", [
    ("results", "--log results is a directory"),
    ("pipe", "--log pipe is a FIFO"),
    ("link.h5", "--log link.h5 is a symbolic link"),
    ("notes.h5", "--log notes.h5 exists and is not an hpctrain run log")])
def test_a_log_path_that_is_not_ours_is_refused(place, name, message):
    refused(place, message, "--log", name)


def test_the_data_file_is_never_a_log(place):
    refused(place, f"--log {DATA} is the --data input of this run", "--log", str(DATA))


def test_a_plan_file_that_is_a_fifo_is_refused(place):
    refused(place, "--plan-file pipe is a FIFO", "--grid", "auto", "--plan-file", "pipe")
    assert stat.S_ISFIFO(os.lstat(place / "pipe").st_mode)


def test_a_checkpoint_dir_that_is_a_file_is_refused(place):
    refused(place, "--checkpoint-dir: cannot create directory notes.h5: it is a regular file",
            "--checkpoint-dir", "notes.h5")


def test_two_runs_never_share_a_log(tmp_path):
    first = start(2, *RUN[:-1], "100000", "--log", "run.h5", tmp_path=tmp_path)
    try:
        wait_for_step(first, 2)
        before = snapshot(tmp_path)
        second = launch(*RUN, "--log", "run.h5", cwd=tmp_path)
        assert_refused(second, "--log run.h5 is the log of a run still going")
        after = snapshot(tmp_path)
        assert changed_outside(before, after, (tmp_path / "run.h5", tmp_path / "cache")) == []
        assert sorted(p.name for p in tmp_path.glob("run*")) == ["run.h5"]
    finally:
        first.send_signal(signal.SIGUSR1)  # every rank stops after the same step
        out, err = first.communicate(timeout=60)
    assert first.returncode == 0, err
    assert "log written to run.h5" in out
    with h5py.File(tmp_path / "run.h5") as h5:  # the first run's log, whole, where it said
        status = h5.attrs["status"]
        assert status.startswith("stopped by SIGUSR1"), status
        assert len(h5["steps/loss"]) == int(status.split()[-1])


def test_a_finished_log_is_renamed_aside_and_the_new_one_reported(tmp_path):
    for _ in range(2):
        outcome = launch(*RUN, "--log", "run.h5", cwd=tmp_path)
        assert outcome.returncode == 0, outcome.stderr
        assert outcome.seconds < LIMIT
    assert "the earlier log run.h5 was renamed to run.1.h5" in outcome.stdout
    assert "log written to run.h5" in outcome.stdout
    assert sorted(p.name for p in tmp_path.glob("run*")) == ["run.1.h5", "run.h5"]
