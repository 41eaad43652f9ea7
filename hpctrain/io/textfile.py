"""The small text files a user names: net files, plan files, machine profiles.

:func:`read_text` gives a file's text or raises the caller's :class:`~hpctrain.errors.UserError`
in one line saying what is wrong with the file as a whole: it cannot be read, it is empty, it is
far larger than any such file, it is binary (holds a NUL byte) or it is not UTF-8. The parsers
then only ever see bounded, decoded text. :func:`existing_file` and :func:`shipped_file` look a
name up without raising on names the operating system cannot look up (too long, a NUL byte).
"""

from __future__ import annotations

from importlib.resources.abc import Traversable
from pathlib import Path

from hpctrain.errors import UserError, shown_path
from hpctrain.io.locations import shipped

MAX_BYTES = 1 << 20
"""The largest input text file read is 1 MiB. The shipped VGG16 is 1 kB and a plan file takes
about 20 bytes a layer, so this leaves room for nets of tens of thousands of layers while a
stray multi-gigabyte file is refused before it is read into memory."""


def read_text(path: Path | Traversable, error: type[UserError], what: str) -> str:
    """The UTF-8 text of ``path`` (a byte-order mark dropped), or ``error`` in one line.

    Parameters
    ----------
    path : the file, on disk or shipped (package data).
    error : the :class:`~hpctrain.errors.UserError` subclass to raise, e.g. ``NetError``.
    what : what the file should be, for the message: ``"net file"``, ``"plan file"``…
    """
    name = shown_path(path)
    try:
        with path.open("rb") as stream:
            data = stream.read(MAX_BYTES + 1)
    except OSError as err:
        raise error(f"{name}: cannot read this {what} ({err.strerror or err}); check the "
                    f"path and its permissions") from None
    if len(data) > MAX_BYTES:
        raise error(f"{name}: larger than {MAX_BYTES >> 20} MiB, far more than any {what}; "
                    f"check the path") from None
    if not data.strip():
        raise error(f"{name}: the {what} is empty")
    zero = data.find(b"\0")
    if zero >= 0:
        raise error(f"{name}: a binary file (NUL byte at offset {zero}), not a {what}; check "
                    f"the path")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise error(f"{name}: not UTF-8 text (byte 0x{data[err.start]:02x} at offset "
                    f"{err.start}); a {what} is plain text") from None


def existing_file(name: str) -> Path | None:
    """``Path(name)`` when it names a file (or a link to one), else None, also for names that
    cannot name a file (too long, a NUL byte)."""
    try:
        path = Path(name)
        return path if path.is_file() else None
    except (OSError, ValueError):
        return None


def shipped_file(folder: str, name: str, suffix: str) -> Traversable | None:
    """The file ``name`` + ``suffix`` of the shipped ``folder`` (see
    :func:`hpctrain.io.locations.shipped`), or None when there is none; a ``name`` with a path
    separator is never one."""
    if not name or "/" in name or "\\" in name or name.startswith("."):
        return None
    try:
        resource = shipped(folder) / f"{name}{suffix}"
        return resource if resource.is_file() else None
    except (OSError, ValueError):
        return None
