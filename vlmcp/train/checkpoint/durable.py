"""Files and directories that a crash or a planted link cannot corrupt: the checkpoints' primitives.

* :func:`open_exclusive` creates a temporary file with ``O_CREAT | O_EXCL | O_NOFOLLOW``: it
  never writes through a symlink planted at the (predictable) temporary name, nor into a
  file another writer holds open;
* :func:`fsync_file`, :func:`fsync_dir`: a rename is durable only once the renamed file's
  data and the directory holding the new name are on disk (a power cut otherwise leaves a
  complete-looking name over missing data);
* :func:`publish_dir` and :func:`retire_dir` put a complete directory in place and take one
  away so that no crash leaves a partial directory under a visible name (Note [vlmcp DCP
  checkpoints: atomic and durable]);
* :func:`remove_stale_temps`: the debris of crashed saves, this writer's and dead writers' only;
* :func:`clean_os_error`: a full disk inside ``torch.save`` or safetensors as one clean ``OSError``.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from pathlib import Path
from typing import IO

from vlmcp.train.lock import writer_gone, writer_tag

__all__ = ["clean_os_error", "fsync_dir", "fsync_file", "open_exclusive", "publish_dir", "remove_stale_temps",
           "retire_dir"]


def open_exclusive(path: str | os.PathLike) -> IO[bytes]:
    """A new file at ``path`` for writing (binary), created with ``O_EXCL | O_NOFOLLOW``.

    ``path`` is a temporary name that carries this writer's pid and host, so what sits there
    already is debris of this writer's own failed attempt or something planted (a symlink to a
    file elsewhere): the name is removed (a link itself, never its target) and created once
    more; a second clash means another process races for the name.

    Raises:
        FileExistsError: the name was taken again between the removal and the creation.
    """
    path = Path(path)

    def opener(name, flags):
        return os.open(name, flags | os.O_NOFOLLOW, 0o644)

    try:
        return open(path, "xb", opener=opener)
    except FileExistsError:
        path.unlink()  # a symlink is removed, not followed
    return open(path, "xb", opener=opener)


def fsync_file(path: str | os.PathLike) -> None:
    """Flush the data of the file ``path`` to disk (also a file another process wrote)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(directory: str | os.PathLike) -> None:
    """Make the names in ``directory`` durable (the renames into it); a no-op where a directory
    cannot be opened (not every platform can)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish_dir(temp: Path, final: Path) -> None:
    """Move the complete directory ``temp`` to ``final`` (same parent), durably.

    Every file of ``temp`` and ``temp`` itself are fsynced first; a directory already at ``final``
    is renamed aside to a hidden name (``.NAME.old-<pid>-<host>``) before ``temp`` takes its
    place, and deleted only after the parent directory is fsynced. A crash at any moment leaves
    ``final`` complete (old or new) or absent, never partial; debris is hidden and carries its
    writer, for :func:`remove_stale_temps`.
    """
    for p in sorted(temp.iterdir()):
        if p.is_file() and not p.is_symlink():
            fsync_file(p)
    fsync_dir(temp)
    aside = None
    if final.exists() or final.is_symlink():
        aside = final.with_name(f".{final.name}.old-{writer_tag()}")
        _remove(aside)  # this writer's own debris
        os.replace(final, aside)
    os.replace(temp, final)
    fsync_dir(final.parent)
    if aside is not None:
        _remove(aside)


def retire_dir(path: Path) -> None:
    """Delete the directory ``path`` so that no crash leaves it half deleted under its name: it is
    renamed to a hidden name first (``.NAME.old-<pid>-<host>``), then removed."""
    aside = path.with_name(f".{path.name}.old-{writer_tag()}")
    _remove(aside)
    os.replace(path, aside)
    fsync_dir(path.parent)
    _remove(aside)


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
    elif path.is_dir():
        shutil.rmtree(path)


_RUST_OS_ERROR = re.compile(r"I/O error: (.+) \(os error (\d+)\)")
"""How safetensors' Rust writer words an ``io::Error``: ``SafetensorError: Error while serializing:
I/O error: No space left on device (os error 28)``, no ``OSError`` in the chain."""


def clean_os_error(err: BaseException, what: str) -> OSError | None:
    """The operating system's error behind ``err`` as one clean ``OSError`` naming ``what``; None
    when no ``OSError`` caused it. A full disk inside ``torch.save`` surfaces as ``RuntimeError:
    unexpected pos`` chained to the ``OSError``; inside safetensors (``save_pretrained``) as a
    ``SafetensorError`` whose message carries the errno."""
    seen = err
    while seen is not None and not isinstance(seen, OSError):
        if type(seen).__name__ == "SafetensorError" and (m := _RUST_OS_ERROR.search(str(seen))):
            return OSError(int(m.group(2)), f"cannot write {what}: {m.group(1)}")
        seen = seen.__cause__ or seen.__context__
    if seen is None:
        return None
    reason = seen.strerror or str(seen)
    return OSError(seen.errno or errno.EIO, f"cannot write {what}: {reason}")


def remove_stale_temps(directory: Path, pattern: re.Pattern) -> None:
    """Remove the temporaries in ``directory`` whose name (``pattern``: groups pid and host)
    names this process or a writer that no longer exists; never a live writer's file."""
    if not directory.is_dir():
        return
    for p in directory.iterdir():
        m = pattern.match(p.name)
        if m and (f"{m.group(1)}-{m.group(2)}" == writer_tag() or writer_gone(int(m.group(1)), m.group(2))):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:  # a file, or a link (removed itself, never what it points to)
                p.unlink(missing_ok=True)
