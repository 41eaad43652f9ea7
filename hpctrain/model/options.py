"""Typed options of a layer line: each kind declares its keys as
:class:`~hpctrain.model.options.Key` readers.

A net file gives options as ``key=value`` text; a kind lists, per key, how to read the text (a
whole number, a size or ``HxW`` pair, a fraction, a 0/1 flag) and its default. Reading refuses,
in one line naming the value: an unknown key, a missing one, and a value of the wrong type or out
of range. The values a layer sees are plain Python numbers and pairs, never text.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hpctrain.errors import UserError, shown

MAX_SIZE = sys.maxsize
"""The largest number of elements in any activation (per sample) or parameter, and so the
largest value a net file takes: 2**63 - 1 on a 64-bit machine, the most elements an array can
be indexed by. Larger is refused while parsing; sizes that are possible but do not fit in memory
are for the memory check."""
_INTEGER = re.compile(r"[+-]?[0-9]+", re.ASCII)


class NetError(UserError):
    """A network file that cannot be read, or a network that does not fit its input."""


def integer(key: str, text: str, where: str, low: int = 0) -> int:
    """``key=text`` as a whole number from ``low`` to :data:`MAX_SIZE`."""
    if not _INTEGER.fullmatch(text):
        try:
            float(text)
        except ValueError:
            raise NetError(f"{where}: {key}={shown(text)} is not a number") from None
        raise NetError(f"{where}: {key}={shown(text)} must be a whole number written with "
                       f"digits 0-9")
    if len(text) > 20 or abs(int(text)) > MAX_SIZE:
        raise NetError(f"{where}: {key}={shown(text)} is larger than any size can be "
                       f"(at most {MAX_SIZE}, the most elements an array can hold)")
    value = int(text)
    if value < low:
        what = {0: "a non-negative integer", 1: "a positive integer"}.get(
            low, f"an integer of at least {low}")
        raise NetError(f"{where}: {key}={value} must be {what}")
    return value


def number(key: str, text: str, where: str) -> float:
    """``key=text`` as a finite decimal number."""
    try:
        value = float(text)
    except ValueError:
        raise NetError(f"{where}: {key}={shown(text)} is not a number") from None
    if not math.isfinite(value):
        raise NetError(f"{where}: {key}={shown(text)} must be a finite number")
    return value


@dataclass(frozen=True)
class Key:
    """How one key is read: ``read(key, text, where)``, and its default text (None: required)."""

    read: Callable[[str, str, str], Any]
    default: str | None = None


def whole(low: int = 0) -> Callable[[str, str, str], int]:
    """A reader of whole numbers of at least ``low``."""
    return lambda key, text, where: integer(key, text, where, low)


def sizes(low: int = 0) -> Callable[[str, str, str], tuple[int, ...]]:
    """A reader of ``K`` (the same along every spatial axis), ``HxW`` or ``DxHxW``, each at
    least ``low``: one size, or one per axis (matched to the input by
    :func:`spread`)."""

    def read(key: str, text: str, where: str) -> tuple[int, ...]:
        parts = text.split("x")
        if len(parts) > 3:
            raise NetError(f"{where}: {key}={shown(text)} must be K, HxW or DxHxW, e.g. 3, "
                           f"1x7 or 2x2x2")
        return tuple(integer(key, part, where, low) for part in parts)

    return read


SAME = "same"
"""``pad=same``: TensorFlow's padding for stride 1, k − 1 zeros in all, the odd one after."""


def padding(key: str, text: str, where: str) -> tuple[tuple[int, int], ...] | str:
    """``P`` (P zeros on both sides), ``B+A`` (B before, A after), one per axis joined by
    ``x`` (``0+1x1x1``), or ``same``: the (before, after) pairs, or :data:`SAME`."""
    if text == SAME:
        return SAME
    forms = "P, B+A (before+after) or one per axis as HxW or DxHxW, e.g. 1, 0+1 or 0+1x1x1, or same"
    parts = [part.split("+") for part in text.split("x")]
    if len(parts) > 3 or any(len(sides) > 2 or not all(sides) for sides in parts):
        raise NetError(f"{where}: {key}={shown(text)} must be {forms}")
    found = []
    for sides in parts:
        values = tuple(integer(key, side, where) for side in sides)
        found.append(values if len(values) == 2 else values * 2)
    return tuple(found)


def spread(values: tuple, axes: int, key: str, where: str, layer: str) -> tuple:
    """``values`` given once for every axis, or once per axis, as one per each of the
    ``axes`` spatial axes of a layer's input; refused naming the layer otherwise."""
    if len(values) == axes:
        return tuple(values)
    if len(values) == 1:
        return tuple(values) * axes
    names = {1: "L", 2: "HxW", 3: "DxHxW"}.get(axes, f"{axes} sizes")
    raise NetError(f"{where}: layer {layer} gives {key} for {len(values)} axes but its input "
                   f"has {axes} spatial axes; give one size or {names}")


def fraction(low: float, high: float, high_open: bool = True
             ) -> Callable[[str, str, str], float]:
    """A reader of decimal numbers in [low, high) (or [low, high] when not ``high_open``)."""

    def read(key: str, text: str, where: str) -> float:
        value = number(key, text, where)
        if not (low <= value and (value < high if high_open else value <= high)):
            raise NetError(f"{where}: {key}={value:g} must be in [{low:g}, {high:g}"
                           f"{')' if high_open else ']'}")
        return value

    return read


def flag(key: str, text: str, where: str) -> bool:
    """0 or 1."""
    if text not in ("0", "1"):
        raise NetError(f"{where}: {key}={shown(text, 30, quoted=False)} must be 0 or 1")
    return text == "1"


def option_text(value: Any) -> str | None:
    """The text a net file gives for an option's ``value``, as its reader reads it back: 0 or
    1 for a flag, digits for a whole number, the shortest decimal that reads back the same
    float, ``HxW`` for sizes per axis, ``B+A`` per axis joined by ``x`` for padding; None for
    None (the key's default).

    >>> [option_text(v) for v in (True, 3, 0.1, (1, 7), ((0, 1), (2, 2)), None)]
    ['1', '3', '0.1', '1x7', '0+1x2+2', None]
    """
    if value is None:
        return None
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int | str):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if all(isinstance(v, tuple) for v in value):
        return "x".join(f"{before}+{after}" for before, after in value)
    return "x".join(str(v) for v in value)


def read_options(kind: str, keys: dict[str, Key], texts: dict[str, str], where: str
                 ) -> dict[str, Any]:
    """The values of a ``kind`` line's ``key=value`` texts, defaults filled in."""
    for key in texts:
        if key not in keys:
            raise NetError(f"{where}: {kind} takes no {shown(key)}; it takes "
                           f"{', '.join(['name', 'in', *keys])}")
    values = {}
    for key, spec in keys.items():
        text = texts.get(key, spec.default)
        if text is None:
            raise NetError(f"{where}: {kind} needs {key}=…")
        values[key] = spec.read(key, text, where)
    return values
