"""Sizes as people write them: ``4194304``, ``64KiB``, ``512M``, ``1.5 GiB`` (K/M/G/T = 1024ⁿ)."""

from __future__ import annotations

import re

_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)


def bytes_from(text: str) -> float | None:
    """The number of bytes ``text`` names, or None when it is not a size."""
    match = _SIZE.match(text)
    if match is None:
        return None
    return float(match.group(1)) * 1024 ** "bkmgt".index((match.group(2) or "b").lower())
