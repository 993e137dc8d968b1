"""Run a function on P gloo ranks on this machine, failing fast.

Every command that runs ranks without a launcher (``vlmcp train``, ``verify``, ``compare``,
``bench``, through :func:`vlmcp.ranks.run_command`) and every distributed test (through
:func:`vlmcp.testing.run_on_ranks`) go through :func:`spawn_ranks`. It spawns the
ranks from a fork server that has already imported torch (so a spawn costs
milliseconds, not an import), rendezvouses them through a ``FileStore`` in a private
directory with no port open to the network (:mod:`vlmcp.rendezvous`, Note [vlmcp spawned
ranks open no port to the network]), and waits for every rank, optionally with one deadline:

* a rank that raises makes the call fail at once with that rank's traceback,
  and the other ranks (probably stuck in a collective) are killed;
* a rank whose collective timed out (:class:`vlmcp.train.faults.CollectiveTimeout`) or
  whose disk failed (``OSError``) is reported in one line, not a traceback; for a
  timeout the line adds the ranks that had not answered by then, and which of them are
  stopped (Note [vlmcp stalled peers and orphaned ranks]);
* a rank that dies without a report (SIGKILL, a segfault, ``os._exit``) is named with its
  signal or exit code, one line, followed by one line for each rank that lost it as a peer
  (:class:`vlmcp.train.faults.PeerLost`), not their gloo tracebacks;
* ranks still running at the deadline are killed and reported by number;
* ranks never outlive the launcher: each watches it and SIGKILLs itself within a
  second of its death.

The function receives ``(group, *args)`` where ``group`` is the default gloo
process group of the spawned world, passed explicitly like every vlmcp API
expects. Run a grid of cases inside one call (one spawn) rather than one call
per case: starting ranks is the expensive part.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import queue
import signal
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from vlmcp.rendezvous import join_rendezvous, make_rendezvous, remove_rendezvous
from vlmcp.train.faults import (
    CollectiveTimeout,
    PeerLost,
    is_peer_lost,
    is_timeout,
    stall_guard,
    watch_launcher,
)

__all__ = ["RankFailure", "spawn_ranks"]

_CTX = mp.get_context("forkserver")
_CTX.set_forkserver_preload(["torch", "torch.distributed", "vlmcp"])


class RankFailure(RuntimeError):
    """A rank raised, died, or missed the deadline.

    Attributes:
        detail: the failing rank's traceback (also in the message, except for a one-line
            failure: a collective timeout, a lost peer, a dead rank or an ``OSError``).
        lines: the message's lines, one per failed rank, when each is one line (a rank
            that died and the ranks that lost it); otherwise ``[message]``.
    """

    def __init__(self, message: str, detail: str = "", lines: list[str] | None = None) -> None:
        super().__init__(message)
        self.detail = detail or message
        self.lines = lines or [message]


def _one_line(err: BaseException) -> tuple[str, str] | None:
    """The one-line report of an error that needs no traceback and its kind (``"timeout"``,
    ``"peer lost"``, ``"os"``), else None."""
    if not isinstance(err, (CollectiveTimeout, PeerLost)) and (is_timeout(err) or is_peer_lost(err)):
        try:  # raised outside any stall_guard: name the collective, not the step
            with stall_guard("outside the step loop"):
                raise err
        except (CollectiveTimeout, PeerLost) as brief:
            err = brief
    if isinstance(err, CollectiveTimeout):
        return str(err), "timeout"
    if isinstance(err, PeerLost):
        return str(err), "peer lost"
    if isinstance(err, OSError) and not isinstance(err, (FileNotFoundError, NotADirectoryError)):
        return f"{type(err).__name__}: {err}", "os"
    return None


def _proc_state(pid: int | None) -> str:
    """``"stopped"``, ``"running"`` ... from ``/proc`` (Linux), or ``""``."""
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError, TypeError):
        return ""
    return {"T": "stopped", "t": "stopped by a debugger", "D": "in uninterruptible I/O", "Z": "dead",
            "R": "running", "S": "waiting"}.get(state, state)


def _rank_main(fn, args, rank, world_size, rendezvous, results, threads, collective_timeout, launcher):
    watch_launcher(launcher)  # Note [vlmcp stalled peers and orphaned ranks]
    try:
        torch.set_num_threads(threads)
        store = join_rendezvous(rendezvous, world_size, collective_timeout)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=collective_timeout))
        try:
            report = (rank, "ok", pickle.dumps(fn(dist.group.WORLD, *args)))
        except BaseException as err:  # noqa: BLE001 - the parent reports it
            report = _report(rank, err)  # before the groups go: its line names their ranks
        finally:
            dist.destroy_process_group()
        results.put(report)
    except BaseException as err:  # noqa: BLE001 - the parent reports it
        results.put(_report(rank, err))


def _report(rank: int, err: BaseException) -> tuple:
    """What a failed rank sends the launcher: its one line (and its kind) or its traceback."""
    brief = _one_line(err)
    if brief is None:
        return rank, "error", traceback.format_exc()
    return rank, "brief", (brief[0], traceback.format_exc(), brief[1])


def spawn_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout: float | None = 120.0,
    threads_per_rank: int = 1,
    collective_timeout: float | None = None,
) -> list[Any]:
    """Run ``fn(group, *args)`` on ``world_size`` gloo ranks; return each rank's result.

    Args:
        fn: a module-level (picklable) function. Its return value must pickle.
        world_size: number of ranks to start (1 is allowed and still spawns).
        *args: picklable arguments passed to every rank.
        timeout: seconds for the whole call, rank start-up included; None waits
            as long as the ranks run (a failing rank still stops everything).
        threads_per_rank: torch intra-op threads in each rank.
        collective_timeout: seconds a rank waits in one collective before gloo
            raises (default: ``timeout``, at least 10 s; 300 s when ``timeout`` is None).

    Returns:
        ``[result of rank 0, result of rank 1, ...]``.

    Raises:
        RankFailure: with the failing rank's traceback, or naming the
            ranks that were still running at the deadline.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if collective_timeout is None:
        collective_timeout = 300.0 if timeout is None else max(timeout, 10.0)
    rendezvous = make_rendezvous()
    results = _CTX.Queue()
    procs = [
        _CTX.Process(
            target=_rank_main,
            args=(fn, args, r, world_size, rendezvous, results, threads_per_rank,
                  collective_timeout, os.getpid()),
            daemon=True,
        )
        for r in range(world_size)
    ]
    deadline = float("inf") if timeout is None else time.monotonic() + timeout
    outputs: dict[int, Any] = {}
    try:
        for p in procs:
            p.start()
        while len(outputs) < world_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = sorted(set(range(world_size)) - set(outputs))
                raise RankFailure(
                    f"{fn.__name__}: ranks {missing} of {world_size} still running after "
                    f"{timeout:.0f}s (hang?)")
            try:
                rank, status, payload = results.get(timeout=min(remaining, 0.5))
            except queue.Empty:
                if any(p.exitcode not in (None, 0) and r not in outputs for r, p in enumerate(procs)):
                    # a rank died without reporting (SIGKILL, segfault, os._exit): its peers
                    # are about to report that they lost it
                    _raise_collected(fn, procs, outputs, results, {}, grace=2.0)
                continue
            if status == "brief" and payload[2] == "timeout":
                _raise_brief(fn, rank, payload, procs, outputs, results)
            if status == "brief" and payload[2] != "peer lost":
                raise RankFailure(f"rank {rank}: {payload[0]}", payload[1])
            if status in ("brief", "error"):
                # a peer that died silently is the likelier root cause of an error; a lost
                # peer is someone else's failure, and that rank's line comes first
                _raise_collected(fn, procs, outputs, results, {rank: (status, payload)},
                                 grace=2.0 if status == "brief" else 0.3)
            outputs[rank] = pickle.loads(payload)
    finally:
        started = [p for p in procs if p.pid is not None]  # a start that failed leaves the rest unstarted
        for p in started:
            p.join(timeout=5 if len(outputs) == world_size else 0)
        for p in started:
            if p.is_alive():
                p.kill()
                p.join()
        results.close()
        remove_rendezvous(rendezvous)
    return [outputs[r] for r in range(world_size)]


def _death(rank: int, code: int) -> str:
    """``rank 1 was killed by SIGKILL (signal 9) without a report``, or its exit code."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "a signal"
        return f"rank {rank} was killed by {name} (signal {-code}) without a report"
    return f"rank {rank} died with exit code {code} without a report"


def _raise_collected(fn, procs, outputs: dict, results, reports: dict, grace: float) -> None:
    """Raise the failure of the run after its first sign, with what every rank says within ``grace``.

    The ranks that died without a report come first (the likely cause), one line each; then a
    rank's traceback if one raised, or else one line per rank that reported: its own failure
    (a full disk, a timeout), then those that only lost a peer.
    """
    world = len(procs)
    end = time.monotonic() + grace
    while time.monotonic() < end:
        try:
            rank, status, payload = results.get(timeout=0.05)
        except queue.Empty:
            if all(r in reports or r in outputs or procs[r].exitcode is not None for r in range(world)):
                break
            continue
        if status == "ok":
            outputs[rank] = pickle.loads(payload)
        else:
            reports[rank] = (status, payload)
    deaths = [_death(r, procs[r].exitcode) for r in range(world)
              if r not in reports and r not in outputs and procs[r].exitcode not in (None, 0)]
    errors = [(r, payload) for r, (status, payload) in sorted(reports.items()) if status == "error"]
    if errors:
        rank, trace = errors[0]
        raise RankFailure(f"{fn.__name__}: {''.join(d + '; ' for d in deaths)}failed on rank {rank} of "
                          f"{world}:\n{trace}")
    # the causes first (a dead rank, a full disk), then the ranks that only lost them as peers
    briefs = sorted(reports.items(), key=lambda item: (item[1][1][2] == "peer lost", item[0]))
    lines = deaths + [f"rank {r}: {payload[0]}" for r, (_, payload) in briefs]
    detail = "\n".join(f"rank {r}:\n{payload[1]}" for r, (_, payload) in sorted(reports.items()))
    raise RankFailure("\n".join(lines), detail, lines)


def _raise_brief(fn, rank: int, payload, procs, outputs: dict, results) -> None:
    """Raise the one-line timeout of ``rank``, naming who had not answered.

    Ranks whose own waits timed out within a second of the first are answering (they
    waited on someone else); the ones left with no report are the stalled ones.
    """
    line, detail, _ = payload
    reported = {rank} | set(outputs)
    end = time.monotonic() + 1.0
    while time.monotonic() < end:
        try:
            other, _, _ = results.get(timeout=max(0.0, end - time.monotonic()))
            reported.add(other)
        except queue.Empty:
            break
    silent = [r for r in range(len(procs)) if r not in reported]
    if silent:
        states = [f"{r}" + (f" ({st})" if (st := _proc_state(procs[r].pid)) else "") for r in silent]
        line += f"; no answer from rank{'s' if len(silent) > 1 else ''} {', '.join(states)}"
    raise RankFailure(f"rank {rank}: {line}", detail)
