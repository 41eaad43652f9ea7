"""Learning-rate schedules, stop requests and the step-by-step run log, on one process."""

import json
import math
import os
import signal

import h5py
import numpy as np
import pytest

from hpctrain.errors import UserError
from hpctrain.run.schedule import parse_schedule
from hpctrain.run.signals import StopRequests

# -- schedules ---------------------------------------------------------------------------------


def test_constant_cosine_and_step_schedules():
    assert [parse_schedule("constant", 0.1, 5).lr(k) for k in range(5)] == [0.1] * 5
    cosine = parse_schedule("cosine", 0.2, 10)
    assert cosine.lr(0) == pytest.approx(0.2)
    assert cosine.lr(5) == pytest.approx(0.1)  # half-way: half the rate
    assert cosine.lr(9) == pytest.approx(0.2 * 0.5 * (1 + math.cos(math.pi * 9 / 10)))
    assert cosine.lr(50) == pytest.approx(0.0)  # past the end: stays at the bottom
    rates = [parse_schedule("step:3:0.1", 1.0, 9).lr(k) for k in range(9)]
    assert rates == pytest.approx([1, 1, 1, 0.1, 0.1, 0.1, 0.01, 0.01, 0.01])


def test_warm_up_ramps_then_hands_over():
    s = parse_schedule("cosine", 0.4, 14, warmup=4)
    assert [s.lr(k) for k in range(4)] == pytest.approx([0.1, 0.2, 0.3, 0.4])
    assert s.lr(4) == pytest.approx(0.4)  # the cosine starts after the warm-up
    assert s.lr(9) == pytest.approx(0.2)  # half-way through the 10 steps after it
    assert "4 warm-up steps" in s.describe()


def test_poly_is_pytorchs_polynomial_lr_after_the_warm_up():
    """poly is PyTorch's PolynomialLR(total_iters=T, power=p) over the T steps after the
    warm-up (MLPerf's LARS recipe: power 2 by default)."""
    torch = pytest.importorskip("torch")
    for power in (None, 1.0, 3.5):
        s = parse_schedule("poly", 0.8, 13, warmup=3, power=power)
        weight = torch.nn.Parameter(torch.zeros(1))
        sgd = torch.optim.SGD([weight], lr=0.8)
        poly = torch.optim.lr_scheduler.PolynomialLR(sgd, total_iters=10,
                                                     power=2.0 if power is None else power)
        theirs = []
        for _ in range(10):
            theirs.append(sgd.param_groups[0]["lr"])
            sgd.step()
            poly.step()
        assert [s.lr(k) for k in range(3)] == pytest.approx([0.8 / 3, 1.6 / 3, 0.8])
        assert [s.lr(k) for k in range(3, 13)] == pytest.approx(theirs, rel=1e-12)
        assert s.lr(40) == 0.0  # past the end: stays at the bottom
    assert "polynomial (power 2)" in parse_schedule("poly", 0.1, 5).describe()


def test_poly_power_refusals():
    with pytest.raises(UserError, match="--poly-power 3 is the exponent of --lr-schedule poly"):
        parse_schedule("cosine", 0.1, 10, power=3.0)
    for power in (0.0, -1.0, math.inf):
        with pytest.raises(UserError, match=f"--poly-power {power} must be a positive"):
            parse_schedule("poly", 0.1, 10, power=power)
    with pytest.raises(UserError, match="poly takes no parameters"):
        parse_schedule("poly:2", 0.1, 10)


def test_rates_depend_on_the_step_alone():
    """What makes resuming exact: the rate of step k never depends on the steps before it."""
    s = parse_schedule("step:2:0.5", 0.3, 10, warmup=1)
    assert [s.lr(k) for k in (7, 3, 7)] == [s.lr(7), s.lr(3), s.lr(7)]


@pytest.mark.parametrize("text,message", [
    ("linear", "unknown schedule 'linear'"),
    ("step:0:0.1", "EVERY must be >= 1"),
    ("step:10:2", "FACTOR in (0, 1]"),
    ("step:10", "write step:EVERY:FACTOR"),
    ("step:x:0.1", "write step:EVERY:FACTOR"),
    ("cosine:3", "cosine takes no parameters"),
])
def test_bad_schedules_name_the_text(text, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_schedule(text, 0.1, 10)


def test_bad_rate_and_warm_up():
    with pytest.raises(UserError, match="--lr -1"):
        parse_schedule("constant", -1, 10)
    with pytest.raises(UserError, match="--warmup-steps -2"):
        parse_schedule("constant", 0.1, 10, warmup=-2)
    for warmup in (6, 100):  # as long as the run, or longer: the rate never reaches --lr
        with pytest.raises(UserError, match=f"--warmup-steps {warmup} must be fewer than the "
                                            f"run's 6 steps"):
            parse_schedule("cosine", 0.1, 6, warmup=warmup)
    assert parse_schedule("constant", 0.1, 6, warmup=5).lr(5) == 0.1


# -- stop requests -----------------------------------------------------------------------------

class SelfComm:
    """A one-rank communicator, enough for StopRequests.agreed."""

    def Get_size(self):
        return 1


def test_a_signal_is_recorded_not_fatal_and_handlers_are_restored():
    before = signal.getsignal(signal.SIGTERM)
    with StopRequests() as stop:
        assert stop.agreed(SelfComm()) is None
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGUSR1)
        assert stop.received == "SIGTERM"  # the first one counts
        assert stop.agreed(SelfComm()) == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is before


# -- the run log -------------------------------------------------------------------------------

def planned_smallcnn():
    from hpctrain.cost.machine import load_machine
    from hpctrain.device.backend import Backend
    from hpctrain.model.net import load_net
    from hpctrain.plan.planner import choices_of, evaluate
    from hpctrain.plan.plans import plan_from_spec
    from hpctrain.plan.pricing import build_cost_model

    net = load_net("smallcnn")
    model = build_cost_model(net, 8, 2, load_machine("default"), "flops", Backend(np, np.float32))
    return evaluate(model, choices_of(model, plan_from_spec("conv=domain:2x1,fc=2x1", net, 2)))


def log_steps(log, steps, procs=2):
    from hpctrain.record.runlog import RECORD_FIELDS

    width = len(log.rows) * len(RECORD_FIELDS) + 1
    for step in steps:
        records = np.arange(procs * width, dtype=float).reshape(procs, width) + step
        table = records[:, :-1].reshape(procs, len(log.rows), len(RECORD_FIELDS))
        log.step({"step": step, "loss": 1.0 / (step + 1), "accuracy": 0.5, "seconds": 0.1,
                  "images_per_second": 80.0, "lr": 0.01, "comm_fraction": 0.25},
                 table.max(axis=0), table.mean(axis=0))


def test_run_log_grows_step_by_step_with_max_and_mean_over_ranks(tmp_path):
    from hpctrain.record.runlog import RECORD_FIELDS, RunLog

    planned = planned_smallcnn()
    rows = [c.layer for c in planned.layers] + ["loss"]
    log = RunLog(tmp_path / "run.h5", {"net": "smallcnn", "config": {"batch": 8}}, planned, rows)
    log_steps(log, range(1, 4))
    # readable while the run goes on (in this process the flags must match the writer's)
    with h5py.File(tmp_path / "run.h5", locking=False) as h5:
        assert h5["steps/loss"].shape == (3,) and h5.attrs["status"] == "running"
    log.validation(3, 0.7, 0.9)
    log.finish("finished at step 3")
    with h5py.File(tmp_path / "run.h5") as h5:
        assert json.loads(h5.attrs["config"]) == {"batch": 8}
        assert h5.attrs["status"] == "finished at step 3"
        assert list(h5["steps/step"][:]) == [1, 2, 3]
        width = len(RECORD_FIELDS)
        k = RECORD_FIELDS.index("backward_compute")
        stride = len(rows) * width + 1
        for row, step in enumerate(range(1, 4)):  # rank 1's record is rank 0's plus stride
            want_max = np.arange(len(rows)) * width + k + stride + step
            assert np.array_equal(h5["steps/layers/backward_compute/max"][row], want_max)
            assert np.array_equal(h5["steps/layers/backward_compute/mean"][row],
                                  want_max - stride / 2)
        assert list(h5["plan/mode"][:2]) == [b"domain", b"follow"]
        assert list(h5["plan/grid"][0]) == [2, 1]
        assert h5["validation/accuracy"][:].tolist() == [0.9]


def test_resuming_a_log_drops_the_rows_it_will_log_again(tmp_path):
    from hpctrain.record.runlog import RunLog

    planned = planned_smallcnn()
    rows = [c.layer for c in planned.layers] + ["loss"]
    attrs = {"processes": 2, "net": "smallcnn", "plan": "conv1 domain 2x1"}
    log = RunLog(tmp_path / "run.h5", attrs, planned, rows)
    log_steps(log, range(1, 7))
    log.validation(4, 0.5, 0.5)
    log.validation(6, 0.4, 0.6)
    log.close()  # killed after step 6; the checkpoint was at step 4
    log = RunLog(tmp_path / "run.h5", attrs, planned, rows, resume_step=4)
    log_steps(log, range(5, 9))
    log.finish("finished at step 8")
    with h5py.File(tmp_path / "run.h5") as h5:
        assert list(h5["steps/step"][:]) == list(range(1, 9))
        assert h5["steps/layers/forward_compute/max"].shape[0] == 8
        assert list(h5["validation/step"][:]) == [4]  # made at the checkpoint: kept
        assert h5.attrs["resumed"].startswith("at step 4")
    assert not (tmp_path / "run.1.h5").exists()


def test_a_resume_on_another_plan_starts_its_own_log(tmp_path):
    from hpctrain.record.runlog import RunLog

    planned = planned_smallcnn()
    rows = [c.layer for c in planned.layers] + ["loss"]
    RunLog(tmp_path / "run.h5", {"processes": 2, "plan": "a"}, planned, rows).finish("stopped")
    RunLog(tmp_path / "run.h5", {"processes": 4, "plan": "b"}, planned, rows,
           resume_step=3).finish("done")
    with h5py.File(tmp_path / "run.1.h5") as old, h5py.File(tmp_path / "run.h5") as new:
        assert old.attrs["processes"] == 2 and new.attrs["processes"] == 4
        assert new.attrs["resumed"].startswith("at step 3") and "new log" in new.attrs["resumed"]
        assert "resumed" not in old.attrs


def test_a_new_log_never_overwrites_an_old_one(tmp_path):
    from hpctrain.io.files import rotate_aside
    from hpctrain.record.runlog import RunLog

    planned = planned_smallcnn()
    rows = [c.layer for c in planned.layers] + ["loss"]
    for _ in range(3):
        RunLog(tmp_path / "run.h5", {}, planned, rows).finish("done")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.1.h5", "run.2.h5", "run.h5"]
    assert rotate_aside(tmp_path / "run.h5").name == "run.3.h5"  # the next name is free


# -- the per-layer timings, written as the run goes ---------------------------------------------

def timings_of(rows, value):
    """A record of every row's times all equal to ``value``."""
    from hpctrain.record.timing import StepTimes

    blank = StepTimes.blank(rows[:-1])
    return blank.from_array(np.full(blank.to_array().shape, value))


def names_in(path):
    with h5py.File(path, locking=False) as h5:
        found = []
        h5.visit(found.append)
        return sorted(found)


def test_timings_are_rewritten_in_place_and_read_back_with_the_steps_they_cover(tmp_path):
    """Created empty with the log, overwritten in place by each write (nothing is added or
    removed), read back by calibrate --from-log with the steps they cover until the run's own
    end writes them as final."""
    from hpctrain.model.net import load_net
    from hpctrain.plan.plans import plan_text
    from hpctrain.record.measured import LogError, read_measured_plans
    from hpctrain.record.runlog import RunLog

    planned = planned_smallcnn()
    rows = [c.layer for c in planned.layers] + ["loss"]
    net = load_net("smallcnn")
    attrs = {"processes": 2, "net": "smallcnn", "batch": 8,
             "plan": plan_text(net, planned.plans)}
    log = RunLog(tmp_path / "run.h5", attrs, planned, rows)
    log_steps(log, range(1, 5))
    with pytest.raises(LogError, match="ended before it wrote any"):
        read_measured_plans(tmp_path / "run.h5")
    before = names_in(tmp_path / "run.h5")
    log.timings(planned, timings_of(rows, 2.0), timings_of(rows, 1.0), 0.5, (2, 4), final=False)
    assert names_in(tmp_path / "run.h5") == before  # values alone changed
    (found,) = read_measured_plans(tmp_path / "run.h5")
    assert found.unfinished == (2, 4) and found.iteration == (planned.iteration_time, 0.5)
    assert np.all(found.measured["backward_compute"] == 2.0)
    assert np.all(found.fastest_rank["forward_layer_comm"] == 1.0)
    assert found.unfinished_words.endswith("run.h5: the run did not finish; timings from its "
                                           "first 4 steps (medians over steps 2-4)")
    log.timings(planned, timings_of(rows, 3.0), timings_of(rows, 1.0), 0.25, (2, 6), final=True)
    log.finish("finished at step 6")
    assert names_in(tmp_path / "run.h5") == before
    (found,) = read_measured_plans(tmp_path / "run.h5")
    assert found.unfinished is None and found.unfinished_words == ""
    assert np.all(found.measured["forward_compute"] == 3.0) and found.iteration[1] == 0.25


def test_a_log_with_the_summary_of_an_older_hpctrain_keeps_it_when_resumed(tmp_path):
    """Written once at the end, with no second copy: a resume gives it one, values kept."""
    from hpctrain.record.runlog import RunLog, write_timings
    from hpctrain.record.summary import read_summary

    planned = planned_smallcnn()
    rows = [c.layer for c in planned.layers] + ["loss"]
    attrs = {"processes": 2, "net": "smallcnn", "plan": "conv1 domain 2x1"}
    log = RunLog(tmp_path / "run.h5", attrs, planned, rows)
    log_steps(log, range(1, 5))
    for name in ("layers", "iteration"):
        del log.h5[name]
    write_timings(log.h5, planned, timings_of(rows, 2.0), timings_of(rows, 1.0), 0.5)
    log.finish("finished at step 4")
    log = RunLog(tmp_path / "run.h5", attrs, planned, rows, resume_step=4)
    found = read_summary(log.h5)
    assert found.final and found.iteration == (planned.iteration_time, 0.5)
    assert np.all(found.fields["measured"]["forward_compute"] == 2.0)
    log.timings(planned, timings_of(rows, 3.0), timings_of(rows, 1.0), 0.25, (6, 8), False)
    log.finish("finished at step 8")
    with h5py.File(tmp_path / "run.h5") as h5:
        found = read_summary(h5)
        assert (found.first_step, found.last_step, found.final) == (6, 8, False)
        assert np.all(h5["layers/staged/measured/forward_compute"][:] == 3.0)


CUT_SHORT = """
import os, sys
import h5py, numpy as np
from hpctrain.record import summary as s
from hpctrain.record.timing import TIME_FIELDS

def made(value, last):
    return s.Summary({source: {f: np.full(3, value) for f in TIME_FIELDS}
                      for source in s.SOURCES}, (value, value), 2, last, False)

class Killed:  # the log, killed right after its flush number `after`
    def __init__(self, h5, after):
        self.h5, self.after, self.flushes = h5, after, 0
    def __getitem__(self, key):
        return self.h5[key]
    def flush(self):
        self.h5.flush()
        self.flushes += 1
        if self.flushes == self.after:
            os._exit(0)

def torn(at):  # the `at`-th copy written is killed half-way, its first part on disk
    fill, calls = s._fill, [0]
    def write(copy, summary):
        calls[0] += 1
        if calls[0] < at:
            return fill(copy, summary)
        for f in TIME_FIELDS:
            copy.datasets["measured", f][...] = summary.fields["measured"][f]
        copy.group.file.flush()
        os._exit(0)
    s._fill = write

for cut in sys.argv[2:]:
    how, k = cut.split(":")
    path = f"{sys.argv[1]}/{how}{k}.h5"
    with h5py.File(path, "w") as h5:
        s.create_summary(h5, ["conv1", "relu1", "loss"])
        s.write_summary(h5, made(1.0, 4))
    pid = os.fork()
    if pid == 0:
        h5 = h5py.File(path, "a")
        if how == "torn":
            torn(int(k))
        s.write_summary(Killed(h5, int(k)) if how == "flush" else h5, made(2.0, 6))
        os._exit(3)  # not killed: the cut was not reached
    assert os.waitpid(pid, 0)[1] == 0, cut
"""


def test_a_write_of_the_timings_killed_at_any_point_leaves_one_whole_copy(tmp_path):
    """A process killed after each flush of a write, or half-way through either copy, leaves
    the earlier timings or the new ones, never a mix: the reader takes the whole copy, and a
    resumed run's log finishes the write first."""
    import subprocess
    import sys

    from hpctrain.record.summary import read_summary, require_summary

    # flush:K, killed after the K-th of the write's 4 flushes; torn:N, inside the N-th copy
    expect = {"flush:1": 1.0, "flush:2": 2.0, "flush:3": 2.0, "flush:4": 2.0,
              "torn:1": 1.0, "torn:2": 2.0}
    done = subprocess.run([sys.executable, "-c", CUT_SHORT, str(tmp_path), *expect],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    for cut, value in expect.items():
        path = tmp_path / f"{cut.replace(':', '')}.h5"
        with h5py.File(path, "a") as h5:
            found = read_summary(h5)
            for source in found.fields.values():
                assert all(np.all(v == value) for v in source.values()), cut
            assert found.iteration == (value, value) and found.last_step == (4, 6)[value > 1]
            require_summary(h5, ["conv1", "relu1", "loss"])  # as a resumed run opens it
            assert h5["layers"].attrs["writing"] == 0, cut
            assert np.all(h5["layers/measured/forward_compute"][:] == value), cut
            assert read_summary(h5).last_step == found.last_step, cut


def test_timings_go_into_the_log_every_n_steps_and_at_checkpoints_ever_further_apart():
    from hpctrain.run.loop import TIMINGS_SHARE, _timings_due

    def written(every, steps, checkpoint_every=0, first=0):
        last, out = first, []
        for done in range(first + 1, steps + 1):
            checkpointing = bool(checkpoint_every) and done % checkpoint_every == 0
            if _timings_due(every, done - last, done - first, checkpointing):
                out.append(done)
                last = done
        return out

    assert written(100, 450) == [100, 200, 300, 400]
    assert written(100, 450, checkpoint_every=150) == [100, 150, 250, 300, 400, 450]
    assert written(0, 450, checkpoint_every=150) == []
    assert written(3, 10, first=4) == [7, 10]  # a resumed run counts from its first step
    late = written(10, 20_000)
    gaps = np.diff(late)
    assert late[:3] == [10, 20, 30] and np.all(gaps >= 10)
    assert np.all(gaps >= np.array(late[1:]) // TIMINGS_SHARE)  # ever further apart
    assert len(late) < 120  # not 2,000 medians over ever more steps
