"""What calibrate checks of its conditions: the CPU a rank gets, and fits that disagree with
their own points (hpctrain.cost.conditions)."""

import os
import subprocess
import sys

import pytest

from hpctrain.cost.conditions import QUIET_SHARE, cpu_share, troubles, warning_text
from hpctrain.cost.machine import format_machine, load_machine, parse_machine, warning_lines


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity")
def test_a_core_shared_with_a_busy_process_gives_about_half():
    """Pinned to one CPU with a process that spins there, the busy loop gets about half of
    it: below the share a quiet node gives."""
    cpu = min(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        os.sched_setaffinity(spinner.pid, {cpu})
        os.sched_setaffinity(0, {cpu})
        share = cpu_share(0.3)
    finally:
        os.sched_setaffinity(0, before)
        spinner.kill()
        spinner.wait()
    assert 0 < share < QUIET_SHARE


def test_the_troubles_name_what_went_wrong_and_a_quiet_run_has_none():
    found = troubles({"before measuring": 0.4, "after the collectives": 0.95},
                     [("allreduce", 2, 0.93), ("halo", 2, 0.1)])
    text = warning_text(found)
    assert "40% before measuring" in text and "after the collectives" not in text
    assert "up to 93% off their points" in text and "allreduce on 2" in text
    assert "halo" not in text
    assert troubles({"before measuring": 1.0}, [("allreduce", 2, 0.1)]) == []
    assert warning_text([]) == ""


def test_a_profile_keeps_its_warning_through_toml(tmp_path):
    machine = load_machine("default")
    from dataclasses import replace

    warned = replace(machine, warning="measured on a busy machine: x")
    again = parse_machine(format_machine(warned), "w.toml")
    assert again.warning == warned.warning
    assert warning_lines(again) == ["warning: machine profile default: measured on a busy "
                                    "machine: x"]
    assert warning_lines(machine) == [] and warning_lines(None) == []
    with pytest.raises(Exception, match="'warning' must be a line of text"):
        parse_machine(format_machine(machine) + "warning = 3\n", "w.toml")
