"""A result that cannot be written (rank 0 writes it) stops every rank with exit status 3 and
one line naming the file and the reason; no rank is left waiting."""

import errno
import os

from hpctrain import cli
from hpctrain.comm.grid import GridSet
from hpctrain.errors import OutputError
from hpctrain.record import runlog
from hpctrain.run import checkpoint
from tests.mpi.helpers import all_agree, raises_everywhere
from tests.mpi.test_checkpoint import NET, Run, mixed_plans

RUN = ["--net", "smallcnn", "--batch", "8", "--steps", "3", "--compute", "flops", "--machine",
       "default"]


def disk_full(*_args, **_kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def run_cli(comm, capsys, argv):
    """cli.main(argv) on every rank: (every rank's exit status, rank 0's standard error)."""
    code = cli.main(argv)
    err = capsys.readouterr().err
    return comm.allgather(code), err


def test_a_checkpoint_write_that_fails_exits_3_on_every_rank(comm, shared_dir, monkeypatch,
                                                             capsys):
    monkeypatch.setenv("HPCTRAIN_CACHE_DIR", str(shared_dir / "cache"))
    if comm.Get_rank() == 0:
        monkeypatch.setattr(checkpoint, "_write_tensor", disk_full)
    codes, err = run_cli(comm, capsys, [*RUN, "--checkpoint-dir", str(shared_dir / "ck")])
    assert all_agree(comm, codes == [3] * comm.Get_size()), codes
    if comm.Get_rank() == 0:
        lines = err.strip().splitlines()
        assert len(lines) == 1, err
        assert "step-00000003.h5" in lines[0] and "No space left on device" in lines[0], err
        # no temporary left, nor the directory made for it
        assert not (shared_dir / "ck").exists()


def test_a_log_write_that_fails_exits_3_on_every_rank(comm, shared_dir, monkeypatch, capsys):
    monkeypatch.setenv("HPCTRAIN_CACHE_DIR", str(shared_dir / "cache"))
    if comm.Get_rank() == 0:
        monkeypatch.setattr(runlog.RunLog, "_append", disk_full)
    log = shared_dir / "run.h5"
    codes, err = run_cli(comm, capsys, [*RUN, "--log", str(log)])
    assert all_agree(comm, codes == [3] * comm.Get_size()), codes
    if comm.Get_rank() == 0:
        lines = err.strip().splitlines()
        assert len(lines) == 1, err
        assert f"cannot write {log}: No space left on device" in lines[0], err
        assert "step 2" not in capsys.readouterr().out  # stopped at the first failed step


def test_a_checkpoint_where_the_directory_is_a_file_fails_everywhere(comm, shared_dir):
    blocker = shared_dir / "not-a-directory"
    if comm.Get_rank() == 0:
        blocker.write_text("a user's file\n")
    comm.Barrier()
    with GridSet(comm) as grids:
        run = Run(NET, mixed_plans(comm.Get_size())[0], grids)
        run.train(range(1))
        path = blocker / "step-00000001.h5"
        raises_everywhere(comm, lambda: run.save(path, 1), path, error=OutputError)
        assert blocker.read_text() == "a user's file\n"


def test_a_file_hpctrain_did_not_write_is_never_replaced_by_a_checkpoint(comm, shared_dir):
    path = shared_dir / "step-00000001.h5"
    if comm.Get_rank() == 0:
        path.write_text("a user's file\n")
    comm.Barrier()
    with GridSet(comm) as grids:
        run = Run(NET, mixed_plans(comm.Get_size())[0], grids)
        raises_everywhere(comm, lambda: run.save(path, 1), "hpctrain did not write",
                          error=OutputError)
        assert path.read_text() == "a user's file\n"
        assert sorted(p.name for p in shared_dir.iterdir()) == [path.name]
