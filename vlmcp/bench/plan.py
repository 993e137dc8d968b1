"""The planner's speed on a long packed row, and its balance on chat-layout rows.

Run: ``make bench-plan`` or ``vlmcp bench plan [--tokens N --samples S --cp P]``.
Prints the best of several repeats for ``plan_cp`` alone and for ``plan_cp`` plus
every rank's ``for_rank``; then, on ``--chat-rows`` rows of the chat-layout mix
(:mod:`vlmcp.bench.chat_rows`, 32,768 tokens each) at P = 2, 4 and 8, the text-query
work max/mean of plain per-sample zigzag (equal chunks) and of vlmcp's cut points,
the padding they cost, and the share of attended pairs that replicated image queries
repeat on every rank (images after text see it from the passing chunks).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

import vlmcp
from vlmcp.bench.chat_rows import chat_rows
from vlmcp.layout.cuts import equal_cuts


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tokens", type=int, default=1 << 20, help="tokens of the packed row")
    parser.add_argument("--samples", type=int, default=512, help="samples packed into it")
    parser.add_argument("--cp", type=int, default=8, help="CP group size P")
    parser.add_argument("--image-tokens", type=int, default=576, help="image prefix per sample")
    parser.add_argument("--repeats", type=int, default=5, help="timings; the best is reported")
    parser.add_argument("--chat-rows", type=int, default=40,
                        help="chat-layout rows for the balance table (0: skip it)")


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
    if args.chat_rows > 0:
        print(chat_balance_table(args.chat_rows))
    return 0


def chat_balance_table(num_rows: int, seed: int = 0) -> str:
    """Text-query balance, padding and repeated image-query pairs on chat rows at P = 2, 4, 8."""
    rows = chat_rows(num_rows, seed=seed)
    lines = [f"{num_rows} chat-layout rows of <= 32,768 tokens (vlmcp.bench.chat_rows), replicate, causal:",
             "   P  text max/mean, equal chunks (mean / worst)  vlmcp cuts (mean / worst)  padding "
             "(mean / worst rank)  image-after-text pairs / all pairs"]
    for P in (2, 4, 8):
        plain, mine, pad, repeated = [], [], [], []
        for is_image, cu in rows:
            plan = vlmcp.plan_cp(is_image, P, cu)
            work = vlmcp.attended_pairs(plan)
            mine.append(work.text_balance)
            plain.append(equal_chunk_text_balance(plan))
            pad.append(max(1 - t / s for t, s in zip(work.tokens, work.slots, strict=True)))
            repeated.append(_image_text_pairs(plan) / sum(work.total_pairs))
        mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
        lines.append(f"  {P:2d}  {mean(plain):20.4f} / {max(plain):.4f}  {mean(mine):17.4f} / {max(mine):.4f}"
                     f"  {mean(pad):11.2%} / {max(pad):.2%}  {mean(repeated):22.2%}")
    return "\n".join(lines)


def equal_chunk_text_balance(plan: vlmcp.CPPlan) -> float:
    """max/mean text-query work if each sample's text were cut into 2P equal chunks (the baseline)."""
    P = plan.cp_size
    keys = (plan.images.offsets + 1).numpy()
    text = ~plan.is_image.numpy()
    work = np.zeros(P, dtype=np.int64)
    cu = plan.cu_seqlens.tolist()
    for a, b in zip(cu[:-1], cu[1:], strict=True):
        w = keys[a:b][text[a:b]]
        cw = np.concatenate([[0], np.cumsum(w)])[equal_cuts(w.size, P)]
        chunk = cw[1:] - cw[:-1]
        work += chunk[:P] + chunk[P:][::-1]
    return float(work.max() / work.mean())


def _image_text_pairs(plan: vlmcp.CPPlan) -> int:
    """Pairs of image queries with text keys before them: what every rank repeats (per rank)."""
    img = plan.is_image
    text_before = torch.cumsum((~img).long(), 0)
    text_before = text_before - text_before[plan.cu_seqlens[:-1]][plan.images.sample_ids] \
        + (~img[plan.cu_seqlens[:-1]]).long()[plan.images.sample_ids]
    return int(text_before[img].sum())


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
