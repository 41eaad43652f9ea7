"""The graph kinds of net format 2 (add, concat, batchnorm, avgpool, non-square windows) and the
pool options ``count_pad=0`` and ``ceil=1`` under every mode and Pr×Pc grid against one process,
in float64.

Each check runs one forward and backward of a small inline net under a plan and the same step on
rank 0 alone (:func:`hpctrain.commands.verify.run_step`), and compares every layer's output, input
gradients, parameter gradients and buffers (batch norm's running statistics), and the loss, to a
relative error of 1e-9. Sizes are odd on purpose (heights 7, 9, 13; batches 5 and 7; 5 or 6
channels) so that the 3- and 4-rank runs cut them unevenly. Plans give neighbouring layers
different modes and grids, so the inputs of add and concat arrive on other layouts and are moved.

Asserts are collective: rank 0 computes the verdict and every rank asserts it.
"""

import numpy as np
import pytest
from mpi4py import MPI

from hpctrain.comm.gather import gather_to_root
from hpctrain.comm.grid import GridSet
from hpctrain.commands.verify import relative_error, run_step, serial_plan, verify
from hpctrain.data.synthetic import SyntheticData
from hpctrain.layout.layout import HEIGHT_AXIS, Layout
from hpctrain.layout.partition import SplitError, factorisations
from hpctrain.model.net import load_net, parse_net
from hpctrain.plan.plans import LayerPlan, plan_from_spec
from hpctrain.run.network import Network
from hpctrain.run.optimizer import SGD
from tests.mpi.helpers import (
    block,
    check_close,
    global_random,
    local_dot,
    make_layer,
    raises_everywhere,
)

TOL = 1e-9

# conv → batchnorm → relu, a 1x3 conv without bias, batchnorm with its options, global average
# pooling, and a batchnorm on the features of a linear layer
NORM_NET = parse_net("""
input channels=3 height=7 width=5 classes=4
conv out=5 kernel=3 pad=1 bias=0
batchnorm
relu
conv out=6 kernel=1x3 pad=0x1 bias=0
batchnorm eps=1e-3 momentum=0.3
relu
avgpool kernel=global
flatten
linear out=5 bias=0
batchnorm
relu
linear out=4
""", "norm")

# a 1x7 / 7x1 pair (3 halo rows under a height split), a padded non-square average pool with a
# non-square stride, then a strided conv and global pooling
WINDOW_NET = parse_net("""
input channels=2 height=13 width=9 classes=5
conv out=4 kernel=1x7 pad=0x3 bias=0
conv out=4 kernel=7x1 pad=3x0 bias=0
batchnorm
avgpool kernel=3x2 stride=2x1 pad=1x1
relu
conv out=5 kernel=3 stride=2x1 pad=1
avgpool kernel=global
flatten
linear out=5
""", "windows")

# a residual add of three inputs: two conv branches on their own grids and the fork point r,
# which is read by a, b and the add (its gradient is the sum of three)
ADD_NET = parse_net("""
input channels=2 height=7 width=6 classes=5
conv name=stem out=4 kernel=3 pad=1
relu name=r
conv name=a out=4 kernel=3 pad=1 bias=0
batchnorm name=bna
conv name=b in=r out=4 kernel=1
add in=bna,b,r
relu
avgpool kernel=global
flatten
linear out=5
""", "add")

# Inception-like branches joined along channels: a conv, a non-square conv and an average pool
# of the stem's output (a fork of three), then batch norm on the joined tensor (replicated over
# Pr when the first branch is channel-split), and a strided conv
CONCAT_NET = parse_net("""
input channels=3 height=9 width=6 classes=4
conv name=stem out=4 kernel=3 pad=1
conv name=a out=5 kernel=3 pad=1 bias=0
conv name=b in=stem out=4 kernel=1x3 pad=0x1 bias=0
avgpool name=c in=stem kernel=3 stride=1 pad=1
concat in=a,b,c
batchnorm
relu
conv out=5 kernel=3 stride=2 pad=1
avgpool kernel=global
flatten
linear out=4
""", "concat")

# layers without weights before the first convolution: they run where it reads the input, so
# their layout follows its mode and grid (replicated for model, the height split for domain)
INPUT_FIRST_NET = parse_net("""
input channels=3 size=12 classes=5
batchnorm
relu
maxpool kernel=2
conv out=4 kernel=3 pad=1 bias=0
batchnorm
relu
flatten
linear out=5
""", "input-first")

# an average pool over the input entries alone (count_pad=0) whose edge windows hold padding,
# and a max pool rounding up (ceil=1) that adds a window along the height (7 rows: 4 windows,
# the last reading the padding ceil adds), not along the width (6 columns: 3); no ReLU before
# the max pool, so no window holds ties
POOL_NET = parse_net("""
input channels=2 height=13 width=11 classes=4
conv out=4 kernel=3 pad=1
avgpool kernel=3 stride=2 pad=1 count_pad=0
conv out=5 kernel=3 pad=1
maxpool kernel=2 stride=2 ceil=1
relu
flatten
linear out=4
""", "pools")

NETS = {net.name: net for net in (NORM_NET, WINDOW_NET, ADD_NET, CONCAT_NET, INPUT_FIRST_NET,
                                  POOL_NET)}
BATCH = 7  # uneven over 2, 3 and 4 batch shards
SEED = 3  # of the weights and the data of check_plan's step
# In these nets a layer feeding a batch norm has no bias, and a ReLU follows each batch norm
# before anything linear: else a bias (or β) gradient, or a running mean, would be zero up to
# rounding (the norm removes the mean) and a relative error of rounding noise means nothing.


def uniform_plan(net, mode, grid):
    """Every conv in ``mode`` on ``grid``, every linear layer model-parallel on ``grid``."""
    plan = []
    for layer in net.layers:
        if layer.kind == "conv":
            plan.append(LayerPlan(mode, grid))
        elif layer.kind == "linear":
            plan.append(LayerPlan("model", grid))
        else:
            plan.append(LayerPlan("follow"))
    return plan


def cycled_plans(net, procs):
    """Plans whose weighted layers cycle through the grids of ``procs`` and alternate between
    model and domain mode, from every starting grid and mode: neighbouring branches differ."""
    shapes = factorisations(procs)
    plans = []
    for offset in range(len(shapes)):
        for first_mode in (0, 1):
            plan, k = [], 0
            for layer in net.layers:
                grid = shapes[(k + offset) % len(shapes)]
                if layer.kind == "conv":
                    plan.append(LayerPlan(("model", "domain")[(k + first_mode) % 2],
                                          grid))
                    k += 1
                elif layer.kind == "linear":
                    plan.append(LayerPlan("model", grid))
                    k += 1
                else:
                    plan.append(LayerPlan("follow"))
            plans.append(plan)
    return plans


def describe(net, plan):
    return ", ".join(f"{layer.name} {p.describe()}"
                     for layer, p in zip(net.layers, plan, strict=True) if p.mode != "follow")


def step_errors(net, states, loss, reference):
    """(error, what) of every tensor of the step against the serial ``reference``."""
    serial_loss, want = reference
    found = [(relative_error(np.array([loss]), np.array([serial_loss])), "loss")]
    for layer, got, ref in zip(net.layers, states, want, strict=True):
        found.append((relative_error(got.output, ref.output), f"{layer.name} output"))
        if ref.input_grads is not None:
            if got.input_grads is None:
                found.append((float("inf"), f"{layer.name} input gradient (missing)"))
                continue
            for e, (g, w) in enumerate(zip(got.input_grads, ref.input_grads, strict=True)):
                if w is not None:
                    found.append((relative_error(g, w), f"{layer.name} input gradient {e}"))
        for name, w in ref.param_grads.items():
            found.append((relative_error(got.param_grads[name], w), f"{name} gradient"))
        for name, w in ref.buffers.items():
            found.append((relative_error(got.buffers[name], w), name))
    return found


def serial_step(net, plan, backend):
    data = SyntheticData(backend, net.input_shape, net.classes, BATCH, SEED)
    with GridSet(MPI.COMM_SELF) as grids:
        return run_step(Network(net, serial_plan(plan), BATCH, grids, backend, SEED), data)


def check_plan(comm, backend, net, plan, reference=None):
    """One step of ``net`` under ``plan`` equals one process in every tensor. Returns the serial
    reference (on rank 0) for reuse."""
    data = SyntheticData(backend, net.input_shape, net.classes, BATCH, SEED)
    with GridSet(comm) as grids:
        network = Network(net, plan, BATCH, grids, backend, SEED)
        loss, states = run_step(network, data)
    worst, what = 0.0, ""
    if comm.Get_rank() == 0:
        reference = reference or serial_step(net, plan, backend)
        errors = step_errors(net, states, loss, reference)
        worst, what = max(errors)
        if sum(name.endswith("running_var") for _, name in errors) != sum(
                layer.kind == "batchnorm" for layer in net.layers):
            worst, what = float("inf"), "the running statistics (some were not compared)"
    worst, what = comm.bcast((worst, what), root=0)
    assert worst <= TOL, (f"net {net.name} under {describe(net, plan)}: {what} differs from one "
                          f"process by {worst:.2e}")
    return reference


# -- every new kind under every mode on every grid --------------------------------------------


@pytest.mark.parametrize("mode", ["model", "domain"])
@pytest.mark.parametrize("net", ["norm", "windows", "add", "concat", "input-first", "pools"])
def test_kinds_under_every_mode_and_grid(comm, backend, grid_shape, mode, net):
    """Pr = 1 is batch mode; Pr > 1 splits output channels (model) or the height (domain)."""
    check_plan(comm, backend, NETS[net], uniform_plan(NETS[net], mode, grid_shape))


@pytest.mark.parametrize("net", ["norm", "windows", "add", "concat", "input-first", "pools"])
def test_kinds_under_mixed_plans(comm, backend, net):
    """Neighbouring layers on different grids and modes: add and concat inputs are moved (a
    channel-split branch replicated for concat, a height split kept), forks sum gradients."""
    net = NETS[net]
    reference = None
    for plan in cycled_plans(net, comm.Get_size()):
        reference = check_plan(comm, backend, net, plan, reference=reference)


def test_the_pool_options_run_on_split_rows(comm, backend):
    """Under a domain split on every rank the pools of ``pools`` take their input in row
    blocks (they are not gathered first), so the tests above run count_pad=0 and ceil=1 on
    bands with halos, the padding at the image's edges only."""
    procs = comm.Get_size()
    if procs == 1:
        pytest.skip("one process: no rows split")
    with GridSet(comm) as grids:
        network = Network(POOL_NET, uniform_plan(POOL_NET, "domain", (procs, 1)), BATCH, grids,
                          backend)
        pools = [layer for spec, layer in zip(POOL_NET.layers, network.layers, strict=True)
                 if spec.kind.endswith("pool")]
        assert len(pools) == 2
        assert all(layer.in_layout.split_axis == HEIGHT_AXIS for layer in pools)
    ceil = POOL_NET.layers[3].options
    assert ceil.ceil and ceil.ceil_pad == (1, 0)  # a window added along the height alone


def test_merge_inputs_really_move(comm, backend):
    """The mixed plans do move the inputs of add and concat (when P > 1), so the tests above
    cover moved inputs and not only identities."""
    if comm.Get_size() == 1:
        pytest.skip("one process: nothing moves")
    for net in (ADD_NET, CONCAT_NET):
        moved = False
        with GridSet(comm) as grids:
            for plan in cycled_plans(net, comm.Get_size()):
                network = Network(net, plan, BATCH, grids, backend)
                k = next(i for i, layer in enumerate(net.layers) if layer.kind in ("add",
                                                                                   "concat"))
                moved |= any(m.src != m.dst for m in network.moves[k])
        assert moved, f"net {net.name}: no mixed plan moves a merge input"


# -- adjoint tests -----------------------------------------------------------------------------


def adjoint_gap(comm, fx, dy, xs, dxs):
    """|⟨F x, y⟩ − Σₑ ⟨xₑ, Fₑᵀ y⟩| relative to the larger, summed over ranks: values may be
    replicated (then equal everywhere), gradients are partial sums, so these are the inner
    products of the whole tensors."""
    left = local_dot(comm, fx, dy)
    right = sum(local_dot(comm, x, dx) for x, dx in zip(xs, dxs, strict=True))
    return abs(left - right) / max(abs(left), abs(right))


def test_global_avgpool_adjoint_under_a_height_split(comm, backend, grid_shape):
    shape = (5, 3, 7, 5)
    rank = comm.Get_rank()
    with GridSet(comm) as grids:
        layer = make_layer("avgpool", {"kernel": "global"}, Layout(shape, grid_shape, HEIGHT_AXIS),
                           "follow", grid_shape, grids, backend)
        x_layout, y_layout = layer.in_layout, layer.out_layout
        assert y_layout.split_axis is None  # replicated over the Pr ranks of a batch group
        x_whole = global_random(shape, 11)
        x = block(backend, x_whole, x_layout, rank)
        fx = layer.forward(x, step=0)
        # dY as partial sums: a different buffer on each replica
        dy = backend.xp.asarray(global_random(y_layout.local_shape(rank), 100 + rank))
        dx = layer.backward(dy)
        gap = adjoint_gap(comm, fx, dy, [x], [dx])
        got = gather_to_root(backend, comm, fx, y_layout.shape, y_layout.box, "copy")
        dy_whole = gather_to_root(backend, comm, dy, y_layout.shape, y_layout.box, "sum")
        dx_whole = gather_to_root(backend, comm, dx, x_layout.shape, x_layout.box, "sum")
    want = x_whole.mean(axis=(2, 3), keepdims=True) if rank == 0 else None
    want_dx = (np.broadcast_to(dy_whole / (7 * 5), shape) if rank == 0 else None)
    check_close(comm, got, want, "global average pool output")
    check_close(comm, dx_whole, want_dx, "global average pool input gradient")
    assert gap < 1e-12, f"<F x, y> - <x, F^T y> relative gap {gap:.2e} on {grid_shape}"


MERGE_NET = """
input channels=2 height=9 width=4 classes=5
conv name=a out=5 kernel=3 pad=1
conv name=b in=input out={b_out} kernel=1
{merge} in=a,b
avgpool kernel=global
flatten
linear out=5
"""


@pytest.mark.parametrize("merge", ["add", "concat"])
@pytest.mark.parametrize("a_mode,b_mode", [("model", "domain"), ("domain", "model"),
                                           ("domain", "domain"), ("model", "model")])
def test_merge_adjoint_with_its_moves(comm, backend, grid_shape, merge, a_mode, b_mode):
    """F = the merge layer after the moves of its inputs, from the producers' layouts to its
    output layout: gathered F x is the serial sum / concatenation, and ⟨F x, y⟩ = ⟨x, Fᵀ y⟩."""
    procs, rank = comm.Get_size(), comm.Get_rank()
    shapes = factorisations(procs)
    other = shapes[(shapes.index(grid_shape) + 1) % len(shapes)]
    net = parse_net(MERGE_NET.format(merge=merge, b_out=5 if merge == "add" else 4), "merge")
    plan = uniform_plan(net, "model", grid_shape)
    plan[:2] = [LayerPlan(a_mode, grid_shape), LayerPlan(b_mode, other)]
    with GridSet(comm) as grids:
        network = Network(net, plan, 6, grids, backend)
        layer, moves = network.layers[2], network.moves[2]
        sources = [network.layers[p].out_layout for p in (0, 1)]
        wholes = [global_random(src.shape, 20 + e) for e, src in enumerate(sources)]
        xs = [block(backend, w, src, rank) for w, src in zip(wholes, sources, strict=True)]
        fx = layer.forward([m.forward(x) for m, x in zip(moves, xs, strict=True)], step=0)
        y_layout = layer.out_layout
        dy = backend.xp.asarray(global_random(y_layout.local_shape(rank), 200 + rank))
        dxs = [m.backward(d) for m, d in zip(moves, layer.backward(dy), strict=True)]
        gap = adjoint_gap(comm, fx, dy, xs, dxs)
        got = gather_to_root(backend, comm, fx, y_layout.shape, y_layout.box, "copy")
        dy_whole = gather_to_root(backend, comm, dy, y_layout.shape, y_layout.box, "sum")
        got_dx = [gather_to_root(backend, comm, d, src.shape, src.box, "sum")
                  for d, src in zip(dxs, sources, strict=True)]
    want = want_dx = [None, None]
    if rank == 0:
        if merge == "add":
            want, want_dx = wholes[0] + wholes[1], [dy_whole, dy_whole]
        else:
            want = np.concatenate(wholes, axis=1)
            want_dx = [dy_whole[:, :5], dy_whole[:, 5:]]
    check_close(comm, got, want, f"{merge} output")
    for e in (0, 1):
        check_close(comm, got_dx[e], want_dx[e], f"{merge} input gradient {e}")
    assert gap < 1e-12, f"{merge}: <F x, y> - <x, F^T y> relative gap {gap:.2e}"


# -- refusals ----------------------------------------------------------------------------------


def test_infeasible_plans_are_refused_on_every_rank_naming_the_layer(comm, backend, grid_shape):
    pr, pc = grid_shape
    if pr == 1 and pc == 1:
        pytest.skip("one process splits nothing")
    with GridSet(comm) as grids:
        if pr > 1:
            # a model split of a conv with fewer output channels than Pr
            net = parse_net(f"input channels=2 size=6 classes=4\nconv name=narrow out={pr - 1} "
                            f"kernel=3\nbatchnorm\nflatten\nlinear out=4\n", "narrow")
            raises_everywhere(comm, lambda: Network(
                net, uniform_plan(net, "model", grid_shape), 4 * pc, grids, backend),
                "layer narrow", "output channels", error=SplitError)
            # batch norm of the features of a channel-split conv: the channels arrive in
            # blocks of 4 features (2x2 images), not the even block split of its features
            net = parse_net(f"input channels=2 size=2 classes=4\nconv out={pr + 1} kernel=1\n"
                            f"flatten\nbatchnorm name=bnflat\nlinear out=4\n", "uneven")
            raises_everywhere(comm, lambda: Network(
                net, uniform_plan(net, "model", grid_shape), 4 * pc, grids, backend),
                "layer bnflat", error=SplitError)
        if pr > 2:  # (on two row blocks each neighbour holds every other row)
            # a domain split finer than a 7x1 window's halo allows
            net = parse_net(f"input channels=1 height={2 * pr} width=3 classes=4\n"
                            f"conv name=tall out=2 kernel=7x1 pad=3x0\nflatten\nlinear out=4\n",
                            "tall")
            raises_everywhere(comm, lambda: Network(
                net, uniform_plan(net, "domain", grid_shape), 4 * pc, grids, backend),
                "layer tall", "halo", error=SplitError)
        if pc > 1:
            # a batch smaller than Pc
            net = parse_net("input channels=2 size=4 classes=4\nconv name=first out=2 kernel=1\n"
                            "batchnorm\nflatten\nlinear out=4\n", "small")
            raises_everywhere(comm, lambda: Network(
                net, uniform_plan(net, "model", grid_shape), pc - 1, grids, backend),
                "layer first", "batch", error=SplitError)


# -- training ----------------------------------------------------------------------------------

TRAIN_BATCH, TRAIN_STEPS = 6, 3


def train(net, plan, comm, backend):
    """Losses of three SGD-with-momentum steps, then every parameter and buffer, whole on
    rank 0."""
    with GridSet(comm) as grids:
        network = Network(net, plan, TRAIN_BATCH, grids, backend, seed=4)
        data = SyntheticData(backend, net.input_shape, net.classes, TRAIN_BATCH, seed=4)
        optimizer = SGD(network.params, lr=0.05, momentum=0.9, weight_decay=1e-3)
        losses = []
        for step in range(TRAIN_STEPS):
            losses.append(network.train_step(data, step)[0])
            optimizer.step()
        tensors = {p.name: gather_to_root(backend, comm, p.value, p.shape, p.box, "copy")
                   for p in network.params + network.buffers}
    return losses, tensors


def test_residual_net_trains_like_one_process(comm, backend):
    """The shipped ``resdigits`` (blocks, batch norm, adds, global pooling) at 8x8 under mixed
    plans: three steps of SGD with momentum give the serial losses, parameters and running
    statistics."""
    net = load_net("resdigits", 8)
    plans = cycled_plans(net, comm.Get_size())
    plans = [plans[0], plans[-1]]  # two starting grids and both mode orders; keeps it quick
    reference = None
    if comm.Get_rank() == 0:
        reference = train(net, serial_plan(plans[0]), MPI.COMM_SELF, backend)
        assert any(name.endswith("running_mean") for name in reference[1])
        assert reference[0][-1] < reference[0][0]  # it learns
    for plan in plans:
        losses, tensors = train(net, plan, comm, backend)
        what = describe(net, plan)
        check_close(comm, np.array(losses), reference and np.array(reference[0]),
                    f"losses under {what}", tol=TOL)
        worst, name = 0.0, ""
        if comm.Get_rank() == 0:
            assert tensors.keys() == reference[1].keys()
            worst, name = max((relative_error(tensors[n], reference[1][n]), n) for n in tensors)
        worst, name = comm.bcast((worst, name), root=0)
        assert worst <= TOL, f"{name} after {TRAIN_STEPS} steps under {what}: error {worst:.2e}"


# -- the serial reference itself ---------------------------------------------------------------


def serial_network(net, grids, backend):
    """``net`` on one process, batch 5, seed 2 (the data the two tests below use)."""
    return Network(net, serial_plan(uniform_plan(net, "model", (1, 1))), 5, grids, backend, 2)


@pytest.mark.parametrize("net", ["add", "concat", "norm"])
def test_serial_gradients_match_finite_differences(comm, backend, net):
    """The tests above compare with the same engine on one process; this checks that engine
    against central differences of the loss, where a tensor read by several layers (add's
    r, concat's stem) must get the sum of their gradients and batch norm differentiates
    through its batch statistics. Rank 0 computes; every rank asserts."""
    net, worst, what = NETS[net], 0.0, ""
    if comm.Get_rank() == 0:
        with GridSet(MPI.COMM_SELF) as grids:
            network = serial_network(net, grids, backend)
            data = SyntheticData(backend, net.input_shape, net.classes, 5, seed=2)
            network.train_step(data, 0)
            grads = {p.name: backend.to_numpy(p.grad).copy() for p in network.params}
            rng = np.random.default_rng(0)
            h = 1e-5
            for p in network.params:
                scale = max(float(np.abs(grads[p.name]).max()), 1e-3)
                for _ in range(2):
                    idx = tuple(int(rng.integers(n)) for n in p.value.shape)
                    original = float(p.value[idx])
                    losses = []
                    for shift in (h, -h):
                        p.value[idx] = original + shift
                        losses.append(network.train_step(data, 0)[0])
                    p.value[idx] = original
                    err = abs((losses[0] - losses[1]) / (2 * h) - grads[p.name][idx]) / scale
                    worst, what = max((worst, what), (err, f"{p.name}{list(idx)}"))
    worst, what = comm.bcast((worst, what), root=0)
    assert worst < 1e-6, (f"net {net.name}: gradient of {what} off central differences by "
                          f"{worst:.1e}")


def test_serial_batchnorm_statistics_and_options(comm, backend):
    """The serial batch norm's output and running statistics from NumPy: the batch's mean and
    biased variance normalise (with ``eps``), the running statistics move by ``momentum``
    towards the mean and the unbiased variance, from 0 and 1 (as PyTorch)."""
    worst, what = 0.0, ""
    if comm.Get_rank() == 0:
        with GridSet(MPI.COMM_SELF) as grids:
            network = serial_network(NORM_NET, grids, backend)
            data = SyntheticData(backend, NORM_NET.input_shape, NORM_NET.classes, 5, seed=2)
            outputs = []
            network.train_step(data, 0, outputs)
            for k, (spec, layer) in enumerate(zip(NORM_NET.layers, network.layers,
                                                  strict=True)):
                if spec.kind != "batchnorm":
                    continue
                options = spec.options
                x, y = backend.to_numpy(outputs[k - 1]), backend.to_numpy(outputs[k])
                axes = (0, *range(2, x.ndim))
                mean, var = x.mean(axis=axes), x.var(axis=axes)
                shape = (1, -1) + (1,) * (x.ndim - 2)
                want = {"output": (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape)
                                                                    + options.eps),
                        "running_mean": options.momentum * mean,
                        "running_var": 1 - options.momentum + options.momentum * x.var(
                            axis=axes, ddof=1)}
                got = {"output": y, "running_mean": backend.to_numpy(layer.running_mean.value),
                       "running_var": backend.to_numpy(layer.running_var.value)}
                for name in want:
                    worst, what = max((worst, what), (relative_error(got[name], want[name]),
                                                      f"{layer.name} {name}"))
    worst, what = comm.bcast((worst, what), root=0)
    assert worst < 1e-12, f"{what} differs from NumPy by {worst:.1e}"


@pytest.mark.parametrize("spec", ["conv=domain:{r}x{c},fc={r}x{c}", "{r}x{c}", "shipped"])
def test_verify_passes_resdigits_under_grid_specs(comm, backend, grid_shape, spec):
    """``verify`` (what ``python -m hpctrain verify`` runs) on the shipped residual net under
    --grid specs, and under its shipped 4-rank plan."""
    procs = comm.Get_size()
    if spec == "shipped":
        if procs != 4 or grid_shape != (1, 4):
            pytest.skip("the shipped plan is for 4 ranks (run once)")
        spec = "resdigits-p4-mixed"
    net = load_net("resdigits", 8)
    plan = plan_from_spec(spec.format(r=grid_shape[0], c=grid_shape[1]), net, procs)
    lines = []
    with GridSet(comm) as grids:
        ok = verify(net, plan, 5, grids, backend, seed=1, out=lines.append)
    assert ok, "\n".join(lines) if comm.Get_rank() == 0 else "verify failed (see rank 0)"
