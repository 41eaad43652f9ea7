"""The command line as a user meets it: help, a short run, and one-line errors (one process)."""

import io
import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

from hpctrain import cli
from hpctrain.errors import Failure, OutputError, Terminated, UserError
from tests.test_training_app import mpiexec

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def hpctrain(*args):
    return subprocess.run([sys.executable, "-m", "hpctrain", *args], capture_output=True,
                          text=True, timeout=120, env=ENV)


def test_help_documents_the_flags():
    result = hpctrain("--help")
    assert result.returncode == 0
    for flag in ("--net", "--grid", "--batch", "--steps", "--lr", "--device", "--image-size"):
        assert flag in result.stdout
    assert "--tolerance" in hpctrain("verify", "--help").stdout


def test_short_training_run_prints_plan_and_progress():
    result = hpctrain("--net", "smallcnn", "--steps", "3", "--batch", "8")
    assert result.returncode == 0, result.stderr
    assert "conv1" in result.stdout and "step     3/3" in result.stdout


def test_verify_passes_on_one_process():
    result = hpctrain("verify", "--net", "mlp", "--grid", "1x1")
    assert result.returncode == 0, result.stderr
    assert "PASS" in result.stdout


@pytest.mark.parametrize("args,message", [
    (["--net", "resnet"], "unknown net 'resnet'"),
    (["--grid", "2x2"], "grid 2x2 needs 4 processes but 1"),
    (["--batch", "0"], "--batch 0 must be at least 1"),
    (["--net", "alexnet", "--image-size", "30"], "layer maxpool2 receives 2x2"),
    (["--net", "mlp", "--image-size", "30"], "flat input"),
    (["--steps", "0"], "--steps 0 must be >= 1"),
    (["--lr", "-1", "--net", "mlp"], "--lr -1.0 must be positive"),
    (["--device", "gpu", "--net", "mlp"], "gpu"),
    (["--timeline", "3", "--log", "x.h5"], "--timeline '3' must be FIRST:LAST"),
    (["--timeline", "2:1", "--log", "x.h5"], "FIRST <= LAST"),
    (["--timeline", "1:2"], "--timeline 1:2 needs --log"),
    (["--timeline", "4:12", "--log", "x.h5"], "ends after the last step (10)"),
    (["--replan-after", "3"], "--replan-after 3 plans again as --grid auto does; give --grid"),
    (["--grid", "auto", "--replan-after", "1"], "--replan-after 1 must be from 2"),
    (["--grid", "auto", "--replan-after", "10"], "to 9, below the last step (10)"),
    (["--grid", "auto", "--replan-after", "3"], "give --checkpoint-dir DIR"),
    (["--replan-threshold", "0.2"], "give --replan-after K too"),
    (["--grid", "auto", "--replan-after", "3", "--checkpoint-dir", "ck", "--replan-threshold",
      "-1"], "--replan-threshold -1.0 must be a fraction"),
])
def test_bad_input_is_one_clear_line_and_exit_2(args, message):
    result = hpctrain(*args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hpctrain: error:") and message in lines[0]


def test_nan_loss_stops_naming_the_step():
    result = hpctrain("--net", "mlp", "--lr", "1e6", "--steps", "20", "--batch", "8")
    assert result.returncode == 2
    assert "at step" in result.stderr and "lower --lr" in result.stderr


@pytest.mark.parametrize("error", ["ValueError", "RuntimeError"])
def test_a_failure_on_one_rank_aborts_every_rank(tmp_path, error):
    launcher = mpiexec()
    if launcher is None:
        pytest.skip("no mpiexec")
    script = tmp_path / "fail_on_rank_1.py"
    script.write_text(f"""
import sys
from mpi4py import MPI
import hpctrain.data.synthetic as data
images = data.SyntheticData.images
def failing(self, step, box):
    if MPI.COMM_WORLD.Get_rank() == 1:
        raise {error}("disk vanished on rank 1")
    return images(self, step, box)
data.SyntheticData.images = failing
from hpctrain.cli import main
sys.exit(main(["--net", "mlp", "--steps", "3", "--batch", "8"]))
""")
    result = subprocess.run([launcher, "-n", "2", sys.executable, str(script)],
                            capture_output=True, text=True, timeout=60, env=ENV)
    assert result.returncode != 0
    assert "rank 1 failed" in result.stderr and "disk vanished on rank 1" in result.stderr


def test_plan_prints_a_plan_for_4096_processes_without_mpi(tmp_path):
    out = tmp_path / "alexnet.plan"
    result = hpctrain("plan", "--net", "alexnet", "--procs", "4096", "--batch", "2048",
                      "--machine", "cori-knl", "--out", str(out))
    assert result.returncode == 0, result.stderr
    for name in ("conv1", "conv5", "fc6", "fc8", "predicted iteration"):
        assert name in result.stdout
    from hpctrain.model.net import load_net
    from hpctrain.plan.plans import read_plan

    plan = read_plan(out, load_net("alexnet"), 4096)
    assert len(plan) == len(load_net("alexnet").layers)


def test_plan_loads_only_what_planning_runs():
    """No MPI, no compute kernels, no thread set-up, no ONNX importer: planning a .net file
    from a FLOP rate needs none, and loading them is a good part of a plan's time."""
    code = ("import sys; from hpctrain.cli import main; "
            "rc = main(['plan', '--net', 'resnet18', '--procs', '64', '--batch', '256', "
            "'--machine', 'cori-knl']); "
            "bad = [m for m in sys.modules if m.split('.')[0] == 'mpi4py' or m.startswith("
            "('hpctrain.kernels.conv', 'hpctrain.kernels.pool', 'hpctrain.commands.setup', "
            "'hpctrain.device.threads', 'hpctrain.layers.conv', "
            "'hpctrain.interchange.onnx_import'))]; "
            "assert not bad, bad; sys.exit(rc)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, env=ENV)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("args,message", [
    (["--machine", "nowhere"], "unknown machine 'nowhere'"),
    (["--mem-per-rank", "1K"], "no plan fits in --mem-per-rank"),
    (["--procs", "0"], "--procs 0 must be at least 1"),
    (["--procs", "64", "--batch", "2", "--net", "smallcnn", "--space", "grids"], "raise --batch"),
])
def test_plan_bad_input_is_one_clear_line(args, message):
    base = {"--procs": "16", "--batch": "32", "--machine": "cori-knl"}
    for flag, value in zip(args[::2], args[1::2]):
        base[flag] = value
    result = hpctrain("plan", *[x for kv in base.items() for x in kv])
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr


def test_memory_sizes_parse_with_binary_units():
    import argparse

    from hpctrain.commands.flags import parse_size

    assert parse_size("2G") == 2 * 2**30
    assert parse_size("512MiB") == 512 * 2**20
    assert parse_size("1000") == 1000
    with pytest.raises(argparse.ArgumentTypeError, match="'2Q' is not a memory size"):
        parse_size("2Q")


class Writes(io.RawIOBase):
    """The file under a stderr built as ``python -u`` (or ``PYTHONUNBUFFERED=1``) builds it: a
    text layer writing through to an unbuffered file. Keeps each write it is handed: under a
    launcher each is read on its own, and another rank's output may come between two."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self.writes.append(bytes(data))
        return len(data)


@pytest.mark.parametrize("error,line", [
    (UserError("dataset 'd.h5': the file is damaged"),
     "hpctrain: error: dataset 'd.h5': the file is damaged"),
    (OutputError("cannot write 'p.plan': disk full"),
     "hpctrain: error: cannot write 'p.plan': disk full"),
    (Failure("a decoding worker process was lost"),
     "hpctrain plan: error: a decoding worker process was lost"),
    (Terminated(), "hpctrain plan: stopped by SIGTERM"),
    (KeyboardInterrupt(), "hpctrain plan: interrupted"),
])
def test_each_failure_line_is_one_write_ending_with_its_newline(monkeypatch, error, line):
    file = Writes()
    monkeypatch.setattr(sys, "stderr", io.TextIOWrapper(file, encoding="utf-8",
                                                        write_through=True))

    def run(argv):
        raise error

    monkeypatch.setattr(cli, "command_module", lambda command: SimpleNamespace(run=run))
    assert cli.main(["plan"]) != 0
    assert file.writes == [f"{line}\n".encode()]


@pytest.mark.parametrize("error,end", [("RuntimeError", "rank 0 failed: disk vanished\n"),
                                       ("ValueError", "ValueError: disk vanished\n")])
def test_a_rank_failure_is_one_write_ending_with_one_newline(tmp_path, error, end):
    """The line of a rank that fails alone (a RuntimeError's text, or any other error's
    traceback, which ends with a line break of its own) is one write, then the job is
    aborted; where sys.stderr is not the process's own (a harness capturing it, lost with
    the process), the line is written to the process's own stderr too."""
    script = tmp_path / "fail.py"
    script.write_text(textwrap.dedent(f"""
        import io, os, sys
        from types import SimpleNamespace

        class Marked(io.RawIOBase):  # each write of stderr, followed by a mark
            def writable(self):
                return True

            def write(self, data):
                os.write(2, bytes(data) + b"<write>")
                return len(data)

        sys.stderr = io.TextIOWrapper(Marked(), encoding="utf-8", write_through=True)
        from hpctrain import cli

        def run(argv, comm):
            raise {error}("disk vanished")

        cli.command_module = lambda command: SimpleNamespace(run=run)
        sys.exit(cli.main(["--net", "mlp"]))
        """))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                            timeout=60, env=ENV)
    assert result.returncode != 0
    writes = result.stderr.split("<write>")[:-1]  # (the last part: what MPI_Abort printed)
    ours = [w for w in writes if "rank 0 failed" in w]
    assert len(ours) == 1 and ours[0].startswith("hpctrain: rank 0 failed: "), result.stderr
    assert ours[0].endswith(end) and all(w.strip() for w in writes), result.stderr
    # sys.stderr was not the process's own: the line reached that too, before the abort
    assert result.stderr.count("hpctrain: rank 0 failed: ") == 2, result.stderr


def test_a_sigterm_a_library_reported_as_its_own_error_is_still_a_sigterm():
    """h5py turns an exception raised inside its attribute write into a TypeError of its own,
    raised while handling it: the stop is still recognised by the chain."""
    from hpctrain.cli import _caused_by
    from hpctrain.errors import Terminated

    try:
        try:
            raise Terminated
        except Terminated:
            raise TypeError("operation not defined for data type class")  # noqa: B904
    except TypeError as err:
        assert _caused_by(err, Terminated)
    assert not _caused_by(ValueError("x"), Terminated)


def test_version_and_a_mistyped_command():
    """``--version`` answers, and a word where a command belongs is refused in one line that
    names the nearest command (once, under a launcher of two ranks), not taken as train's
    unrecognised argument."""
    from hpctrain import __version__

    result = hpctrain("--version")
    assert (result.returncode, result.stdout) == (0, f"hpctrain {__version__}\n")
    result = hpctrain("calibrat", "--quick")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("hpctrain: error: unknown command 'calibrat': did you "
                                    "mean 'calibrate'?") and result.stderr.count("\n") == 1
    assert "did you mean" not in hpctrain("xyzzy").stderr
    both = subprocess.run([mpiexec(), "-n", "2", sys.executable, "-m", "hpctrain", "plann"],
                          capture_output=True, text=True, timeout=120, env=ENV)
    assert both.returncode == 2 and both.stderr.count("did you mean 'plan'?") == 1


def test_a_python_without_the_dependencies_gets_one_line():
    """``python -m hpctrain`` under a Python that lacks a dependency (h5py, here hidden) says
    which, and how to get a Python that has it, in one line: no traceback."""
    hide = ("import runpy, sys; sys.modules['h5py'] = None; sys.argv = ['hpctrain', 'convert', "
            "'--digits', '--out', 'x.h5']; runpy.run_module('hpctrain', run_name='__main__')")
    result = subprocess.run([sys.executable, "-c", hide], capture_output=True, text=True,
                            timeout=120, env=ENV)
    assert result.returncode == 2
    assert result.stderr.startswith("hpctrain: error: this Python") and "'h5py'" in result.stderr
    assert result.stderr.count("\n") == 1 and "make install" in result.stderr


SILENT_FLAGS = [
    (["--branches", "serial", "--grid", "1x1"], "--branches serial is unused"),
    (["--branches", "serial"], "--branches serial is unused"),
    (["verify", "--net", "mlp", "--grid", "1x1", "--branches", "serial"],
     "--branches serial is unused"),
    (["plan", "--net", "mlp", "--procs", "4", "--batch", "8", "--grid", "2x2", "--branches",
      "serial"],
     "--branches serial is unused"),
    (["--space", "axes", "--grid", "1x1"], "--space axes is unused"),
    (["--timings-every", "5"], "give --log FILE.h5 too"),
    (["--keep-checkpoints", "3"], "give --checkpoint-dir DIR too"),
    (["--plan-file", "x.plan", "--grid", "1x1"], "nothing is planned"),
    (["--loss-scale", "1024"], "under --precision fp16 only"),
    (["--loss-scale", "1024", "--precision", "bf16"], "under --precision fp16 only"),
    (["--loss-scale", "inf", "--precision", "fp16"], "positive number a float32 holds"),
    (["--loss-scale", "1e39", "--precision", "fp16"], "positive number a float32 holds"),
    (["--loss-scale", "0", "--precision", "fp16"], "positive number a float32 holds"),
    (["--loss-scale", "-4", "--precision", "fp16"], "positive number a float32 holds"),
    (["--loss-scale", "nan", "--precision", "fp16", "--grid", "auto"],
     "positive number a float32 holds"),
    (["calibrate", "--from-log", "x.h5", "--quick"], "--quick measures nothing"),
    (["calibrate", "--from-log", "x.h5", "--collectives", "mpi"], "--collectives measures"),
    (["calibrate", "--from-log", "x.h5", "--probe-nets", "none"], "--probe-nets measures"),
    (["calibrate", "--from-log", "x.h5", "--precision", "bf16"], "--precision measures"),
    (["calibrate", "--check-log", "x.h5"], "--check-log belongs to --from-log"),
    (["--timeline", "1:2"], "needs --log"),
    (["plan", "--net", "mlp", "--procs", "4", "--batch", "8", "--compute", "flops", "--retime"],
     "--retime times the kernels again, but compute comes from FLOPs"),
    (["--retime", "--compute", "flops"], "--retime times the kernels again"),
    (["compare-plans", "--net", "smallcnn", "--batch", "8", "--retime"], "--retime is unused"),
]


@pytest.mark.parametrize(("args", "message"), SILENT_FLAGS,
                         ids=[" ".join(a) for a, _ in SILENT_FLAGS])
def test_every_flag_a_run_would_ignore_is_refused_before_anything_is_done(
        args, message, tmp_path, monkeypatch, capsys):
    """Each flag that the run would ignore, or a value it could only fail with, is refused in
    one line naming why, before any planning or timing: no plan file, no cache, no log."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HPCTRAIN_CACHE_DIR", str(tmp_path / "cache"))
    argv = args if args[0] in cli.COMMANDS else ["--net", "smallcnn", "--steps", "1", *args]
    assert cli.main(list(argv)) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == []
