"""``predict`` on 1 to 4 ranks: under every grid (and a domain split) the outputs of every sample
of a dataset split are one process's, in the data's order, the last batch shorter; a file rank 0
cannot write stops every rank with status 3, before the first forward or after the last,
never leaving a rank waiting or a half-written file.
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from hpctrain.commands import predict as predict_command
from hpctrain.errors import OutputError
from tests.mpi.helpers import all_agree

DIGITS = Path(__file__).resolve().parents[2] / "inputs" / "digits.h5"
pytestmark = pytest.mark.skipif(not DIGITS.exists(), reason="make inputs/digits.h5 first")


def predict(comm, out: Path, *more: str) -> int:
    """``predict`` of the small CNN with batch norm (seeded weights) on the digits' held-out
    split, batch 7 (359 samples: the last batch holds 2)."""
    return predict_command.run(["--net", "resdigits", "--data", str(DIGITS), "--out", str(out),
                                "--batch", "7", "--print-every", "0", *more], comm)


def outputs(path: Path) -> np.ndarray:
    with h5py.File(path) as h5:
        assert h5.attrs["format"] == "hpctrain-predictions"
        return h5["outputs"][...]


@pytest.fixture
def one_process(comm, shared_dir) -> np.ndarray:
    """The outputs on one process (rank 0 alone)."""
    out = shared_dir / "serial.h5"
    if comm.Get_rank() == 0:
        from mpi4py import MPI

        assert predict(MPI.COMM_SELF, out) == 0
    comm.Barrier()
    return outputs(out)


def test_every_grid_predicts_what_one_process_does(comm, shared_dir, grid_shape, one_process):
    p = comm.Get_size()
    specs = [f"{grid_shape[0]}x{grid_shape[1]}"]
    if p > 1:
        specs.append(f"conv=domain:{p}x1,fc={p}x1")
    for spec in specs:
        out = shared_dir / f"{spec.replace(':', '_').replace(',', '_')}.h5"
        assert all_agree(comm, predict(comm, out, "--grid", spec) == 0)
        got = outputs(out)
        assert got.shape == one_process.shape == (359, 10)
        assert np.abs(got - one_process).max() <= 1e-5 * np.abs(one_process).max(), spec


@pytest.mark.parametrize("when", ["open", "write"])
def test_a_file_rank_0_cannot_write_stops_every_rank(comm, shared_dir, monkeypatch, when):
    """Rank 0's file fails as it is created, or while the outputs go in (a disk that fills):
    every rank raises the same error, none waits in a collective, and nothing is left."""
    if comm.Get_rank() == 0:
        real = h5py.File

        def failing(path, mode="r", *args, **kwargs):
            if mode == "w" and when == "open":
                raise OSError(28, "No space left on device")
            found = real(path, mode, *args, **kwargs)
            if mode == "w":
                found.create_dataset = _filling(found.create_dataset)
            return found

        monkeypatch.setattr(h5py, "File", failing)
    out = shared_dir / f"{when}.h5"
    with pytest.raises(OutputError, match="could not write the predictions"):
        predict(comm, out)
    comm.Barrier()
    assert not out.exists()
    assert not [p for p in shared_dir.iterdir() if p.name.startswith(f".{out.name}")]


def _filling(create):
    """``create_dataset`` whose dataset refuses its second write, as a full disk would."""
    def made(*args, **kwargs):
        dataset = create(*args, **kwargs)

        class Filling:
            writes = 0

            def __setitem__(self, key, value):
                Filling.writes += 1
                if Filling.writes > 1:
                    raise OSError(28, "No space left on device")
                dataset[key] = value

        return Filling()

    return made
