"""hpctrain as a cluster user gets it: a wheel built from the sources, installed into a fresh
virtual environment and run from another directory, where the checkout is out of reach.

Offline: the wheel is built without build isolation (this environment's setuptools), and the
fresh environment gets numpy, mpi4py and h5py from this one through a ``.pth`` path line, which
adds this environment's site-packages but does not run its editable-install hook, so the
``hpctrain`` imported there is the wheel's.
"""

import importlib.metadata
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.test_training_app import mpiexec

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "hpctrain" / "inputs"
TIMEOUT = 120


def setuptools_builds_wheels() -> bool:
    """setuptools >= 70.1 builds wheels itself (bdist_wheel built in, no ``wheel`` package)."""
    try:
        version = importlib.metadata.version("setuptools")
    except importlib.metadata.PackageNotFoundError:
        return False
    major, minor = (int("".join(c for c in part if c.isdigit()) or 0)
                    for part in (version.split(".") + ["0"])[:2])
    return (major, minor) >= (70, 1)


pytestmark = pytest.mark.skipif(not setuptools_builds_wheels(),
                                reason="building the wheel offline needs setuptools>=70.1 here "
                                       "(pip install -e '.[test]')")


def run(*command, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in command], capture_output=True, text=True,
                          timeout=TIMEOUT, **kwargs)


class Installed:
    """A wheel of the sources installed into a fresh venv, and how to run it elsewhere."""

    def __init__(self, where: Path) -> None:
        source, dist, venv = where / "source", where / "dist", where / "venv"
        self.cwd, self.config = where / "elsewhere", where / "config"
        self.cwd.mkdir()
        # a copy, so building leaves no build/ or egg-info in the checkout
        shutil.copytree(ROOT / "hpctrain", source / "hpctrain",
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        for name in ("pyproject.toml", "README.md"):
            shutil.copy2(ROOT / name, source / name)
        built = run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "--no-index", "--wheel-dir", dist, source)
        assert built.returncode == 0, built.stdout + built.stderr
        [self.wheel] = dist.glob("hpctrain-*.whl")
        made = run(sys.executable, "-m", "venv", "--without-pip", venv)
        assert made.returncode == 0, made.stderr
        self.python = venv / "bin" / "python"
        installed = run(sys.executable, "-m", "pip", "--python", self.python, "install",
                        "--no-deps", "--no-index", self.wheel)
        assert installed.returncode == 0, installed.stdout + installed.stderr
        # only now the dependencies: pip above saw no other hpctrain
        purelib = run(self.python, "-c", "import sysconfig; print(sysconfig.get_paths()"
                                         "['purelib'])").stdout.strip()
        ours = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
        (Path(purelib) / "hpctrain-test-dependencies.pth").write_text("\n".join(ours) + "\n")
        self.env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        self.env.update(OMP_NUM_THREADS="1", XDG_CONFIG_HOME=str(self.config),
                        HPCTRAIN_CACHE_DIR=str(where / "cache"))
        # an MPICH installed from PyPI lives in this environment's lib/, where mpi4py looks
        # for it under sys.prefix: the fresh environment's prefix has none
        libdir = Path(sys.prefix) / "lib"
        if any(libdir.glob("libmpi.so*")):
            self.env["MPI4PY_LIBMPI"] = str(libdir)

    def run(self, *args, launcher: tuple = ()) -> subprocess.CompletedProcess:
        return run(*launcher, self.python, *args, cwd=self.cwd, env=self.env)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Installed:
    return Installed(tmp_path_factory.mktemp("package"))


def test_the_wheel_ships_every_net_profile_and_plan(installed):
    with zipfile.ZipFile(installed.wheel) as wheel:
        names = set(wheel.namelist())
    shipped = sorted(p.relative_to(ROOT).as_posix() for p in SHIPPED.rglob("*")
                     if p.suffix in (".net", ".toml", ".plan"))
    assert len(shipped) >= 7 and "hpctrain/inputs/nets/alexnet.net" in shipped
    assert set(shipped) <= names, sorted(set(shipped) - names)


def test_the_installed_package_is_the_one_imported(installed):
    result = installed.run("-c", "import hpctrain, sys; print(hpctrain.__file__)")
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()).is_relative_to(installed.python.parent.parent)


def test_plan_finds_a_shipped_net_and_machine_by_name(installed):
    result = installed.run("-m", "hpctrain", "plan", "--net", "alexnet", "--procs", "64",
                           "--batch", "256", "--machine", "cori-knl")
    assert result.returncode == 0, result.stderr
    assert "conv1" in result.stdout and "predicted iteration" in result.stdout
    assert list(installed.cwd.iterdir()) == []


def test_shipped_plan_and_locations_outside_a_checkout(installed):
    script = (
        "from hpctrain.model.net import load_net\n"
        "from hpctrain.plan.plans import plan_from_spec\n"
        "from hpctrain.cost.machine import available_machines, local_profile\n"
        "from hpctrain.record.runlog import git_commit\n"
        "from hpctrain.commands.simulate import plot_script\n"
        "plan = plan_from_spec('smallcnn-p4-mixed', load_net('smallcnn'), 4)\n"
        "print(plan[0].describe(), '|', git_commit(), '|', plot_script(), '|',\n"
        "      local_profile(), '|', ' '.join(available_machines()))\n")
    result = installed.run("-c", script)
    assert result.returncode == 0, result.stderr
    plan, commit, plots, local, machines = (s.strip() for s in result.stdout.split("|"))
    assert (plan, commit, plots) == ("domain 2x2", "unknown", "None")
    assert local == str(installed.config / "hpctrain" / "machines" / "local.toml")
    assert {"cori-knl", "default"} <= set(machines.split())


def test_verify_on_two_ranks(installed):
    launcher = mpiexec()
    if launcher is None:
        pytest.skip("no mpiexec beside this Python or on PATH: the MPI run of the installed "
                    "package is not checked")
    result = installed.run("-m", "hpctrain", "verify", "--net", "smallcnn", "--grid", "2x1",
                           launcher=(launcher, "-n", "2"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PASS" in result.stdout
