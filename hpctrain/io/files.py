"""Output files: which paths hpctrain may write, and how it writes them.

The rules, for every file hpctrain writes (run logs, plan files, checkpoints, machine profiles,
datasets):

- An output path holds nothing yet, or a regular file (not a link) that hpctrain wrote, which
  its writer recognises by a marker (an HDF5 ``format`` attribute, a first comment line). Such a
  file may be replaced (plans, checkpoints, profiles, datasets) or renamed aside (run logs).
  Anything else there — a directory, FIFO, device, socket, a symbolic link to anything, a file
  hpctrain did not write, an input of the same run — is refused by name
  (:func:`check_output`), before any work.
- A file is written beside its final name, under a temporary name ``.NAME.XXXXXXXX.tmp``, and
  then renamed over it (:func:`replace_atomically`) or linked to it, which fails when the name
  was taken meanwhile (:func:`publish_exclusive`): a crash leaves the old file or the new one,
  never half of one, and two jobs never write to one file.
- New files get the permissions the umask allows (``0o666 & ~umask``), as ``open`` would give.
- Temporaries left by a crash are removed where the run owns the directory (a checkpoint
  directory: :func:`remove_orphans`), and only regular files named like ours. Beside an output
  in a directory the user owns (``convert --out``), the next run to that path removes only
  the temporaries of its own name that no live run holds (:func:`remove_abandoned`): their
  writer held a lock on them (``replace_atomically(..., lock=True)``), which the system
  drops when the writer dies, however it dies.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator
from functools import cache
from pathlib import Path

from hpctrain.errors import OutputError, UserError, sigterm_at_safe_points, stop_if_terminated


@cache
def new_file_mode() -> int:
    """``0o666`` less the process's umask: the mode a plain ``open`` gives a new file.

    Read once, from ``/proc/self/status`` where Linux offers it (reading changes nothing);
    elsewhere by setting and restoring the umask, once, before any thread writes files.
    """
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


def what_is(path: Path) -> str:
    """'nothing', 'a regular file', or what else is at ``path`` (links not followed)."""
    try:
        mode = os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):  # a part of the path is missing or a file
        return "nothing"
    for test, name in ((stat.S_ISREG, "a regular file"), (stat.S_ISLNK, "a symbolic link"),
                       (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a device"),
                       (stat.S_ISBLK, "a device")):
        if test(mode):
            return name
    return "not a regular file"


def same_file(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` name one file (through links too); False when either is absent."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def is_hdf5_of(path: str | Path, format_name: str) -> bool:
    """Whether ``path`` is an HDF5 file whose ``format`` attribute is ``format_name``: how each
    HDF5 file hpctrain writes (checkpoint, dataset, predictions) is told from anything else at
    an output path. Opened without the HDF5 lock, which some parallel file systems refuse."""
    import h5py  # only where a file is looked at

    try:
        with h5py.File(path, "r", locking=False) as h5:
            return h5.attrs.get("format") == format_name
    except (OSError, ValueError):
        return False


def check_output(path: Path, flag: str, ours: Callable[[Path], bool], what: str,
                 inputs: Iterable[tuple[str, Path]] = ()) -> None:
    """Refuse ``path`` as an output unless it is free or a regular file that ``ours`` accepts.

    Parameters
    ----------
    path : the output path given with ``flag`` (e.g. ``--log``).
    ours : whether an existing regular file is one hpctrain wrote (its marker).
    what : what such a file is, for the message, e.g. "an hpctrain run log".
    inputs : (flag, path) of every file the same run reads; none may be the output.

    Raises
    ------
    UserError
        Naming the path, what is there, and what to give instead.
    """
    path = Path(path)
    for input_flag, source in inputs:
        if same_file(path, source):
            raise UserError(f"{flag} {path} is the {input_flag} input of this run; give another "
                            f"path for {flag}")
    found = what_is(path)
    if found == "nothing":
        return
    if found != "a regular file":
        raise UserError(f"{flag} {path} is {found}; hpctrain writes only new files or "
                        f"regular files it wrote, give another path")
    if not ours(path):
        raise UserError(f"{flag} {path} exists and is not {what}; hpctrain replaces only files "
                        f"it wrote: give a new path, or move the file aside")


def check_directory(path: Path, flag: str) -> None:
    """Refuse ``path`` as a directory for outputs unless it is one (not a link) where this
    process may create files, or could be made so. A missing directory is not made here but
    when the first file is written, so a run refused later leaves nothing behind."""
    path = Path(path)
    found = what_is(path)
    existing = path
    while found == "nothing" and existing != existing.parent:  # the nearest part that exists
        existing = existing.parent
        found = what_is(existing)
    if found != "a directory":
        reason = f"it is {found}" if existing == path else f"{existing} is {found}"
        raise UserError(f"{flag}: cannot create directory {path}: {reason}; choose another path")
    if not can_create_in(existing):
        what = "is not writable" if existing == path else f"cannot be made in {existing}"
        raise UserError(f"{flag}: directory {path} {what}; choose another path")


def can_create_in(directory: Path) -> bool:
    """Whether this process can create a file in ``directory``, found by creating an unnamed
    one (``O_TMPFILE`` where Linux has it, so no name ever appears): ``os.access`` says yes to
    root where the file system says no (read-only mounts, /proc)."""
    try:
        with tempfile.TemporaryFile(dir=directory, prefix=".hpctrain-probe-"):
            return True
    except OSError:
        return False


def temporary_beside(path: Path) -> Path:
    """A new empty file ``.NAME.XXXXXXXX.tmp`` in ``path``'s directory, mode per the umask."""
    tmp, fd = _temporary(path, lock=False)
    os.close(fd)
    return tmp


def _temporary(path: Path, lock: bool) -> tuple[Path, int]:
    """:func:`temporary_beside`, and its open descriptor, under an exclusive ``flock`` when
    ``lock``: taken at once, so :func:`remove_abandoned` never sees it unheld."""
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        if lock:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.fchmod(fd, new_file_mode())  # mkstemp makes 0600
    except OSError:
        os.close(fd)
        Path(name).unlink(missing_ok=True)
        raise
    return Path(name), fd


def _refuse_to_replace(path: Path, ours: Callable[[Path], bool] | None) -> None:
    found = what_is(path)
    if found == "nothing":
        return
    if found != "a regular file" or (ours is not None and not ours(path)):
        raise OutputError(f"{path} is {found if found != 'a regular file' else 'a file'} "
                          f"hpctrain did not write; it was left as it is")


# SIGTERM under the command line's handler waits for a safe point here: raised at once, it
# could come between the temporary's creation and the code that removes it, and leave it behind
@sigterm_at_safe_points()
def replace_atomically(path: Path, write: Callable[[Path], None],
                       ours: Callable[[Path], bool] | None = None, *,
                       lock: bool = False) -> None:
    """Run ``write(tmp)`` on a fresh file in ``path``'s directory, then rename it to ``path``.

    The rename is atomic, so readers and crashes see the old file or the new one, never half
    of one; on any failure the temporary file is removed and the old file is left as it was.
    The new file's data reach the disk before the rename (and the rename before returning), so
    even a power loss cannot leave an empty file under the final name. Only a regular file
    (not a link) that ``ours`` accepts is replaced; anything else at ``path`` raises
    :class:`~hpctrain.errors.OutputError` and is left as it is. A write that fails (disk full, no
    permission) raises :class:`~hpctrain.errors.OutputError` too, naming ``path`` and the reason
    (:func:`output_error`).

    With ``lock``, the temporary is held under an exclusive ``flock`` while it is written, so
    that :func:`remove_abandoned` tells it from one a killed run left; ``write`` must then not
    lock the file itself (h5py: ``locking=False``).

    Under the command line's SIGTERM handler (:func:`~hpctrain.errors.on_sigterm`) a SIGTERM
    is only noted meanwhile (:func:`~hpctrain.errors.sigterm_at_safe_points`): a long ``write``
    calls :func:`~hpctrain.errors.stop_if_terminated` where it may stop, and the stop comes at
    the latest before the rename, leaving nothing, or once it is done.
    """
    path = Path(path)
    made: list[Path] = []
    try:
        made = make_directories(path.parent)
        _refuse_to_replace(path, ours)
        tmp, held = _temporary(path, lock)
    except BaseException as err:
        remove_directories(made)
        if isinstance(err, OSError):
            raise output_error(path, err) from None
        raise
    if not lock:
        os.close(held)
    done = False
    try:
        write(tmp)
        _sync(tmp)
        stop_if_terminated()  # the last point where a stop leaves nothing behind
        _refuse_to_replace(path, ours)  # again: the write may have taken hours
        os.replace(tmp, path)
        done = True
        _sync(path.parent)
    except OSError as err:
        raise output_error(path, err) from None
    finally:
        tmp.unlink(missing_ok=True)
        if lock:
            os.close(held)  # the lock goes with it
        if not done:  # refused, failed or stopped: the directories made for it go too
            remove_directories(made)


def make_directories(directory: Path) -> list[Path]:
    """Make ``directory`` and its missing parents; the ones this call made, innermost first
    (one made meanwhile by another process is not counted), for :func:`remove_directories`."""
    missing = []
    part = Path(directory)
    while what_is(part) == "nothing" and part != part.parent:
        missing.append(part)
        part = part.parent
    made = []
    for part in reversed(missing):
        try:
            os.mkdir(part)
        except FileExistsError:
            continue
        made.append(part)
    return made[::-1]


def remove_directories(made: Iterable[Path]) -> None:
    """Remove the directories :func:`make_directories` made, innermost first, each only while
    it is empty (another run may have put a file there meanwhile)."""
    for part in made:
        try:
            os.rmdir(part)
        except OSError:
            return


def publish_exclusive(tmp: Path, path: Path) -> None:
    """Give the complete file ``tmp`` the name ``path``, only if nothing has that name.

    A hard link fails when the name exists, so of two jobs publishing to one path exactly
    one wins; the loser gets ``FileExistsError`` and its ``tmp`` is kept for it to remove.
    """
    _sync(tmp)
    os.link(tmp, path)
    tmp.unlink()
    _sync(path.parent)


def rotate_aside(path: Path) -> Path:
    """Give the file at ``path`` the first free name of ``NAME.1.EXT``, ``NAME.2.EXT``, …
    (never replacing one that exists) and remove ``path``; the new name.

    Hold :func:`exclusive_lock` on ``path`` meanwhile, so no other job rotates or creates it.
    """
    number = 1
    while True:
        aside = path.with_name(f"{path.stem}.{number}{path.suffix}")
        try:
            os.link(path, aside)
        except FileExistsError:
            number += 1
            continue
        path.unlink()
        _sync(path.parent)
        return aside


@contextlib.contextmanager
def exclusive_lock(path: Path, flag: str) -> Iterator[None]:
    """Hold ``.NAME.lock`` beside ``path`` while checking, rotating and creating it: a file
    created exclusively, so two jobs given one output path take turns, the second refused."""
    lock = path.with_name(f".{path.name}.lock")
    try:
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        raise UserError(f"{flag} {path} is being created by another run ({lock} exists); give "
                        f"another path, or remove {lock} if no run is starting") from None
    os.close(fd)
    try:
        yield
    finally:
        lock.unlink(missing_ok=True)


def temporary_pattern(names: str) -> re.Pattern[str]:
    """The names of the temporaries :func:`temporary_beside` makes for files whose names match
    the regular expression ``names``."""
    return re.compile(rf"^\.(?:{names})\.[A-Za-z0-9_]+\.tmp$")


def remove_orphans(directory: Path, names: str) -> list[Path]:
    """Remove the temporaries a crash left in ``directory`` for files named like ``names`` (a
    regular expression); only regular files, never links. The paths removed."""
    pattern = temporary_pattern(names)
    removed = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return []
    for entry in entries:
        if pattern.match(entry.name) and entry.is_file(follow_symlinks=False):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)
                removed.append(Path(entry.path))
    return removed


def remove_abandoned(path: Path, signature: bytes = b"") -> list[Path]:
    """Remove the temporaries that runs killed while writing ``path`` left beside it; the
    paths removed.

    Only what is ours beyond doubt: a regular file (not a link) of this user, named exactly as
    :func:`temporary_beside` names them for ``path`` (``.NAME.`` and eight of ``mkstemp``'s
    letters, digits or ``_``, then ``.tmp``), empty or starting with ``signature`` (an HDF5
    file's, for a dataset), and that no live run holds: its writer held an exclusive ``flock``
    on it (``replace_atomically(..., lock=True)``), which the system drops when the writer
    dies. A file that cannot be opened or locked is left as it is.
    """
    path = Path(path)
    pattern = re.compile(rf"^\.{re.escape(path.name)}\.[a-z0-9_]{{8}}\.tmp$")
    removed = []
    try:
        entries = [e for e in os.scandir(path.parent) if pattern.match(e.name)]
    except OSError:
        return []
    for entry in entries:
        try:
            fd = os.open(entry.path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:  # a link, a FIFO nobody writes, or not ours to open
            continue
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
                continue
            if info.st_size and os.pread(fd, len(signature), 0) != signature:
                continue
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # fails while its writer lives
            if not os.path.samestat(info, os.stat(entry.path, follow_symlinks=False)):
                continue  # replaced since it was opened
            os.unlink(entry.path)
            removed.append(Path(entry.path))
        except OSError:
            continue
        finally:
            os.close(fd)
    return removed


def output_error(path: Path, err: OSError) -> OutputError:
    """An :class:`~hpctrain.errors.OutputError` naming ``path`` and the operating system's
    reason."""
    reason = err.strerror or str(err)
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        reason += "; free space or give another path"
    return OutputError(f"cannot write {path}: {reason}")


def _sync(path: Path) -> None:
    """fsync a file or a directory (where the file system allows it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:  # some file systems cannot sync a directory
        pass
    finally:
        os.close(fd)
