"""How long planning a long packed row takes (the planner is vectorized: no loop per token).

Run: ``make bench-plan`` or ``vlmcp bench plan [--tokens N --samples S --cp P]``.
Prints the best of several repeats for ``plan_cp`` alone and for ``plan_cp`` plus
every rank's ``for_rank``.
"""

from __future__ import annotations

import argparse
import time

import torch

import vlmcp


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tokens", type=int, default=1 << 20, help="tokens of the packed row")
    parser.add_argument("--samples", type=int, default=512, help="samples packed into it")
    parser.add_argument("--cp", type=int, default=8, help="CP group size P")
    parser.add_argument("--image-tokens", type=int, default=576, help="image prefix per sample")
    parser.add_argument("--repeats", type=int, default=5, help="timings; the best is reported")


def run(args: argparse.Namespace) -> int:
    if args.tokens < args.samples * (args.image_tokens + 1):
        raise ValueError(f"--tokens {args.tokens} cannot hold {args.samples} samples of more than "
                         f"{args.image_tokens} image tokens each")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        best_plan, best_all = _time_plan(args)
    finally:
        torch.set_num_threads(threads)  # run() may be called in a longer-lived process
    print(f"L={args.tokens:,} tokens, {args.samples} samples, P={args.cp}, 1 thread: "
          f"plan_cp {best_plan * 1e3:.1f} ms; plan_cp + for_rank on all {args.cp} ranks "
          f"{best_all * 1e3:.1f} ms; one rank's for_rank {(best_all - best_plan) / args.cp * 1e3:.1f} ms "
          f"(best of {args.repeats})")
    return 0


def _time_plan(args: argparse.Namespace) -> tuple[float, float]:
    """Best seconds of ``plan_cp`` alone and of ``plan_cp`` plus every ``for_rank``."""
    g = torch.Generator().manual_seed(0)
    # random sample lengths summing to --tokens, each longer than its image prefix
    w = torch.rand(args.samples, generator=g) + 0.5
    lens = (w / w.sum() * (args.tokens - args.samples * (args.image_tokens + 1))).long()
    lens += args.image_tokens + 1
    lens[-1] += args.tokens - int(lens.sum())
    cu = torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)])
    offset = torch.arange(args.tokens) - cu[:-1].repeat_interleave(lens)
    is_image = offset < args.image_tokens
    best_plan = best_all = float("inf")
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        plan = vlmcp.plan_cp(is_image, args.cp, cu)
        t1 = time.perf_counter()
        plan.shards()
        t2 = time.perf_counter()
        best_plan, best_all = min(best_plan, t1 - t0), min(best_all, t2 - t0)
    return best_plan, best_all
