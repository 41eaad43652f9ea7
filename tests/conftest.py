"""Fixtures shared by the serial and the MPI tests."""

import os
import sys
import tempfile

import h5py
import numpy as np
import pytest

CONFIG_DIR = pytest.StashKey[tuple[tempfile.TemporaryDirectory, str | None]]()
REFERENCE = pytest.StashKey[dict[str, int]]()
REQUIRE_REFERENCE = "HPCTRAIN_REQUIRE_REFERENCE"
"""Set to 1 (``make test`` and CI do), a reference test that skips fails the run: the tests
held against PyTorch and onnxruntime must run, not pass by skipping."""


def pytest_configure(config):
    """XDG_CONFIG_HOME is a fresh directory for the whole run, from before collection and in
    every subprocess: no test reads the user's calibrated profiles or writes among them."""
    config.stash[REFERENCE] = {"passed": 0, "failed": 0, "skipped": 0}
    fresh = tempfile.TemporaryDirectory(prefix="hpctrain-config-")
    config.stash[CONFIG_DIR] = (fresh, os.environ.get("XDG_CONFIG_HOME"))
    os.environ["XDG_CONFIG_HOME"] = fresh.name


@pytest.fixture(autouse=True)
def quiet_kernel_timing(monkeypatch):
    """Kernel timings count as taken on a quiet machine: the load of the machine the tests run
    on (other tests beside them) is not what they check, and a timing taken busy is timed
    again, so a test of the cache's reuse would depend on it. The tests of that check
    (tests/test_compute_cache.py) set the share they need."""
    from hpctrain.cost import compute

    monkeypatch.setattr(compute, "cpu_share", lambda seconds=0.0: 1.0)


@pytest.fixture(autouse=True)
def searches_in_this_process(monkeypatch):
    """Every search runs in the test's own process, with or without pytest-xdist's threads
    (which already rule the fork out), so that a test reading what its compute model was asked
    sees it all. The tests of the search beside (tests/test_beside.py) let it fork."""
    from hpctrain.plan import spaces

    monkeypatch.setattr(spaces, "may_fork", lambda: False)


def pytest_unconfigure(config):
    if CONFIG_DIR not in config.stash:
        return
    fresh, before = config.stash[CONFIG_DIR]
    if before is None:
        os.environ.pop("XDG_CONFIG_HOME", None)
    else:
        os.environ["XDG_CONFIG_HOME"] = before
    fresh.cleanup()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A reference test skipped for want of a reference package fails under
    :data:`REQUIRE_REFERENCE` (a skip for another reason, a comparison made on 2 ranks alone,
    stays a skip)."""
    report = (yield).get_result()
    if ("reference" in item.keywords and report.skipped
            and os.environ.get(REQUIRE_REFERENCE) == "1"
            and _missing_reference(str(report.longrepr))):
        report.outcome = "failed"
        report.longrepr = (f"{report.nodeid}: {MISSING} under {REQUIRE_REFERENCE}=1 "
                           f"({report.longrepr}); install the reference extra: pip install -e "
                           f"'.[reference]'")


def pytest_runtest_logreport(report):
    """Count the reference tests by outcome, where the run reports (with pytest-xdist, its
    controller): a test counts once, by its call, or by its set-up where that did not pass."""
    counts = _CONFIG.get("counts")
    if counts is None or "reference" not in report.keywords:
        return
    if report.when == "call" or (report.when == "setup" and not report.passed):
        counts[report.outcome] += 1


REFERENCE_PACKAGES = ("torch", "torchvision", "onnxruntime", "onnx", "safetensors")
MISSING = "reference tests skipped"


def _missing_reference(reason: str) -> bool:
    """Whether a skip's ``reason`` is a reference package that did not import
    (``pytest.importorskip``'s "could not import 'torch'")."""
    return any(f"could not import '{name}'" in reason for name in REFERENCE_PACKAGES)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """A module of reference tests that skips whole (``pytest.importorskip("torch")`` at its
    top) fails under :data:`REQUIRE_REFERENCE`."""
    report = (yield).get_result()
    if (report.skipped and _missing_reference(str(report.longrepr))
            and os.environ.get(REQUIRE_REFERENCE) == "1"):
        report.outcome = "failed"
        report.longrepr = (f"{collector.nodeid}: {MISSING} under {REQUIRE_REFERENCE}=1 "
                           f"({report.longrepr}); install the reference extra: pip install -e "
                           f"'.[reference]'")


def pytest_collectreport(report):
    """A module of reference tests skipped whole, or failed for it, counts once."""
    counts = _CONFIG.get("counts")
    reason = str(report.longrepr) if not report.passed else ""
    if counts is not None and (_missing_reference(reason) or MISSING in reason):
        counts[report.outcome] += 1


_CONFIG: dict = {}


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session):
    _CONFIG["counts"] = session.config.stash[REFERENCE]


def pytest_terminal_summary(terminalreporter, config):
    counts = config.stash.get(REFERENCE, None)
    if counts is not None and sum(counts.values()):
        terminalreporter.write_line(
            f"reference tests (PyTorch, torchvision, onnxruntime): {counts['passed']} ran and "
            f"passed, {counts['failed']} failed, {counts['skipped']} skipped")


@pytest.fixture
def reads(monkeypatch):
    """Every read through h5py's Dataset.__getitem__: (dataset name, shape of what it read)."""
    log = []
    original = h5py.Dataset.__getitem__

    def recording(self, selection, *args, **kwargs):
        result = original(self, selection, *args, **kwargs)
        log.append((self.name, np.shape(result)))
        return result

    monkeypatch.setattr(h5py.Dataset, "__getitem__", recording)
    return log


@pytest.fixture
def standin_cupy(monkeypatch):
    """The strict CuPy stand-in of :mod:`tests.gpu_standin` as ``cupy``, for this test only,
    its counters zeroed and MPI taken as not CUDA-aware (set ``cuda_aware_mpi`` and
    HPCTRAIN_CUDA_AWARE_MPI together to change that)."""
    from tests import gpu_standin

    monkeypatch.setitem(sys.modules, "cupy", gpu_standin)
    monkeypatch.delenv("HPCTRAIN_CUDA_AWARE_MPI", raising=False)
    gpu_standin.counters.reset()
    gpu_standin.counters.cuda_aware_mpi = False
    gpu_standin.counters.devices, gpu_standin.counters.current_device = 1, 0
    gpu_standin.get_default_memory_pool().free_all_blocks()  # as a fresh process's pool
    yield gpu_standin
    gpu_standin.counters.reset()


@pytest.fixture
def standin_nccl(standin_cupy, monkeypatch):
    """The CuPy stand-in with the NCCL stand-in of :mod:`tests.nccl_standin` as its
    ``cuda.nccl``, for this test only: ``--collectives auto`` then picks NCCL on the GPU path
    (under :func:`standin_cupy` alone CuPy has no NCCL, and auto picks MPI)."""
    from tests import nccl_standin

    nccl_standin.install(monkeypatch, standin_cupy)
    return standin_cupy


@pytest.fixture
def real_cupy():
    """CuPy on a real GPU, for the tests of kernels the stand-in cannot run (fused CuPy
    kernels); skipped where CuPy or a GPU is missing."""
    cupy = pytest.importorskip("cupy")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("no GPU")
    except cupy.cuda.runtime.CUDARuntimeError:
        pytest.skip("no GPU")
    return cupy
