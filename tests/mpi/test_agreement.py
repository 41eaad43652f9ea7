"""Decisions every rank must share: a file error seen by some ranks only, a stop request."""

import os

import pytest

from hpctrain.comm.agree import agreed
from hpctrain.errors import UserError
from tests.mpi.helpers import all_agree


def test_an_error_on_one_rank_is_raised_on_every_rank(comm):
    last = comm.Get_size() - 1

    def open_file():
        if comm.Get_rank() == last:  # say, a file on a node-local disk of the others
            raise UserError(f"dataset 'd.h5' does not exist (rank {last})")
        return comm.Get_rank()

    with pytest.raises(UserError, match=f"rank {last}"):
        agreed(comm, open_file, everywhere=True)
    assert agreed(comm, lambda: comm.Get_rank() * 0 + 7, everywhere=True) == 7


def test_rank_0_reads_and_every_rank_gets_its_answer_or_its_error(comm):
    assert agreed(comm, lambda: {"rank": comm.Get_rank()}) == {"rank": 0}
    with pytest.raises(UserError, match="only rank 0 looked"):
        agreed(comm, lambda: (_ for _ in ()).throw(UserError("only rank 0 looked")))


def test_a_stop_requested_before_training_trains_nothing(comm):
    import signal

    from hpctrain.device.backend import make_backend
    from hpctrain.model.net import load_net
    from hpctrain.plan.plans import plan_from_spec
    from hpctrain.run.loop import TrainConfig, train
    from hpctrain.run.signals import StopRequests

    net = load_net("smallcnn")
    backend = make_backend(os.environ.get("HPCTRAIN_DEVICE", "cpu"), "float32")
    config = TrainConfig(8, 5, 0.01, 0.9, 0.0, 0, 1)
    with StopRequests() as stop:
        if comm.Get_rank() == 0:  # arrives on one rank only, while "planning"
            os.kill(os.getpid(), signal.SIGUSR1)
        result = train(net, plan_from_spec(f"1x{comm.Get_size()}", net, comm.Get_size()),
                       config, backend, comm, out=lambda *_: None, stop=stop)
    assert all_agree(comm, result.stopped_by == "SIGUSR1" and result.losses == [])
