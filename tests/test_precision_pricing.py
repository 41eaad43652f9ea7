"""The planner, cost model and memory model in every precision: messages and buffers priced at
the storage dtype's size, master weights and optimizer state at float32, batch norm's
statistics at float32, FLOP-rate compute at the profile's rate for the precision, and
--precision on plan, simulate and compare-plans (serial)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from hpctrain.commands import plan as plan_command
from hpctrain.cost.compute import FlopModel, timed_dtype
from hpctrain.cost.machine import load_machine, parse_machine
from hpctrain.cost.memory import parameter_bytes
from hpctrain.device.backend import Backend
from hpctrain.device.precision import PRECISIONS
from hpctrain.model.net import load_net
from hpctrain.plan.planner import plan_memory, plan_network
from hpctrain.plan.plans import LayerPlan
from hpctrain.plan.pricing import CostModel, build_cost_model
from hpctrain.plan.spaces import predict

FP32, BF16 = PRECISIONS["fp32"], PRECISIONS["bf16"]
# plan --net resnet50 --procs 512 --batch 2048 --machine dgx-h100 --compute flops
NET, PROCS, BATCH = "resnet50", 512, 2048


def backend(name: str) -> Backend:
    precision = PRECISIONS[name]
    return Backend(np, precision.storage, precision=precision)


@pytest.fixture(scope="module")
def resnet():
    return load_net(NET)


@pytest.fixture(scope="module")
def dgx():
    return load_machine("dgx-h100")


@pytest.fixture(scope="module")
def fp32_plan(resnet, dgx) -> list[LayerPlan]:
    return plan_network(build_cost_model(resnet, BATCH, PROCS, dgx, "flops",
                                         overlap=True)).plans


def byte_machine(machine):
    """``machine`` with no latency and no buckets: every message's seconds are its bytes times
    a constant, so a message of half the bytes takes exactly half the time."""
    network = replace(machine.network, alpha=0.0) if machine.network else None
    return replace(machine, alpha=0.0, bucket_bytes=0, network=network)


def models(net, machine, precisions=("fp32", "bf16")) -> dict[str, CostModel]:
    return {name: build_cost_model(net, BATCH, PROCS, machine, "flops", backend(name),
                                   overlap=True) for name in precisions}


# -- fp32 is priced as before precisions ----------------------------------------------------

def test_fp32_predictions_are_unchanged(resnet, dgx):
    """The figures of the command above before the cost model took a precision (the plan,
    its iteration time and its memory per rank; the time since with the last bucket of
    gradient sums whole, 87 µs more), and every way of asking for fp32 alike."""
    asked = [build_cost_model(resnet, BATCH, PROCS, dgx, "flops", overlap=True),
             build_cost_model(resnet, BATCH, PROCS, dgx, "flops", backend("fp32"), overlap=True),
             CostModel(resnet, BATCH, PROCS, dgx, FlopModel(dgx.flops), overlap=True),
             CostModel(resnet, BATCH, PROCS, dgx, FlopModel(dgx.flops), 4, overlap=True)]
    planned = [plan_network(model) for model in asked]
    assert planned[0].iteration_time == pytest.approx(0.012449315067795057, rel=1e-12)
    assert planned[0].memory == pytest.approx(1075.6005859375 * 2**20, rel=1e-12)
    for other in planned[1:]:
        assert other.plans == planned[0].plans
        assert other.iteration_time == planned[0].iteration_time
        assert other.memory == planned[0].memory


def test_tf32_prices_bytes_as_fp32_and_compute_at_its_own_rate(resnet, dgx, fp32_plan):
    found = {name: predict(model, fp32_plan)
             for name, model in models(resnet, dgx, ("fp32", "tf32")).items()}
    for ours, theirs in zip(found["tf32"].layers, found["fp32"].layers, strict=True):
        assert (ours.comm, ours.redistribution) == (theirs.comm, theirs.redistribution)
        assert ours.resident == theirs.resident
        assert ours.compute == pytest.approx(
            tuple(t * dgx.flops / dgx.precision_flops["tf32"] for t in theirs.compute),
            rel=1e-12)


# -- bf16: half the bytes of every message and activation ---------------------------------

def test_bf16_halves_gradient_and_activation_bytes(resnet, dgx, fp32_plan):
    """ResNet-50 on 512 ranks of dgx-h100 under the fp32 plan: on links priced by bytes alone,
    every gradient sum and every redistribution takes half the time under bf16; every
    activation a layer keeps takes half the bytes."""
    found = {name: predict(model, fp32_plan)
             for name, model in models(resnet, byte_machine(dgx)).items()}
    sums = 0
    for ours, theirs in zip(found["bf16"].layers, found["fp32"].layers, strict=True):
        assert ours.grad_sum == theirs.grad_sum / 2, ours.layer
        assert ours.redistribution == tuple(t / 2 for t in theirs.redistribution), ours.layer
        sums += theirs.grad_sum > 0
        if ours.kind != "batchnorm":  # its statistics stay float32 (below)
            assert ours.comm == tuple(t / 2 for t in theirs.comm), ours.layer
        for what, size in theirs.resident.items():
            if what not in ("momentum", "optimizer scratch", "maxima positions"):  # float32, int
                assert ours.resident[what] == size / 2, (ours.layer, what)
    assert sums == 54  # its 53 convolutions and the linear layer
    assert found["bf16"].data.resident["input batch"] == found["fp32"].data.resident[
        "input batch"] / 2
    assert found["bf16"].loss.redistribution == tuple(t / 2 for t in
                                                      found["fp32"].loss.redistribution)


def test_bf16_moves_the_prediction(resnet, dgx, fp32_plan):
    """On dgx-h100 itself: compute at the profile's bf16 rate, less communication, less
    memory, and the planner's own choice no slower than the fp32 plan under bf16."""
    fp32, bf16 = (models(resnet, dgx)[name] for name in ("fp32", "bf16"))
    before, after = predict(fp32, fp32_plan), predict(bf16, fp32_plan)
    rate = dgx.precision_flops["bf16"] / dgx.flops
    assert rate == pytest.approx(989 / 67, rel=1e-3)
    assert after.totals()["compute"] == pytest.approx(before.totals()["compute"] / rate,
                                                      rel=1e-12)
    assert after.totals()["communication"] < before.totals()["communication"]
    assert after.memory < before.memory
    assert plan_network(bf16).iteration_time <= after.iteration_time * (1 + 1e-12)


def test_batch_norm_statistics_stay_float32(resnet, dgx, fp32_plan):
    found = {name: predict(model, fp32_plan)
             for name, model in models(resnet, byte_machine(dgx)).items()}
    norms = [(ours, theirs) for ours, theirs in zip(found["bf16"].layers, found["fp32"].layers,
                                                    strict=True) if ours.kind == "batchnorm"]
    assert norms
    for ours, theirs in norms:
        assert ours.comm[0] == theirs.comm[0] > 0  # the forward: the statistics alone


def test_bf16_memory_counts_master_weights_and_momentum_at_four_bytes(resnet):
    plan = [LayerPlan("batch", (1, 8)) if layer.kind in ("conv", "linear", "batchnorm")
            else LayerPlan("follow") for layer in resnet.layers]
    planned = {name: plan_memory(resnet, plan, 64, 8, PRECISIONS[name])
               for name in ("fp32", "bf16")}
    fc = {name: next(c for c in p.layers if c.layer == "fc") for name, p in planned.items()}
    entries = 2048 * 1000 + 1000  # the whole linear layer on every rank of a batch plan
    assert fc["fp32"].resident["parameters"] == 4 * entries
    assert "master weights" not in fc["fp32"].resident
    assert {what: fc["bf16"].resident[what] for what in
            ("parameters", "master weights", "gradients", "momentum", "optimizer scratch")} \
        == {"parameters": 2 * entries, "master weights": 4 * entries, "gradients": 2 * entries,
            "momentum": 4 * entries, "optimizer scratch": 4 * entries}
    # per parameter: 4 + 4 + 4 + 4 = 16 bytes in fp32; 2 + 4 + 2 + 4 + 4 = 16 in bf16
    assert sum(parameter_bytes(10, BF16).values()) == sum(parameter_bytes(10, FP32).values())
    assert planned["bf16"].memory < planned["fp32"].memory


# -- profiles and timing keys ---------------------------------------------------------------

def test_a_precision_without_its_own_rate_falls_back_to_flops():
    flat = parse_machine('alpha = 1e-6\nbeta = 1e-9\nflops = 1e12\nflops_bf16 = 4e12\n', "m")
    assert flat.flops_for("bf16") == 4e12
    assert flat.flops_for("fp16") == flat.flops_for("tf32") == flat.flops_for("fp32") == 1e12


@pytest.mark.parametrize("name,fp32,peaks", [
    ("dgx-h100", 67e12, {"tf32": 495e12, "bf16": 989e12, "fp16": 989e12}),
    ("perlmutter-gpu", 19.5e12, {"tf32": 156e12, "bf16": 312e12, "fp16": 312e12})])
def test_gpu_profiles_scale_the_vendor_peaks_as_their_flops(name, fp32, peaks):
    machine = load_machine(name)
    share = machine.flops / fp32
    for precision, peak in peaks.items():
        assert machine.flops_for(precision) == pytest.approx(share * peak, rel=1e-9)


def test_tf32_and_fp32_are_timed_under_different_keys():
    keys = {name: timed_dtype(backend(name)) for name in ("fp32", "tf32", "bf16", "fp64")}
    assert keys["fp32"] == "float32" and keys["fp64"] == "float64"  # as before precisions
    assert len(set(keys.values())) == len(keys)


# -- the commands -----------------------------------------------------------------------------

def test_plan_prints_and_writes_the_precision(tmp_path, capsys):
    out = tmp_path / "bf16.plan"
    assert plan_command.run(["--net", "smallcnn", "--procs", "4", "--batch", "16", "--machine",
                             "dgx-h100", "--compute", "flops", "--precision", "bf16",
                             "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert ("precision bf16: 2-byte activations and gradients, float32 master weights"
            in text)
    assert "machine dgx-h100, precision bf16" in out.read_text()


@pytest.mark.parametrize("machine,expected", [("dgx-h100", "tf32"), ("cori-knl", "fp32")])
def test_plan_auto_is_what_a_run_on_the_profile_device_picks(capsys, machine, expected):
    assert plan_command.run(["--net", "smallcnn", "--procs", "2", "--batch", "8", "--machine",
                             machine, "--compute", "flops"]) == 0
    assert f"precision {expected}:" in capsys.readouterr().out


def test_plan_accepts_the_older_dtype_names(capsys):
    assert plan_command.run(["--net", "smallcnn", "--procs", "2", "--batch", "8", "--machine",
                             "default", "--compute", "flops", "--precision", "float64"]) == 0
    assert "precision fp64: 8-byte" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["plan", "simulate", "compare-plans"])
def test_commands_refuse_a_bad_precision_in_one_line(command):
    result = subprocess.run([sys.executable, "-m", "hpctrain", command, "--precision", "fp8",
                             "--net", "smallcnn", "--procs", "2", "--batch", "4"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "--precision" in lines[0] and "'fp8'" in lines[0]


@pytest.mark.parametrize("command", ["plan", "simulate", "compare-plans"])
def test_commands_take_precision(command):
    import importlib

    module = importlib.import_module(f"hpctrain.commands.{command.replace('-', '_')}")
    parser = module.build_parser()
    assert "--precision" in parser.format_help() and "--dtype" not in parser.format_help()
    for name in ("bf16", "fp16", "tf32", "fp32", "fp64", "float32", "float64"):
        extra = ["--net", "smallcnn", "--procs", "2", "--batch", "4"] if command == "plan" else []
        assert parser.parse_args([*extra, "--precision", name]).precision == name
