"""The calibrate fit and options, without MPI: fits recover the cost model's constants exactly."""

from pathlib import Path

import numpy as np
import pytest

from hpctrain.comm import benchmarks
from hpctrain.comm.benchmarks import (
    DEFAULT_ALPHA,
    DEFAULT_BETA,
    MIN_BYTES,
    Measured,
    communicator_sizes,
    far_sizes,
    message_sizes,
)
from hpctrain.commands import calibrate as calibrate_command
from hpctrain.commands.calibrate import DEFAULTS, QUICK, CalibrateError, format_table, parse_bytes
from hpctrain.cost import collectives as cost
from hpctrain.cost.fits import (
    MIN_A,
    MIN_B,
    fit_collective,
    fit_knee,
    fit_line,
    line_to_fit,
    worst_residual,
)
from hpctrain.cost.machine import COLLECTIVES, Fit, Machine, local_profile
from hpctrain.errors import UserError
from hpctrain.layout.partition import factorisations

SIZES = message_sizes(4 * 1024 * 1024, 8)


def model_time(collective: str, machine: Machine, p: int, n: float) -> float:
    """What the planner predicts, straight from hpctrain.cost.collectives."""
    if collective == "allgather":
        return cost.allgather_time(machine, p, n)
    if collective == "reduce_scatter":
        return cost.reduce_scatter_time(machine, p, n)
    if collective == "allreduce":
        return cost.allreduce_time(machine, p, n)
    if collective == "alltoall":
        return cost.exchange_time(machine, p, p - 1, n)
    return cost.halo_time(machine, n)


@pytest.mark.parametrize("collective", COLLECTIVES)
@pytest.mark.parametrize("p", [2, 3, 4, 6, 8])
def test_fit_recovers_alpha_beta_of_the_cost_model(collective, p):
    alpha, beta = 3.7e-6, 2.3e-10
    key = 2 if collective == "halo" else p
    machine = Machine("m", 1.0, 1.0, 1.0, fits={collective: {key: Fit(alpha, beta)}})
    times = [model_time(collective, machine, p, n) for n in SIZES]
    fit = fit_collective(collective, key, SIZES, times)
    assert fit.alpha == pytest.approx(alpha, rel=1e-9)
    assert fit.beta == pytest.approx(beta, rel=1e-9)


def test_fit_line_is_exact_on_a_line_and_residual_is_zero():
    a, b = 5e-6, 1e-9
    times = [a + b * n for n in SIZES]
    got = fit_line(SIZES, times)
    assert got == pytest.approx((a, b), rel=1e-10)
    assert all(type(v) is float for v in got)  # plain floats, ready for TOML and formatting
    assert worst_residual(SIZES, times, *got) < 1e-9


def test_fit_line_minimises_relative_error():
    rng = np.random.default_rng(1)
    n = np.array(SIZES, dtype=float)
    t = (4e-6 + 5e-10 * n) * rng.uniform(0.7, 1.3, n.size)
    b_want, a_want = np.polyfit(n, t, 1, w=1 / t)  # weights multiply the residuals
    assert fit_line(n, t) == pytest.approx((a_want, b_want), rel=1e-8)
    # the small messages keep their say: an absolute fit would pass far from them
    a_abs = np.polyfit(n, t, 1)[1]
    assert abs(fit_line(n, t)[0] - 4e-6) < abs(a_abs - 4e-6)


def test_negative_intercept_is_clamped_and_slope_refitted():
    b = 1e-9
    times = [b * n - 2e-8 for n in SIZES]  # a line through a negative latency
    a_got, b_got = fit_line(SIZES, times)
    assert a_got == MIN_A
    n, t = np.array(SIZES, dtype=float), np.array(times)
    w2 = 1 / t**2  # the best slope with the intercept held at its floor
    assert b_got == pytest.approx(np.sum(w2 * n * (t - MIN_A)) / np.sum(w2 * n * n), rel=1e-12)
    assert 0.8 * b < b_got < b


def test_falling_times_clamp_the_slope_and_refit_the_intercept():
    times = [2e-5 - 1e-12 * n for n in SIZES]
    a_got, b_got = fit_line(SIZES, times)
    assert b_got == MIN_B
    w2 = 1 / np.square(times)
    want = np.sum(w2 * (np.array(times) - MIN_B * np.array(SIZES))) / np.sum(w2)
    assert a_got == pytest.approx(want, rel=1e-12)
    assert MIN_A < a_got < 2e-5


def test_both_terms_stay_positive_on_any_times():
    rng = np.random.default_rng(0)
    for _ in range(50):
        a, b = fit_line(SIZES, rng.uniform(1e-7, 1e-3, len(SIZES)))
        assert a >= MIN_A and b >= MIN_B


@pytest.mark.parametrize("sizes,times,message", [
    ([1, 2, 3], [1.0, 2.0], "one time per size"),
    ([64, 64], [1.0, 2.0], "two distinct sizes"),
    ([64, 128], [1.0, 0.0], "positive finite times"),
])
def test_fit_line_refuses_data_it_cannot_fit(sizes, times, message):
    with pytest.raises(ValueError, match=message):
        fit_line(sizes, times)


def test_message_sizes_span_the_range_log_evenly():
    sizes = message_sizes(65536, 4)
    assert sizes == [64, 645, 6502, 65536]
    assert sizes[0] == MIN_BYTES and len(message_sizes(4 << 20, 8)) == 8


@pytest.mark.parametrize("world", [1, 2, 3, 4, 6, 12])
def test_communicator_sizes_are_those_of_every_factorisation(world):
    shapes = factorisations(world)
    got = communicator_sizes(world)
    rows = sorted({r for r, _ in shapes} - {1})
    assert got["allgather"] == got["reduce_scatter"] == rows
    assert got["allreduce"] == sorted({c for _, c in shapes} - {1})  # 1xP covers the world
    assert got["alltoall"] == ([world] if world > 1 else [])
    assert got["halo"] == ([2] if world > 1 else [])


@pytest.mark.parametrize("text,want", [
    ("4194304", 4194304), ("64KiB", 65536), ("4M", 4 << 20), ("1 GiB", 1 << 30), ("2kb", 2048),
])
def test_parse_bytes(text, want):
    assert parse_bytes(text) == want


def test_defaults_and_quick(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    args = calibrate_command.build_parser().parse_args([])
    assert args.out == str(local_profile()) == str(tmp_path / "hpctrain/machines/local.toml")
    assert args.name == "local" and args.device == "cpu"
    assert QUICK["max_bytes"] == 65536 and QUICK["sizes"] < DEFAULTS["sizes"]
    help_text = calibrate_command.build_parser().format_help()
    for flag in ("--out", "--name", "--max-bytes", "--sizes", "--repeats", "--device", "--quick"):
        assert flag in help_text


@pytest.mark.parametrize("argv,message", [
    (["--max-bytes", "12"], "--max-bytes 12 must be between"),
    (["--max-bytes", "4XB"], "--max-bytes '4XB' is not a size"),
    (["--max-bytes", "2GiB"], "--max-bytes 2GiB must be between"),
    (["--sizes", "1"], "--sizes 1 must be"),
    (["--quick", "--repeats", "0"], "--repeats 0 must be"),
    (["--gemm-size", "0"], "--gemm-size 0 must be"),
    (["--name", 'my "box"'], "--name 'my \"box\"'"),
])
def test_bad_options_are_user_errors_naming_the_value(argv, message):
    # options are checked before the communicator is touched
    with pytest.raises(CalibrateError, match=message.replace("(", r"\(")) as err:
        calibrate_command.run(argv, comm=None)
    assert isinstance(err.value, UserError) and "\n" not in str(err.value)


class OneRank:
    """Just enough of a communicator for the checks made before any measurement."""

    def Get_rank(self):
        return 0

    def Get_size(self):
        return 1

    def bcast(self, value, root=0):
        return value


def test_out_that_is_a_directory_is_refused(tmp_path):
    with pytest.raises(CalibrateError, match=f"--out {tmp_path} is a directory"):
        calibrate_command.run(["--out", str(tmp_path)], OneRank())


def test_out_that_cannot_be_written_is_refused_in_one_line(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    link = tmp_path / "link.toml"
    link.symlink_to(blocker)
    cases = [(blocker / "machines" / "local.toml", f"cannot create files in {blocker}; give"),
             (link, f"--out {link} is not a regular file")]
    if Path("/dev/null").exists():
        cases.append((Path("/dev/null"), "--out /dev/null is not a regular file"))
    if Path("/proc/self").is_dir():  # os.access lets root write anywhere, yet not into /proc
        cases.append((Path("/proc/hpctrain/local.toml"), "cannot create files in /proc;"))
    for out, message in cases:
        with pytest.raises(CalibrateError, match=message) as err:
            calibrate_command.run(["--out", str(out)], OneRank())
        assert "\n" not in str(err.value)


def test_table_lists_every_fit():
    fits = [Measured("allgather", 2, (64, 128), (1e-5, 2e-5), Fit(1e-5, 1e-9), 0.05),
            Measured("halo", 2, (64, 128), (1e-5, 2e-5), Fit(2e-6, 1e-10, 2**23, 5e-10), 0.0)]
    table = format_table(fits, 5e10, "cpu").splitlines()
    assert table[1].split() == ["allgather", "2", "10.00", "1.000", "-", "-", "5.0%"]
    assert table[2].split() == ["halo", "2", "2.00", "10.000", "8", "2.000", "0.0%"]
    assert "50.0 GFLOP/s" in table[-1]
    floored = Measured("halo", 2, (64, 128), (1e-5, 1e-5), Fit(1e-5, MIN_B), 0.0, True)
    table = format_table([floored], 5e10, "cpu").splitlines()
    assert table[1].endswith(" *") and table[2].startswith("* alpha or beta held at its floor")


def test_a_profile_keeps_its_threads_per_rank_and_refuses_a_bad_count():
    from hpctrain.cost.machine import MachineError, format_machine, parse_machine

    machine = Machine("here", 2e-6, 1e-10, 5e10, threads=4)
    assert parse_machine(format_machine(machine), "here.toml").threads == 4
    assert parse_machine('alpha = 1\nbeta = 1\nflops = 1\n', "old.toml").threads == 0
    with pytest.raises(MachineError, match="'threads' must be a whole number >= 0, got -1"):
        parse_machine('alpha = 1\nbeta = 1\nflops = 1\nthreads = -1\n', "bad.toml")


def test_a_profile_keeps_its_overlap_share_and_refuses_one_out_of_range():
    from hpctrain.cost.machine import MachineError, format_machine, parse_machine

    machine = Machine("rdma", 2e-6, 1e-10, 5e10, overlap=0.75)
    assert parse_machine(format_machine(machine), "rdma.toml").overlap == 0.75
    assert parse_machine('alpha = 1\nbeta = 1\nflops = 1\n', "old.toml").overlap == 0.0
    for bad in ("1.5", "-0.1", "true", '"all"'):
        with pytest.raises(MachineError, match="'overlap' must be a number from 0 to 1, got"):
            parse_machine(f'alpha = 1\nbeta = 1\nflops = 1\noverlap = {bad}\n', "bad.toml")


def knee_price(a, b, knee, slope, n):
    """The bent line written out independently of the code under test."""
    return a + b * np.minimum(n, knee) + slope * np.maximum(0, n - knee)


def test_far_sizes_double_from_past_the_near_sweep():
    assert far_sizes(4 * 2**20, 64 * 2**20) == [2**23, 2**24, 2**25, 2**26]
    assert far_sizes(4 * 2**20, 0) == far_sizes(4 * 2**20, 4 * 2**20) == []


@pytest.mark.parametrize("knee", [2**22, 2**24])
def test_fit_knee_recovers_where_and_how_far_the_bandwidth_falls(knee):
    a, b, slope = 4e-6, 4e-10, 1e-9  # 2.5 GB/s in the caches, 1 GB/s past them
    sizes = far_sizes(2**22, 2**27)
    times = knee_price(a, b, knee, slope, np.array(sizes, dtype=float))
    got_knee, got_slope = fit_knee(a, b, sizes, times, 2**22)
    assert got_knee == knee and got_slope == pytest.approx(slope, rel=1e-12)
    assert worst_residual(sizes, times, a, b, got_knee, got_slope) < 1e-12


def test_fit_knee_keeps_the_slope_where_the_bandwidth_holds():
    a, b = 4e-6, 4e-10
    sizes = far_sizes(2**22, 2**26)
    times = a + b * np.array(sizes, dtype=float) * np.array([1.01, 0.99, 1.0, 1.02])
    assert fit_knee(a, b, sizes, times, 2**22)[1] == pytest.approx(b, rel=0.05)


def test_a_knee_prices_the_bytes_past_it_at_the_far_rate_and_round_trips():
    from hpctrain.cost.collectives import allreduce_time
    from hpctrain.cost.machine import MachineError, format_machine, parse_machine

    fit = line_to_fit("allreduce", 4, 8e-6, 4e-10, 2**22, 1e-9)  # a, b per byte of message
    machine = Machine("m", 1e-6, 1e-10, 1e9, fits={"allreduce": {4: fit}})
    for n in (2**20, 2**22, 2**26):  # the fitted line, bent at 4 MiB of message
        want = float(knee_price(8e-6, 4e-10, 2**22, 1e-9, n))
        assert allreduce_time(machine, 4, n) == pytest.approx(want, rel=1e-12)
    again = parse_machine(format_machine(machine), "m.toml")
    back = again.link("allreduce", 4)
    assert (back.alpha, back.beta, back.knee, back.far_beta) == pytest.approx(
        (fit.alpha, fit.beta, fit.knee, fit.far_beta), rel=1e-5)
    table = '[fits.allreduce]\n2 = {{ alpha = 1, beta = 1{} }}\n'
    for extra, message in ((", knee = 8", "give knee and far_beta together, or neither"),
                           (", knee = 8, far_beta = -1", "'far_beta' must be a number"),
                           (", knee = 0, far_beta = 1", "'knee' must be a number"),
                           (", bend = 8", "unknown key 'bend'; a fit takes alpha, beta, knee, "
                                          "far_beta")):
        with pytest.raises(MachineError, match=message):
            parse_machine("alpha = 1\nbeta = 1\nflops = 1\n" + table.format(extra), "b.toml")


def test_far_bytes_is_checked_against_max_bytes():
    for value, message in (("1MiB", "--far-bytes 1MiB must be 0 or between twice --max-bytes"),
                           ("lots", "--far-bytes 'lots' is not a size")):
        with pytest.raises(CalibrateError, match=message):
            calibrate_command.run(["--far-bytes", value], OneRank())


def test_overlap_share_is_the_part_of_the_sum_hidden_by_the_gemms(monkeypatch):
    from hpctrain.device.backend import Backend

    class TwoRanks(OneRank):
        def Get_size(self):
            return 2

        def allreduce(self, value, op=None):
            return value

    def times(sum_alone, one_gemm, gemms, both):
        answers = iter([sum_alone, one_gemm, gemms, both])
        monkeypatch.setattr(benchmarks, "time_calls", lambda *args: next(answers))
        return benchmarks.measure_overlap(TwoRanks(), Backend(np, np.float32), 16, 3)

    # a 4 ms sum beside 4 ms of GEMMs, 5 ms together: 3 of its 4 ms moved during them
    assert times(4e-3, 1e-3, 4e-3, 5e-3) == pytest.approx(0.75)
    assert times(4e-3, 1e-3, 4e-3, 9e-3) == 0.0  # slower together: none hidden, not below 0
    assert times(4e-3, 1e-3, 4e-3, 3e-3) == 1.0  # faster than the GEMMs alone: at most all
    assert benchmarks.measure_overlap(OneRank(), Backend(np, np.float32), 16, 3) == 0.0


# ---------------------------------------------------------------------------------------------
# Levels: the node and the network between nodes


@pytest.mark.parametrize("count,groups", [(1, []), (2, [2]), (3, [3]), (4, [2, 4]),
                                          (6, [2, 3, 6]), (8, [2, 4, 8])])
def test_level_sizes_are_every_divisor_and_the_whole(count, groups):
    got = benchmarks.level_sizes(count)
    assert got["allgather"] == got["reduce_scatter"] == got["allreduce"] == groups
    assert got["alltoall"] == ([count] if count > 1 else [])
    assert got["halo"] == ([2] if count > 1 else [])


def test_placement_problem_is_one_line_naming_the_fix():
    from hpctrain.commands.calibrate import placement_problem

    assert placement_problem(4, 2, True, True) == ""
    for even, blocked, why in ((True, False, "not consecutive"),
                               (False, True, "different numbers of ranks")):
        message = placement_problem(2, 2, even, blocked)
        assert why in message and "\n" not in message
        assert "--distribution=block" in message and "-hosts a:R,b:R" in message


@pytest.mark.parametrize("alone,together,ranks,want", [
    (10e-6, 20e-6, 4, 2.0),   # half speed with 4 ranks: 2 NICs
    (10e-6, 40e-6, 4, 1.0),   # a quarter: one NIC
    (10e-6, 80e-6, 4, 1.0),   # slower still (noise): at least 1
    (10e-6, 5e-6, 4, 4.0),    # faster together (noise): at most R
    (10e-6, 10e-6, 1, 1.0),   # one rank per node: nothing shares
    (0.0, 0.0, 4, 1.0),       # not measured
])
def test_nics_from_times_is_r_t1_over_tr_within_1_and_r(alone, together, ranks, want):
    from hpctrain.comm.benchmarks import nics_from_times

    assert nics_from_times(alone, together, ranks) == pytest.approx(want)


def measured(collective, p, fit, level="node"):
    return Measured(collective, p, (64, 128), (1e-5, 2e-5), fit, 0.0, False, level)


def test_build_machine_puts_node_fits_on_top_and_network_fits_under_network():
    from hpctrain.comm.benchmarks import Sharing, build_machine
    from hpctrain.cost.machine import format_machine, parse_machine

    node_halo, net_halo = Fit(2e-6, 1e-10), Fit(8e-6, 4e-10)
    results = [measured("allreduce", 2, Fit(3e-6, 2e-10)), measured("halo", 2, node_halo),
               measured("allreduce", 2, Fit(9e-6, 5e-10), "network"),
               measured("halo", 2, net_halo, "network")]
    sharing = Sharing(2, 65536, 10e-6, 15e-6)  # 2·10/15: 1.33 NICs
    machine = build_machine("two", "cpu", results, 5e10, 1, 0.0, 2, sharing)
    assert (machine.alpha, machine.beta, machine.ranks_per_node) == (2e-6, 1e-10, 2)
    assert machine.fits == {"allreduce": {2: Fit(3e-6, 2e-10)}, "halo": {2: node_halo}}
    net = machine.network
    assert (net.alpha, net.beta, net.nics) == (8e-6, 4e-10, 1.33)
    assert net.fits == {"allreduce": {2: Fit(9e-6, 5e-10)}, "halo": {2: net_halo}}
    again = parse_machine(format_machine(machine), "two.toml")
    assert again.levelled and again.network.nics == 1.33
    assert again.network.link("allreduce", 2).alpha == pytest.approx(9e-6)
    # one rank per node: nothing inside a node, placeholders on top, one NIC
    machine = build_machine("two", "cpu", results[2:], 5e10, 1, 0.0, 1, Sharing(1))
    assert (machine.alpha, machine.beta, machine.fits) == (DEFAULT_ALPHA, DEFAULT_BETA, {})
    assert machine.network.nics == 1 and "not measured" in Sharing(1).describe()


def test_one_node_profile_is_flat_with_its_ranks_per_node():
    from hpctrain.comm.benchmarks import build_machine
    from hpctrain.cost.machine import format_machine

    results = [measured("halo", 2, Fit(2e-6, 1e-10))]
    machine = build_machine("two", "cpu", results, 5e10, 1, 0.0, 4, None)
    assert machine.network is None and machine.ranks_per_node == 4
    text = format_machine(machine)
    assert "ranks_per_node = 4\n" in text and "[network]" not in text


def test_table_has_a_level_column_when_the_network_was_measured():
    fits = [measured("allgather", 2, Fit(1e-5, 1e-9)),
            measured("allgather", 2, Fit(2e-5, 1e-9), "network")]
    table = format_table(fits, 5e10, "cpu").splitlines()
    assert table[0].split()[:2] == ["level", "collective"]
    assert table[1].split()[:3] == ["node", "allgather", "2"]
    assert table[2].split()[:4] == ["network", "allgather", "2", "20.00"]
    assert "nodes (one rank on each) at the network level" in table[3]
