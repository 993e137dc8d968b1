"""Run a function on P gloo ranks on this machine, failing fast.

``vlmcp train`` without a launcher, ``vlmcp verify``, and every distributed test
(through :func:`vlmcp.testing.run_on_ranks`) go through :func:`spawn_ranks`. It spawns the
ranks from a fork server that has already imported torch (so a spawn costs
milliseconds, not an import), rendezvouses them through a ``TCPStore`` that the
parent owns on a free loopback port (no port race: the OS picks the port and
the parent holds it), and waits for every rank, optionally with one deadline:

* a rank that raises makes the call fail at once with that rank's traceback,
  and the other ranks (probably stuck in a collective) are killed;
* a rank whose collective timed out (:class:`vlmcp.train.faults.CollectiveTimeout`) or
  whose disk failed (``OSError``) is reported in one line, not a traceback; for a
  timeout the line adds the ranks that had not answered by then, and which of them are
  stopped (Note [vlmcp stalled peers and orphaned ranks]);
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
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["RankFailure", "spawn_ranks"]

_CTX = mp.get_context("forkserver")
_CTX.set_forkserver_preload(["torch", "torch.distributed", "vlmcp"])


class RankFailure(RuntimeError):
    """A rank raised, died, or missed the deadline.

    Attributes:
        detail: the failing rank's traceback (also in the message, except for a one-line
            failure: a collective timeout or an ``OSError``).
    """

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail or message


def _one_line(err: BaseException) -> str | None:
    """The one-line report of an error that needs no traceback, else None."""
    from vlmcp.train.faults import CollectiveTimeout, is_timeout, stall_guard

    if isinstance(err, CollectiveTimeout):
        return str(err)
    if is_timeout(err):  # raised outside any stall_guard: name the collective, not the step
        try:
            with stall_guard("outside the step loop"):
                raise err
        except CollectiveTimeout as timeout:
            return str(timeout)
    if isinstance(err, OSError) and not isinstance(err, (FileNotFoundError, NotADirectoryError)):
        return f"{type(err).__name__}: {err}"
    return None


def _proc_state(pid: int | None) -> str:
    """``"stopped"``, ``"running"`` ... from ``/proc`` (Linux), or ``""``."""
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError, TypeError):
        return ""
    return {"T": "stopped", "t": "stopped by a debugger", "D": "in uninterruptible I/O", "Z": "dead",
            "R": "running", "S": "waiting"}.get(state, state)


def _rank_main(fn, args, rank, world_size, port, results, threads, collective_timeout, launcher):
    from vlmcp.train.faults import watch_launcher

    watch_launcher(launcher)  # Note [vlmcp stalled peers and orphaned ranks]
    try:
        torch.set_num_threads(threads)
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        store = dist.TCPStore("127.0.0.1", port, world_size + 1, is_master=False,
                              timeout=timedelta(seconds=collective_timeout))
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=collective_timeout))
        try:
            out = fn(dist.group.WORLD, *args)
        finally:
            dist.destroy_process_group()
        results.put((rank, "ok", pickle.dumps(out)))
    except BaseException as err:  # noqa: BLE001 - the parent reports it
        line = _one_line(err)
        results.put((rank, "error", traceback.format_exc()) if line is None
                    else (rank, "brief", (line, traceback.format_exc())))


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
    store = dist.TCPStore("127.0.0.1", 0, world_size + 1, is_master=True,
                          wait_for_workers=False, timeout=timedelta(seconds=collective_timeout))
    results = _CTX.Queue()
    procs = [
        _CTX.Process(
            target=_rank_main,
            args=(fn, args, r, world_size, store.port, results, threads_per_rank,
                  collective_timeout, os.getpid()),
            daemon=True,
        )
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    deadline = float("inf") if timeout is None else time.monotonic() + timeout
    outputs: dict[int, Any] = {}
    try:
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
                dead = [r for r, p in enumerate(procs)
                        if p.exitcode not in (None, 0) and r not in outputs]
                if dead:
                    # A rank died without reporting (segfault, os._exit, kill).
                    time.sleep(0.2)  # let a late report arrive first
                    if results.empty():
                        raise RankFailure(
                            f"{fn.__name__}: rank {dead[0]} died with exit code "
                            f"{procs[dead[0]].exitcode} without a report") from None
                continue
            if status == "brief":
                _raise_brief(fn, rank, payload, procs, outputs, results)
            if status == "error":
                time.sleep(0.3)  # a peer that died silently is the likelier root cause
                silent = [f"rank {r} died with exit code {p.exitcode} without a report; "
                          for r, p in enumerate(procs)
                          if p.exitcode not in (None, 0) and r not in outputs and r != rank]
                raise RankFailure(
                    f"{fn.__name__}: {''.join(silent)}failed on rank {rank} of {world_size}:"
                    f"\n{payload}")
            outputs[rank] = pickle.loads(payload)
    finally:
        for p in procs:
            p.join(timeout=5 if len(outputs) == world_size else 0)
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        results.close()
    return [outputs[r] for r in range(world_size)]


def _raise_brief(fn, rank: int, payload, procs, outputs: dict, results) -> None:
    """Raise the one-line failure of ``rank``; after a timeout, name who had not answered.

    Ranks whose own waits timed out within a second of the first are answering (they
    waited on someone else); the ones left with no report are the stalled ones.
    """
    line, detail = payload
    reported = {rank} | set(outputs)
    if "timed out" in line:
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
