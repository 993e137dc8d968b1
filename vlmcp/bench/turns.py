"""Timing a rank's variants of one piece of work, one rank at a time (the benchmarks' ViT times).

On a shared machine the ranks of a gloo group compete for the same cores, so a rank's time
would measure its neighbours. :func:`time_in_turns` lets one rank compute while the others
wait at a barrier, and runs every variant back to back in that turn (alternating their order
from one round to the next), so machine noise hits them alike; the first round warms up.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import torch.distributed as dist

__all__ = ["time_in_turns"]


def time_in_turns(group: dist.ProcessGroup, repeats: int, work: Mapping[str, Callable[[], None]],
                  reset: Callable[[], None]) -> dict[str, list[float]]:
    """Seconds of each ``work[name]()`` on this rank, ``repeats`` times (after one warm-up round).

    Args:
        group: the ranks that take turns (every rank calls this).
        repeats: timed rounds.
        work: variant name -> the work (forward and backward), run in this rank's turn.
        reset: run after each variant (e.g. ``model.zero_grad``), not timed.
    """
    P, r = dist.get_world_size(group), dist.get_rank(group)
    times: dict[str, list[float]] = {name: [] for name in work}
    for rep in range(repeats + 1):
        for turn in range(P):
            dist.barrier(group=group)
            if turn != r:
                continue
            order = list(work.items()) if rep % 2 else list(work.items())[::-1]
            for name, fn in order:
                t0 = time.perf_counter()
                fn()
                if rep:
                    times[name].append(time.perf_counter() - t0)
                reset()
    return times
