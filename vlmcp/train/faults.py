"""What a training rank does when its peers or its launcher fail: stalls and orphans.

Note [vlmcp stalled peers and orphaned ranks]
---------------------------------------------
A stalled rank (SIGSTOP, a hung driver, a dead NIC) never answers a collective. Every
process group a run makes waits at most ``--timeout``: the world group from
``init_process_group(timeout=)``, and every subgroup (CP, DP, Ulysses/USP) inherits it
(:func:`vlmcp.attention.usp_groups.group_timeout`; ``new_group`` without ``timeout=``
would wait torch's default 30 minutes). Ring attention's P2P waits use their group's
timeout too (gloo's ``Work.wait()``; NCCL's watchdog). When one runs out, the rank's
error is turned into one line by :func:`stall_guard`::

    step 25: all_reduce over ranks [0, 1] timed out (waited --timeout for ranks [1])

and the launcher (:func:`vlmcp.launch.spawn_ranks`) adds which ranks had not answered
when the first timeout came (and that a rank is stopped), kills every rank and exits
non-zero. A peer that died (SIGKILL, a segfault) closes its sockets: the ranks waiting on
it get gloo's "Connection reset by peer" at once, which :func:`stall_guard` turns into one
:class:`PeerLost` line in the same form, and the launcher reports the dead rank (its signal)
first, then one line per rank that lost it. Under torchrun each rank exits non-zero with its
line, and torchrun tears down the rest (its own contract). On NCCL the flight recorder
(``TORCH_NCCL_TRACE_BUFFER_SIZE``, ``TORCH_NCCL_DUMP_ON_TIMEOUT``) records what each rank was
waiting for.

An orphan is a rank whose launcher died (SIGKILL, OOM killer, a lost terminal): it would
go on training unsupervised, writing into the directories the next run uses. Ranks of
:func:`vlmcp.launch.spawn_ranks` are children of its fork server, not of the launcher,
and the fork server outlives the launcher while any rank lives (every rank holds a copy
of the pipe whose end-of-file would stop it), so the parent's death signal
(``prctl(PR_SET_PDEATHSIG)``) would never come: each rank runs a thread that checks the
launcher every half second and SIGKILLs its own process when the launcher is gone
(:func:`watch_launcher`; the launcher's start time guards against a reused pid). torchrun's
workers are its agent's children: there the rank asks the kernel for SIGKILL when its
parent dies (:func:`die_with_parent`, Linux), which covers a SIGKILLed agent; a
SIGTERM to torchrun follows torchrun's own contract (it forwards SIGTERM to the workers,
which finish the step, save and exit, and SIGKILLs them after its grace period).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import sys
import threading
import time
import traceback

import torch.distributed as dist

__all__ = ["CollectiveTimeout", "PeerLost", "die_with_parent", "is_peer_lost", "is_timeout", "stall_guard",
           "watch_launcher"]

_TIMEOUT = re.compile(r"timed out|timeout", re.IGNORECASE)
# what gloo (and NCCL) say when the rank at the other end of a connection is gone
_PEER_LOST = re.compile(r"Connection reset by peer|Connection closed by peer|Broken pipe|Socket closed|"
                        r"remote process exited")
_PR_SET_PDEATHSIG = 1


class CollectiveTimeout(RuntimeError):
    """A collective or P2P wait ran past the group's timeout; the message is one line."""


class PeerLost(RuntimeError):
    """A collective or P2P transfer failed because a peer's connection closed (the peer died);
    the message is one line."""


def is_peer_lost(err: BaseException) -> bool:
    """Whether ``err`` (or what caused it) is a distributed call whose peer went away."""
    while err is not None:
        if isinstance(err, PeerLost):
            return True
        if isinstance(err, RuntimeError) and _PEER_LOST.search(str(err)):
            return True
        err = err.__cause__ or err.__context__
    return False


def _peer_reason(err: BaseException) -> str:
    """``Connection reset by peer``: the words of the lost connection in ``err``'s chain."""
    while err is not None:
        if found := _PEER_LOST.search(str(err)):
            return found.group(0)
        err = err.__cause__ or err.__context__
    return "connection lost"


def is_timeout(err: BaseException) -> bool:
    """Whether ``err`` (or what caused it) is a distributed wait that ran out of time."""
    while err is not None:
        if isinstance(err, CollectiveTimeout):
            return True
        if isinstance(err, RuntimeError) and _TIMEOUT.search(str(err)):
            return True
        err = err.__cause__ or err.__context__
    return False


def _collective(err: BaseException) -> tuple[str, str, list[int] | None]:
    """The collective's name, ``"with"`` (P2P peers) or ``"over"`` (a group), and those global
    ranks, from the error or its traceback."""
    seen = err
    while seen is not None:
        if getattr(seen, "collective", None):
            return seen.collective, "with", getattr(seen, "peers", None)
        seen = seen.__cause__ or seen.__context__
    name, ranks = "a collective", None
    for frame, _ in traceback.walk_tb(err.__traceback__):
        if frame.f_code.co_filename.endswith("distributed_c10d.py") and frame.f_code.co_name[0] != "_":
            name = frame.f_code.co_name
            group = frame.f_locals.get("group")
            try:
                ranks = dist.get_process_group_ranks(group or dist.group.WORLD)
            except (RuntimeError, ValueError, AttributeError, KeyError):  # KeyError: a group destroyed
                ranks = None
    return name, "over", ranks


@contextlib.contextmanager
def stall_guard(where: str):
    """Turn a distributed timeout inside the block into one :class:`CollectiveTimeout` line, and a
    lost peer into one :class:`PeerLost` line.

    Args:
        where: what the rank was doing, e.g. ``"step 25"`` or ``"checkpoint of step 24"``.

    Other errors pass through unchanged.
    """
    try:
        yield
    except (CollectiveTimeout, PeerLost):
        raise
    except Exception as err:
        lost = is_peer_lost(err)  # first: gloo's words for a lost peer may say "timed out or failed" too
        if not lost and not is_timeout(err):
            raise
        name, how, ranks = _collective(err)
        group = f" {how} ranks {ranks}" if ranks else ""
        if lost:
            raise PeerLost(f"{where}: {name}{group} lost a peer ({_peer_reason(err)})") from err
        me = dist.get_rank() if dist.is_initialized() else None
        others = [r for r in ranks if r != me] if ranks else None
        waited = f" (waited --timeout for ranks {others})" if others else ""
        raise CollectiveTimeout(f"{where}: {name}{group} timed out{waited}") from err


def die_with_parent() -> bool:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux; False elsewhere)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _start_time(pid: int) -> str | None:
    """Process ``pid``'s start time (``/proc``, Linux), None if it does not exist or is a zombie
    (dead, not yet reaped by its parent); ``""`` where there is no ``/proc`` (then only
    existence is checked)."""
    if os.path.exists("/proc/self/stat"):
        try:
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            return None if fields[0] in ("Z", "X") else fields[19]
        except FileNotFoundError:
            return None
        except (OSError, IndexError):
            pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:  # exists, another user's
        pass
    return ""


def watch_launcher(pid: int, every: float = 0.5) -> threading.Thread:
    """SIGKILL this process within ``every`` seconds of process ``pid`` (the launcher) ending
    (at once when it is already gone). Returns the daemon thread that watches."""
    born = _start_time(pid)

    def check():
        while True:
            now = _start_time(pid)
            if now is None or (born and now != born):
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(every)

    if born is None:
        os.kill(os.getpid(), signal.SIGKILL)
    thread = threading.Thread(target=check, name="vlmcp-watch-launcher", daemon=True)
    thread.start()
    return thread
