"""Helpers for testing distributed vlmcp code on one machine (gloo on the CPU).

:func:`run_on_ranks` is :func:`vlmcp.launch.spawn_ranks` with a deadline that
is always set, so a hang fails the test instead of blocking CI.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vlmcp.launch import RankFailure, spawn_ranks

__all__ = ["DistributedTestError", "run_on_ranks"]

DistributedTestError = RankFailure


def run_on_ranks(fn: Callable[..., Any], world_size: int, *args: Any, timeout: float = 120.0,
                 threads_per_rank: int = 1) -> list[Any]:
    """Run ``fn(group, *args)`` on ``world_size`` gloo ranks within ``timeout`` seconds.

    Returns each rank's (pickled) result in rank order; raises
    :class:`DistributedTestError` with the failing rank's traceback, or naming the
    ranks still running at the deadline.

    ``fn`` must be importable by name from a module (ranks start from a fork server
    that imports it; a function typed into ``python -`` or a notebook cannot be), and
    a script that calls this needs the ``if __name__ == "__main__":`` guard.
    """
    return spawn_ranks(fn, world_size, *args, timeout=timeout, threads_per_rank=threads_per_rank)
