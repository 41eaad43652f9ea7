"""The shipped cluster profiles with levels say what their sources say (no MPI)."""

import re
from pathlib import Path

import pytest

from hpctrain.cost.machine import load_machine

SHIPPED = Path(__file__).resolve().parents[1] / "hpctrain" / "inputs" / "machines"

# name: ranks per node, NICs, device, 1/β inside and between nodes (B/s), FLOP/s of one rank
CLUSTERS = {
    "dgx-h100": (8, 8, "gpu", 450e9, 50e9, 3.35e13),
    "perlmutter-gpu": (4, 4, "gpu", 300e9, 25e9, 9.75e12),
    "perlmutter-cpu": (8, 1, "cpu", 20e9, 25e9, 6.3e11),
}


@pytest.mark.parametrize("name", sorted(CLUSTERS))
def test_a_cluster_profile_has_the_levels_its_sources_give(name):
    per_node, nics, device, inside, across, flops = CLUSTERS[name]
    machine = load_machine(name)
    assert machine.name == name and machine.levelled
    assert (machine.ranks_per_node, machine.network.nics, machine.device) == (per_node, nics,
                                                                             device)
    assert 1 / machine.beta == pytest.approx(inside, rel=1e-3)
    assert 1 / machine.network.beta == pytest.approx(across, rel=1e-3)
    assert machine.flops == pytest.approx(flops)
    assert machine.network.alpha > machine.alpha  # a message between nodes starts slower


@pytest.mark.parametrize("name", ["dgx-h100", "perlmutter-gpu"])
def test_on_gpu_nodes_the_network_is_an_order_of_magnitude_slower_per_byte(name):
    """NVLink against one NIC per GPU: 450 / 50 GB/s on DGX H100, 300 / 25 on Perlmutter."""
    machine = load_machine(name)
    assert 8 <= machine.network.beta / machine.beta <= 20


def test_a_pair_of_perlmutter_gpus_has_one_pairs_nvlink_links():
    """4 links of 25 GB/s per direction between two A100s; all 12 when the 4 GPUs talk."""
    machine = load_machine("perlmutter-gpu")
    for collective in ("allgather", "reduce_scatter", "allreduce", "alltoall", "halo"):
        assert 1 / machine.link(collective, 2).beta == pytest.approx(100e9, rel=1e-3)
    assert 1 / machine.link("allreduce", 4).beta == pytest.approx(300e9, rel=1e-3)


def test_flattened_cluster_profiles_price_every_pair_on_the_network():
    for name in CLUSTERS:
        flat = load_machine(name).flattened()
        assert not flat.levelled and flat.beta == load_machine(name).network.beta


@pytest.mark.parametrize("name", sorted(CLUSTERS))
def test_every_constant_has_its_source_in_a_comment_above_it(name):
    lines = (SHIPPED / f"{name}.toml").read_text().splitlines()
    for number, line in enumerate(lines):
        if re.match(r"(alpha|beta|flops|ranks_per_node|nics) =", line):
            assert lines[number - 1].startswith("#"), f"{name}.toml:{number + 1}: {line}"
