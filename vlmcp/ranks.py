"""Where a command's ranks come from: torchrun's process group, or gloo ranks spawned here.

Every command that runs ranks (``train``, ``train --model``, ``verify``, ``verify --model``,
``compare``, and each benchmark of ``bench``) goes through :func:`run_command`: under torchrun
the calling process is one rank and joins the launcher's group (NCCL when CUDA is available,
with the flight recorder on timeouts); otherwise it spawns ``world`` gloo ranks
(:func:`vlmcp.launch.spawn_ranks`), forwards its SIGTERM to them (they finish the step, save
and exit) and turns a failed rank into one line per rank and exit code 1
(:func:`failures_reported`). The tests spawn through :func:`vlmcp.testing.run_on_ranks`, which
raises instead.

Nothing here imports torch at import time: a command's ``--help`` stays fast.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

__all__ = ["RanksFailed", "failures_reported", "forward_sigterm", "is_rank_zero", "join_torchrun",
           "run_command", "say", "under_torchrun"]


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


@contextlib.contextmanager
def failures_reported(command: str) -> Iterator[None]:
    """A :class:`vlmcp.launch.RankFailure` raised inside is printed to stderr, ``{command}: failed:
    {line}`` for each failed rank (or one message: a traceback), and re-raised as :class:`RanksFailed`.

    The output printed so far is flushed first, so that the figures stay ahead of the failure when
    stdout and stderr are piped to one file.
    """
    from vlmcp.launch import RankFailure  # torch: imported when ranks run, not at --help

    try:
        yield
    except RankFailure as err:
        sys.stdout.flush()
        for line in err.lines:
            print(f"{command}: failed: {line}", file=sys.stderr)
        raise RanksFailed(str(err)) from None


def run_command(command: str, fn: Callable[..., Any], world: int, *args: Any, timeout: float | None,
                collective_timeout: float | None = None, torchrun: bool = True, world_from: str = "",
                interrupt: bool = False, threads_per_rank: int | None = None,
                every_rank: bool = False) -> Any:
    """``fn(group, *args)`` on ``world`` ranks; returns rank 0's result (None on other torchrun ranks).

    Args:
        command: the command's name in messages (``"vlmcp train"``, ``"vlmcp bench memory"``).
        fn: the rank function; its first argument is the world's process group.
        world: the number of ranks (checked against torchrun's ``WORLD_SIZE``).
        timeout: seconds before spawned ranks are killed (None: no deadline).
        collective_timeout: seconds a collective waits for a peer (None: torch's default under
            torchrun, :func:`vlmcp.launch.spawn_ranks`' default for spawned ranks).
        torchrun: join torchrun's group when launched by it (``verify``, ``compare`` and the
            benchmarks always spawn).
        world_from: where ``world`` comes from, for the mismatch message (``"--cp 2 x --dp 2 = 4"``).
        interrupt: a Ctrl-C stops the spawned ranks as a SIGTERM does (they save and stop; the
            caller reports), and a second one at once with exit status 130 (the rank function
            must handle SIGINT as SIGTERM too: the terminal sends it to every rank).
        threads_per_rank: torch threads in each spawned rank (None: this machine's cores shared
            out; the benchmarks and ``compare`` take 1, so a rank's time is its own compute).
        every_rank: return every spawned rank's result, in rank order (with ``torchrun=False``).

    Raises:
        RanksFailed: a spawned rank failed (its one line is printed to stderr).
        ValueError: torchrun started another number of ranks.
    """
    if every_rank and torchrun:
        raise ValueError("run_command: every_rank needs torchrun=False (a torchrun rank holds only its own "
                         "result)")
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
    from vlmcp.launch import spawn_ranks

    threads = max(1, (os.cpu_count() or 1) // world) if threads_per_rank is None else threads_per_rank
    previous = signal.signal(signal.SIGTERM, forward_sigterm)
    previous_int = signal.signal(signal.SIGINT, _Interrupt(command)) if interrupt else None
    try:
        with failures_reported(command):
            results = spawn_ranks(fn, world, *args, timeout=timeout, threads_per_rank=threads,
                                  collective_timeout=collective_timeout)
        return results if every_rank else results[0]
    finally:
        signal.signal(signal.SIGTERM, previous)
        if interrupt:
            signal.signal(signal.SIGINT, previous_int)
