"""Property: every parser of a user's file or spec returns a value or raises a UserError whose
message is one printable line of bounded length; never another exception, never a hang.

Inputs: random bytes, random mutations of the shipped files (hpctrain/inputs/), and token soup
built from each format's real keywords and awkward numbers. Derandomized, so a run is
reproducible; about 300 examples a target.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpctrain.cost.machine import load_machine, parse_machine
from hpctrain.errors import UserError
from hpctrain.io.locations import shipped
from hpctrain.model.net import load_net, parse_net
from hpctrain.plan.plans import plan_from_spec, read_plan

MESSAGE_LIMIT = 400  # characters: the longest one-line message a fuzzed input may produce
# 5 s an example: a hang fails, a loaded shared machine does not (an example takes ~10 ms)
FUZZ = settings(max_examples=300, deadline=5000, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

NUMBERS = ["0", "1", "2", "3", "8", "-1", "+4", "0.5", "1.5", "1e400", "-1e400", "nan", "inf",
           "1e3", "9223372036854775807", "9223372036854775808", "9" * 30, "9" * 5000, "x",
           "٣", "0x10", "1_000", "", "²"]


def _shipped(folder: str, suffix: str) -> list[bytes]:
    where = shipped(folder)
    return [entry.read_bytes() for entry in where.iterdir() if entry.name.endswith(suffix)]


def _mutated(originals: list[bytes]) -> st.SearchStrategy[bytes]:
    """A shipped file cut, spliced with random bytes, a line doubled, or a number replaced."""
    @st.composite
    def build(draw) -> bytes:
        data = draw(st.sampled_from(originals))
        for _ in range(draw(st.integers(1, 4))):
            where = draw(st.integers(0, len(data)))
            how = draw(st.sampled_from(["cut", "insert", "truncate", "double", "number"]))
            if how == "cut":
                data = data[:where] + data[where + draw(st.integers(0, 40)):]
            elif how == "insert":
                data = data[:where] + draw(st.binary(max_size=20)) + data[where:]
            elif how == "truncate":
                data = data[:where]
            elif how == "double":
                lines = data.splitlines(keepends=True) or [b""]
                line = draw(st.sampled_from(lines))
                data = data + b"\n" + line
            else:
                number = draw(st.sampled_from(NUMBERS)).encode()
                data = data[:where] + number + data[where:]
        return data

    return build()


def _soup(words: list[str], joins: list[str]) -> st.SearchStrategy[str]:
    """Lines of real keywords, ``key=value`` pairs and awkward numbers."""
    token = st.one_of(
        st.sampled_from(words),
        st.sampled_from(NUMBERS),
        st.builds(lambda k, v: f"{k}={v}", st.sampled_from(words), st.sampled_from(NUMBERS)),
        st.text(max_size=8))
    line = st.lists(token, max_size=8).map(" ".join)
    return st.lists(line, max_size=12).flatmap(
        lambda lines: st.sampled_from(joins).map(lambda join: join.join(lines)))


def _check_refusal(err: UserError) -> None:
    message = str(err)
    assert message and message.isprintable(), repr(message)
    assert len(message) <= MESSAGE_LIMIT, (len(message), message[:200])


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """Where each example's file is written (one file, overwritten)."""
    return tmp_path_factory.mktemp("fuzz")


def _file(folder: Path, data: bytes, suffix: str) -> str:
    path = folder / f"input{suffix}"
    path.write_bytes(data)
    return str(path)


NET_WORDS = ["input", "conv", "maxpool", "relu", "dropout", "flatten", "linear", "name", "out",
             "kernel", "stride", "pad", "bias", "p", "channels", "size", "height", "width",
             "features", "classes", "#", "conv1"]
NET_FILES = st.one_of(st.binary(max_size=600), _mutated(_shipped("nets", ".net")),
                      _soup(NET_WORDS, ["\n", "\r\n", "\n\n"]).map(str.encode))


def _use_net(net) -> None:
    net.shapes()
    net.parameter_count()


@FUZZ
@given(_soup(NET_WORDS, ["\n", "\r\n", "\n\n"]))
def test_parse_net_on_token_soup(text):
    try:
        _use_net(parse_net(text, "soup.net"))
    except UserError as err:
        _check_refusal(err)


@FUZZ
@given(NET_FILES)
def test_load_net_on_any_file(folder, data):
    try:
        _use_net(load_net(_file(folder, data, ".net")))
    except UserError as err:
        _check_refusal(err)


GRID_WORDS = ["conv", "fc", "domain", "model", "auto", "2x2", "1x4", "4x1", "2x1", "x", ":",
              "=", ",", "smallcnn-p4-mixed", "9" * 40 + "x1"]


@FUZZ
@given(st.one_of(
    st.lists(st.sampled_from(GRID_WORDS + NUMBERS), max_size=8).map("".join),
    st.text(max_size=40)),
    st.sampled_from([1, 2, 3, 4, 6]))
def test_grid_specs(spec, procs):
    try:
        plan_from_spec(spec, load_net("smallcnn"), procs)
    except UserError as err:
        _check_refusal(err)


PLAN_WORDS = ["conv1", "conv2", "relu1", "maxpool1", "flatten1", "dropout1", "linear1",
              "linear2", "fc9", "batch", "model", "domain", "follow", "2x2", "1x4", "4x1",
              "0x4", "#"]
PLAN_FILES = st.one_of(st.binary(max_size=400), _mutated(_shipped("plans", ".plan")),
                       _soup(PLAN_WORDS, ["\n"]).map(str.encode))


@FUZZ
@given(PLAN_FILES, st.sampled_from([1, 2, 4]))
def test_plan_files(folder, data, procs):
    try:
        read_plan(Path(_file(folder, data, ".plan")), load_net("smallcnn"), procs)
    except UserError as err:
        _check_refusal(err)


TOML_VALUES = ["1e-6", "2", "0", "-1", "nan", "inf", "-inf", "1e999", "9" * 400, '"cpu"',
               '"gpu"', '"x"', "true", "[]", "[1, 2]", "{}", "{ alpha = 1, beta = 2 }",
               "{ alpha = nan }", "1979-05-27", '"' + "n" * 300 + '"', "[" * 50]
TOML_KEYS = ["name", "alpha", "beta", "flops", "device", "threads", "colour", "fits",
             "fits.allgather", "fits.halo.2", "fits.allgather.0", "fits.nope", '"²"',
             "fits.allreduce.99999999999"]


@st.composite
def _profiles(draw) -> str:
    lines = []
    for _ in range(draw(st.integers(0, 10))):
        if draw(st.booleans()):
            lines.append(f"{draw(st.sampled_from(TOML_KEYS))} = "
                         f"{draw(st.sampled_from(TOML_VALUES))}")
        else:
            lines.append(f"[{draw(st.sampled_from(TOML_KEYS))}]")
    return "\n".join(lines)


MACHINE_FILES = st.one_of(st.binary(max_size=400), _mutated(_shipped("machines", ".toml")),
                          _profiles().map(str.encode))


@FUZZ
@given(_profiles())
def test_parse_machine_on_token_soup(text):
    try:
        parse_machine(text, "soup.toml")
    except UserError as err:
        _check_refusal(err)


@FUZZ
@given(MACHINE_FILES)
def test_load_machine_on_any_file(folder, data):
    try:
        load_machine(_file(folder, data, ".toml"))
    except UserError as err:
        _check_refusal(err)


@pytest.mark.parametrize("load,suffix", [(load_net, ".net"), (load_machine, ".toml")])
def test_a_huge_token_or_a_huge_file_is_one_short_line(folder, load, suffix):
    for data in (b"x" * (10 << 20), b"input " + b"y" * 500_000 + b"\n"):
        with pytest.raises(UserError) as err:
            load(_file(folder, data, suffix))
        _check_refusal(err.value)
    with pytest.raises(UserError) as err:
        load("z" * 100_000)  # a name too long for the operating system
    _check_refusal(err.value)
