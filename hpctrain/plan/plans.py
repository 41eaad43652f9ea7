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
- ``conv=SPEC,fc=SPEC``: per kind; SPEC is ``RxC``, ``domain:RxC`` (conv),
  ``replicated:RxC`` (fc) or a degree per axis (``h2w2``, :func:`parse_split`). Deep in a net
  the image may be too short to cut into R row blocks (a ResNet's last stage at a small
  --image-size): a convolution whose height cannot take ``domain:RxC`` runs ``model`` on the
  same grid instead; a linear layer with fewer than R outputs runs ``replicated``. The plan
  printed at start-up shows it, and ``plan`` says so in one line per layer
  (:func:`plan_and_fallbacks`). A degree per axis names exactly the split wanted: a layer whose
  sizes cannot take it is refused, naming the axis, its size and the degree, unless the spec
  asks for the fallback after a ``/`` (``conv=h2w2/model``, ``fc=n2c8/replicated``); it is
  never replaced silently by another mode.
- a plan file path: one line per weighted layer, ``NAME MODE RxC`` (other lines may say
  ``NAME follow``); ``#`` comments. :func:`write_plan` writes this format. A weighted layer may
  run on a group of ranks, a block of the P: ``NAME MODE RxC ranks A-B`` with R·C = B − A + 1
  (the layers without weights after it follow it there); the ranks outside hold nothing of it
  (see :mod:`hpctrain.plan.placement` for where the layers that join groups run).
- a shipped plan's name (``hpctrain/inputs/plans/NAME.plan``), e.g. ``smallcnn-p4-mixed``.

Nothing odd passes silently: a kind given twice in a spec, a plan line for a layer the net lacks
or for a layer already given, and words after the grid are refused, each in one line.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from importlib.resources.abc import Traversable
from pathlib import Path

from hpctrain.errors import UserError, shown, shown_path
from hpctrain.io.files import replace_atomically
from hpctrain.io.locations import shipped_names
from hpctrain.io.textfile import existing_file, read_text, shipped_file
from hpctrain.layout.layout import Layout, Split, axis_letters
from hpctrain.layout.partition import SplitError
from hpctrain.model.kinds import KINDS
from hpctrain.model.kinds.base import Kind
from hpctrain.model.net import NetSpec

MODES = ("batch", "model", "domain", "replicated", "split", "follow")
MARKER = "# hpctrain plan"  #: the first line of every plan file hpctrain writes
# the --grid keys (conv=, fc=) and the weighted kinds they plan
# the first kind of each key: a transposed convolution is split by conv=, as a convolution is
KINDS_BY_GRID_KEY: dict[str, Kind] = {}
for _kind in KINDS.values():
    if _kind.grid_key:
        KINDS_BY_GRID_KEY.setdefault(_kind.grid_key, _kind)
_GRID = re.compile(r"([0-9]+)x([0-9]+)", re.ASCII)


class PlanError(UserError):
    """A grid spec or plan file that cannot be used."""


@dataclass(frozen=True)
class LayerPlan:
    """One layer's split: a 1.5D mode and Pr×Pc grid, or (mode ``split``) a degree for each
    axis of its output (``follow``: none of its own). A plan is a list of these, one per layer
    in the net's order: the entry needs no name.

    A split that is one of the 1.5D modes is made that mode (``n=2,c=2`` on an image is
    ``model 2x2``): the modes are names of special cases of the one split."""

    mode: str
    grid: tuple[int, int] = (1, 1)
    split: Split | None = None  # mode split: the degrees
    ranks: tuple[int, int] | None = None  # (first, size) of its group; None: every rank

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if self.split is not None:
            set_(self, "grid", self.split.grid)
            set_(self, "mode", self.split.mode)
            if self.mode != "split":
                set_(self, "split", None)
        if self.mode in ("model", "domain", "replicated") and self.grid[0] == 1:
            set_(self, "mode", "batch")  # Pr = 1 splits nothing but the batch
        # hashed once: a search looks its choices up in dictionaries millions of times
        set_(self, "_hash", hash((self.mode, self.grid, self.split, self.ranks)))

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple:
        """Rebuilt from its fields, so that another process hashes it as its own strings."""
        return LayerPlan, (self.mode, self.grid, self.split, self.ranks)

    def split_of(self, ndim: int) -> Split | None:
        """The split of an output of ``ndim`` axes under this entry (None: ``follow``)."""
        if self.mode == "follow":
            return None
        if self.split is not None:
            return self.split
        return Split.of_mode(self.mode, self.grid, ndim)

    def describe(self) -> str:
        if self.mode == "follow":
            return "follow"
        if self.split is not None:
            text = f"split {self.split.text()}"
        else:
            text = f"{self.mode} {self.grid[0]}x{self.grid[1]}"
        return text + (f" {ranks_text(self.ranks)}" if self.ranks is not None else "")

    def on_ranks(self, ranks: tuple[int, int] | None) -> LayerPlan:
        """This entry on the group ``ranks`` (first, size), or on every rank for None."""
        return LayerPlan(self.mode, self.grid, self.split, ranks)


FOLLOW = LayerPlan("follow")
"""The entry of a layer with no split of its own, one for every plan (entries are immutable,
and a search fills whole plans with it)."""


def ranks_text(ranks: tuple[int, int]) -> str:
    """``ranks A-B``: a plan file's words for the group (first, size)."""
    first, size = ranks
    return f"ranks {first}-{first + size - 1}"


_RANKS = re.compile(r"([0-9]{1,12})-([0-9]{1,12})", re.ASCII)


def parse_ranks(text: str, procs: int, where: str, layer: str) -> tuple[int, int] | None:
    """(first, size) of the group ``A-B`` names, or None when it is every rank; refused in one
    line naming ``where`` and the layer."""
    match = _RANKS.fullmatch(text)
    if not match:
        raise PlanError(f"{where}: layer {layer}: {shown(text)} is not a block of ranks; write "
                        f"ranks A-B, e.g. ranks 0-{max(procs // 2 - 1, 0)}")
    first, last = int(match.group(1)), int(match.group(2))
    if last < first or last >= procs:
        raise PlanError(f"{where}: layer {layer}: ranks {first}-{last} are not a block of the "
                        f"ranks 0-{procs - 1} launched; write A-B with A <= B <= {procs - 1}")
    return None if (first, last) == (0, procs - 1) else (first, last - first + 1)


def _parse_grid(text: str, procs: int, where: str, group: str = "") -> tuple[int, int]:
    """The grid ``RxC`` of ``procs`` ranks, those launched or (``group``, e.g. "ranks 0-3")
    a group's."""
    have = f"{group} are {procs}" if group else f"{procs} were launched"
    match = _GRID.fullmatch(text.strip())
    if not match:
        raise PlanError(f"{where}: {shown(text)} is not a grid; write RxC, e.g. 2x2")
    if max(len(group.lstrip("0")) for group in match.groups()) > 12:  # int() takes < 4300
        raise PlanError(f"{where}: grid {shown(text)} needs far more than the {procs} processes "
                        f"{'of ' + group if group else 'launched'}; "
                        f"choose R and C with R*C = {procs}")
    pr, pc = int(match.group(1)), int(match.group(2))
    if pr < 1 or pc < 1 or pr * pc != procs:
        raise PlanError(f"{where}: grid {pr}x{pc} needs {pr * pc} processes but {have}; "
                        f"choose R and C with R*C = {procs}")
    return pr, pc


_DEGREES = re.compile(r"(?:[a-z]=?[0-9]+,?)+", re.ASCII)
_DEGREE = re.compile(r"([a-z])=?([0-9]+)", re.ASCII)


def parse_split(text: str, ndim: int, procs: int, where: str, layer: str, group: str = ""
                ) -> Split:
    """The split ``text`` gives a layer whose output has ``ndim`` axes: a degree per axis
    letter, ``n2h2w2`` or ``n=2,c=1,h=2,w=2`` (``n`` batch, ``c`` channels or features, ``d``
    ``h`` ``w`` the spatial axes, ``r`` replicas), an axis not named being 1 and ``n``, when
    not named, what the others leave of ``procs``. A conv or linear layer may also split its
    input channels: ``i=Q`` summed by an all-reduce, ``s=Q`` by a reduce-scatter into the
    output's channels; ``i`` written before ``c`` puts its digit outside the channels'
    (:class:`~hpctrain.layout.layout.Split`). Refused in one line, naming ``where``."""
    letters = axis_letters(ndim)
    if not _DEGREES.fullmatch(text):
        raise PlanError(f"{where}: {shown(text)} is not a split; write a degree per axis, e.g. "
                        f"n=2,h=2,w=2 (axes {', '.join(letters)}, r for replicas, i or s for "
                        f"input channels)")
    found: dict[str, int] = {}
    for letter, digits in _DEGREE.findall(text):
        if letter not in letters + "ris":
            raise PlanError(f"{where}: layer {layer} has no axis {shown(letter)}: its output "
                            f"has axes {', '.join(letters)} (and r for replicas, i or s for "
                            f"input channels)")
        if letter in found:
            raise PlanError(f"{where}: axis {letter} is given twice in {shown(text)}")
        if len(digits.lstrip("0")) > 12 or int(digits) < 1:
            raise PlanError(f"{where}: degree {letter}={digits} must be from 1 to {procs}")
        found[letter] = int(digits)
    if "i" in found and "s" in found:
        raise PlanError(f"{where}: {shown(text)} gives both i= and s=; the input channels are "
                        f"summed one way: i= (all-reduce) or s= (reduce-scatter)")
    order = list(found)
    inputs_letter = "s" if "s" in found else "i"
    outer = "c" in found and inputs_letter in found and (
        order.index(inputs_letter) < order.index("c"))
    if outer and inputs_letter == "s" and found["c"] > 1:
        raise PlanError(f"{where}: s={found['s']} before c= in {shown(text)}: a reduce-scatter "
                        f"leaves each rank part of its own channels, so its digit is the inner "
                        f"one; write c= before s=, or use i=")
    rest = math.prod(d for letter, d in found.items() if letter != "n")
    if "n" not in found and procs % rest == 0:
        found["n"] = procs // rest
    degrees = tuple(found.get(letter, 1) for letter in letters)
    split = Split(degrees, found.get("r", 1), found.get(inputs_letter, 1), outer,
                  inputs_letter == "s")
    if split.procs != procs:
        raise PlanError(f"{where}: split {split.text()} needs {split.procs} processes but "
                        f"{f'{group} are {procs}' if group else f'{procs} were launched'}; "
                        f"make the degrees multiply to {procs}")
    return split


def _key_spec(text: str, key: str, procs: int) -> tuple[str, tuple[int, int], str | None]:
    """The (mode, grid, fallback) a ``--grid KEY=`` value asks for.

    A split by axes gives ("split", (0, 0), fallback), the degrees being read per layer
    (:func:`parse_split`) and the fallback the mode written after ``/``, or None where none is
    asked for (a layer that cannot take the split is then refused). A 1.5D mode's fallback is
    its kind's (:attr:`~hpctrain.model.kinds.base.Kind.fallbacks`), or None."""
    kind = KINDS_BY_GRID_KEY[key]
    degrees, slash, asked = text.partition("/")
    if _DEGREES.fullmatch(degrees) and not _GRID.fullmatch(degrees):
        if slash and asked != kind.fallbacks["split"]:
            raise PlanError(f"--grid {key}={shown(text)}: a {kind.name} layer that cannot take "
                            f"a split falls back to {kind.fallbacks['split']} only; write "
                            f"{key}={degrees}/{kind.fallbacks['split']}, or {key}={degrees} "
                            f"to refuse it")
        return "split", (0, 0), asked or None
    if slash:
        raise PlanError(f"--grid {key}={shown(text)}: only a degree per axis takes "
                        f"/{shown(asked, quoted=False)} (e.g. {key}=h2w2/"
                        f"{kind.fallbacks['split']}); RxC and {key}=MODE:RxC fall back by "
                        f"themselves")
    mode, _, grid = text.rpartition(":")
    if not mode and not _GRID.fullmatch(grid.strip()):
        # neither form: name both, since a slip in either (h-2, 2by2) lands here
        other = next(m for m in kind.modes if m != "model")
        example = "h2w2" if key == "conv" else "c2"
        raise PlanError(f"--grid {key}={shown(text)}: {shown(text)} is neither a grid nor a "
                        f"split; write RxC (e.g. 2x2), {other}:RxC or a degree per axis "
                        f"(e.g. {example}: letters n, c, d, h, w, r, i or s, each with a "
                        f"whole number)")
    mode = mode or "model"
    if mode not in ("model", "domain", "replicated"):
        raise PlanError(f"--grid {key}={shown(text)}: unknown mode {shown(mode)}; use RxC, "
                        f"domain:RxC, replicated:RxC or a degree per axis such as n2h2w2")
    if mode not in kind.modes:
        raise PlanError(f"--grid {key}={shown(text)}: {kind.name} layers "
                        f"cannot be {mode}-parallel; use {key}=RxC")
    return mode, _parse_grid(grid, procs, f"--grid {key}={shown(text)}"), kind.fallbacks.get(mode)


def plan_from_spec(spec: str, net: NetSpec, procs: int) -> list[LayerPlan]:
    """The per-layer plan a ``--grid`` value asks for, on ``procs`` processes."""
    return plan_and_fallbacks(spec, net, procs)[0]


def plan_and_fallbacks(spec: str, net: NetSpec, procs: int) -> tuple[list[LayerPlan], list[str]]:
    """The per-layer plan a ``--grid`` value asks for, on ``procs`` processes, and one line for
    each layer that runs a fallback because its sizes cannot take the split asked (see the
    module's text)."""
    spec = spec.strip()
    if spec == "auto":
        raise PlanError("--grid auto needs the planner, which this build does not include; "
                        "give RxC, conv=SPEC,fc=SPEC or a plan file")
    fell_back: list[str] = []
    if _GRID.fullmatch(spec):
        grid = _parse_grid(spec, procs, "--grid")
        where = f"--grid {spec}"
        return [_fitting(LayerPlan("model", grid), None, KINDS[l.kind].fallbacks.get("model"),
                         net, k, where, fell_back) if KINDS[l.kind].weighted
                else LayerPlan("follow") for k, l in enumerate(net.layers)], fell_back
    if "=" in spec:
        by_key: dict[str, tuple[str, tuple[int, int], str | None, str]] = {}
        for part in spec.split(","):
            key, _, value = part.partition("=")
            if key not in KINDS_BY_GRID_KEY:
                raise PlanError(f"--grid: unknown layer kind {shown(key)} in {shown(spec)}; "
                                f"use {'= and '.join(KINDS_BY_GRID_KEY)}=")
            if key in by_key:
                raise PlanError(f"--grid {shown(spec)} gives {key}= twice; give each of conv= "
                                f"and fc= once")
            by_key[key] = (*_key_spec(value, key, procs), value)
        plans = []
        for k, layer in enumerate(net.layers):
            key = KINDS[layer.kind].grid_key
            if not key:
                plans.append(LayerPlan("follow"))
                continue
            if key not in by_key:
                raise PlanError(f"--grid {shown(spec)} gives no grid for {key} layers "
                                f"(layer {layer.name}); add {key}=RxC")
            mode, grid, fallback, value = by_key[key]
            where = f"--grid {key}={shown(value)}"
            if mode == "split":
                ndim = 1 + len(net.out_shapes[k])
                split = parse_split(value.partition("/")[0], ndim, procs, where, layer.name)
                entry, asked = LayerPlan(mode, split=split), f"split {split.text()}"
            else:
                entry, asked = LayerPlan(mode, grid), None
            plans.append(_fitting(entry, asked, fallback, net, k, where, fell_back))
        return plans, fell_back
    path = existing_file(spec)
    if path is not None:
        return read_plan(path, net, procs), []
    resource = shipped_file("plans", spec, ".plan")
    if resource is None:
        raise PlanError(f"--grid {shown(spec)} is not RxC, conv=…,fc=…, auto, an existing plan "
                        f"file or a shipped plan ({', '.join(shipped_names('plans', '.plan'))})")
    return read_plan(resource, net, procs), []


def _refusal(entry: LayerPlan, net: NetSpec, k: int) -> str | None:
    """Why layer ``k``'s sizes cannot take ``entry`` (its kind's check, without the layer's
    name in front), or None when they can. The batch does not matter here: the smallest that
    splits is used."""
    spec, kind = net.layers[k], KINDS[net.layers[k].kind]
    grid = entry.grid
    batch = grid[1]
    fed = (Layout((batch, *net.in_shapes(k)[0]), grid),)
    out_shape = (batch, *net.out_shapes[k])
    inputs, output = kind.layouts(spec, fed, out_shape, entry.split_of(len(out_shape)))
    try:
        kind.check(spec, inputs, output)
    except SplitError as err:
        return str(err).removeprefix(f"layer {spec.name}: ")
    return None


def _fitting(entry: LayerPlan, asked: str | None, fallback: str | None, net: NetSpec, k: int,
             where: str, fell_back: list[str]) -> LayerPlan:
    """``entry`` for layer ``k``, or ``fallback`` on the same grid where its sizes cannot take
    it, with a line saying so added to ``fell_back``: a convolution whose height (or any
    spatial axis a split cuts) cannot be cut into its blocks (each window taking halo rows from
    direct neighbours only) runs ``model``; a linear layer with fewer outputs than Pr runs
    ``replicated``. ``asked``: the split by axes as written (``entry`` may be a 1.5D mode it
    names), None for a 1.5D mode asked as such.

    Refused, naming ``where`` and what was asked, where a split by axes has no fallback or the
    fallback cannot run either; a 1.5D mode without one is left as it is, for the check that
    sees the batch to refuse."""
    name = net.layers[k].name
    if entry.mode == "batch" or asked is None and fallback is None:
        return entry
    refused = _refusal(entry, net, k)
    if refused is None:
        return entry
    asked = asked or entry.describe()
    if fallback is None:  # a split by axes, and no fallback asked for: never another mode
        other = KINDS[net.layers[k].kind].fallbacks["split"]
        raise SplitError(f"{where}: layer {name} cannot take {asked}: {refused}, or write "
                         f"/{other} after the degrees to run {other} where they do not fit")
    ran = LayerPlan(fallback, entry.grid)
    also = _refusal(ran, net, k)
    if also is not None:
        raise SplitError(f"{where}: layer {name} cannot take {asked} ({refused}) nor its "
                         f"fallback {ran.describe()} ({also})")
    fell_back.append(f"layer {name} runs {ran.describe()}, not {asked}: {refused}")
    return ran


def read_plan(path: Path | Traversable, net: NetSpec, procs: int) -> list[LayerPlan]:
    """Read a plan file written by :func:`write_plan` (or by hand), or a shipped plan.

    Refused, each in one line: a line that is not ``NAME MODE RxC`` or ``NAME follow``, a layer
    the net lacks, a layer given twice, a ``batch`` grid with R > 1, a weighted layer without
    a grid and a mode the layer cannot take.
    """
    return parse_plan(read_text(path, PlanError, "plan file"), str(path), net, procs)


def parse_plan(text: str, source: str, net: NetSpec, procs: int) -> list[LayerPlan]:
    """The plan in plan-file ``text`` read from ``source`` (a path, or where else the text was
    kept, for messages); refused as :func:`read_plan` says."""
    name = shown_path(source)
    known = {l.name for l in net.layers}
    entries: dict[str, LayerPlan] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        words = raw.split("#", 1)[0].split()
        if not words:
            continue
        where = f"{name}, line {number}"
        size = 2 if len(words) > 1 and words[1] == "follow" else 3
        if size == 3 and len(words) == 5 and words[3] == "ranks":
            size = 5
        if len(words) != size or words[1] not in MODES:
            raise PlanError(f"{where}: expected 'NAME MODE RxC' with MODE one of "
                            f"{', '.join(MODES[:-2])}, 'NAME split n=…,c=…', either + "
                            f"'ranks A-B' for a group, or 'NAME follow', got "
                            f"{shown(raw.strip())}")
        layer, mode = words[0], words[1]
        if layer not in known:
            raise PlanError(f"{where}: layer {shown(layer)} is not in net "
                            f"{shown_path(net.name)}")
        if layer in entries:
            raise PlanError(f"{where}: layer {shown(layer)} is given twice; give each layer one "
                            f"line")
        if mode == "follow":
            entries[layer] = LayerPlan(mode)
            continue
        ranks = parse_ranks(words[4], procs, where, layer) if size == 5 else None
        size, group = (procs, "") if ranks is None else (ranks[1], ranks_text(ranks))
        if mode == "split":
            k = next(k for k, l in enumerate(net.layers) if l.name == layer)
            split = parse_split(words[2], 1 + len(net.out_shapes[k]), size, where, layer,
                                group)
            entries[layer] = LayerPlan(mode, split=split, ranks=ranks)
            continue
        grid = _parse_grid(words[2], size, where, group)
        if mode == "batch" and grid[0] != 1:
            raise PlanError(f"{where}: mode batch splits only the batch, so its grid is 1x{size}"
                            f", not {grid[0]}x{grid[1]}; or use model {grid[0]}x{grid[1]}")
        entries[layer] = LayerPlan(mode, grid, ranks=ranks)
    plans = []
    for layer in net.layers:
        entry = entries.get(layer.name, LayerPlan("follow"))
        kind = KINDS[layer.kind]
        if kind.weighted and entry.mode == "follow":
            raise PlanError(f"{name}: no grid for layer {layer.name} ({layer.kind})")
        if not kind.weighted and entry.mode != "follow":
            raise PlanError(f"{name}: layer {layer.name} ({layer.kind}) follows the layer "
                            f"feeding it; write '{layer.name} follow'")
        if entry.mode not in ("batch", "follow", *kind.modes) and not (
                kind.weighted and entry.mode == "split"):
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
