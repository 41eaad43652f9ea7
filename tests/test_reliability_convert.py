"""The reliability of ``convert`` as a user runs it, in a process of its own: signals and killed
runs leave nothing behind, a lost worker ends the run, and what it refuses is one line."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py

SLOW_DECODING = """
import time
import hpctrain.data.folder as folder
decode_task = folder._decode_task
def slow(paths, size):  # a big photograph per task: the run lasts until the signal comes
    time.sleep(2)
    return decode_task(paths, size)
folder._decode_task = slow
"""


def start_convert(cwd: Path, *args: object, code: str = "") -> subprocess.Popen:
    """``python -m hpctrain convert ARGS`` started in ``cwd``, after ``code`` (a stand-in for
    a slow machine) when given."""
    script = f"import sys\n{code}\nfrom hpctrain.cli import main\nsys.exit(main(sys.argv[1:]))"
    return subprocess.Popen([sys.executable, "-c", script, "convert", *map(str, args)],
                            cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_temporary(directory: Path, name: str, timeout: float = 20) -> Path:
    """The temporary ``.NAME.*.tmp`` once it appears: the run is writing."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = list(directory.glob(f".{name}.*.tmp"))
        if found:
            return found[0]
        time.sleep(0.005)
    raise AssertionError(f"no temporary for {name} appeared in {timeout} s")


def test_sigterm_stops_a_parallel_conversion_as_ctrl_c_does(tmp_path):
    """SIGTERM killed the run where it stood (status 143): a temporary left beside --out, and
    the workers writing a BrokenPipeError traceback each into the closed pipe."""
    from tests.test_image_folder import make_folder

    make_folder(tmp_path / "train", 12, seed=2)
    process = start_convert(tmp_path, "--image-folder", "train", "--size", 16, "--workers", 2,
                            "--out", "out.h5", code=SLOW_DECODING)
    wait_for_temporary(tmp_path, "out.h5")
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=20)
    time.sleep(0.3)  # a worker left alive would write its traceback now
    assert process.returncode == 128 + signal.SIGTERM, err
    assert err.strip().splitlines() == ["hpctrain convert: stopped by SIGTERM"], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train"]


def stopped_leaving_nothing(process, tmp_path, timeout):
    """``process`` exits as SIGTERM stops a conversion: status 128 + 15, one line, and nothing
    left in ``tmp_path``."""
    _, err = process.communicate(timeout=timeout)
    assert process.returncode == 128 + signal.SIGTERM, err
    assert err.strip().splitlines() == ["hpctrain convert: stopped by SIGTERM"], err
    assert list(tmp_path.iterdir()) == []


def test_sigterm_stops_a_conversion_in_one_process_leaving_nothing(tmp_path):
    process = start_convert(tmp_path, "--universe", 3000, "--size", 16, "--channels", 2,
                            "--out", "u.h5")
    wait_for_temporary(tmp_path, "u.h5")
    process.send_signal(signal.SIGTERM)
    stopped_leaving_nothing(process, tmp_path, timeout=20)


SIGTERM_IN_A_WEAKREF_CALLBACK = """
import os, signal, weakref
import hpctrain.data.universe as universe
sample = universe.Universe.sample
class Freed:
    pass
def sigterm_inside(ref):  # as it comes, now and then, while h5py frees one of its objects
    os.kill(os.getpid(), signal.SIGTERM)
    sum(range(3))  # a call: the handler runs here, inside the callback
def sample_freeing_an_object(self, index):
    if index == 2:
        freed = Freed()
        ref = weakref.ref(freed, sigterm_inside)
        del freed
    return sample(self, index)
universe.Universe.sample = sample_freeing_an_object
"""


def test_a_sigterm_that_comes_inside_a_weakref_callback_still_stops_the_conversion(tmp_path):
    """Python prints an exception raised inside a weakref callback and carries on, so the
    Terminated the handler raised there was lost: the run went on to write u.h5 and exit 0."""
    process = start_convert(tmp_path, "--universe", 3000, "--size", 16, "--channels", 2,
                            "--out", "u.h5", code=SIGTERM_IN_A_WEAKREF_CALLBACK)
    stopped_leaving_nothing(process, tmp_path, timeout=60)


SIGTERM_AS_THE_TEMPORARY_APPEARS = """
import os, signal, tempfile
mkstemp = tempfile.mkstemp
def mkstemp_then_sigterm(*args, **kwargs):  # as the test above sends it, at its earliest
    made = mkstemp(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGTERM)
    return made
tempfile.mkstemp = mkstemp_then_sigterm
"""


def test_a_sigterm_as_the_temporary_appears_leaves_nothing(tmp_path):
    """Raised at once, the stop came between the temporary's creation and the code that
    removes it, and the temporary was left beside --out."""
    process = start_convert(tmp_path, "--universe", 3000, "--size", 16, "--channels", 2,
                            "--out", "u.h5", code=SIGTERM_AS_THE_TEMPORARY_APPEARS)
    stopped_leaving_nothing(process, tmp_path, timeout=60)


def test_the_temporary_of_a_killed_run_is_removed_by_the_next_run_to_that_path(tmp_path):
    process = start_convert(tmp_path, "--universe", 3000, "--size", 16, "--channels", 2,
                            "--out", "u.h5")
    left = wait_for_temporary(tmp_path, "u.h5")
    process.kill()  # SIGKILL: nothing of the run's own can remove it
    process.communicate(timeout=20)
    assert left.exists()
    user = tmp_path / ".u.h5.mynotes1.tmp"  # named like ours, but a user's text
    user.write_text("a user's notes\n")
    again = start_convert(tmp_path, "--universe", 8, "--size", 8, "--out", "u.h5")
    _, err = again.communicate(timeout=60)
    assert again.returncode == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == [".u.h5.mynotes1.tmp", "u.h5"]
    with h5py.File(tmp_path / "u.h5", "r") as h5:
        assert len(h5["train/images"]) == 6


def run_script(code: str, *args: str) -> subprocess.CompletedProcess:
    """``code`` run by a fresh interpreter with ``args``: what it prints and its status."""
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=60)


SIGTERM_AS_A_WORKER_IS_FORKED = """
import os, signal
import hpctrain.data.folder as folder
from hpctrain.errors import on_sigterm
signal.signal(signal.SIGTERM, on_sigterm)  # the command line's handler, which raises
# as the parent's terminate() reaches a worker started a moment before the run failed
os.register_at_fork(after_in_child=lambda: os.kill(os.getpid(), signal.SIGTERM))
pool = folder._Workers(1)
worker = pool.processes[0]
worker.join(20)
print(worker.exitcode)
"""


def test_a_sigterm_that_reaches_a_worker_as_it_is_forked_ends_it(tmp_path):
    """The forked worker ran the parent's SIGTERM handler until it installed its own; raised
    there, the Terminated left the worker running on as a copy of its parent (a test run's
    decoding worker went on to report the test's result a second time, and the parent's close
    waited for it for good)."""
    done = run_script(SIGTERM_AS_A_WORKER_IS_FORKED)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(-signal.SIGTERM)], done.stdout + done.stderr
    assert done.stderr == ""  # no handler ran in the worker: nothing raised, nothing ignored


A_WORKER_THAT_NEVER_EXITS = """
import signal, sys, time
import hpctrain.data.folder as folder
def stuck(pipe, parents):  # deaf to SIGTERM and to the pipe: a worker stuck in a read
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(600)
folder._work = stuck
folder.CLOSE_SECONDS = 0.5
pool = folder._Workers(2)
time.sleep(0.5)  # the workers are past their set-up
start = time.monotonic()
pool.close(finished=sys.argv[1] == "finished")
print(time.monotonic() - start, *(p.exitcode for p in pool.processes))
"""


def test_closing_the_workers_kills_one_that_does_not_exit():
    """Closing joined each worker without a limit: one that neither read its pipe nor died of
    SIGTERM kept the run waiting for good."""
    for how in ("finished", "failed"):
        done = run_script(A_WORKER_THAT_NEVER_EXITS, how)
        assert done.returncode == 0, done.stderr
        seconds, *codes = done.stdout.split()
        assert float(seconds) < 5, (how, seconds)
        assert codes == [str(-signal.SIGKILL)] * 2, (how, codes)
