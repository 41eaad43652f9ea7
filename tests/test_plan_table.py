"""The table ``python -m hpctrain plan`` prints: each column as wide as its widest entry (the
header's included) and starting at the same offset on every line, a split's degrees as
``n8 c4 d4 h2 w2``, and on a terminal narrower than the table, layer names cut in the middle
where that makes it fit; where it would not, the lines are left whole and the terminal wraps
them."""

import re
import sys

import pytest

from hpctrain.cli import main
from hpctrain.model.net import load_net
from hpctrain.plan import spaces

COLUMNS = ("layer", "kind", "mode", "grid", "compute", "comm", "redist", "fed by", "mem", "+tmp")
LEFT = ("layer", "kind", "mode", "grid", "fed by")  # the others are numbers, right-aligned
INCEPTION = ("--net", "inception_v3", "--procs", "64", "--batch", "512", "--machine", "dgx-h100")


def plan_output(capsys, monkeypatch, *args, columns=None):
    """The lines ``plan --compute flops ARGS`` prints on a terminal ``columns`` wide, or into a
    pipe when None."""
    if columns is not None:
        monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
        monkeypatch.setenv("COLUMNS", str(columns))
    assert main(["plan", "--compute", "flops", *args]) == 0
    return capsys.readouterr().out.splitlines()


@pytest.fixture(scope="module")
def searched():
    """The plans ``plan_over`` found in this module, by what its search depends on."""
    return {}


@pytest.fixture
def search_once(monkeypatch, searched):
    """``plan`` searches a plan once for the module and prints it again after: these tests read
    how INCEPTION's table is laid out on pipes and terminals of several widths, and its search
    (seconds, under --space auto) would otherwise be repeated for each; every call still runs
    the whole command, its cost model and the table's formatting."""
    search = spaces.plan_over

    def plan_over(model, *args, **kwargs):
        key = (model.net.name, model.batch, model.procs, model.machine.name,
               model.precision.name, model.hidden_share, args, tuple(sorted(kwargs.items())))
        if key not in searched:
            searched[key] = search(model, *args, **kwargs)
        return searched[key]

    monkeypatch.setattr(spaces, "plan_over", plan_over)


def table_of(lines):
    """The table's lines, its two header lines first, out of ``plan``'s output."""
    first = next(i for i, line in enumerate(lines) if line.startswith("layer ")) - 1
    last = next(i for i, line in enumerate(lines) if line.startswith("predicted iteration"))
    return lines[first:last]


def rows_of(table):
    """Each layer line's cells by column, after checking that every column lines up: on every
    line a left-aligned cell starts, and a number ends, where its header does."""
    names, units = table[:2]
    at = {c: units.index(c) for c in LEFT}  # a text column's start
    at.update({c: names.index(c) + len(c) for c in COLUMNS if c not in LEFT})  # a number's end
    assert at["layer"] == 0 and sorted(at.values()) == [at[c] for c in COLUMNS]
    assert [units[at[c] - len(u):at[c]] for c, u in
            (("compute", "ms"), ("comm", "ms"), ("redist", "ms"), ("mem", "MiB"),
             ("+tmp", "MiB"))] == ["ms", "ms", "ms", "MiB", "MiB"]
    rows = []
    for line in table[2:]:
        cells, end = {}, 0
        for column in COLUMNS:
            if column in LEFT:  # from its start to the gap of two spaces that ends it
                start = at[column]
                assert line[start - 1:start] in ("", " ") and line[start - 2:start].strip() == ""
                cells[column] = re.match(r"(\S+(?: \S+)*)?", line[start:]).group(0)
                end = start + len(cells[column])
            else:  # from the previous cell to its end, one word
                cells[column] = line[end:at[column]].strip()
                assert re.fullmatch(r"\d+\.\d+", cells[column]), (column, line)
                end = at[column]
            assert line[end:end + 2].strip() == "", (column, line)
        assert line[end:] == "", line
        rows.append(cells)
    return rows


def names_of(net):
    return ["input", *(layer.name for layer in load_net(net).layers), "loss"]


def test_a_1_5d_plan_lines_up_and_fits_80_columns(capsys, monkeypatch):
    args = ("--net", "alexnet", "--procs", "8", "--batch", "512", "--machine", "dgx-h100",
            "--space", "grids")
    piped = plan_output(capsys, monkeypatch, *args)
    table = table_of(piped)
    rows = rows_of(table)
    assert [r["layer"] for r in rows] == names_of("alexnet")
    assert {r["grid"] for r in rows if r["mode"] == "follow"} == {""}
    assert {r["grid"] for r in rows if r["mode"] != "follow"} <= {"1x8", "2x4", "4x2", "8x1"}
    # each column as wide as its widest entry: 'maxpool1' then the gap, 'allgather' then one
    assert table[2].index("data") == len("maxpool1") + 2
    assert max(len(line) for line in table) == 80
    for columns in (80, 200):  # it fits both: nothing cut
        shown = plan_output(capsys, monkeypatch, *args, columns=columns)
        assert table_of(shown) == table
        assert max(len(line) for line in shown) <= columns  # the prose below wrapped too


@pytest.mark.parametrize("grid,shown", [
    ("auto", {"linear1": "n64 c4 r2"}),
    ("conv=n8c4d4h2w2,fc=n64c4i2", {"block1.conv1": "n8 c4 d4 h2 w2", "linear1": "n64 c4 i2"}),
    ("conv=8x64,fc=n16i8c4", {"block1.conv1": "8x64", "linear1": "n16 i8 c4"}),
    # c2s2r2, not c2s4: the last linear layer has 4 outputs, and a split by axes never falls
    # back to another mode
    ("conv=8x64,fc=n64c2s2r2", {"block5.conv1": "8x64", "linear2": "n64 c2 s2 r2"}),
])
def test_a_split_by_axes_shows_its_degrees_compactly(capsys, monkeypatch, grid, shown):
    space = ["--space", "balanced"] if grid == "auto" else []  # it only says what auto searches
    lines = plan_output(capsys, monkeypatch, "--net", "cosmoflow", "--procs", "512", "--batch",
                        "64", *space, "--machine", "dgx-h100", "--grid", grid)
    table = table_of(lines)
    rows = {r["layer"]: r for r in rows_of(table)}
    assert list(rows) == names_of("cosmoflow")
    for layer, text in shown.items():
        assert rows[layer]["grid"] == text
        assert (rows[layer]["mode"] == "split") == (" " in text)
    assert not any(set(r["grid"]) & set("=,") for r in rows.values())
    # the grid column is as wide as its widest split, and the numbers follow two spaces on
    widest = max(len(r["grid"]) for r in rows.values())
    assert table[1].index("grid") + widest + 2 == table[1].index("ms") + 2 - len("compute")


@pytest.mark.parametrize("columns", [None, 200])
@pytest.mark.usefixtures("search_once")
def test_long_layer_names_set_the_first_column_and_stay_whole(capsys, monkeypatch, columns):
    lines = plan_output(capsys, monkeypatch, *INCEPTION, columns=columns)
    table = table_of(lines)
    names = names_of("inception_v3")
    assert [r["layer"] for r in rows_of(table)] == names
    assert table[2].index("data") == max(map(len, names)) + 2 > 16 + 2
    assert max(len(line) for line in table) < 200


@pytest.mark.usefixtures("search_once")
def test_a_terminal_a_little_narrower_than_the_table_cuts_the_longest_names(
        capsys, monkeypatch):
    whole = table_of(plan_output(capsys, monkeypatch, *INCEPTION))
    columns = max(len(line) for line in whole) - 8
    lines = plan_output(capsys, monkeypatch, *INCEPTION, columns=columns)
    table = table_of(lines)
    assert max(len(line) for line in lines) == columns  # the table fits exactly, prose wrapped
    names = names_of("inception_v3")
    width = max(map(len, names)) - 8
    rows = rows_of(table)
    assert [r["layer"] for r in rows if "…" not in r["layer"]] == [
        name for name in names if len(name) <= width]
    for name, row in zip(names, rows, strict=True):
        if len(name) > width:  # its middle cut: the block and the layer stay
            head, tail = row["layer"].split("…")
            assert len(row["layer"]) == width and len(head) - len(tail) in (0, 1)
            assert name.startswith(head) and name.endswith(tail)
    # every other column as it was
    assert [{c: v for c, v in r.items() if c != "layer"} for r in rows] == [
        {c: v for c, v in r.items() if c != "layer"} for r in rows_of(whole)]


@pytest.mark.usefixtures("search_once")
def test_a_terminal_too_narrow_to_fit_by_cutting_names_gets_the_whole_table(
        capsys, monkeypatch):
    """At 80 columns the names would have to be cut below 16 characters, and then to
    nothing that tells them apart: the lines are left whole, and the terminal wraps them."""
    whole = table_of(plan_output(capsys, monkeypatch, *INCEPTION))
    lines = plan_output(capsys, monkeypatch, *INCEPTION, columns=80)
    assert table_of(lines) == whole and min(len(line) for line in whole[2:]) > 80
    assert all(len(line) <= 80 for line in lines[len(lines) - 2:])  # the prose is wrapped


def test_plan_prints_one_line_for_each_layer_that_fell_back(capsys, monkeypatch):
    lines = plan_output(capsys, monkeypatch, "--net", "smallcnn", "--procs", "16", "--batch",
                        "64", "--grid", "conv=domain:16x1,fc=16x1")
    after = lines[lines.index(next(line for line in lines
                                   if line.startswith("predicted iteration"))) + 1:]
    assert [line.split(":")[0] for line in after] == [
        "layer conv1 runs model 16x1, not domain 16x1",
        "layer conv2 runs model 16x1, not domain 16x1",
        "layer linear2 runs replicated 16x1, not model 16x1"]


@pytest.mark.parametrize("grid,what", [
    ("2x2", "--grid '2x2' gives the plan"),
    ("conv=h2w2,fc=4x1", "--grid 'conv=h2w2,fc=4x1' gives the plan"),
    ("smallcnn-p4-mixed", "--grid 'smallcnn-p4-mixed' gives the plan"),
])
@pytest.mark.parametrize("space", ["balanced", "grids"])
def test_plan_refuses_a_space_it_would_not_search(capsys, grid, what, space):
    """--space says what --grid auto searches; with a plan given it would be ignored, so it is
    refused in one line, before any work (typed as the default too)."""
    assert main(["plan", "--compute", "flops", "--net", "smallcnn", "--procs", "4", "--batch",
                 "16", "--space", space, "--grid", grid]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"hpctrain: error: --space {space} is unused: it says what --grid auto "
                   f"searches, and {what}; drop --space or give --grid auto")


def test_train_and_compare_plans_refuse_a_space_they_would_not_search():
    from hpctrain.commands import compare_plans, train
    from hpctrain.commands.flags import check_space
    from hpctrain.errors import UserError

    args = train.build_parser().parse_args(["--space", "axes"])
    with pytest.raises(UserError, match="without --grid the plan is pure batch; drop --space"):
        check_space(args, [args.grid])
    check_space(train.build_parser().parse_args([]), [None])  # not given: nothing to refuse
    args = train.build_parser().parse_args(["--space", "axes", "--grid", "auto"])
    check_space(args, [args.grid])
    args = compare_plans.build_parser().parse_args(["--space", "axes", "--plan", "1x4",
                                                    "--plan", "4x1"])
    with pytest.raises(UserError, match="no --plan is auto; drop --space or give --plan auto"):
        check_space(args, args.plans, "--plan")
    check_space(args, [*args.plans, "auto"], "--plan")
