"""Reading a user's input files and echoing their values: the text-file reader, machine
profiles, shown() and argparse's messages, each refusal one line of bounded length."""

import pytest

from hpctrain.cost.machine import MachineError, load_machine, parse_machine
from hpctrain.errors import ArgumentParser, UserError, one_line, shown
from hpctrain.io.textfile import MAX_BYTES, existing_file, read_text
from hpctrain.model.net import NetError, load_net

GOOD = "alpha = 1e-6\nbeta = 1e-10\nflops = 1e11\n"


def _one_short_line(err: BaseException) -> str:
    message = str(err)
    assert message.isprintable() and len(message) < 300, message[:400]
    return message


def test_shown_cuts_long_values_and_escapes_line_breaks():
    assert shown("relu") == "'relu'"
    assert shown("a\nb") == "'a\\nb'"
    assert shown("x" * 10_000_000) == "'" + "x" * 78 + "… (10,000,000 characters)"
    assert shown("my.net", quoted=False) == "my.net"
    assert shown("my\n.net", quoted=False) == "'my\\n.net'"
    assert shown({"a": 1}) == "{'a': 1}"
    assert one_line("two\nlines\t here") == "two lines here"
    assert one_line("y" * 1000, 20).endswith("… (1,000 characters)")


def test_argparse_messages_are_cut_to_one_line():
    parser = ArgumentParser(prog="hpctrain")
    parser.add_argument("--batch", type=int)
    with pytest.raises(UserError, match="invalid int value") as err:
        parser.parse_args(["--batch", "9" * 100_000])
    assert _one_short_line(err.value).endswith("(see hpctrain --help)")


@pytest.mark.parametrize("data,message", [
    (b"", "the net file is empty"), (b" \n\t\n", "the net file is empty"),
    (b"input\0", "a binary file \\(NUL byte at offset 5\\)"),
    (b"input features=\xff", "not UTF-8 text \\(byte 0xff at offset 15\\)"),
    (b"input features=4 classes=2\n" + b"#" * MAX_BYTES, "larger than 1 MiB"),
])
def test_a_file_that_is_not_small_text_is_refused_whole(tmp_path, data, message):
    path = tmp_path / "bad.net"
    path.write_bytes(data)
    with pytest.raises(NetError, match=message) as err:
        load_net(str(path))
    _one_short_line(err.value)


def test_a_byte_order_mark_is_dropped_and_unreadable_names_are_no_file(tmp_path):
    path = tmp_path / "bom.net"
    path.write_bytes(b"\xef\xbb\xbfinput features=4 classes=2\nlinear out=2\n")
    assert read_text(path, NetError, "net file").startswith("input")
    assert load_net(str(path)).input_shape == (4,)
    assert existing_file("n" * 100_000) is None and existing_file("a\0b") is None
    assert existing_file(str(tmp_path)) is None and existing_file(str(path)) == path


@pytest.mark.parametrize("text,message", [
    ("alpha = [", "not a valid TOML profile \\(Invalid value"),
    ("alpha = " + "9" * 5000, "not a valid TOML profile \\(Exceeds the limit"),
    ("alpha = " + "[" * 100_000, "not a valid TOML profile \\(nested too deeply\\)"),
    (GOOD + "colour = 3", "unknown key 'colour'; a profile takes name, alpha"),
    ("alpha = nan\nbeta = 1e-10\nflops = 1e11", "'alpha' must be a number from 1e-30 to 1e"),
    ("alpha = inf\nbeta = 1e-10\nflops = 1e11", "got inf"),
    ("alpha = 1e-6\nbeta = 0\nflops = 1e11", "'beta' must be a number"),
    ("alpha = 1e-6\nbeta = 1e-10\nflops = " + "9" * 400, "'flops' must be a number"),
    ("alpha = 1e-6\nbeta = 1e-10\n[flops]\nx = 1", "'flops' must be a positive number, got"),
    ("beta = 1e-10\nflops = 1e11", "'alpha' is missing"),
    (GOOD + "fits = 3", "fits must be a table, got 3"),
    (GOOD + "[fits]\nallgather = 3", "fits.allgather must be a table"),
    (GOOD + "[fits.allgather]\n2 = 3", "fits.allgather.2: a fit must be a table"),
    (GOOD + "[fits.allgather]\n0 = { alpha = 1, beta = 1 }", "size must be a whole number"),
    (GOOD + '[fits.allgather]\n"²" = { alpha = 1, beta = 1 }', "size must be a whole number"),
    (GOOD + "[fits.allgather]\n99999999999 = { alpha = 1, beta = 1 }", "from 1 to 2147483647"),
    (GOOD + "[fits.allgather]\n2 = { alpha = 1, beta = 1, gamma = 1 }", "unknown key 'gamma'"),
    (GOOD + "[fits.bcast]\n2 = { alpha = 1, beta = 1 }", "unknown collective 'bcast'"),
    (GOOD + "name = 3", "'name' must be a line of 1 to 100 characters, got 3"),
    (GOOD + 'name = "a\\nb"', "got 'a\\\\nb'"),
    (GOOD + "device = { a = 1 }", "device {'a': 1} must be"),
    (GOOD + "threads = 1.5", "'threads' must be a whole number >= 0, got 1.5"),
])
def test_machine_profiles_refuse_anything_odd_in_one_line(text, message):
    with pytest.raises(MachineError, match=message) as err:
        parse_machine(text, "bad.toml")
    _one_short_line(err.value)


def test_a_machine_name_with_quotes_round_trips(tmp_path):
    from hpctrain.cost.machine import format_machine

    machine = parse_machine(GOOD + 'name = "rack \\"B\\" \\\\ 7"', "quoted.toml")
    assert parse_machine(format_machine(machine), "again.toml").name == 'rack "B" \\ 7'


def test_a_binary_or_unknown_machine_profile_is_one_line(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_bytes(bytes(range(256)))
    with pytest.raises(MachineError, match="bad.toml: a binary file"):
        load_machine(str(path))
    with pytest.raises(MachineError, match="unknown machine 'mmm.*… \\(100,000 characters\\)"):
        load_machine("m" * 100_000)
