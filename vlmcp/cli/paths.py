"""Output paths of the command line, checked before any work starts.

A run that finds out only when it saves that it cannot write its checkpoint, metrics
or picture has lost all its work, so every flag that names something to write is
checked first, before any rank starts (under torchrun: in every rank, before the
process group forms): the directory is created (as the writer would create it later)
and a temporary file is made and removed in it. A path that cannot be written is a
:class:`ValueError` naming the flag, the path and the operating system's reason; the
command line prints it as one line and exits with code 2, like every other flag error.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["check_writable_dir", "check_writable_file"]


def check_writable_dir(flag: str, path: str | os.PathLike) -> Path:
    """Create the directory ``path`` if needed and check that files can be created in it.

    Args:
        flag: the command-line flag that names the directory, for the message
            (e.g. ``"--checkpoint-dir"``).
        path: the directory; missing parents are created.

    Returns:
        ``Path(path)``, which now exists.

    Raises:
        ValueError: ``"{flag} {path}: {reason}"`` when it cannot be created or written.
    """
    _check_not_empty(flag, path)
    directory = Path(path)
    problem = _unwritable_dir(directory, target=directory)
    if problem:
        raise ValueError(f"{flag} {path}: {problem}")
    return directory


def check_writable_file(flag: str, path: str | os.PathLike) -> Path:
    """Check that the file ``path`` can be written: create its directory, try a file there.

    An existing file is opened for appending and left as it is; a missing one is not
    created (only a temporary file beside it).

    Args:
        flag: the command-line flag that names the file, for the message (e.g. ``"--out"``).
        path: the file.

    Returns:
        ``Path(path)``.

    Raises:
        ValueError: ``"{flag} {path}: {reason}"`` when it cannot be written.
    """
    _check_not_empty(flag, path)
    file = Path(path)
    if file.is_dir():
        raise ValueError(f"{flag} {path}: is a directory, not a file")
    problem = _unwritable_dir(file.parent, target=file)
    if not problem and file.exists():
        try:
            with open(file, "ab"):  # appending writes nothing: the file stays as it is
                pass
        except OSError as err:
            problem = f"cannot write the file: {_reason(err)}"
    if problem:
        raise ValueError(f"{flag} {path}: {problem}")
    return file


def _check_not_empty(flag: str, path: str | os.PathLike) -> None:
    # Path("") is ".": an empty shell variable would quietly mean the current directory.
    if os.fspath(path) == "":
        raise ValueError(f"{flag} needs a path, got ''")


def _unwritable_dir(directory: Path, target: Path) -> str | None:
    """Why files cannot be created in ``directory`` (created if missing), or None.

    ``target`` is the path the flag names (``directory`` or a file in it), which the
    message does not repeat.
    """
    for ancestor in (directory, *directory.parents):
        if ancestor.exists():
            if not ancestor.is_dir():
                where = "" if ancestor == target else f"{ancestor} "
                return f"{where}is a file, not a directory"
            break
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        return f"cannot create the directory {directory}: {_reason(err)}"
    try:
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".vlmcp-write-check-"):
            pass
    except OSError as err:
        return f"cannot create a file in {directory}: {_reason(err)}"
    return None


def _reason(err: OSError) -> str:
    # The OS's words ("Permission denied"); the path is already in the message.
    return err.strerror or str(err)
