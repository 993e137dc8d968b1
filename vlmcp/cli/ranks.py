"""Where a command's ranks come from: torchrun's process group, or gloo ranks spawned here.

Every command that runs ranks (``train``, ``train --model``, ``verify``, ``verify --model``)
goes through :func:`run_on_ranks`: under torchrun the calling process is one rank and joins the
launcher's group (NCCL when CUDA is available, with the flight recorder on timeouts); otherwise
it spawns ``world`` gloo ranks (:func:`vlmcp.launch.spawn_ranks`), forwards its SIGTERM to them
(they finish the step, save and exit) and turns a failed rank into one line and exit code 1.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from datetime import timedelta
from typing import Any

__all__ = ["RanksFailed", "forward_sigterm", "is_rank_zero", "join_torchrun", "run_on_ranks", "say",
           "under_torchrun"]


class RanksFailed(Exception):
    """A rank failed; the one-line reason was printed already (the command exits 1)."""


def under_torchrun() -> bool:
    """Whether this process is a rank that torchrun (or another launcher setting its variables) started."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def is_rank_zero() -> bool:
    """True outside a launcher and on its rank 0: the process that reports."""
    return os.environ.get("RANK", "0") == "0"


def say(line: str, file=None) -> None:
    """Print once per run: under torchrun every rank runs the checks, rank 0 reports."""
    if is_rank_zero():
        print(line, file=file or sys.stdout, flush=True)


def forward_sigterm(*_) -> None:
    """The launcher's SIGTERM goes to every spawned rank; they finish the step, save and exit."""
    import multiprocessing

    for child in multiprocessing.active_children():
        try:
            os.kill(child.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


class _Interrupt:
    """The launcher's SIGINT (Ctrl-C) with ``interrupt=True``: the first is a SIGTERM to every rank
    (finish the step, save, stop); a second kills the ranks and exits 130 at once."""

    def __init__(self, command: str) -> None:
        self.command, self.count = command, 0

    def __call__(self, *_) -> None:
        self.count += 1
        if self.count > 1:
            print(f"\n{self.command}: interrupted again: stopping now, without a checkpoint", file=sys.stderr,
                  flush=True)
            raise SystemExit(130)  # spawn_ranks kills the ranks on the way out
        print(f"\n{self.command}: interrupted: finishing the step and saving a checkpoint (Ctrl-C again to "
              "stop at once)", file=sys.stderr, flush=True)
        forward_sigterm()


def join_torchrun(timeout: float):
    """Join torchrun's process group: NCCL with the flight recorder on timeouts, or gloo.

    Returns:
        ``torch.distributed``, initialized (the caller destroys the group).
    """
    import torch
    import torch.distributed as dist

    from vlmcp.train.faults import die_with_parent

    die_with_parent()  # a SIGKILLed torchrun agent takes its workers along
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        os.environ.setdefault("TORCH_NCCL_TRACE_BUFFER_SIZE", "2000")  # what each rank waited for
        os.environ.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout))
    return dist


def run_on_ranks(command: str, fn: Callable[..., Any], world: int, *args: Any, timeout: float | None,
                 collective_timeout: float | None = None, torchrun: bool = True, world_from: str = "",
                 interrupt: bool = False) -> Any:
    """``fn(group, *args)`` on ``world`` ranks; returns rank 0's result (None on other torchrun ranks).

    Args:
        command: the command's name in messages (``"vlmcp train"``).
        fn: the rank function; its first argument is the world's process group.
        world: the number of ranks (checked against torchrun's ``WORLD_SIZE``).
        timeout: seconds before spawned ranks are killed (None: no deadline).
        collective_timeout: seconds a collective waits for a peer (None: torch's default).
        torchrun: join torchrun's group when launched by it (``verify`` always spawns).
        world_from: where ``world`` comes from, for the mismatch message (``"--cp 2 x --dp 2 = 4"``).
        interrupt: a Ctrl-C stops the spawned ranks as a SIGTERM does (they save and stop; the
            caller reports), and a second one at once with exit status 130 (the rank function
            must handle SIGINT as SIGTERM too: the terminal sends it to every rank).

    Raises:
        RanksFailed: a spawned rank failed (its one line is printed to stderr).
        ValueError: torchrun started another number of ranks.
    """
    if torchrun and under_torchrun():
        if int(os.environ["WORLD_SIZE"]) != world:
            raise ValueError(f"{world_from or f'the run needs {world}'}, but torchrun started "
                             f"{os.environ['WORLD_SIZE']} ranks")
        dist = join_torchrun(collective_timeout or 1800.0)
        try:
            result = fn(dist.group.WORLD, *args)
        finally:
            dist.destroy_process_group()
        return result if is_rank_zero() else None
    from vlmcp.launch import RankFailure, spawn_ranks

    threads = max(1, (os.cpu_count() or 1) // world)
    previous = signal.signal(signal.SIGTERM, forward_sigterm)
    previous_int = signal.signal(signal.SIGINT, _Interrupt(command)) if interrupt else None
    try:
        return spawn_ranks(fn, world, *args, timeout=timeout, threads_per_rank=threads,
                           collective_timeout=collective_timeout)[0]
    except RankFailure as err:
        for line in err.lines:  # one per failed rank, or one message (a traceback)
            print(f"{command}: failed: {line}", file=sys.stderr)
        raise RanksFailed(str(err)) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
        if interrupt:
            signal.signal(signal.SIGINT, previous_int)
