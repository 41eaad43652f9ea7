"""Machine profiles: the α–β constants of the network and the FLOP rate of one rank.

A profile is a small TOML file, found by name among the shipped profiles
(``hpctrain/inputs/machines/``) and the user's calibrated ones (``machines/`` in
:func:`hpctrain.io.locations.config_dir`, where ``calibrate`` writes ``local.toml``), or anywhere
by path::

    name = "cori-knl"
    alpha = 2e-6          # seconds per message (latency)
    beta = 1.6667e-10     # seconds per byte (1/β = 6 GB/s)
    flops = 1.0e12        # sustained FLOP/s of one rank, for the FLOP-rate compute model:
                          # fp32's, and any precision's without a rate of its own
    flops_bf16 = 4.9e14   # optional (a GPU's): the rate under --precision bf16; likewise
                          # flops_tf32 and flops_fp16 (products on tensor cores)
    device = "cpu"        # where compute times may be measured (optional)
    threads = 1           # threads per rank when flops was measured (optional; 0: unknown)
    overlap = 0.0         # share of gradient sums in flight that hides behind compute
                          # (optional; 0: communication moves only inside MPI calls)
    bucket_bytes = 26214400  # gradients summed together in one all-reduce (optional;
                             # default 25 MiB, PyTorch DDP's bucket_cap_mb)

    # optional: fitted constants per collective and communicator size, written by calibrate;
    # past knee bytes (of the β term) each byte costs far_beta (optional, both or neither)
    [fits.allgather]
    2 = { alpha = 3.1e-6, beta = 2.2e-10, knee = 4194304, far_beta = 9.5e-10 }

Collectives: ``allgather``, ``reduce_scatter``, ``allreduce``, ``alltoall`` and ``halo`` (one
point-to-point message). A collective or size without a fit uses ``alpha`` and ``beta``; a size
between fitted sizes uses the fit of the nearest fitted size (in log₂ p).

A profile *with levels* also says how many ranks share a node and what the network between
nodes costs. The top level above is then the link inside a node (NVLink, shared memory), with
its fits keyed by the ranks of one node; ``[network]`` is the link between nodes, measured with
one rank per node talking alone, its fits keyed by the number of nodes; ``nics`` is how many
ranks of a node can talk across at full speed at once (the node's NICs: more ranks than that
share their bandwidth)::

    ranks_per_node = 8
    [network]
    alpha = 5e-6
    beta = 2.5e-11        # one rank alone on a NIC: 1/β = 40 GB/s
    nics = 8
    [network.fits.allreduce]
    4 = { alpha = 9e-6, beta = 3.1e-11 }
    [network.shapes.allreduce]   # groups of 8 ranks on each of 4 nodes, measured whole
    "8x4" = { alpha = 4e-6, beta = 1.2e-11 }

How the levels price a collective on a group that spans nodes:
:mod:`hpctrain.cost.collectives`. A profile without ``[network]`` is flat: one link between
every pair of ranks, as before levels existed.
"""

from __future__ import annotations

import json
import math
import re
import tomllib
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hpctrain.errors import UserError, one_line, shown, shown_path
from hpctrain.io.files import replace_atomically
from hpctrain.io.locations import config_dir, shipped_names
from hpctrain.io.textfile import existing_file, read_text, shipped_file

COLLECTIVES = ("allgather", "reduce_scatter", "allreduce", "alltoall", "halo")
PRECISION_FLOPS = ("tf32", "bf16", "fp16")
"""Precisions a profile may give a FLOP rate of their own (``flops_tf32``, …)."""
KEYS = ("name", "alpha", "beta", "flops", *(f"flops_{p}" for p in PRECISION_FLOPS), "device",
        "threads", "overlap", "bucket_bytes", "fits", "ranks_per_node", "network",
        "compute_scale", "cache_bytes", "sources", "warning")
BUCKET_BYTES = 25 * 2**20
"""How many gradient bytes one all-reduce sums unless the profile says otherwise, as PyTorch
DistributedDataParallel's default bucket (``bucket_cap_mb=25``). A bucket's latency is paid
once for all the layers in it; a larger bucket pays it fewer times but, with the sums in flight
(``--overlap``), starts the first sum later and leaves more of the last one exposed."""
SOURCE_KEYS = ("links", "compute")
"""What a profile's ``sources`` table may say where it came from: its α and β (``links``) and
its compute (``compute``)."""
NETWORK_KEYS = ("alpha", "beta", "nics", "fits", "shapes")
SHAPE_COLLECTIVES = ("allgather", "reduce_scatter", "allreduce")
_SHAPE = re.compile(r"([0-9]{1,10})x([0-9]{1,10})", re.ASCII)
FIT_KEYS = ("alpha", "beta", "knee", "far_beta")
MAX_PROCS = 2**31 - 1  # an MPI communicator's size is a C int
LEAST, MOST = 1e-30, 1e30
"""The range of alpha, beta and flops is 15 orders of magnitude either side of any machine's
(alpha ~ 1e-6 s, beta ~ 1e-10 s/B, flops ~ 1e12 FLOP/s), narrow enough that every time the cost
model predicts, for any net that parses, stays a finite float."""
_SIZE = re.compile(r"[0-9]{1,10}", re.ASCII)

MARKER = "# hpctrain machine profile"  #: the first line of every profile hpctrain writes


class MachineError(UserError):
    """A machine profile that cannot be found or read."""


@dataclass(frozen=True)
class Fit:
    """t = α·(message terms) + β·(byte terms), in seconds and seconds per byte; past ``knee``
    bytes of byte terms, each further byte costs ``far_beta`` instead of β.

    The knee is where a message outgrows the caches: on shared memory an all-reduce of 4 MiB
    between two ranks moved 2.6 GB/s and one of 64 MiB 1.0 GB/s, so one β fitted to small
    messages priced AlexNet's 67 MB fc7 gradient at half its time.
    """

    alpha: float
    beta: float
    knee: float = math.inf
    far_beta: float = 0.0

    def seconds(self, messages: float, byte_terms: float) -> float:
        near = min(byte_terms, self.knee)
        return self.alpha * messages + self.beta * near + self.far_beta * (byte_terms - near)


def nearest_fit(fits: dict[str, dict[int, Fit]], collective: str, size: int,
                default: Fit) -> Fit:
    """The fit of ``collective`` at ``size`` in ``fits``, else at the nearest fitted size (in
    log₂), else ``default``."""
    sizes = fits.get(collective)
    if not sizes:
        return default
    if size in sizes:
        return sizes[size]
    nearest = min(sizes, key=lambda p: (abs(math.log2(p) - math.log2(max(size, 1))), p))
    return sizes[nearest]


# what is found once per level of a machine (its links, the routes of exchanges, the times of
# collectives): a plan asks for the same few hundreds of thousands of times. Levels are frozen
# but hold dicts and do not hash, so they are told apart by identity, and what was found on
# one is dropped with it (and never travels with it, pickled to another process).
_FOUND: dict[int, tuple[weakref.ref, dict[str, dict]]] = {}


def found_on(level: Machine | Network, what: str) -> dict:
    """What is already found of kind ``what`` on ``level`` (a machine, or its network)."""
    entry = _FOUND.get(id(level))
    if entry is None or entry[0]() is not level:
        key = id(level)
        entry = _FOUND[key] = (weakref.ref(level, lambda _: _FOUND.pop(key, None)), {})
    return entry[1].setdefault(what, {})


def _link_of(level: Machine | Network, collective: str, size: int) -> Fit:
    """``level.link``: the fit of ``collective`` at ``size`` (:func:`nearest_fit`), else the
    level's α and β, found once per collective and size."""
    links = found_on(level, "links")
    found = links.get((collective, size))
    if found is None:
        found = links[collective, size] = nearest_fit(level.fits, collective, size,
                                                      Fit(level.alpha, level.beta))
    return found


@dataclass(frozen=True)
class Network:
    """The link between nodes: α and β of one rank per node talking alone, the fits by number
    of nodes, and the NICs a node's ranks share."""

    alpha: float
    beta: float
    nics: float = 1.0
    fits: dict[str, dict[int, Fit]] = field(default_factory=dict)
    # fits of whole groups of k ranks on each of m nodes, by (k, m), measured with every group
    # of the pattern at once: what the MPI library really runs for that shape
    shapes: dict[str, dict[tuple[int, int], Fit]] = field(default_factory=dict)

    def link(self, collective: str, nodes: int) -> Fit:
        """α and β for ``collective`` over ``nodes`` nodes, one rank on each."""
        return _link_of(self, collective, nodes)

    def shape(self, collective: str, per_node: int, nodes: int) -> Fit | None:
        """The fit measured for ``collective`` on groups of ``per_node`` ranks on each of
        ``nodes`` nodes, if calibrate measured that shape."""
        return self.shapes.get(collective, {}).get((per_node, nodes))


@dataclass(frozen=True)
class Machine:
    name: str
    alpha: float
    beta: float
    flops: float
    device: str = "cpu"
    fits: dict[str, dict[int, Fit]] = field(default_factory=dict)
    source: str = ""
    threads: int = 0  # threads per rank the profile was measured with; 0: not recorded
    # The share of a gradient sum's time that progresses while the backward computes, with
    # sums in flight (--overlap): 0 where the ranks' own cores move the data inside MPI calls
    # (shared memory, or a network without offload: measured 0 on the reference machines),
    # 1 where the network moves it by itself (RDMA with offloaded collectives). calibrate
    # measures it.
    overlap: float = 0.0
    ranks_per_node: int = 0  # 0: not known (a flat profile)
    network: Network | None = None  # None: flat, every pair of ranks on the link above
    # per layer kind, (forward, backward) factors on the compute times the cost model takes
    # from kernels or FLOPs, fitted to training steps (hpctrain.plan.stepfit); 1 where absent
    compute_scale: dict[str, tuple[float, float]] = field(default_factory=dict)
    # the bytes a layer's work may touch on a rank and still run as from cache in a training
    # step, fitted with compute_scale (hpctrain.plan.stepfit.fit_cache_bytes); larger work
    # takes the factors beyond the cache (hpctrain.model.kinds.BEYOND_CACHE); 0: one set
    cache_bytes: int = 0
    sources: dict[str, str] = field(default_factory=dict)  # SOURCE_KEYS: where each came from
    bucket_bytes: int = BUCKET_BYTES  # gradients summed together (hpctrain.comm.gradients)
    # FLOP/s of one rank under a precision of PRECISION_FLOPS, by its name; absent: flops
    precision_flops: dict[str, float] = field(default_factory=dict)
    # why the figures may not hold (the machine was busy while calibrate measured, fits far off
    # their points): said wherever the profile is used, until it is measured again; "": none
    warning: str = ""

    def flops_for(self, precision: str) -> float:
        """The FLOP rate of one rank under the precision named ``precision`` (fp32, tf32,
        bf16, …): its own rate when the profile gives one, else ``flops``."""
        return self.precision_flops.get(precision, self.flops)

    def link(self, collective: str, procs: int) -> Fit:
        """α and β for ``collective`` on a communicator of ``procs`` ranks (inside one node,
        when the profile has levels)."""
        return _link_of(self, collective, procs)

    @property
    def levelled(self) -> bool:
        """Whether the profile tells the link inside a node from the network between nodes."""
        return self.network is not None

    def describe(self) -> str:
        """The links in a line: α and 1/β, per level when there are levels."""
        text = f"alpha {self.alpha * 1e6:.3g} us, 1/beta {1 / self.beta / 1e9:.3g} GB/s"
        net = self.network
        if net is None:
            return text
        return (f"{self.ranks_per_node} ranks per node, inside: {text}; between nodes: alpha "
                f"{net.alpha * 1e6:.3g} us, 1/beta {1 / net.beta / 1e9:.3g} GB/s, "
                f"{net.nics:g} NICs")

    def flattened(self) -> Machine:
        """The flat profile a planner without levels would use for this machine: the network's
        link between every pair of ranks (the constants a paper quotes for a cluster), or this
        profile itself when it is flat."""
        if self.network is None:
            return self
        net = self.network
        return replace(self, name=f"{self.name} (flat)", alpha=net.alpha, beta=net.beta,
                       fits=net.fits, ranks_per_node=0, network=None)


def _positive(table: dict, key: str, where: str) -> float:
    value = table.get(key)
    if value is None:
        raise MachineError(f"{where}: '{key}' is missing; give {key} = a positive number")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise MachineError(f"{where}: '{key}' must be a positive number, got {shown(value)}")
    try:
        number = float(value)
    except OverflowError:  # an integer beyond any float
        number = math.inf
    if not LEAST <= number <= MOST:  # NaN too
        raise MachineError(f"{where}: '{key}' must be a number from {LEAST:g} to {MOST:g}, got "
                           f"{shown(value)}")
    return number


def _table(value: object, where: str, what: str) -> dict:
    if not isinstance(value, dict):
        raise MachineError(f"{where}: {what} must be a table, got {shown(value)}")
    return value


def scaled_links(machine: Machine, inside: tuple[float, float],
                 between: tuple[float, float] = (1.0, 1.0)) -> Machine:
    """``machine`` with every α of the links inside a node multiplied by ``inside[0]`` and
    every β (far ones too) by ``inside[1]``, and the network's by ``between``. The cost model's
    communication times are linear in these four groups of constants, which is what fitting
    them to measured times rests on (:mod:`hpctrain.plan.stepfit`)."""

    def fit(f: Fit, by: tuple[float, float]) -> Fit:
        return Fit(f.alpha * by[0], f.beta * by[1], f.knee, f.far_beta * by[1])

    def fits(table: dict, by: tuple[float, float]) -> dict:
        return {c: {k: fit(f, by) for k, f in sizes.items()} for c, sizes in table.items()}

    network = machine.network
    if network is not None:
        network = replace(network, alpha=network.alpha * between[0],
                          beta=network.beta * between[1], fits=fits(network.fits, between),
                          shapes=fits(network.shapes, between))
    return replace(machine, alpha=machine.alpha * inside[0], beta=machine.beta * inside[1],
                   fits=fits(machine.fits, inside), network=network)


def _fit(table: dict, at: str) -> Fit:
    for key in table:
        if key not in FIT_KEYS:
            raise MachineError(f"{at}: unknown key {shown(key)}; a fit takes "
                               f"{', '.join(FIT_KEYS)}")
    alpha, beta = _positive(table, "alpha", at), _positive(table, "beta", at)
    if ("knee" in table) != ("far_beta" in table):
        raise MachineError(f"{at}: give knee and far_beta together, or neither")
    far = [_positive(table, key, at) for key in ("knee", "far_beta") if key in table]
    return Fit(alpha, beta, *far)


def parse_machine(text: str, source: str) -> Machine:
    """The profile in the TOML ``text`` read from ``source`` (a path or a name, for messages).

    Refused, each in one line: text that is not TOML, a key the format does not have, a value
    of the wrong type (a table where a number belongs), a number outside [:data:`LEAST`,
    :data:`MOST`] (NaN, inf, 0), an unknown collective, a communicator size that is not a
    whole number from 1 to 2**31 - 1 (an MPI communicator's size is a C int), and two keys of
    one collective that name the same size or shape (``2`` and ``02``, ``"8x2"`` and
    ``"08x2"``), naming the file and both keys.
    """
    where = shown_path(source)
    try:
        table = tomllib.loads(text)
    except (ValueError, RecursionError) as err:  # TOMLDecodeError; too many digits; nesting
        reason = "nested too deeply" if isinstance(err, RecursionError) else str(err)
        raise MachineError(f"{where}: not a valid TOML profile ({one_line(reason, 120)})"
                           ) from None
    for key in table:
        if key not in KEYS:
            raise MachineError(f"{where}: unknown key {shown(key)}; a profile takes "
                               f"{', '.join(KEYS)}")
    name = table.get("name", Path(source).stem)
    if "name" in table and not (isinstance(name, str) and name.isprintable()
                                and 0 < len(name) <= 100):
        raise MachineError(f"{where}: 'name' must be a line of 1 to 100 characters, got "
                           f"{shown(name)}")
    device = table.get("device", "cpu")
    if device not in ("cpu", "gpu"):
        raise MachineError(f"{where}: device {shown(device)} must be \"cpu\" or \"gpu\"")
    threads = _whole_number(table, "threads", where, None, "a whole number >= 0")
    overlap = table.get("overlap", 0.0)
    if (not isinstance(overlap, (int, float)) or isinstance(overlap, bool)
            or not 0.0 <= overlap <= 1.0):
        raise MachineError(f"{where}: 'overlap' must be a number from 0 to 1, got "
                           f"{shown(overlap)}")
    ranks_per_node = _whole_number(table, "ranks_per_node", where, MAX_PROCS,
                                   f"a whole number from 1 to {MAX_PROCS}")
    cache_bytes = _whole_number(table, "cache_bytes", where, 2**50,
                                "a whole number of bytes from 0 to 2**50")
    bucket_bytes = (_whole_number(table, "bucket_bytes", where, 2**50,
                                  "a whole number of bytes from 0 to 2**50")
                    if "bucket_bytes" in table else BUCKET_BYTES)
    network = None
    if "network" in table:
        if not ranks_per_node:
            raise MachineError(f"{where}: a [network] level needs ranks_per_node = the ranks "
                               f"on one node")
        network = _network(_table(table["network"], where, "network"), where)
    return Machine(name, _positive(table, "alpha", where), _positive(table, "beta", where),
                   _positive(table, "flops", where), device, _fits(table, where), source,
                   threads, float(overlap), ranks_per_node, network,
                   _compute_scale(table, where), cache_bytes, _sources(table, where),
                   bucket_bytes, {p: _positive(table, f"flops_{p}", where)
                                  for p in PRECISION_FLOPS if f"flops_{p}" in table},
                   _warning(table, where))


def _warning(table: dict, where: str) -> str:
    warning = table.get("warning", "")
    if not isinstance(warning, str) or not warning.isprintable() or len(warning) > 1000:
        raise MachineError(f"{where}: 'warning' must be a line of text, got {shown(warning)}")
    return warning


def _whole_number(table: dict, key: str, where: str, most: int | None, wording: str) -> int:
    """``table[key]`` (0 when absent): an integer from 0 to ``most`` (None: no bound), else
    refused in one line that says it must be ``wording``."""
    value = table.get(key, 0)
    if (not isinstance(value, int) or isinstance(value, bool) or value < 0
            or (most is not None and value > most)):
        raise MachineError(f"{where}: {key!r} must be {wording}, got {shown(value)}")
    return value


def _compute_scale(table: dict, where: str) -> dict[str, tuple[float, float]]:
    """``compute_scale``: per layer kind, [forward, backward] positive factors."""
    found = {}
    for kind, pair in _table(table.get("compute_scale", {}), where, "compute_scale").items():
        at = f"{where}, compute_scale.{shown(kind, 30, quoted=False)}"
        if not (isinstance(pair, list) and len(pair) == 2):
            raise MachineError(f"{at}: give [forward, backward] factors, got {shown(pair)}")
        found[kind] = tuple(_positive({"factor": v}, "factor", at) for v in pair)
    return found


def _sources(table: dict, where: str) -> dict[str, str]:
    found = _table(table.get("sources", {}), where, "sources")
    for key, text in found.items():
        if key not in SOURCE_KEYS:
            raise MachineError(f"{where}: unknown key {shown(key)} under [sources]; it takes "
                               f"{', '.join(SOURCE_KEYS)}")
        if not (isinstance(text, str) and text.isprintable() and len(text) <= 1000):
            raise MachineError(f"{where}: sources.{key} must be a line of text, got "
                               f"{shown(text)}")
    return dict(found)


def _fits(table: dict, where: str) -> dict[str, dict[int, Fit]]:
    """The ``fits`` table of ``table`` (the profile's, or its network's), keyed by size."""
    return _fit_tables(table, "fits", COLLECTIVES, where, _size,
                       f"communicator size must be a whole number from 1 to {MAX_PROCS}")


def _size(key: str) -> int | None:
    return int(key) if _SIZE.fullmatch(key) and 1 <= int(key) <= MAX_PROCS else None


def _fit_tables(table: dict, name: str, known: tuple[str, ...], where: str,
                parse_key: Callable[[str], Any], rule: str) -> dict[str, dict[Any, Fit]]:
    """``table[name]``: per collective of ``known``, fits by the key ``parse_key`` reads (None:
    refused, saying ``rule``).

    Two keys that read as one (``"8x2"`` and ``"08x2"``, ``8`` and ``"08"``) are refused, naming
    both: TOML sees two keys, and keeping either fit would drop the other without a word.
    """
    found: dict[str, dict[Any, Fit]] = {}
    for collective, entries in _table(table.get(name, {}), where, name).items():
        if collective not in known:
            raise MachineError(f"{where}: unknown collective {shown(collective)} under "
                               f"[{name}]; known: {', '.join(known)}")
        written: dict[Any, str] = {}  # parsed key -> the key as the file writes it
        for key, fit in _table(entries, where, f"{name}.{collective}").items():
            at = f"{where}, {name}.{collective}.{shown(key, 30, quoted=False)}"
            parsed = parse_key(key)
            if parsed is None:
                raise MachineError(f"{at}: {rule}")
            if parsed in written:
                raise MachineError(f"{where}, {name}.{collective}: keys "
                                   f"{shown(written[parsed], 30)} and {shown(key, 30)} name "
                                   f"the same group; keep one of them")
            written[parsed] = key
            found.setdefault(collective, {})[parsed] = _fit(_table(fit, at, "a fit"), at)
    return found


def _network(table: dict, where: str) -> Network:
    at = f"{where}, [network]"
    for key in table:
        if key not in NETWORK_KEYS:
            raise MachineError(f"{at}: unknown key {shown(key)}; the network takes "
                               f"{', '.join(NETWORK_KEYS)}")
    nics = table.get("nics", 1)
    if isinstance(nics, bool) or not isinstance(nics, int | float) or not 1 <= nics <= MAX_PROCS:
        raise MachineError(f"{at}: 'nics' must be a number from 1 to {MAX_PROCS}, got "
                           f"{shown(nics)}")
    return Network(_positive(table, "alpha", at), _positive(table, "beta", at), float(nics),
                   _fits(table, at), _shapes(table, at))


def _shapes(table: dict, where: str) -> dict[str, dict[tuple[int, int], Fit]]:
    """The network's ``shapes``: per collective, fits keyed "KxM" (K ranks on each of M
    nodes, both at least 2)."""
    return _fit_tables(table, "shapes", SHAPE_COLLECTIVES, where, _shape,
                       f"a shape is KxM, K ranks on each of M nodes, both whole numbers from 2 "
                       f"to {MAX_PROCS}")


def _shape(key: str) -> tuple[int, int] | None:
    found = _SHAPE.fullmatch(key)
    if not found or not all(2 <= int(n) <= MAX_PROCS for n in found.groups()):
        return None
    return int(found[1]), int(found[2])


def user_machines_dir() -> Path:
    """Where the user's calibrated profiles live: ``machines/`` in the config directory."""
    return config_dir() / "machines"


def local_profile() -> Path:
    """The profile ``calibrate`` writes by default and ``--machine local`` reads."""
    return user_machines_dir() / "local.toml"


def available_machines() -> list[str]:
    """Names of the shipped profiles and of the user's calibrated ones, sorted."""
    folder = user_machines_dir()
    mine = {p.stem for p in folder.glob("*.toml") if p.is_file()} if folder.is_dir() else set()
    return sorted(mine | set(shipped_names("machines", ".toml")))


def load_machine(name_or_path: str | None = None) -> Machine:
    """A profile by path, or by name (``cori-knl``): the user's calibrated profile of that name
    when there is one, else the shipped one. None means ``local`` when calibrated, else
    ``default``."""
    if name_or_path is None:
        name_or_path = "local" if local_profile().is_file() else "default"
    path = existing_file(name_or_path)
    if path is not None:
        return parse_machine(read_text(path, MachineError, "machine profile"), str(path))
    if "/" not in name_or_path:
        for candidate in (existing_file(str(user_machines_dir() / f"{name_or_path}.toml")),
                          shipped_file("machines", name_or_path, ".toml")):
            if candidate is not None:
                return parse_machine(read_text(candidate, MachineError, "machine profile"),
                                     str(candidate))
    hint = (f" (run 'mpiexec -n P python -m hpctrain calibrate' to write {local_profile()})"
            if name_or_path == "local" else "")
    raise MachineError(f"unknown machine {shown(name_or_path)}{hint}: not a file, and not one "
                       f"of {', '.join(available_machines())}")


def warning_lines(machine: Machine | None) -> list[str]:
    """What a plan's output says of ``machine``'s figures: its warning, each time it is used,
    until it is measured again (none for a profile without one)."""
    if machine is None or not machine.warning:
        return []
    return [f"warning: machine profile {machine.name}: {machine.warning}"]


def sums_in_flight(choice: str | bool, machine: Machine | None) -> bool:
    """Whether a run's gradient sums go in flight (``--overlap``): ``on`` or ``off`` as told;
    ``auto``, where ``machine`` says part of a sum moves while the ranks compute (its
    ``overlap`` above 0: the network progresses messages by itself); else, or with no profile,
    not."""
    if isinstance(choice, bool):
        return choice
    if choice == "auto":
        return machine is not None and machine.overlap > 0
    return choice == "on"


def format_machine(machine: Machine, comment: str = "") -> str:
    """The TOML text of ``machine`` (what :func:`parse_machine` reads back)."""
    lines = [f"# {line}" for line in comment.splitlines()]
    lines += [f"name = {json.dumps(machine.name)}", f"alpha = {machine.alpha:.6g}  # s per message",
              f"beta = {machine.beta:.6g}  # s per byte (1/beta = {1 / machine.beta / 1e9:.3g} "
              f"GB/s)", f"flops = {machine.flops:.6g}  # FLOP/s of one rank",
              f'device = "{machine.device}"']
    lines += [f"flops_{p} = {machine.precision_flops[p]:.6g}  # FLOP/s of one rank under {p}"
              for p in PRECISION_FLOPS if p in machine.precision_flops]
    if machine.warning:
        lines.append(f"warning = {json.dumps(machine.warning)}  # said wherever it is used")
    if machine.threads:
        lines.append(f"threads = {machine.threads}  # threads per rank when measured")
    if machine.overlap:
        lines.append(f"overlap = {machine.overlap:.3g}  # share of gradient sums hidden")
    if machine.bucket_bytes != BUCKET_BYTES:
        lines.append(f"bucket_bytes = {machine.bucket_bytes}  # gradients summed together")
    if machine.ranks_per_node:
        lines.append(f"ranks_per_node = {machine.ranks_per_node}")
    if machine.cache_bytes:
        lines.append(f"cache_bytes = {machine.cache_bytes}  # work touching more runs as from "
                     f"memory ({machine.cache_bytes / 2**20:.3g} MiB)")
    lines += _format_fits(machine.fits, "fits")
    if machine.compute_scale:
        lines += ["", "[compute_scale]  # per layer kind, [forward, backward] factors on the "
                      "kernels' times"]
        lines += [f"{json.dumps(kind)} = [{f:.6g}, {b:.6g}]"
                  for kind, (f, b) in sorted(machine.compute_scale.items())]
    if machine.sources:
        lines += ["", "[sources]  # where the constants came from"]
        lines += [f"{key} = {json.dumps(text)}" for key, text in machine.sources.items()]
    net = machine.network
    if net is not None:
        lines += ["", "[network]", f"alpha = {net.alpha:.6g}  # s per message between nodes",
                  f"beta = {net.beta:.6g}  # s per byte, one rank per node alone (1/beta = "
                  f"{1 / net.beta / 1e9:.3g} GB/s)",
                  f"nics = {net.nics:.6g}  # ranks of a node that talk across at full speed"]
        lines += _format_fits(net.fits, "network.fits")
        for collective in SHAPE_COLLECTIVES:
            shapes = net.shapes.get(collective)
            if shapes:
                lines += ["", f"[network.shapes.{collective}]"]
                lines += [f'"{k}x{m}" = {{ {_format_fit(f)} }}' for (k, m), f in
                          sorted(shapes.items())]
    return "\n".join(lines) + "\n"


def _format_fits(fits: dict[str, dict[int, Fit]], table: str) -> list[str]:
    lines = []
    for collective in COLLECTIVES:
        sizes = fits.get(collective)
        if sizes:
            lines += ["", f"[{table}.{collective}]"]
            lines += [f"{p} = {{ {_format_fit(f)} }}" for p, f in sorted(sizes.items())]
    return lines


def _format_fit(fit: Fit) -> str:
    text = f"alpha = {fit.alpha:.6g}, beta = {fit.beta:.6g}"
    if math.isfinite(fit.knee):
        text += f", knee = {fit.knee:.6g}, far_beta = {fit.far_beta:.6g}"
    return text


def save_machine(machine: Machine, path: Path, comment: str = "") -> None:
    """Write a profile atomically: a crash leaves the old file or the new one, never half.

    Its first line is :data:`MARKER`; an existing file at ``path`` is replaced only when it is a
    profile written so (:func:`is_saved_profile`), else :class:`~hpctrain.errors.OutputError`, as
    for a write that fails."""
    text = MARKER + "\n" + format_machine(machine, comment)
    replace_atomically(path, lambda tmp: tmp.write_text(text), ours=is_saved_profile)


def is_saved_profile(path: Path) -> bool:
    """Whether ``path`` is a profile :func:`save_machine` wrote (or calibrate, before the
    marker): its first line says so."""
    try:
        with open(path, "rb") as file:
            first = file.readline(200).decode(errors="replace")
    except OSError:
        return False
    return first.startswith((MARKER, "# written by 'python -m hpctrain calibrate"))
