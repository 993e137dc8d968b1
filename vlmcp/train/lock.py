"""One run per directory: an exclusive lock file, and who owns a temporary file.

Two runs writing one checkpoint directory replace and prune each other's checkpoints,
and two runs appending to one metrics file interleave their records. So a run takes
a lock on every place it writes (``--checkpoint-dir``, ``--output-dir``, the metrics
file) before any rank starts, and releases it when it ends::

    OUT/.vlmcp.lock       {"pid": 4242, "host": "node7", "started": "2026-12-01T15:51:02+00:00",
                           "proc_start": 123456}

The run holds the file with ``flock(LOCK_EX)`` for as long as it runs; the kernel lets one
open file hold it at a time and drops it when its process dies, however it dies. So of two
runs that start together exactly one gets it, and a lock whose run no longer exists (a run
that was SIGKILLed or lost its machine's power) is simply free: the next run takes it over
with a warning, and of two runs that take over one stale lock together exactly one wins
(checking the holder's pid and then deleting the file, as vlmcp did before, let both win: the
second deleted the first's fresh lock). A run that gets the kernel lock still reads the file:
a live process named there (a run of an older vlmcp, which did not ``flock``; this process on
NFS, where locks are per process) or another host (whose processes cannot be checked from
here) is an error naming that run; delete the file by hand only when you know that run is
gone. ``proc_start`` (the process's start time in clock ticks, Linux) tells a live holder
from a new process that reused its pid. A run that ends deletes the file, then lets the lock
go; a run that locked the deleted file meanwhile sees that the name now points elsewhere and
tries again. Where the file system cannot ``flock`` (some NFS mounts), the file is created
with ``O_CREAT | O_EXCL`` and a stale one is not taken over: the error says to delete it.

Temporary files name their writer as ``<pid>-<host>`` (:func:`writer_tag`); a writer
removes only its own and those whose writer is gone (:func:`writer_gone`).
"""

from __future__ import annotations

import errno
import json
import os
import socket
import warnings
from datetime import datetime, timezone
from pathlib import Path

__all__ = ["LOCK_NAME", "RunLock", "RunLocked", "writer_gone", "writer_tag"]

LOCK_NAME = ".vlmcp.lock"


class RunLocked(ValueError):
    """Another run holds the lock (a flag error: the command line exits with code 2)."""


def _stat(pid: int) -> list[str] | None:
    """Fields 3... of ``/proc/<pid>/stat`` (Linux), or None."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()  # the name may hold spaces
    except OSError:
        return None


def _proc_start(pid: int) -> int | None:
    """The start time of process ``pid`` in clock ticks since boot (Linux), or None."""
    fields = _stat(pid)
    return int(fields[19]) if fields else None  # field 22


def _alive(pid: int, proc_start: int | None = None) -> bool:
    """Whether ``pid`` runs on this host (a zombie, dead but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, another user's
        return True
    fields = _stat(pid)
    if fields and fields[0] in ("Z", "X"):
        return False
    if proc_start is not None:
        now = _proc_start(pid)
        return now is None or now == proc_start
    return True


def writer_tag() -> str:
    """``<pid>-<host>``: the owner part of this process's temporary file names."""
    return f"{os.getpid()}-{socket.gethostname()}"


def writer_gone(pid: int, host: str) -> bool:
    """True when process ``pid`` of ``host`` is known to no longer exist (this host only)."""
    return host == socket.gethostname() and pid != os.getpid() and not _alive(pid)


class RunLock:
    """The lock of one directory, or of one file (then ``.<name>.lock`` beside it).

    Args:
        path: a directory the run writes into, or a file it writes (``file=True``).
        what: how the message names it, e.g. ``"--checkpoint-dir"``.
        file: ``path`` is a file.

    Use as a context manager, or :meth:`acquire` and :meth:`release`.
    """

    def __init__(self, path: str | os.PathLike, what: str, file: bool = False) -> None:
        path = Path(path)
        self.path = path.parent / f".{path.name}.lock" if file else path / LOCK_NAME
        self.what, self.target = what, path
        self._held, self._fd = False, None

    def _record(self) -> dict:
        return {"pid": os.getpid(), "host": socket.gethostname(),
                "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "proc_start": _proc_start(os.getpid())}

    def _read(self, fd: int | None = None) -> dict | None:
        try:
            text = os.pread(fd, 1 << 16, 0).decode() if fd is not None else self.path.read_text()
            held = json.loads(text)
            return held if isinstance(held, dict) and isinstance(held.get("pid"), int) else None
        except (OSError, ValueError):
            return None

    def _in_use(self, held: dict | None) -> RunLocked:
        if held is None:
            return RunLocked(f"{self.what} {self.target} is in use by another run (it holds {self.path}); "
                             "wait for it to end or choose another directory")
        return RunLocked(
            f"{self.what} {self.target} is in use by another run (pid {held['pid']} on {held['host']}, "
            f"started {held.get('started', '?')}); wait for it to end or choose another directory (if that "
            f"run is gone, delete {self.path})")

    def acquire(self) -> RunLock:
        """Take the lock; take over a stale one with a warning.

        Raises:
            RunLocked: another live run (or another host's run) holds it.
        """
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(3):  # the name pointed at a file its run was deleting: once more
            try:
                fd, created = os.open(self.path, os.O_RDWR | os.O_NOFOLLOW), False
            except FileNotFoundError:
                try:  # O_EXCL: where flock fails, having created the file is the lock
                    fd, created = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                                          0o644), True
                except FileExistsError:
                    continue
            except OSError as err:
                if err.errno != errno.ELOOP:
                    raise
                raise RunLocked(f"{self.what} {self.target}: {self.path} is a symbolic link, not a lock "
                                "file; delete it") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise self._in_use(self._read()) from None
            except OSError as err:
                if err.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                    os.close(fd)
                    raise
                if not created:
                    os.close(fd)
                    raise self._no_takeover() from None
                # else the file is ours alone (O_EXCL), held by its existence
            try:
                if os.fstat(fd).st_ino != os.stat(self.path, follow_symlinks=False).st_ino:
                    os.close(fd)
                    continue
            except FileNotFoundError:
                os.close(fd)
                continue
            try:
                self._take(fd)
            except BaseException:
                os.close(fd)  # refused: the file stays as it was, the kernel lock goes
                raise
            self._fd, self._held = fd, True
            return self
        raise RunLocked(f"{self.what} {self.target}: could not take the lock {self.path} (another run "
                        "keeps taking it)")

    def _take(self, fd: int) -> None:
        """With the kernel lock held: refuse a holder that is alive or elsewhere, else write ours."""
        held = self._read(fd)
        if held is not None:
            if held["host"] != socket.gethostname() or _alive(held["pid"], held.get("proc_start")):
                raise self._in_use(held)
            warnings.warn(f"{self.what} {self.target}: taking over the lock of a run that no longer exists "
                          f"(pid {held['pid']} on {held['host']}, started {held.get('started')})",
                          stacklevel=3)
        elif os.fstat(fd).st_size:  # not a record: a file no run holds, debris
            warnings.warn(f"{self.what} {self.target}: taking over {self.path}, which no run holds and which "
                          "holds no lock record", stacklevel=3)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(self._record()).encode(), 0)

    def _no_takeover(self) -> RunLocked:
        """Without ``flock`` the lock is the file's existence (``O_EXCL``), and a stale one is not taken
        over: deleting it is not atomic."""
        held = self._read()
        if held is not None and held["host"] == socket.gethostname() and not _alive(held["pid"],
                                                                                  held.get("proc_start")):
            return RunLocked(f"{self.what} {self.target}: {self.path} names a run that no longer exists "
                             f"(pid {held['pid']}), but this file system cannot lock files, so it is not "
                             "taken over; delete it")
        return self._in_use(held)

    def release(self) -> None:
        """Remove the lock if this process holds it (idempotent): the file first, then the kernel lock."""
        if not self._held:
            return
        fd, self._fd, self._held = self._fd, None, False
        try:
            if fd is None or os.fstat(fd).st_ino == os.stat(self.path, follow_symlinks=False).st_ino:
                held = self._read(fd)
                if held is not None and held["pid"] == os.getpid():
                    self.path.unlink(missing_ok=True)
        except FileNotFoundError:
            pass
        finally:
            if fd is not None:
                os.close(fd)

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
