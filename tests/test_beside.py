"""A search run beside on a second core (hpctrain.plan.beside): its value, or what it raised,
comes back; a lost child's search runs here; closing ends it; and ``--space auto`` finds the
same plans, to the byte printed, with the balanced search in a child as without."""

import os
import signal
import subprocess
import sys
import time

import pytest

from hpctrain.cli import main
from hpctrain.plan import spaces
from hpctrain.plan.beside import Beside
from hpctrain.plan.planner import PlannerError


def test_the_childs_value_comes_back_from_another_process():
    parent = os.getpid()
    assert Beside(lambda: (os.getpid(), [1.5, "x"])).result()[1] == [1.5, "x"]
    assert Beside(os.getpid).result() != parent


def test_what_the_child_raised_is_raised_here():
    def refuse():
        raise PlannerError("--space balanced: too large")

    with pytest.raises(PlannerError, match="--space balanced: too large"):
        Beside(refuse).result()


def test_a_lost_child_leaves_the_search_to_this_process():
    parent = os.getpid()

    def search():
        if os.getpid() != parent:  # as the out-of-memory killer would
            os.kill(os.getpid(), signal.SIGKILL)
        return "searched here"

    assert Beside(search).result() == "searched here"


def test_closing_ends_a_child_still_searching():
    beside = Beside(lambda: time.sleep(60))
    pid, start = beside.pid, time.monotonic()
    beside.close()
    assert time.monotonic() - start < 5
    with pytest.raises(ChildProcessError):  # reaped: no zombie left
        os.waitpid(pid, os.WNOHANG)


SIGTERM_AS_THE_CHILD_IS_FORKED = """
import os, signal
from hpctrain.errors import on_sigterm
from hpctrain.plan.beside import Beside
signal.signal(signal.SIGTERM, on_sigterm)  # the command line's handler, which raises
os.register_at_fork(after_in_child=lambda: os.kill(os.getpid(), signal.SIGTERM))
beside = Beside(lambda: "the child's")
_, status = os.waitpid(beside.pid, 0)
beside.pid = None
print(os.waitstatus_to_exitcode(status))
"""


def test_a_sigterm_that_reaches_the_child_as_it_is_forked_ends_it():
    """Run in the child, the parent's handler would raise in a copy of the parent's code."""
    done = subprocess.run([sys.executable, "-c", SIGTERM_AS_THE_CHILD_IS_FORKED],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(-signal.SIGTERM)], done.stdout + done.stderr
    assert done.stderr == ""


@pytest.mark.parametrize("net,procs,batch,machine,flags", [
    ("inception_v3", 256, 128, "dgx-h100", []),  # the grids' plan, regions on groups of ranks
    ("resnet50", 256, 128, "dgx-h100", []),  # balanced's, with its bound (sums that may hide)
    ("resnet18", 256, 2, "cori-knl", ["--image-size", "16"]),  # no 1.5D plan: balanced's
])
def test_auto_plans_alike_with_the_balanced_search_beside(monkeypatch, capsys, net, procs,
                                                          batch, machine, flags):
    forked = []
    monkeypatch.setattr(spaces, "Beside", lambda search, **told: forked.append(
        Beside(search, **told)) or forked[-1])

    def plan(fork):
        monkeypatch.setattr(spaces, "may_fork", lambda: fork)
        assert main(["plan", "--net", net, "--procs", str(procs), "--batch", str(batch),
                     "--machine", machine, *flags]) == 0
        return capsys.readouterr().out

    alone = plan(False)
    assert not forked
    assert plan(True) == alone
    assert len(forked) == 1 and forked[0].pid is None  # searched in a child, reaped


@pytest.mark.parametrize("argv", [
    ["--net", "vgg16", "--procs", "64", "--batch", "32"],  # a chain: no groups to weigh
    ["--net", "resnet50", "--procs", "64", "--batch", "32", "--branches", "serial"],
])
def test_a_grids_search_without_groups_leaves_balanced_here(monkeypatch, capsys, argv):
    """Without groups the grids take a fraction of balanced's time, and a child would price
    again what balanced finds priced: no fork pays."""
    monkeypatch.setattr(spaces, "may_fork", lambda: True)
    monkeypatch.setattr(spaces, "Beside", lambda search: pytest.fail("forked"))
    assert main(["plan", *argv, "--machine", "cori-knl"]) == 0
    assert "--space auto searched balanced" in capsys.readouterr().out


def test_a_fork_refused_leaves_the_search_to_this_process(monkeypatch):
    def refused():
        raise BlockingIOError("Resource temporarily unavailable")  # EAGAIN: a process limit

    monkeypatch.setattr(os, "fork", refused)
    beside = Beside(lambda: os.getpid())
    assert beside.pid is None and beside.result() == os.getpid()
    beside.close()


def test_a_plan_from_beside_that_does_not_win_is_not_priced_here(monkeypatch, capsys):
    """The child hands back its plan's time with it: where the grids' plan is faster, the
    parent keeps it without pricing the balanced plan again."""
    priced = []
    real = spaces.evaluate_plan
    monkeypatch.setattr(spaces, "evaluate_plan",
                        lambda model, plan, *rest: priced.append(plan) or real(model, plan, *rest))
    monkeypatch.setattr(spaces, "may_fork", lambda: True)
    assert main(["plan", "--net", "inception_v3", "--procs", "256", "--batch", "128",
                 "--machine", "dgx-h100"]) == 0
    assert "no plan of it beats the 1.5D plan" in capsys.readouterr().out
    assert not priced


def test_a_note_comes_back_while_the_child_still_searches():
    """What the child notes reaches this process at once; its search goes on until closed."""
    parent = os.getpid()

    def search(note):
        note((os.getpid() != parent, 1.5))
        note("a second note")
        time.sleep(60)

    beside = Beside(search, noting=True)
    start = time.monotonic()
    assert beside.noted() == (True, 1.5)
    assert beside.noted() == "a second note"  # each in turn
    pid = beside.pid
    beside.close()
    assert time.monotonic() - start < 5
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def test_a_child_that_notes_nothing_leaves_its_value_or_its_error():
    beside = Beside(lambda note: "no note", noting=True)
    assert beside.noted() is None
    assert beside.result() == "no note"

    def refuse(note):
        note(2.5)
        raise PlannerError("--space balanced: too large")

    beside = Beside(refuse, noting=True)
    assert beside.noted() == 2.5
    assert beside.noted() is None  # no more
    with pytest.raises(PlannerError, match="too large"):
        beside.result()


def test_a_noting_search_lost_or_never_forked_runs_here(monkeypatch):
    """A child lost after its note leaves the note and its search to this process; with the
    fork refused, nothing is noted before the search runs here, and its notes are kept."""
    parent = os.getpid()

    def search(note):
        note(os.getpid())
        if os.getpid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)
        return "searched here"

    beside = Beside(search, noting=True)
    assert beside.noted() not in (None, parent)
    assert beside.result() == "searched here"

    def refused():
        raise BlockingIOError("Resource temporarily unavailable")

    monkeypatch.setattr(os, "fork", refused)
    beside = Beside(search, noting=True)
    assert beside.noted() is None
    assert beside.result() == "searched here" and beside.noted() == parent  # kept as it ran


def test_a_bound_that_cannot_win_spares_the_wait_for_the_balanced_plan(monkeypatch, capsys):
    """With sums that may hide, the child notes lower bounds on every balanced plan's time
    (the first round of its search with their share free, then that search's optimum); where
    one does not beat the grids' plan the parent goes on without the balanced plan, and prints
    what it would have."""
    argv = ["plan", "--net", "inception_v3", "--procs", "256", "--batch", "128",
            "--machine", "dgx-h100"]
    monkeypatch.setattr(spaces, "may_fork", lambda: False)  # both searched here, in full
    assert main(argv) == 0
    alone = capsys.readouterr().out
    assert "no plan of it beats the 1.5D plan" in alone
    monkeypatch.setattr(spaces, "may_fork", lambda: True)
    monkeypatch.setattr(Beside, "result", lambda self: pytest.fail("waited for the plan"))
    assert main(argv) == 0
    assert capsys.readouterr().out == alone
