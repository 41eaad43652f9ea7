"""Files a crash cannot leave half-written: write beside the target, then rename over it."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def replace_atomically(path: Path, write: Callable[[Path], None]) -> None:
    """Run ``write(tmp)`` on a fresh file in ``path``'s directory, then rename it to ``path``.

    The rename is atomic, so readers and crashes see the old file or the new one, never half
    of one; on any failure the temporary file is removed and the old file is left as it was.
    The new file's data reach the disk before the rename (and the rename before returning), so
    even a power loss cannot leave an empty file under the final name.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
        _sync(tmp)
        os.replace(tmp, path)
        _sync(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def _sync(path: Path) -> None:
    """fsync a file or a directory (where the file system allows it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:  # some file systems cannot sync a directory
        pass
    finally:
        os.close(fd)
