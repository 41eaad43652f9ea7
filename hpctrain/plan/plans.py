"""Per-layer plans and the grid specs that produce them.

A plan gives each layer of a net, in the net's order, a :class:`LayerPlan`: a mode and a Pr×Pc
grid. The planner's candidates for a layer are plan entries too.

- ``batch``: Pr = 1; weights replicated, batch split over all P.
- ``model``: Pr splits output channels/features (1.5D), Pc the batch.
- ``domain``: Pr splits the image height, or a volume's depth (halo exchange), Pc the batch
  (conv and pooling only).
- ``replicated``: each of the Pr ranks computes the whole layer, Pc splits the batch (linear
  only: a layer with fewer outputs than Pr, a regression head).
- ``follow``: layers without weights (element-wise, batch norm, pooling, flatten, add, concat)
  run on the layout of their first input.

Grid specs (``--grid``):

- ``RxC``: every conv and linear layer in model mode on R×C (``1xP`` is pure batch).
- ``conv=SPEC,fc=SPEC``: per kind; SPEC is ``RxC``, ``domain:RxC`` (conv) or
  ``replicated:RxC`` (fc). Deep in a net the image may be too short to cut into R row blocks (a
  ResNet's last stage at a small --image-size): a convolution whose height cannot take
  ``domain:RxC`` runs ``model`` on the same grid instead; a linear layer with fewer than R
  outputs runs ``replicated``. The plan printed at start-up shows it.
- a plan file path: one line per weighted layer, ``NAME MODE RxC`` (other lines may say
  ``NAME follow``); ``#`` comments. :func:`write_plan` writes this format.
- a shipped plan's name (``hpctrain/inputs/plans/NAME.plan``), e.g. ``smallcnn-p4-mixed``.

Nothing odd passes silently: a kind given twice in a spec, a plan line for a layer the net lacks
or for a layer already given, and words after the grid are refused, each in one line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib.resources.abc import Traversable
from pathlib import Path

from hpctrain.errors import UserError, shown
from hpctrain.io.files import replace_atomically
from hpctrain.io.locations import shipped_names
from hpctrain.io.textfile import existing_file, read_text, shipped_file
from hpctrain.layout.layout import Layout
from hpctrain.layout.partition import SplitError
from hpctrain.model.kinds import KINDS
from hpctrain.model.net import NetSpec

MODES = ("batch", "model", "domain", "replicated", "follow")
MARKER = "# hpctrain plan"  #: the first line of every plan file hpctrain writes
# the --grid keys (conv=, fc=) and the weighted kinds they plan
KINDS_BY_GRID_KEY = {kind.grid_key: kind for kind in KINDS.values() if kind.grid_key}
_GRID = re.compile(r"([0-9]+)x([0-9]+)", re.ASCII)


class PlanError(UserError):
    """A grid spec or plan file that cannot be used."""


@dataclass(frozen=True)
class LayerPlan:
    """One layer's mode and Pr×Pc grid (``follow``: none of its own). A plan is a list of these,
    one per layer in the net's order: the entry needs no name."""

    mode: str
    grid: tuple[int, int] = (1, 1)

    def __post_init__(self) -> None:
        if self.mode in ("model", "domain", "replicated") and self.grid[0] == 1:
            object.__setattr__(self, "mode", "batch")  # Pr = 1 splits nothing but the batch

    def describe(self) -> str:
        return "follow" if self.mode == "follow" else f"{self.mode} {self.grid[0]}x{self.grid[1]}"


def _parse_grid(text: str, procs: int, where: str) -> tuple[int, int]:
    match = _GRID.fullmatch(text.strip())
    if not match:
        raise PlanError(f"{where}: {shown(text)} is not a grid; write RxC, e.g. 2x2")
    if max(len(group.lstrip("0")) for group in match.groups()) > 12:  # int() takes < 4300
        raise PlanError(f"{where}: grid {shown(text)} needs far more than the {procs} processes "
                        f"launched; choose R and C with R*C = {procs}")
    pr, pc = int(match.group(1)), int(match.group(2))
    if pr < 1 or pc < 1 or pr * pc != procs:
        raise PlanError(f"{where}: grid {pr}x{pc} needs {pr * pc} processes but {procs} were "
                        f"launched; choose R and C with R*C = {procs}")
    return pr, pc


def _key_spec(text: str, key: str, procs: int) -> tuple[str, tuple[int, int]]:
    mode, _, grid = text.rpartition(":")
    mode = mode or "model"
    if mode not in ("model", "domain", "replicated"):
        raise PlanError(f"--grid {key}={shown(text)}: unknown mode {shown(mode)}; use RxC, "
                        f"domain:RxC or replicated:RxC")
    if mode not in KINDS_BY_GRID_KEY[key].modes:
        raise PlanError(f"--grid {key}={shown(text)}: {KINDS_BY_GRID_KEY[key].name} layers "
                        f"cannot be {mode}-parallel; use {key}=RxC")
    return mode, _parse_grid(grid, procs, f"--grid {key}={shown(text)}")


def plan_from_spec(spec: str, net: NetSpec, procs: int) -> list[LayerPlan]:
    """The per-layer plan a ``--grid`` value asks for, on ``procs`` processes."""
    spec = spec.strip()
    if spec == "auto":
        raise PlanError("--grid auto needs the planner, which this build does not include; "
                        "give RxC, conv=SPEC,fc=SPEC or a plan file")
    if _GRID.fullmatch(spec):
        grid = _parse_grid(spec, procs, "--grid")
        return [LayerPlan(_fitting("model", net, k, grid), grid) if KINDS[l.kind].weighted
                else LayerPlan("follow") for k, l in enumerate(net.layers)]
    if "=" in spec:
        by_key: dict[str, tuple[str, tuple[int, int]]] = {}
        for part in spec.split(","):
            key, _, value = part.partition("=")
            if key not in KINDS_BY_GRID_KEY:
                raise PlanError(f"--grid: unknown layer kind {shown(key)} in {shown(spec)}; "
                                f"use {'= and '.join(KINDS_BY_GRID_KEY)}=")
            if key in by_key:
                raise PlanError(f"--grid {shown(spec)} gives {key}= twice; give each of conv= "
                                f"and fc= once")
            by_key[key] = _key_spec(value, key, procs)
        plans = []
        for k, layer in enumerate(net.layers):
            key = KINDS[layer.kind].grid_key
            if not key:
                plans.append(LayerPlan("follow"))
            elif key not in by_key:
                raise PlanError(f"--grid {shown(spec)} gives no grid for {key} layers "
                                f"(layer {layer.name}); add {key}=RxC")
            else:
                mode, grid = by_key[key]
                plans.append(LayerPlan(_fitting(mode, net, k, grid), grid))
        return plans
    path = existing_file(spec)
    if path is not None:
        return read_plan(path, net, procs)
    resource = shipped_file("plans", spec, ".plan")
    if resource is None:
        raise PlanError(f"--grid {shown(spec)} is not RxC, conv=…,fc=…, auto, an existing plan "
                        f"file or a shipped plan ({', '.join(shipped_names('plans', '.plan'))})")
    return read_plan(resource, net, procs)


def _fitting(mode: str, net: NetSpec, k: int, grid: tuple[int, int]) -> str:
    """``mode`` for layer ``k`` on ``grid``, or its kind's fallback where its sizes cannot
    take it (:attr:`~hpctrain.model.kinds.base.Kind.fallbacks`): a convolution whose height
    cannot be cut into Pr row blocks (each window taking halo rows from direct neighbours
    only) runs ``model``; a linear layer with fewer outputs than Pr runs ``replicated``."""
    spec, kind = net.layers[k], KINDS[net.layers[k].kind]
    fallback = kind.fallbacks.get(mode)
    if grid[0] == 1 or fallback is None:
        return mode
    batch = grid[1]  # the batch does not matter here: the smallest that splits
    fed = (Layout((batch, *net.in_shapes(k)[0]), grid),)
    inputs, output = kind.layouts(spec, fed, (batch, *net.out_shapes[k]), mode, grid)
    try:
        kind.check(spec, inputs, output)
    except SplitError:
        return fallback
    return mode


def read_plan(path: Path | Traversable, net: NetSpec, procs: int) -> list[LayerPlan]:
    """Read a plan file written by :func:`write_plan` (or by hand), or a shipped plan.

    Refused, each in one line: a line that is not ``NAME MODE RxC`` or ``NAME follow``, a layer
    the net lacks, a layer given twice, a ``batch`` grid with R > 1, a weighted layer without
    a grid and a mode the layer cannot take.
    """
    name = shown(str(path), quoted=False)
    known = {l.name for l in net.layers}
    entries: dict[str, LayerPlan] = {}
    for number, raw in enumerate(read_text(path, PlanError, "plan file").splitlines(), start=1):
        words = raw.split("#", 1)[0].split()
        if not words:
            continue
        where = f"{name}, line {number}"
        size = 2 if len(words) > 1 and words[1] == "follow" else 3
        if len(words) != size or words[1] not in MODES:
            raise PlanError(f"{where}: expected 'NAME MODE RxC' with MODE one of "
                            f"{', '.join(MODES[:-1])}, or 'NAME follow', got {shown(raw.strip())}")
        layer, mode = words[0], words[1]
        if layer not in known:
            raise PlanError(f"{where}: layer {shown(layer)} is not in net "
                            f"{shown(net.name, quoted=False)}")
        if layer in entries:
            raise PlanError(f"{where}: layer {shown(layer)} is given twice; give each layer one "
                            f"line")
        if mode == "follow":
            entries[layer] = LayerPlan(mode)
            continue
        grid = _parse_grid(words[2], procs, where)
        if mode == "batch" and grid[0] != 1:
            raise PlanError(f"{where}: mode batch splits only the batch, so its grid is 1x{procs}"
                            f", not {grid[0]}x{grid[1]}; or use model {grid[0]}x{grid[1]}")
        entries[layer] = LayerPlan(mode, grid)
    plans = []
    for layer in net.layers:
        entry = entries.get(layer.name, LayerPlan("follow"))
        kind = KINDS[layer.kind]
        if kind.weighted and entry.mode == "follow":
            raise PlanError(f"{name}: no grid for layer {layer.name} ({layer.kind})")
        if not kind.weighted and entry.mode != "follow":
            raise PlanError(f"{name}: layer {layer.name} ({layer.kind}) follows the layer "
                            f"feeding it; write '{layer.name} follow'")
        if entry.mode not in ("batch", "follow", *kind.modes):
            raise PlanError(f"{name}: layer {layer.name} ({layer.kind}) cannot be "
                            f"{entry.mode}-parallel; it takes batch or "
                            f"{' or '.join(kind.modes)}")
        plans.append(entry)
    return plans


def plan_text(net: NetSpec, plans: list[LayerPlan]) -> str:
    """``plans`` of ``net``'s layers in the plan-file format, one ``NAME MODE RxC`` (or ``NAME
    follow``) per line."""
    return "\n".join(f"{layer.name} {p.describe()}"
                     for layer, p in zip(net.layers, plans, strict=True))


def write_plan(path: Path, net: NetSpec, plans: list[LayerPlan], header: str = "") -> None:
    """Write ``plans`` of ``net``'s layers to ``path`` (atomically, creating its directory)
    with ``header`` as comments. The first line starts with :data:`MARKER`; an existing file
    at ``path`` is replaced only when it is a plan file written so (:func:`is_plan_file`)."""
    lines = [f"# {line}" for line in header.splitlines()]
    if not lines or not lines[0].startswith(MARKER):
        lines.insert(0, MARKER)
    lines.append("# layer  mode  grid(RxC: R splits model or height, C splits the batch)")
    text = "\n".join(lines) + "\n" + plan_text(net, plans) + "\n"
    replace_atomically(path, lambda tmp: tmp.write_text(text), ours=is_plan_file)


def is_plan_file(path: Path) -> bool:
    """Whether ``path`` is a plan file hpctrain wrote: its first line starts with
    :data:`MARKER`."""
    try:
        with open(path, "rb") as file:
            return file.read(len(MARKER)) == MARKER.encode()
    except OSError:
        return False
