"""ONNX models imported and run under every Pr×Pc grid against one process, in float64.

Rank 0 builds two small graphs with ``onnx.helper`` (:mod:`tests.onnx_graphs`) into a directory
every rank reads: a residual net (conv → batchnorm → relu → maxpool with ceil_mode → conv →
batchnorm + the residual add → average pool with padding not counted → the view chain → gemm)
and a branching one (three branches joined by concat → batchnorm → global pooling → gemm with
transB=0 → MatMul + Add). Sizes are odd where they can be (9 rows, a batch of 5, 5 channels) so
that 2, 3 and 4 ranks cut them unevenly; every layer has at least 4 channels or features, so
that every grid of up to 4 ranks splits them.

``verify`` runs one forward and backward under model-parallel and domain-parallel plans and
the same step on one process, and compares every layer's output, gradients and running
statistics to 1e-9. Every rank starts from the file's weights (``NetSpec.weights``): the other
test gathers each parameter and buffer of a network built under a split plan and compares it
with the file's initializers on rank 0. Only ``onnx`` is needed, not onnxruntime.
"""

import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

pytest.importorskip("onnx")

from onnx import numpy_helper  # noqa: E402

from hpctrain.comm.gather import gather_to_root  # noqa: E402
from hpctrain.comm.grid import GridSet  # noqa: E402
from hpctrain.commands.verify import verify  # noqa: E402
from hpctrain.interchange.onnx_import import import_onnx  # noqa: E402
from hpctrain.layout.partition import SplitError  # noqa: E402
from hpctrain.plan.plans import PlanError, plan_from_spec  # noqa: E402
from hpctrain.run.network import Network  # noqa: E402
from tests.onnx_graphs import Graph, save  # noqa: E402

COMM = MPI.COMM_WORLD
BATCH = 5  # uneven over 2, 3 and 4 batch shards
TOLERANCE = 1e-9
# Convolutions that feed a batch norm have no bias, as in tests/mpi/test_graph_layers.py.


def residual_graph():
    g = Graph((3, 10, 9), seed=11)
    x = g.relu(g.batchnorm(g.conv(g.input, 4, 3, pads=[1] * 4, bias=False, module="conv1"),
                           module="bn1"))
    x = g.maxpool(x, 3, strides=[2, 2], ceil_mode=1)  # 10x9 → 5x4 (4x4 rounding down)
    y = g.batchnorm(g.conv(x, 4, 3, pads=[1] * 4, bias=False, module="layer1.0.conv1"),
                    module="layer1.0.bn1")
    x = g.relu(g.add(y, x, name="/layer1/layer1.0/Add"))
    x = g.avgpool(x, 3, strides=[2, 2], pads=[1] * 4, count_include_pad=0)
    return g.model(g.gemm(g.view(x), 5, module="fc"))


def branch_graph():
    g = Graph((3, 9, 9), seed=12)
    stem = g.relu(g.conv(g.input, 4, 3, pads=[1] * 4, module="stem"))
    x = g.concat(g.conv(stem, 4, 1, bias=False, module="branch1"),
                 g.conv(stem, 5, (3, 1), pads=[1, 0, 1, 0], bias=False, module="branch2"),
                 g.avgpool(stem, 3, strides=[1, 1], pads=[1] * 4, count_include_pad=0))
    x = g.global_avgpool(g.relu(g.batchnorm(x, module="bn")))
    x = g.relu(g.gemm(g.flatten(x), 6, trans_b=0, module="fc1"))
    return g.model(g.matmul(x, 4, module="fc2"))


GRAPHS = {"residual": residual_graph, "branches": branch_graph}


@pytest.fixture(scope="module")
def onnx_files():
    """name → path of each graph of :data:`GRAPHS`, written by rank 0 into one temporary
    directory every rank sees."""
    rank = COMM.Get_rank()
    directory = Path(COMM.bcast(tempfile.mkdtemp(prefix="hpctrain-onnx-") if rank == 0
                                else None, root=0))
    paths = {name: directory / f"{name}.onnx" for name in GRAPHS}
    if rank == 0:
        for name, build in GRAPHS.items():
            save(build(), paths[name])
    COMM.Barrier()
    yield paths
    COMM.Barrier()
    if rank == 0:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.mark.parametrize("spec", ["{r}x{c}", "conv=domain:{r}x{c},fc={r}x{c}"])
@pytest.mark.parametrize("graph", list(GRAPHS))
def test_imported_net_verifies_under_every_grid(comm, backend, grid_shape, onnx_files, graph,
                                                spec):
    """Model-parallel (output channels over Pr, samples over Pc) and domain-parallel (rows
    over Pr) plans of the imported net give one process's step to 1e-9."""
    net = import_onnx(onnx_files[graph]).net
    spec = spec.format(r=grid_shape[0], c=grid_shape[1])
    try:
        plan = plan_from_spec(spec, net, comm.Get_size())
    except (PlanError, SplitError) as err:
        pytest.skip(f"--grid {spec} does not fit net {graph}: {err}")
    lines = []
    with GridSet(comm) as grids:
        ok = verify(net, plan, BATCH, grids, backend, seed=2, tolerance=TOLERANCE,
                    out=lines.append)
    assert ok, "\n".join(lines) if comm.Get_rank() == 0 else "verify failed (see rank 0)"


@pytest.mark.parametrize("spec", ["{p}x1", "conv=domain:{p}x1,fc={p}x1"])
def test_every_rank_starts_from_the_files_weights(comm, backend, onnx_files, spec):
    """Under plans that split channels (model) or rows (domain) over every rank, each parameter
    and buffer gathered whole equals the file's initializer: the weights by PyTorch's names,
    batch norm's scale and shift as gamma and beta, a Gemm's (in, out) weight of transB=0 and
    a MatMul's transposed into (out, in)."""
    procs, rank = comm.Get_size(), comm.Get_rank()
    path = onnx_files["branches"]
    net = import_onnx(path).net
    plan = plan_from_spec(spec.format(p=procs), net, procs)
    with GridSet(comm) as grids:
        network = Network(net, plan, BATCH, grids, backend, seed=5)
        tensors = {p.name: gather_to_root(backend, comm, p.value, p.shape, p.box, "copy")
                   for p in network.params + network.buffers}
        split = any(tuple(b - a for a, b in p.box(rank)) != tuple(p.shape)
                    for p in network.params)
    worst, what = 0.0, ""
    if rank == 0:
        import onnx

        file = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}
        torch_name = {"gamma": "weight", "beta": "bias"}
        want = {}
        for name in tensors:
            layer, _, suffix = name.rpartition(".")
            value = file[f"{layer}.{torch_name.get(suffix, suffix)}"]
            want[name] = value.T if name in ("fc1.weight", "fc2.weight") else value
        assert want["bn.running_mean"].min() > 0.1  # not a fresh buffer's zeros
        assert want["fc1.weight"].shape == file["fc1.weight"].shape[::-1] == (6, 13)
        assert sorted(tensors) == sorted(net.param_shapes() | net.buffer_shapes())
        worst, what = max((float(np.abs(tensors[n] - want[n]).max()), n) for n in tensors)
    worst, what = comm.bcast((worst, what), root=0)
    assert worst == 0.0, f"{what} differs from the file's initializer by {worst:.2e}"
    if procs > 1:
        assert comm.allreduce(int(split)) > 0, "no parameter is split: the plan is trivial"
