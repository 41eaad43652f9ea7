"""The memory estimate against hand counts of what the code keeps, and the check's refusal."""

import pytest

from hpctrain.cost.memory import MemoryRefused, check_memory
from hpctrain.layout.moves import AllGatherMove
from hpctrain.model.net import parse_net
from hpctrain.plan.planner import plan_memory
from hpctrain.plan.plans import plan_from_spec

NET = """input channels=2 size=8 classes=3
conv name=conv1 out=4 kernel=3 pad=1
relu
maxpool kernel=2
flatten
dropout p=0.5
linear name=fc out=3
"""
B = 4  # bytes per float32 entry


def planned(spec="1x1", procs=1, batch=4):
    net = parse_net(NET, "tiny")
    return plan_memory(net, plan_from_spec(spec, net, procs), batch, procs)


def layer(plan, name):
    return next(c for c in [plan.data, *plan.layers, plan.loss] if c.layer == name)


def test_parameters_count_value_gradient_momentum_and_scratch():
    plan = planned()
    conv_params = 4 * 2 * 3 * 3 + 4
    fc_params = 3 * 64 + 3
    for name, count in (("conv1", conv_params), ("fc", fc_params)):
        resident = layer(plan, name).resident
        for what in ("parameters", "gradients", "momentum", "optimizer scratch"):
            assert resident[what] == count * B


def test_saved_activations_are_what_each_layer_keeps():
    plan = planned()
    assert layer(plan, "conv1").resident["im2col columns"] == 2 * 9 * 4 * 8 * 8 * B
    relu = [c for c in plan.layers if c.kind == "relu"][0]
    assert relu.resident == {"output": 4 * 4 * 8 * 8 * B}
    pool = [c for c in plan.layers if c.kind == "maxpool"][0]
    assert pool.resident == {"maxima positions": 4 * 4 * 4 * 4}  # one byte per output
    dropout = [c for c in plan.layers if c.kind == "dropout"][0]
    assert dropout.resident == {"mask": 4 * 64 * B}
    assert layer(plan, "fc").resident["input"] == 4 * 64 * B  # dropout keeps only its mask
    assert [c for c in plan.layers if c.kind == "flatten"][0].resident == {}
    assert plan.data.resident == {"input batch": 4 * 2 * 8 * 8 * B}
    assert plan.loss.resident == {"logits and their gradient": 2 * 4 * 3 * B}


def test_conv_backward_workspace_is_the_im2col_gradient_and_padded_input_gradient():
    conv = layer(planned(), "conv1")
    cols, y = 2 * 9 * 4 * 64 * B, 4 * 4 * 64 * B
    padded = 4 * 2 * 10 * 10 * B
    # the first layer computes no input gradient: its backward is dY, its transpose and dW
    assert conv.transient == {"output and GEMM result": 2 * y, "im2col workspace": cols,
                              "padded input": padded}


def test_peak_is_every_kept_byte_plus_the_largest_transient():
    plan = planned()
    every = [plan.data, *plan.layers, plan.loss]
    assert plan.memory == sum(c.memory for c in every) + max(c.peak for c in every)
    assert plan.memory < sum(c.memory + c.peak for c in every)


def test_model_parallel_linear_splits_its_parameters_and_keeps_the_gathered_input():
    plan = planned("2x1", procs=2)
    fc = layer(plan, "fc")
    assert fc.resident["parameters"] == (2 * 64 + 2) * B  # 2 of the 3 outputs, the larger part
    assert fc.move is AllGatherMove
    assert fc.transient["redistribution buffers"] > 0 or fc.peak > 0


def test_the_check_names_the_largest_consumer_and_the_fix():
    plan = planned()
    check_memory(plan, plan.memory, "--mem-per-rank")  # exactly enough passes
    with pytest.raises(MemoryRefused) as refused:
        check_memory(plan, plan.memory - 1, "--mem-per-rank")
    message = str(refused.value)
    assert "\n" not in message
    assert "conv1 im2col columns alone takes 18 KiB" in message
    assert "--batch" in message and "--mem-per-rank" in message


def test_absurd_sizes_are_arithmetic_only():
    net = parse_net(NET.replace("size=8", "size=100000"), "huge")
    plan = plan_memory(net, plan_from_spec("1x1", net, 1), 4, 1)
    assert plan.memory > 2 ** 40
    assert plan.biggest()[:2] == ("conv1", "im2col columns")


def test_a_run_whose_process_held_more_before_says_so_instead_of_a_ratio(monkeypatch, capsys):
    """A run inside a longer-lived process (a test suite's, a notebook's) may reach no new
    high-water mark: the measured peak above the start is then 0, and the run ends with a line
    that says none was measured, not a division by zero."""
    import hpctrain.cost.memory
    from hpctrain.cli import main

    argv = ["--net", "smallcnn", "--image-size", "8", "--batch", "4", "--steps", "1",
            "--compute", "flops"]
    # a process that grew (whatever this one held before: the suite's other tests count)
    monkeypatch.setattr(hpctrain.cost.memory, "peak_resident_bytes", lambda: 2.0**40)
    assert main(argv) == 0
    measured = next(line for line in capsys.readouterr().out.splitlines()
                    if line.startswith("peak memory per rank"))
    assert " MiB measured, " in measured and "predicted (" in measured, measured
    monkeypatch.setattr(hpctrain.cost.memory, "peak_resident_bytes", lambda: 0.0)
    assert main(argv) == 0
    line = next(line for line in capsys.readouterr().out.splitlines()
                if line.startswith("peak memory per rank"))
    assert " MiB predicted, none measured (" in line, line
    assert "the process held more before this run" in line, line
