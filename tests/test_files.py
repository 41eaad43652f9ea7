"""The output rules of hpctrain.io.files, and their use by every kind of output: what may be
replaced or renamed aside, what is refused by name, exclusive creation, the umask, and the
temporaries a crash leaves."""

import os
import stat
from pathlib import Path
from types import SimpleNamespace

import h5py
import pytest

from hpctrain import cli
from hpctrain.errors import OutputError, UserError
from hpctrain.io.files import (
    check_directory,
    check_output,
    new_file_mode,
    publish_exclusive,
    remove_abandoned,
    remove_orphans,
    replace_atomically,
    rotate_aside,
    temporary_beside,
    what_is,
)
from tests.test_schedule_and_runlog import log_steps, planned_smallcnn


def marked(path: Path) -> bool:
    """The test's own kind of file: its text starts with 'ours'."""
    return path.read_text().startswith("ours")


@pytest.fixture
def paths(tmp_path):
    """One path of each kind, by name."""
    (tmp_path / "ours.txt").write_text("ours\n")
    (tmp_path / "user.txt").write_text("a user's file\n")
    (tmp_path / "dir").mkdir()
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "to-file").symlink_to(tmp_path / "ours.txt")
    (tmp_path / "to-dir").symlink_to(tmp_path / "dir")
    (tmp_path / "dangling").symlink_to(tmp_path / "absent")
    return tmp_path


@pytest.mark.parametrize("name, found", [
    ("user.txt", "exists and is not the test's kind"), ("dir", "is a directory"),
    ("fifo", "is a FIFO"), ("to-file", "is a symbolic link"), ("to-dir", "is a symbolic link"),
    ("dangling", "is a symbolic link")])
def test_anything_but_a_file_of_ours_is_refused_by_name(paths, name, found):
    before = os.lstat(paths / name)
    with pytest.raises(UserError, match=f"--out {paths / name} {found}") as err:
        check_output(paths / name, "--out", marked, "the test's kind")
    assert "\n" not in str(err.value)
    assert os.lstat(paths / name) == before


def test_a_free_path_and_a_file_of_ours_are_accepted(paths):
    check_output(paths / "new.txt", "--out", marked, "the test's kind")
    check_output(paths / "ours.txt", "--out", marked, "the test's kind")


@pytest.mark.skipif(not Path("/dev/null").exists(), reason="no /dev/null")
def test_a_device_is_refused_and_left_alone():
    before = os.lstat("/dev/null")
    with pytest.raises(UserError, match="--log /dev/null is a device"):
        check_output(Path("/dev/null"), "--log", marked, "the test's kind")
    assert what_is(Path("/dev/null")) == "a device" and os.lstat("/dev/null") == before


def test_an_input_of_the_run_is_refused_even_when_it_is_ours(paths):
    (paths / "link-to-ours").symlink_to(paths / "ours.txt")
    for inputs in ([("--data", paths / "ours.txt")], [("--data", paths / "link-to-ours")]):
        with pytest.raises(UserError, match="is the --data input of this run"):
            check_output(paths / "ours.txt", "--log", marked, "the test's kind", inputs)


def test_an_output_directory_must_be_one(paths):
    check_directory(paths / "dir", "--checkpoint-dir")
    check_directory(paths / "new" / "deeper", "--checkpoint-dir")
    assert not (paths / "new").exists()  # made by the first write, not by the check
    with pytest.raises(UserError, match=f"cannot create directory {paths / 'user.txt' / 'sub'}: "
                                        f"{paths / 'user.txt'} is a regular file; choose"):
        check_directory(paths / "user.txt" / "sub", "--checkpoint-dir")
    for name, found in (("user.txt", "a regular file"), ("fifo", "a FIFO"),
                        ("to-dir", "a symbolic link")):
        with pytest.raises(UserError, match=f"cannot create directory {paths / name}: it is "
                                            f"{found}; choose"):
            check_directory(paths / name, "--checkpoint-dir")


def test_replacing_refuses_what_is_not_ours_and_leaves_it(paths):
    for name in ("user.txt", "fifo", "to-file", "dir"):
        before = os.lstat(paths / name)
        with pytest.raises(OutputError, match=f"{paths / name} is .* hpctrain did not write"):
            replace_atomically(paths / name, lambda tmp: tmp.write_text("ours, new\n"), marked)
        assert os.lstat(paths / name) == before
    replace_atomically(paths / "ours.txt", lambda tmp: tmp.write_text("ours, new\n"), marked)
    assert (paths / "ours.txt").read_text() == "ours, new\n"
    assert not list(paths.glob(".*.tmp"))


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o077])
def test_new_files_follow_the_umask(tmp_path, umask):
    from hpctrain.model.net import load_net
    from hpctrain.plan.plans import plan_from_spec, write_plan
    from hpctrain.record.runlog import RunLog

    previous = os.umask(umask)
    new_file_mode.cache_clear()
    try:
        replace_atomically(tmp_path / "a.txt", lambda tmp: tmp.write_text("x"))
        mlp = load_net("mlp")
        write_plan(tmp_path / "p.plan", mlp, plan_from_spec("1x1", mlp, 1))
        planned = planned_smallcnn()
        RunLog(tmp_path / "run.h5", {}, planned, ["loss"]).finish("done")
    finally:
        os.umask(previous)
        new_file_mode.cache_clear()
    for name in ("a.txt", "p.plan", "run.h5"):
        assert stat.S_IMODE(os.stat(tmp_path / name).st_mode) == 0o666 & ~umask, name


def test_of_two_creators_exactly_one_wins(tmp_path):
    path = tmp_path / "out.txt"
    first, second = temporary_beside(path), temporary_beside(path)
    first.write_text("first\n")
    second.write_text("second\n")
    publish_exclusive(first, path)
    with pytest.raises(FileExistsError):
        publish_exclusive(second, path)
    assert path.read_text() == "first\n" and second.exists() and not first.exists()


def test_rotation_never_replaces_a_file(tmp_path):
    path = tmp_path / "run.h5"
    path.write_text("newest\n")
    (tmp_path / "run.1.h5").write_text("older\n")
    assert rotate_aside(path) == tmp_path / "run.2.h5"
    assert not path.exists() and (tmp_path / "run.1.h5").read_text() == "older\n"
    assert (tmp_path / "run.2.h5").read_text() == "newest\n"


def test_only_our_own_temporaries_are_removed(tmp_path):
    ours = [".step-00000001.h5.k2j4_x9a.tmp", ".step-00000120.h5.abc.tmp"]
    kept = [".step-00000001.h5.tmp", ".other.h5.abc.tmp", "step-00000001.h5", ".notes.tmp"]
    for name in ours + kept:
        (tmp_path / name).write_text("")
    (tmp_path / ".step-00000002.h5.dir.tmp").mkdir()
    target = tmp_path / "precious"
    target.write_text("a user's file\n")
    (tmp_path / ".step-00000003.h5.link.tmp").symlink_to(target)
    removed = remove_orphans(tmp_path, r"step-\d+\.h5")
    assert sorted(p.name for p in removed) == sorted(ours)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [*kept, ".step-00000002.h5.dir.tmp", ".step-00000003.h5.link.tmp", "precious"])
    assert target.read_text() == "a user's file\n"


def test_only_abandoned_temporaries_of_ours_are_removed_beside_an_output(tmp_path):
    """Beside an output in the user's directory: only files named as ours for that output,
    empty or HDF5, regular, and held by no live writer."""
    import fcntl

    hdf5 = b"\x89HDF\r\n\x1a\n" + bytes(100)
    abandoned = {".d.h5.abcd_123.tmp": b"", ".d.h5.k2j4x9aa.tmp": hdf5}
    kept = {".d.h5.notesxyz.tmp": b"a user's notes\n", ".d.h5.short.tmp": b"",
            ".d.h5.ABCDEFGH.tmp": b"", ".other.h5.abcdefgh.tmp": b"", "d.h5.abcdefgh.tmp": b"",
            ".d.h5.livelive.tmp": hdf5}
    for name, data in {**abandoned, **kept}.items():
        (tmp_path / name).write_bytes(data)
    (tmp_path / ".d.h5.dirdirdi.tmp").mkdir()
    os.mkfifo(tmp_path / ".d.h5.fifofifo.tmp")
    target = tmp_path / "precious"
    target.write_text("a user's file\n")
    (tmp_path / ".d.h5.linklink.tmp").symlink_to(target)
    live = os.open(tmp_path / ".d.h5.livelive.tmp", os.O_RDWR)
    try:
        fcntl.flock(live, fcntl.LOCK_EX)  # as a run writing it now holds it
        removed = remove_abandoned(tmp_path / "d.h5", b"\x89HDF\r\n\x1a\n")
    finally:
        os.close(live)
    assert sorted(p.name for p in removed) == sorted(abandoned)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [*kept, ".d.h5.dirdirdi.tmp", ".d.h5.fifofifo.tmp", ".d.h5.linklink.tmp", "precious"])
    assert target.read_text() == "a user's file\n"


def test_a_locked_write_holds_its_temporary_until_it_is_renamed(tmp_path):
    seen = []

    def write(tmp: Path) -> None:
        tmp.write_bytes(b"\x89HDF\r\n\x1a\n")
        seen.append(remove_abandoned(tmp_path / "d.h5", b"\x89HDF"))  # another run, now

    replace_atomically(tmp_path / "d.h5", write, lock=True)
    assert seen == [[]] and (tmp_path / "d.h5").read_bytes().startswith(b"\x89HDF")
    assert [p.name for p in tmp_path.iterdir()] == ["d.h5"]


# -- run logs ----------------------------------------------------------------------------------

def test_a_running_log_is_never_shared_and_a_killed_one_is_kept_aside(tmp_path):
    from hpctrain.record.runlog import RunLog, check_log_path

    planned = planned_smallcnn()
    rows = [c.layer for c in planned.layers] + ["loss"]
    path = tmp_path / "run.h5"
    running = RunLog(path, {}, planned, rows)
    log_steps(running, range(1, 3))
    with pytest.raises(UserError, match=f"--log {path} is the log of a run still going"):
        check_log_path(path)
    with pytest.raises(UserError, match="still going"):
        RunLog(path, {}, planned, rows)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.h5"]
    log_steps(running, range(3, 4))  # the first run goes on, unmoved
    running.close()  # killed: its status still says running, but no one holds it
    with h5py.File(path) as h5:
        assert h5.attrs["status"] == "running" and len(h5["steps/loss"]) == 3
    second = RunLog(path, {}, planned, rows)
    assert second.rotated == tmp_path / "run.1.h5"
    second.finish("done")
    with h5py.File(tmp_path / "run.1.h5") as h5:
        assert len(h5["steps/loss"]) == 3


def test_a_log_being_created_by_another_run_is_refused(tmp_path):
    from hpctrain.io.files import exclusive_lock
    from hpctrain.record.runlog import RunLog

    planned = planned_smallcnn()
    path = tmp_path / "run.h5"
    with exclusive_lock(path, "--log"), pytest.raises(UserError, match="another run"):
        RunLog(path, {}, planned, ["loss"])
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_only_hpctrain_logs_are_renamed_aside(tmp_path):
    from hpctrain.record.runlog import RunLog, is_run_log

    planned = planned_smallcnn()
    with h5py.File(tmp_path / "data.h5", "w") as h5:
        h5.attrs["status"] = "mine"
    assert not is_run_log(tmp_path / "data.h5") and not is_run_log(tmp_path / "absent.h5")
    with pytest.raises(UserError, match="exists and is not an hpctrain run log"):
        RunLog(tmp_path / "data.h5", {}, planned, ["loss"])
    RunLog(tmp_path / "run.h5", {}, planned, ["loss"]).finish("done")
    assert is_run_log(tmp_path / "run.h5")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.h5", "run.h5"]


# -- every kind of output ----------------------------------------------------------------------

def test_plan_out_refuses_a_fifo_and_a_user_file(tmp_path):
    from hpctrain.commands import plan as plan_command

    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "user.plan").write_text("conv1 batch 1x2\n")
    for name, found in (("fifo", "is a FIFO"), ("user.plan", "is not an hpctrain plan file")):
        with pytest.raises(UserError, match=found):
            plan_command.run(["--net", "smallcnn", "--procs", "2", "--batch", "8",
                              "--compute", "flops", "--out", str(tmp_path / name)])
    assert stat.S_ISFIFO(os.lstat(tmp_path / "fifo").st_mode)
    assert (tmp_path / "user.plan").read_text() == "conv1 batch 1x2\n"


def test_calibrate_out_refuses_a_file_it_did_not_write(tmp_path):
    from hpctrain.commands import calibrate as calibrate_command
    from hpctrain.commands.calibrate import CalibrateError
    from hpctrain.cost.machine import Machine, is_saved_profile, save_machine
    from tests.test_calibrate import OneRank

    user = tmp_path / "mine.toml"
    user.write_text('name = "mine"\nalpha = 1e-6\nbeta = 1e-9\nflops = 1e9\n')
    with pytest.raises(CalibrateError, match="is not a profile hpctrain wrote"):
        calibrate_command.run(["--out", str(user)], OneRank())
    with pytest.raises(OutputError, match="hpctrain did not write"):
        save_machine(Machine("x", 1e-6, 1e-9, 1e9), user)
    save_machine(Machine("x", 1e-6, 1e-9, 1e9), tmp_path / "ours.toml")
    assert is_saved_profile(tmp_path / "ours.toml") and not is_saved_profile(user)
    save_machine(Machine("y", 1e-6, 1e-9, 1e9), tmp_path / "ours.toml")  # ours: replaced


def test_convert_out_refuses_its_input_and_a_file_it_did_not_write(tmp_path):
    import numpy as np

    from hpctrain.commands import convert as convert_command

    np.save(tmp_path / "x.npy", np.zeros((4, 3, 3), np.float32))
    np.save(tmp_path / "y.npy", np.arange(4))
    (tmp_path / "user.h5").write_text("a user's file\n")
    argv = ["--images", str(tmp_path / "x.npy"), "--labels", str(tmp_path / "y.npy"), "--out"]
    with pytest.raises(UserError, match="is the --labels input of this run"):
        convert_command.run([*argv, str(tmp_path / "y.npy")])
    with pytest.raises(UserError, match="exists and is not an hpctrain dataset"):
        convert_command.run([*argv, str(tmp_path / "user.h5")])
    assert convert_command.run([*argv, str(tmp_path / "d.h5")]) == 0
    assert convert_command.run([*argv, str(tmp_path / "d.h5")]) == 0  # ours: replaced
    assert (tmp_path / "user.h5").read_text() == "a user's file\n"


# -- exit status -------------------------------------------------------------------------------

@pytest.mark.parametrize("error, code", [(UserError("bad --x 1; use 2"), 2),
                                         (OutputError("cannot write run.h5: Disk full"), 3)])
def test_a_result_not_written_exits_3_and_bad_input_2(monkeypatch, capsys, error, code):
    def runner(argv):
        raise error

    monkeypatch.setitem(cli.COMMANDS, "plan", False)
    monkeypatch.setattr(cli, "command_module", lambda command: SimpleNamespace(run=runner))
    assert cli.main(["plan"]) == code
    assert capsys.readouterr().err == f"hpctrain: error: {error}\n"
