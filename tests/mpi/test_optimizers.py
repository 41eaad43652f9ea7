"""SGD, AdamW, LARS and LAMB, with global gradient clipping and with norm and bias parameters
spared, under batch, model, domain, multi-axis, input-split and grouped plans on the ranks of
the run (1–4), against PyTorch in float64 over three steps: ``torch.optim.SGD``,
``torch.optim.AdamW``, LARS and LAMB written from the papers (tests/optimizer_reference.py), and
``torch.nn.utils.clip_grad_norm_``, whose norm the run reports too. The optimizer steps as the
training loop does it: during the backward as each sum arrives where it may, else after. Then
each optimizer resumes from a checkpoint under another plan on fewer ranks and continues
exactly as the run that never stopped.

The nets: the decoder of tests/torch_reference.py (batch norm, biases, a bias-free
convolution, an ASPP module whose branches the grouped plan puts on groups of ranks) and the
small CNN for the input-channel splits.

Run with ``mpiexec -n N python -m mpi4py -m pytest tests/mpi/test_optimizers.py``, N = 1..4.
"""

import numpy as np
import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.reference

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from hpctrain.comm.gather import gather_to_root  # noqa: E402
from hpctrain.comm.grid import GridSet  # noqa: E402
from hpctrain.data.synthetic import SyntheticData  # noqa: E402
from hpctrain.device.backend import Backend  # noqa: E402
from hpctrain.plan.plans import LayerPlan, plan_from_spec  # noqa: E402
from hpctrain.run.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402
from hpctrain.run.network import Network  # noqa: E402
from tests.grouped_plans import grouped_plan  # noqa: E402
from tests.mpi.test_torch_reference import on_root  # noqa: E402
from tests.optimizer_reference import RECIPES, torch_optimizer, torch_step  # noqa: E402
from tests.torch_reference import (  # noqa: E402
    BATCH,
    MODELS,
    SEED,
    TOLERANCE,
    relative_error,
)

STEPS = 3


def _spec(spec):
    """The plan of the grid spec ``spec(P)``; where P does not divide the decoder's grouped
    transposed convolution (4 groups) into whole groups, that layer in batch mode."""
    def plan(net, procs):
        found = plan_from_spec(spec(procs), net, procs)
        names = [layer.name for layer in net.layers]
        if "grouped" in names and 4 % procs:
            found[names.index("grouped")] = LayerPlan("batch", (1, procs))
        return found
    return plan


def _multiaxis(procs):
    """Height and width at once on 4 ranks; the width alone (an axis no 1.5D mode cuts)
    elsewhere."""
    return {1: "1x1", 4: "conv=h2w2/model,fc=2x2"}.get(procs,
                                                     f"conv=w{procs}/model,fc={procs}x1")


PLANS = {  # name → (model, plan of its net on P ranks)
    "batch": ("decoder", _spec(lambda p: f"1x{p}")),
    "model": ("decoder", _spec(lambda p: f"{p}x1")),
    "domain": ("decoder", _spec(lambda p: f"conv=domain:{p}x1,fc={p}x1")),
    "multiaxis": ("decoder", _spec(_multiaxis)),
    "inputsplit": ("small_cnn", _spec(lambda p: f"conv=i{p},fc=s{p}" if p > 1 else "1x1")),
    "grouped": ("decoder", lambda net, procs: grouped_plan(net, procs, BATCH)),
}
# (plan, recipe): under every plan each optimizer that takes norms, with clipping and spared
# parameters; SGD with clipping and LARS without on the plans with the most replicas and groups
CASES = ([(plan, case) for plan in PLANS
          for case in ("adamw-clip-spared", "lars-clip-spared", "lamb-clip-spared-nobc")]
         + [(plan, case) for plan in ("inputsplit", "grouped") for case in ("sgd-clip", "lars")])


def whole(backend, comm, params, arrays):
    """Each array (a shard of its parameter) whole on rank 0, by name; None elsewhere."""
    found = {p.name: gather_to_root(backend, comm, a, p.shape, p.box, "copy")
             for p, a in zip(params, arrays, strict=True)}
    return found if comm.Get_rank() == 0 else None


class Trained:
    """hpctrain on ``comm`` under ``plan`` with ``recipe``'s optimizer, stepped as the loop
    steps it; everything gathered whole on rank 0."""

    def __init__(self, net, plan, comm, recipe):
        self.backend, self.comm, self.recipe = Backend(np, np.float64), comm, recipe
        self.grids = GridSet(comm)
        self.network = Network(net, plan, BATCH, self.grids, self.backend, SEED)
        self.data = SyntheticData(self.backend, net.input_shape, net.classes, BATCH, SEED,
                                  regression=net.regression)
        self.optimizer = recipe.hpctrain(self.network.params, self.grids.world)
        self.initial = self.weights()
        self.params, self.norms, self.batches = [], [], []

    def weights(self):
        return whole(self.backend, self.comm, self.network.params,
                     [p.weights for p in self.network.params])

    def state(self):
        return {name: whole(self.backend, self.comm, self.network.params,
                            [np.zeros(p.weights.shape) if v is None else v
                             for p, v in zip(self.network.params, values, strict=True)])
                for name, values in self.optimizer.state.items()}

    def train(self, steps):
        for step in steps:
            update = self.optimizer.during_backward(self.recipe.lr)
            self.network.train_step(self.data, step, update=update)
            if update is None:
                self.optimizer.step(self.recipe.lr)
            self.params.append(self.weights())
            self.norms.append(self.optimizer.grad_norm)
            everything = tuple((0, n) for n in (BATCH, *self.network.net.input_shape))
            self.batches.append((self.data.images(step, everything),
                                 self.data.labels(step, (0, BATCH))))
        return self

    def close(self):
        self.grids.close()


def torch_run(model, names, recipe, initial, batches):
    """(parameters after each step, clipping norm of each step) of PyTorch."""
    model = model.double().train()
    params = dict(model.named_parameters())
    with torch.no_grad():
        for ours, theirs in names.params.items():
            params[theirs].copy_(torch.from_numpy(initial[ours]))
    named = [(name, params[name]) for name in names.params.values()]
    optimizer = torch_optimizer(recipe, named)
    found, norms = [], []
    for images, labels in batches:
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(torch.from_numpy(images)), torch.from_numpy(labels)).backward()
        norms.append(torch_step(recipe, optimizer, [p for _, p in named]))
        found.append({ours: params[theirs].detach().numpy().copy()
                      for ours, theirs in names.params.items()})
    return found, norms


def really(plan_name, plan, procs):
    """Whether ``plan`` is what its name says on ``procs`` ranks (one rank: anything)."""
    entries = [e for e in plan if e.mode != "follow"]
    modes = {e.mode for e in entries}
    return procs == 1 or {
        "batch": modes == {"batch"},
        "model": "model" in modes,
        "domain": "domain" in modes,
        "multiaxis": "split" in modes,
        "inputsplit": any(e.split is not None and e.split.inputs > 1 for e in entries),
        "grouped": len({e.ranks for e in entries} - {None}) >= 2,
    }[plan_name]


@pytest.mark.parametrize("plan_name, case", CASES, ids=[f"{p}-{c}" for p, c in CASES])
def test_every_plan_matches_pytorch(comm, plan_name, case):
    model, make_plan = PLANS[plan_name]
    make_net, make_model, make_names = MODELS[model]
    net = make_net()
    recipe = RECIPES[case]
    plan = make_plan(net, comm.Get_size())
    assert really(plan_name, plan, comm.Get_size()), plan
    run = Trained(net, plan, comm, recipe).train(range(STEPS))
    run.close()

    def check():
        want, norms = torch_run(make_model(net), make_names(), recipe, run.initial, run.batches)
        errors = {f"step {k + 1} {name}": relative_error(got[name], want[k][name])
                  for k, got in enumerate(run.params) for name in want[k]}
        if recipe.clip is not None:
            errors |= {f"step {k + 1} norm": abs(a / b - 1)
                       for k, (a, b) in enumerate(zip(run.norms, norms, strict=True))}
            if not all(n > recipe.clip for n in norms):
                return f"the norms {norms} do not all clip at {recipe.clip}"
        bad = {k: e for k, e in errors.items() if not e <= TOLERANCE}
        return "" if not bad else f"{len(bad)} above {TOLERANCE:g}: {sorted(bad.items())[:6]}"

    problem = on_root(comm, check)
    assert not problem, f"{case} under {plan_name} on {comm.Get_size()} ranks: {problem}"


@pytest.mark.parametrize("case", ["sgd", "adamw-clip-spared", "lars-clip-spared", "lamb"])
def test_resume_under_another_plan_on_fewer_ranks(comm, shared_dir, case):
    """Two steps under a grouped plan on every rank, a checkpoint, a third step under a
    model-parallel plan on half the ranks: the weights and the state of the run that never
    stopped, to round-off."""
    make_net = MODELS["decoder"][0]
    net, recipe, procs = make_net(), RECIPES[case], comm.Get_size()
    path = shared_dir / "step-2.h5"
    straight = Trained(net, grouped_plan(net, procs, BATCH), comm, recipe).train(range(2))
    save_checkpoint(path, straight.network, straight.optimizer, 2, {}, comm, seed=SEED)
    straight.train([2])
    want = (straight.params[-1], straight.state())
    straight.close()
    fewer = max(1, procs // 2)
    sub = comm.Split(0 if comm.Get_rank() < fewer else 1)
    got = None
    if comm.Get_rank() < fewer:
        resumed = Trained(net, plan_from_spec(f"{fewer}x1", net, fewer), sub, recipe)
        load_checkpoint(path, resumed.network, resumed.optimizer)
        assert resumed.optimizer.steps == 2
        resumed.train([2])
        got = (resumed.params[-1], resumed.state())
        resumed.close()
    sub.Free()
    if comm.Get_rank() == 0:
        (params, state), (want_params, want_state) = got, want
        assert set(state) == set(want_state) == set(recipe.hpctrain([]).state_names)
        for name in want_params:
            assert relative_error(params[name], want_params[name]) <= 1e-12, name
            for group in state:
                assert relative_error(state[group][name], want_state[group][name]) <= 1e-12, \
                    (group, name)
    comm.Barrier()
