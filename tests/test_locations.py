"""Where hpctrain finds its files: shipped data by name, the user's config directory, the
checkout (and what needs it)."""

from pathlib import Path

import pytest

from hpctrain.commands import simulate
from hpctrain.cost.machine import (
    MachineError,
    available_machines,
    load_machine,
    local_profile,
    user_machines_dir,
)
from hpctrain.errors import UserError
from hpctrain.io import locations
from hpctrain.record import runlog

ROOT = Path(__file__).resolve().parent.parent
PROFILE = 'name = "{name}"\nalpha = 3e-6\nbeta = 1e-10\nflops = 2e10\n'


@pytest.fixture
def config(tmp_path, monkeypatch) -> Path:
    """A fresh XDG_CONFIG_HOME; returns hpctrain's config directory in it."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / "hpctrain"


def test_config_dir_follows_xdg_and_defaults_to_dot_config(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert locations.config_dir() == tmp_path / "hpctrain"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for unset in ("", "relative/config"):  # relative values are ignored, as XDG asks
        monkeypatch.setenv("XDG_CONFIG_HOME", unset)
        assert locations.config_dir() == tmp_path / "home" / ".config" / "hpctrain"
    monkeypatch.delenv("XDG_CONFIG_HOME")
    assert locations.config_dir() == tmp_path / "home" / ".config" / "hpctrain"


def test_shipped_data_is_package_data():
    assert locations.shipped_names("nets", ".net")[:1] == ["alexnet"]
    assert {"cori-knl", "default"} <= set(locations.shipped_names("machines", ".toml"))
    assert "smallcnn-p4-mixed" in locations.shipped_names("plans", ".plan")
    assert (locations.shipped("nets") / "alexnet.net").read_text().startswith("#")
    with pytest.raises(ValueError, match="'datasets'"):
        locations.shipped("datasets")


def test_calibrated_profiles_are_found_by_name_and_listed(config):
    assert local_profile() == config / "machines" / "local.toml"
    assert user_machines_dir() == config / "machines"
    assert load_machine().name == "default"  # nothing calibrated yet
    with pytest.raises(MachineError, match=f"to write {local_profile()}"):
        load_machine("local")
    (config / "machines").mkdir(parents=True)
    local_profile().write_text(PROFILE.format(name="local"))
    (config / "machines" / "mybox.toml").write_text(PROFILE.format(name="mybox"))
    (config / "machines" / "cori-knl.toml").write_text(PROFILE.format(name="mine"))
    assert load_machine().source == str(local_profile())  # calibrated: the default
    assert load_machine("local").flops == 2e10
    assert load_machine("mybox").name == "mybox"
    assert load_machine("cori-knl").name == "mine"  # the user's profile wins over the shipped
    assert {"local", "mybox", "cori-knl", "default"} <= set(available_machines())


def test_names_do_not_reach_outside_the_profile_directories(config):
    (config / "machines").mkdir(parents=True)
    (config / "elsewhere.toml").write_text(PROFILE.format(name="elsewhere"))
    with pytest.raises(MachineError, match="unknown machine '../elsewhere'"):
        load_machine("../elsewhere")


def test_git_commit_is_unknown_outside_a_git_checkout(tmp_path, monkeypatch):
    monkeypatch.setattr(runlog, "checkout_root", lambda: None)
    assert runlog.git_commit() == "unknown"
    monkeypatch.setattr(runlog, "checkout_root", lambda: tmp_path)  # a tree without .git
    assert runlog.git_commit() == "unknown"


def test_simulate_plots_need_a_checkout(monkeypatch):
    if locations.checkout_root() == ROOT:
        assert simulate.plot_script() == ROOT / "analysis" / "plot_simulation.py"
    monkeypatch.setattr(simulate, "checkout_root", lambda: None)
    assert simulate.plot_script() is None
    with pytest.raises(UserError, match="analysis/plot_simulation.py of a source checkout") as err:
        simulate._plotting_script()
    assert "\n" not in str(err.value)
