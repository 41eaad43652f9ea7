"""The reliability suite, input files: a net, plan or machine profile that is binary, empty,
huge or holds something twice is refused on 2 ranks with exit status 2 and one short line,
within seconds, and no file but the run's own outputs changes."""

from pathlib import Path

import pytest

from tests.reliability import assert_refused, changed_outside, launch, snapshot
from tests.test_training_app import mpiexec

pytestmark = pytest.mark.skipif(mpiexec() is None, reason="no mpiexec")

SHORT = 300  # characters: the longest line a refusal may print
NET = "input channels=1 size=8 classes=10\nconv out=4 kernel=3 pad=1\nrelu\nflatten\n" \
      "linear out=10\n"
BINARY = bytes(range(256)) * 4


def _write(folder: Path, name: str, data: bytes | str) -> str:
    path = folder / name
    if isinstance(data, str):
        path.write_text(data)
    else:
        path.write_bytes(data)
    return name


CASES = {
    "binary net": (lambda d: ["--net", _write(d, "bad.net", BINARY)], "binary file"),
    "empty net": (lambda d: ["--net", _write(d, "bad.net", b"")], "net file is empty"),
    "10 MB token in a net": (lambda d: ["--net", _write(d, "bad.net", b"x" * (10 << 20))],
                             "larger than 1 MiB"),
    # one argument can hold at most 128 KiB on Linux (MAX_ARG_STRLEN): as long as it can be
    "100 kB token as --net": (lambda d: ["--net", "n" * 100_000], "unknown net 'nnn"),
    "second input line": (lambda d: ["--net", _write(d, "bad.net", "input features=4 "
                                                     "classes=2\n" + NET)],
                          "a second 'input' line"),
    "binary plan": (lambda d: ["--net", "smallcnn", "--grid", _write(d, "bad.plan", BINARY)],
                    "binary file"),
    "duplicated plan line": (lambda d: ["--net", _write(d, "ok.net", NET), "--grid",
                                        _write(d, "bad.plan", "conv1 model 2x1\nlinear1 batch "
                                               "1x2\nconv1 model 2x1\n")],
                             "layer 'conv1' is given twice"),
    "kind twice in --grid": (lambda d: ["--net", "smallcnn", "--grid", "conv=2x1,conv=1x2"],
                             "gives conv= twice"),
    "binary machine": (lambda d: ["--net", "smallcnn", "--grid", "auto", "--plan-only",
                                  "--machine", _write(d, "bad.toml", BINARY)], "binary file"),
}


@pytest.mark.parametrize("case", CASES)
def test_a_bad_input_file_is_one_short_line_and_changes_nothing(tmp_path, case):
    make_args, message = CASES[case]
    args = make_args(tmp_path)
    (tmp_path / "keep.txt").write_text("a user's file\n")
    before = snapshot(tmp_path)
    outcome = launch(*args, "--steps", "1", "--log", "run.h5", cwd=tmp_path)
    assert_refused(outcome, message)
    assert len(outcome.error_lines[0]) < SHORT, outcome.error_lines[0][:SHORT]
    assert changed_outside(before, snapshot(tmp_path), (tmp_path / "cache",)) == []
