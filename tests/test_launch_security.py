"""Spawned ranks open no port to the network (issue 31, item 2).

The launcher used to own a ``TCPStore``, which listens on every interface (``*:PORT``) for the
whole run, unauthenticated. Ranks now rendezvous through a ``FileStore`` in a 0700 directory,
and gloo's own sockets listen on loopback only (Note [vlmcp spawned ranks open no port to the
network]).
"""

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests import dist_cases
from vlmcp import rendezvous
from vlmcp.testing import run_on_ranks

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="reads /proc/net/tcp (Linux)")]


def test_spawned_ranks_listen_on_loopback_only_and_the_launcher_not_at_all(monkeypatch):
    made = []
    real = rendezvous.tempfile.mkdtemp

    def mkdtemp(*args, **kwargs):
        path = real(*args, **kwargs)
        if os.path.basename(path).startswith("vlmcp-rendezvous-"):  # multiprocessing makes its own
            made.append((path, stat.S_IMODE(os.stat(path).st_mode)))
        return path

    monkeypatch.setattr(rendezvous.tempfile, "mkdtemp", mkdtemp)
    # a SIGKILLed launcher's rendezvous directory goes with the next launch; a live one's stays
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    orphan = Path(real(prefix=f"vlmcp-rendezvous-{gone}-"))
    (orphan / "store").write_text("x")
    live = Path(real(prefix=f"vlmcp-rendezvous-{os.getppid()}-"))
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth0")  # exported for torchrun jobs: must not open the ranks
    results = run_on_ranks(dist_cases.listening_sockets, 3, os.getpid(), timeout=60)
    for rank, seen in enumerate(results):
        # gloo listens for its peers (one socket or more per rank): every one on loopback
        assert seen["rank"] and all(seen["loopback"]), (rank, seen["rank"])
        assert seen["launcher"] == [] and seen["fork server"] == [], (rank, seen)
        assert seen["ifname"] == "lo" and seen["sum"] == (6.0 if rank < 2 else 3.0)
    # the rendezvous directory: private while the ranks run, gone after them
    assert len(made) == 1 and made[0][1] == 0o700
    assert not os.path.exists(made[0][0])
    assert not orphan.exists() and live.exists()
    live.rmdir()
