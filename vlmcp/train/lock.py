"""One run per directory: an exclusive lock file, and who owns a temporary file.

Two runs writing one checkpoint directory replace and prune each other's checkpoints,
and two runs appending to one metrics file interleave their records. So a run takes
a lock on every place it writes (``--checkpoint-dir``, ``--output-dir``, the metrics
file) before any rank starts, and releases it when it ends::

    OUT/.vlmcp.lock       {"pid": 4242, "host": "node7", "started": "2026-12-01T15:51:02+00:00",
                           "proc_start": 123456}

The file is created with ``O_CREAT | O_EXCL`` (atomic, also on NFS v3+), so of two runs
that start together exactly one gets it. A lock whose process no longer exists on
this host (a run that was SIGKILLed or lost its machine's power) is stale: the next
run takes it over with a warning. A lock held by a live process, or by another host
(whose processes cannot be checked from here), is an error naming that run; delete
the file by hand only when you know that run is gone. ``proc_start`` (the process's
start time in clock ticks, Linux) tells a live holder from a new process that reused
its pid.

Temporary files name their writer as ``<pid>-<host>`` (:func:`writer_tag`); a writer
removes only its own and those whose writer is gone (:func:`writer_gone`).
"""

from __future__ import annotations

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
        self._held = False

    def _record(self) -> dict:
        return {"pid": os.getpid(), "host": socket.gethostname(),
                "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "proc_start": _proc_start(os.getpid())}

    def _read(self) -> dict | None:
        try:
            held = json.loads(self.path.read_text())
            return held if isinstance(held, dict) and isinstance(held.get("pid"), int) else None
        except (OSError, ValueError):
            return None

    def acquire(self) -> RunLock:
        """Take the lock; take over a stale one with a warning.

        Raises:
            RunLocked: another live run (or another host's run) holds it.
        """
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(3):  # a stale lock is removed, then created again like a fresh one
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                held = self._read()
                if held is None:  # half-written by a run that died right then, or not ours
                    held = {"pid": -1, "host": "?", "started": "?"}
                    if not self._stale_unreadable():
                        raise RunLocked(f"{self.what} {self.target}: {self.path} exists but cannot be read; "
                                        "if no run uses this directory, delete it") from None
                elif held["host"] != socket.gethostname() or _alive(held["pid"], held.get("proc_start")):
                    raise RunLocked(
                        f"{self.what} {self.target} is in use by another run (pid {held['pid']} on "
                        f"{held['host']}, started {held.get('started', '?')}); wait for it to end or choose "
                        f"another directory (if that run is gone, delete {self.path})") from None
                warnings.warn(f"{self.what} {self.target}: taking over the lock of a run that no longer "
                              f"exists (pid {held['pid']} on {held['host']}, started {held.get('started')})",
                              stacklevel=2)
                self.path.unlink(missing_ok=True)
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(self._record(), f)
            self._held = True
            return self
        raise RunLocked(f"{self.what} {self.target}: could not take the lock {self.path} (another run "
                        "keeps taking it)")

    def _stale_unreadable(self) -> bool:
        """An unreadable lock older than a minute is debris (a writer needs microseconds)."""
        import time

        try:
            return time.time() - self.path.stat().st_mtime > 60
        except OSError:
            return True

    def release(self) -> None:
        """Remove the lock if this process holds it (idempotent)."""
        if self._held:
            held = self._read()
            if held is not None and held["pid"] == os.getpid():
                self.path.unlink(missing_ok=True)
            self._held = False

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
