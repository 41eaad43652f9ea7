"""MPI tests: run under ``mpiexec -n N python -m mpi4py -m pytest tests/mpi`` for N = 1..4.

Every rank runs the same tests in the same order. Rank 0 reports; the others write to stderr
only. A test that fails on any rank aborts the whole job at once (MPI_Abort), so a rank that
failed can never leave the others waiting in a collective.
"""

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
from mpi4py import MPI

from hpctrain.layout.partition import factorisations

COMM = MPI.COMM_WORLD


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    if COMM.Get_rank() != 0:
        reporter = config.pluginmanager.getplugin("terminalreporter")
        if reporter is not None:
            config.pluginmanager.unregister(reporter)


def pytest_generate_tests(metafunc):
    if "grid_shape" in metafunc.fixturenames:
        shapes = factorisations(COMM.Get_size())
        metafunc.parametrize("grid_shape", shapes, ids=[f"{r}x{c}" for r, c in shapes])


def pytest_runtest_logreport(report):
    if report.failed:
        sys.stderr.write(f"\n[rank {COMM.Get_rank()}] {report.nodeid} FAILED\n"
                         f"{report.longreprtext}\n")
        sys.stderr.flush()
        COMM.Abort(1)


@pytest.fixture
def comm():
    return COMM


@pytest.fixture
def grids():
    from hpctrain.comm.grid import GridSet

    with GridSet(COMM) as grid_set:
        yield grid_set


@pytest.fixture
def backend():
    from hpctrain.device.backend import make_backend

    return make_backend(os.environ.get("HPCTRAIN_DEVICE", "cpu"), "float64", COMM)


@pytest.fixture
def shared_dir(comm):
    """One temporary directory all ranks see (each rank's tmp_path differs): rank 0 makes it,
    every rank gets its path, rank 0 removes it after the test."""
    path = Path(comm.bcast(tempfile.mkdtemp(prefix="hpctrain-") if comm.Get_rank() == 0
                           else None, root=0))
    yield path
    comm.Barrier()
    if comm.Get_rank() == 0:
        shutil.rmtree(path, ignore_errors=True)
