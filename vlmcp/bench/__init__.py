"""Benchmarks behind ``vlmcp bench`` and the "Measured" figures of docs/benchmarks.md (not tests).

One module per benchmark, each with ``add_arguments(parser)`` and ``run(args) -> int``:

* :mod:`vlmcp.bench.plan`: how long ``plan_cp`` and every rank's ``for_rank`` take
  on a long packed row (``vlmcp bench plan``, ``make bench-plan``);
* :mod:`vlmcp.bench.attention`: CP attention time and saved-for-backward bytes per
  rank against one process on the whole row, ring and Ulysses (``vlmcp bench attention``);
* :mod:`vlmcp.bench.saved_bytes`: saved-for-backward bytes per rank of one VLM training
  step against one process (``vlmcp bench memory``);
* :mod:`vlmcp.bench.vision`: ViT time per rank, ``replicate`` against ``scatter``
  (``vlmcp bench vision``);
* :mod:`vlmcp.bench.hf`: a Hugging Face Qwen2-VL under vlmcp: saved bytes per rank with
  videos and sharded visual tokens (``vlmcp bench hf-memory``), ViT time per rank for one
  long video (``vlmcp bench hf-vision``), what the LM head and loss save at a real vocabulary,
  full logits against chunked (``vlmcp bench hf-loss``), a whole training step at P against one
  process: time and the busiest rank's peak (``vlmcp bench hf-step``), ``vlmcp plan --model``'s memory
  estimate against the exact counter on tiny models (``vlmcp bench hf-estimate``); skipped without
  transformers.

``vlmcp bench all`` runs them all on their defaults (minutes; ``make bench``). Each starts its
ranks with :func:`bench_ranks`, through the launcher every command uses.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vlmcp.ranks import run_command

__all__ = ["BENCHMARKS", "bench_ranks"]

BENCHMARKS = {
    "plan": "vlmcp.bench.plan",
    "attention": "vlmcp.bench.attention",
    "memory": "vlmcp.bench.saved_bytes",
    "vision": "vlmcp.bench.vision",
    "hf-memory": "vlmcp.bench.hf.saved_bytes",
    "hf-vision": "vlmcp.bench.hf.vision",
    "hf-loss": "vlmcp.bench.hf.loss",
    "hf-step": "vlmcp.bench.hf.step",
    "hf-estimate": "vlmcp.bench.hf.estimate",
}
"""The names ``vlmcp bench`` accepts -> the module of each, in the order ``vlmcp bench all`` runs them."""


def bench_ranks(fn: Callable[..., Any], world: int, *args: Any, name: str, timeout: float) -> list[Any]:
    """``fn(group, *args)`` on ``world`` gloo ranks for ``vlmcp bench NAME``; every rank's result, in
    rank order (as :func:`vlmcp.launch.spawn_ranks` returns them).

    :func:`vlmcp.ranks.run_command` with one torch thread per rank (ranks that shared the cores
    would stretch each other's times) and always spawned, never torchrun's group; a failed rank
    is one line per rank, ``vlmcp bench NAME: failed: ...``, and the command exits 1.
    """
    return run_command(f"vlmcp bench {name}", fn, world, *args, timeout=timeout, torchrun=False,
                       threads_per_rank=1, every_rank=True)
