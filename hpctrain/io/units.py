"""Sizes as people write them: ``4194304``, ``64KiB``, ``512M``, ``1.5 GiB`` (K/M/G/T = 1024ⁿ),
and shapes: ``3x224x224``."""

from __future__ import annotations

import re

_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)


def bytes_from(text: str) -> float | None:
    """The number of bytes ``text`` names, or None when it is not a size."""
    match = _SIZE.match(text)
    if match is None:
        return None
    return float(match.group(1)) * 1024 ** "bkmgt".index((match.group(2) or "b").lower())


def format_bytes(size: float) -> str:
    """``size`` bytes in the largest binary unit that keeps it at least 1: '1.2 TiB', '512 B'."""
    for power, unit in ((4, "TiB"), (3, "GiB"), (2, "MiB"), (1, "KiB")):
        if size >= 1024 ** power:
            return f"{size / 1024 ** power:.3g} {unit}"
    return f"{size:.0f} B"


def shape_text(shape: tuple[int, ...]) -> str:
    """(1, 8, 8) -> '1x8x8'."""
    return "x".join(str(n) for n in shape)
