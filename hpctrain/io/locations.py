"""Where hpctrain's files are: the data it ships, the user's configuration, the source checkout.

- **Shipped data** (package data, read through :mod:`importlib.resources`, so it is found the
  same way in a checkout, an editable install and an installed wheel)::

      hpctrain/inputs/nets/*.net          networks, by name: --net alexnet
      hpctrain/inputs/machines/*.toml     machine profiles, by name: --machine cori-knl
      hpctrain/inputs/plans/*.plan        per-layer plans, by name: --grid smallcnn-p4-mixed

- **The user's configuration**: ``$XDG_CONFIG_HOME/hpctrain`` (``~/.config/hpctrain`` when
  ``XDG_CONFIG_HOME`` is unset or not absolute). ``calibrate`` writes
  ``machines/local.toml`` there; profiles there are found by name as the shipped ones are.

- **The source checkout**, when hpctrain runs from one (not from an installed wheel): the
  directory holding ``hpctrain/`` and ``pyproject.toml``, with ``analysis/`` beside them.

Nothing here touches the file system at import time.
"""

from __future__ import annotations

import os
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path

#: The folders of shipped data under ``hpctrain/inputs``: networks, machine profiles, plans.
SHIPPED_FOLDERS = ("nets", "machines", "plans")


def shipped(folder: str) -> Traversable:
    """The shipped ``folder`` (one of :data:`SHIPPED_FOLDERS`), as package data.

    Example: ``shipped("nets") / "alexnet.net"`` is the shipped AlexNet; read it with
    ``.read_text()``.
    """
    if folder not in SHIPPED_FOLDERS:
        raise ValueError(f"unknown folder of shipped data {folder!r}; one of "
                         f"{', '.join(SHIPPED_FOLDERS)}")
    return files("hpctrain") / "inputs" / folder


def shipped_names(folder: str, suffix: str) -> list[str]:
    """Names (file names less ``suffix``) of the files in the shipped ``folder``, sorted."""
    where = shipped(folder)
    if not where.is_dir():
        return []
    return sorted(entry.name.removesuffix(suffix) for entry in where.iterdir()
                  if entry.name.endswith(suffix) and entry.is_file())


def config_dir() -> Path:
    """The user's hpctrain configuration directory: ``$XDG_CONFIG_HOME/hpctrain``.

    ``XDG_CONFIG_HOME`` defaults to ``~/.config``; a relative value is ignored, as the XDG base
    directory specification asks. The directory need not exist.

    Example: with ``XDG_CONFIG_HOME=/scratch/me/config`` this is
    ``/scratch/me/config/hpctrain``; unset, with ``HOME=/home/me``, ``/home/me/.config/hpctrain``.
    """
    base = os.environ.get("XDG_CONFIG_HOME", "")
    root = Path(base) if os.path.isabs(base) else Path.home() / ".config"
    return root / "hpctrain"


def checkout_root() -> Path | None:
    """The source checkout hpctrain runs from, or None when it runs from an installed wheel."""
    root = Path(__file__).resolve().parents[2]  # hpctrain/io/locations.py -> the checkout
    return root if (root / "pyproject.toml").is_file() else None
