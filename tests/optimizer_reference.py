"""The optimizers hpctrain is compared with, in PyTorch: ``torch.optim.SGD`` and
``torch.optim.AdamW`` themselves, and LARS and LAMB written here from the papers' formulas
(no hpctrain code), with ``torch.nn.utils.clip_grad_norm_`` before the step when clipping.

Import this module only after ``pytest.importorskip("torch")``.

LARS (You, Gitman and Ginsburg 2017, with momentum as MLPerf's ResNet and timm apply it): per
tensor, τ = η·‖w‖ / (‖g‖ + λ·‖w‖ + ε) (1 where a norm is 0), v ← μ·v + τ·(g + λ·w) (v = that
at the first step), w ← w − lr·v. LAMB (You et al. 2020, Algorithm 2): m ← β1·m + (1 − β1)·g,
v ← β2·v + (1 − β2)·g², m̂ = m / (1 − β1^t), v̂ = v / (1 − β2^t) (or m, v without bias
correction), u = m̂ / (√v̂ + ε) + λ·w, w ← w − lr·(‖w‖ / ‖u‖)·u (1 where a norm is 0). Spared
parameters (``decay_norm_bias`` False: those of one axis) take no weight decay and a ratio of 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

LR, MOMENTUM, WEIGHT_DECAY = 0.1, 0.9, 1e-2


@dataclass(frozen=True)
class Recipe:
    """An optimizer and its settings, as both sides take them."""

    name: str
    lr: float = LR
    momentum: float = MOMENTUM
    weight_decay: float = WEIGHT_DECAY
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    trust: float = 0.001
    bias_correction: bool = True
    decay_norm_bias: bool = True
    clip: float | None = None

    def settings(self):
        from hpctrain.run.optimizer import OptimizerSettings

        return OptimizerSettings(self.name, self.betas, self.eps, self.trust,
                                 self.bias_correction, self.decay_norm_bias, self.clip)

    def hpctrain(self, params, comm=None):
        from hpctrain.run.optimizer import make_optimizer

        return make_optimizer(params, self.lr, self.momentum, self.weight_decay,
                              self.settings(), comm)


class Lars(torch.optim.Optimizer):
    def __init__(self, groups, lr, momentum, trust, eps):
        super().__init__(groups, {"lr": lr, "momentum": momentum, "trust": trust, "eps": eps,
                                  "weight_decay": 0.0, "adapt": True})

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            wd = group["weight_decay"]
            for p in group["params"]:
                g = p.grad
                d = g + wd * p
                if group["adapt"]:
                    w_norm, g_norm = torch.linalg.vector_norm(p), torch.linalg.vector_norm(g)
                    if w_norm > 0 and g_norm > 0:
                        d = d * (group["trust"] * w_norm / (g_norm + wd * w_norm + group["eps"]))
                state = self.state[p]
                if "momentum" not in state:
                    state["momentum"] = d.clone()
                else:
                    state["momentum"].mul_(group["momentum"]).add_(d)
                p.sub_(group["lr"] * state["momentum"])


class Lamb(torch.optim.Optimizer):
    def __init__(self, groups, lr, betas, eps, bias_correction):
        super().__init__(groups, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": 0.0,
                                  "adapt": True, "bias_correction": bias_correction})

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            (b1, b2), wd = group["betas"], group["weight_decay"]
            for p in group["params"]:
                g, state = p.grad, self.state[p]
                if not state:
                    state["t"], state["m"], state["v"] = 0, torch.zeros_like(p), \
                        torch.zeros_like(p)
                state["t"] += 1
                t, m, v = state["t"], state["m"], state["v"]
                m.mul_(b1).add_((1 - b1) * g)
                v.mul_(b2).add_((1 - b2) * g * g)
                m_hat, v_hat = m, v
                if group["bias_correction"]:
                    m_hat, v_hat = m / (1 - b1 ** t), v / (1 - b2 ** t)
                u = m_hat / (v_hat.sqrt() + group["eps"]) + wd * p
                trust = 1.0
                if group["adapt"]:
                    w_norm, u_norm = torch.linalg.vector_norm(p), torch.linalg.vector_norm(u)
                    if w_norm > 0 and u_norm > 0:
                        trust = w_norm / u_norm
                p.sub_(group["lr"] * trust * u)


def torch_optimizer(recipe: Recipe, named: list[tuple[str, torch.nn.Parameter]]):
    """The PyTorch optimizer of ``recipe`` over ``named`` (name, parameter): two groups, the
    spared parameters (of one axis, when not ``decay_norm_bias``) with no decay and no ratio."""
    spared = [p for _, p in named if not recipe.decay_norm_bias and p.dim() <= 1]
    rest = [p for _, p in named if recipe.decay_norm_bias or p.dim() > 1]
    groups = [{"params": rest, "weight_decay": recipe.weight_decay}]
    if spared:
        groups.append({"params": spared, "weight_decay": 0.0, "adapt": False})
    if recipe.name == "sgd":
        return torch.optim.SGD(groups, lr=recipe.lr, momentum=recipe.momentum, dampening=0.0,
                               nesterov=False)
    if recipe.name == "adamw":
        return torch.optim.AdamW(groups, lr=recipe.lr, betas=recipe.betas, eps=recipe.eps)
    if recipe.name == "lars":
        return Lars(groups, recipe.lr, recipe.momentum, recipe.trust, recipe.eps)
    return Lamb(groups, recipe.lr, recipe.betas, recipe.eps, recipe.bias_correction)


def torch_step(recipe: Recipe, optimizer, params) -> float | None:
    """Clip (when the recipe does; the norm before clipping) and step."""
    norm = None
    if recipe.clip is not None:
        norm = float(torch.nn.utils.clip_grad_norm_(params, recipe.clip))
    optimizer.step()
    return norm


# one recipe per optimizer and option worth telling apart
RECIPES = {
    "sgd": Recipe("sgd"),
    "sgd-clip": Recipe("sgd", clip=0.05),
    "sgd-spared": Recipe("sgd", decay_norm_bias=False),
    "adamw": Recipe("adamw", lr=0.01, weight_decay=0.05),
    "adamw-clip-spared": Recipe("adamw", lr=0.01, weight_decay=0.05, clip=0.05,
                                decay_norm_bias=False),
    "lars": Recipe("lars", lr=2.0, trust=0.02),
    "lars-clip-spared": Recipe("lars", lr=2.0, trust=0.02, clip=0.05, decay_norm_bias=False),
    "lamb": Recipe("lamb", lr=0.01),
    "lamb-clip-spared-nobc": Recipe("lamb", lr=0.01, betas=(0.8, 0.99), clip=0.05,
                                    decay_norm_bias=False, bias_correction=False),
}
