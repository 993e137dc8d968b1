"""Where spawned ranks meet: a private ``FileStore`` and loopback sockets, no port to the network.

:func:`vlmcp.launch.spawn_ranks` makes the directory (:func:`make_rendezvous`), each rank joins
it (:func:`join_rendezvous`), and the launcher removes it (:func:`remove_rendezvous`).

Note [vlmcp spawned ranks open no port to the network]
------------------------------------------------------
A ``TCPStore`` listens on every interface whatever host it is given (``*:PORT`` for the
whole run), unauthenticated: another host could read and write the rendezvous keys
(the addresses the ranks connect to). Spawned ranks all live on this machine, so they
rendezvous through a ``FileStore`` in a directory that ``tempfile.mkdtemp`` creates with
mode 0700 (only this user can open it) and that the launcher removes when the ranks are
done (or, after a SIGKILLed launcher, the next launch): no port at all. gloo's own pair
sockets (rank to rank) bind to the interface named by ``GLOO_SOCKET_IFNAME``, which every
spawned rank sets to the loopback interface, so they listen on ``127.0.0.1`` only
(``tests/test_launch_security.py`` lists every listening socket of the ranks and of the
launcher). Under torchrun, torchrun's rendezvous applies
(its ``--rdzv-endpoint`` store and ``MASTER_ADDR``), not this one.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from datetime import timedelta

import torch.distributed as dist

__all__ = ["join_rendezvous", "make_rendezvous", "remove_rendezvous"]

_PREFIX = "vlmcp-rendezvous-"


def _remove_orphans() -> None:
    """Remove the rendezvous directories of launchers that no longer run (a SIGKILLed launcher
    cannot remove its own; its ranks die with it)."""
    root = tempfile.gettempdir()
    try:
        names = [n for n in os.listdir(root) if n.startswith(_PREFIX)]
    except OSError:
        return
    for name in names:
        pid = name[len(_PREFIX):].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
        except OSError:  # another user's (alive), or not ours to check
            pass


def _loopback() -> str:
    """The name of this machine's loopback interface (``lo`` on Linux, ``lo0`` on macOS)."""
    names = [name for _, name in socket.if_nameindex()]
    return next((n for n in ("lo", "lo0") if n in names), "lo")


def make_rendezvous() -> str:
    """A new private directory (mode 0700, ``tempfile.mkdtemp``) for one spawn's ``FileStore``; its
    name carries the launcher's pid, so that a later launch can remove it if this one is killed."""
    _remove_orphans()
    return tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-")


def join_rendezvous(rendezvous: str, world_size: int, timeout: float) -> dist.Store:
    """In a spawned rank: the store of ``rendezvous``, waits bounded by ``timeout`` seconds, and
    gloo's sockets on the loopback interface."""
    # set, not defaulted: a GLOO_SOCKET_IFNAME exported for torchrun jobs (eth0) would open the
    # ranks' sockets to the network
    os.environ["GLOO_SOCKET_IFNAME"] = _loopback()
    store = dist.FileStore(os.path.join(rendezvous, "store"), world_size)
    store.set_timeout(timedelta(seconds=timeout))
    return store


def remove_rendezvous(rendezvous: str) -> None:
    """Remove the directory of a spawn whose ranks are done."""
    shutil.rmtree(rendezvous, ignore_errors=True)
