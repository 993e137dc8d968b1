"""CP attention speed and memory against one process on the whole row (issue 3's benchmark).

Run: ``vlmcp bench attention`` (defaults: one sample of 1,024 image + 8,192 text
tokens, 8 heads of 64, float32, P = 2, one thread per rank, both backends).

Both measurements run inside one spawned group so that they share the machine's
state: each repeat times forward+backward of ``cp_attention`` on every rank at
once, then forward+backward of single-process attention (same CPU flash kernel,
one thread) on the whole row on rank 0 while the other ranks wait. Reported, as
medians over repeats:

* ``cp/single``: CP time of each rank over the single-process time;
* ``efficiency = single time x (this rank's share of attended pairs) / CP time of
  the slowest rank``, using the exact pair counts of :func:`vlmcp.attended_pairs`
  (with replicated images a rank's share includes the image queries it repeats);
* peak saved-for-backward bytes per rank against the single process (tensors the
  autograd graph keeps between forward and backward, counted once per storage).

The machine may be shared: ``uptime`` is printed, and only ratios measured within
one run are reported.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist

import vlmcp
from vlmcp.attention import cp_attention, varlen_attention
from vlmcp.bench import bench_ranks
from vlmcp.debug.meters.saved_tensors import SavedTensorMeter


def _row(args):
    sample = torch.cat([torch.ones(args.image_tokens, dtype=torch.bool),
                        torch.zeros(args.text_tokens, dtype=torch.bool)])
    is_image = sample.repeat(args.samples)
    L = is_image.numel()
    g = torch.Generator().manual_seed(0)
    dtype = getattr(torch, args.dtype)
    q = torch.randn(L, args.heads, args.head_dim, generator=g).to(dtype)
    k, v = (torch.randn(L, args.kv_heads or args.heads, args.head_dim, generator=g).to(dtype)
            for _ in range(2))
    dout = torch.randn(L, args.heads, args.head_dim, generator=g).to(dtype)
    cu = torch.arange(args.samples + 1) * sample.numel()
    return is_image, cu, q, k, v, dout


def _plan(args, is_image, cu, P):
    return vlmcp.plan_cp(is_image, P, cu, image_strategy=args.image_strategy,
                         sample_placement=args.sample_placement)


def _saved_bytes(fn):
    """Run ``fn()`` (a forward) and count the bytes autograd saves for backward."""
    with SavedTensorMeter() as meter:
        out = fn()
    return out, meter.bytes


def _fwd_bwd(fn, inputs, dout):
    for t in inputs:
        t.grad = None
    out, saved = _saved_bytes(fn)
    (out * dout).sum().backward()
    return saved


def _bench(group, args, backend):
    rank, P = dist.get_rank(group), dist.get_world_size(group)
    is_image, cu, q, k, v, dout = _row(args)
    plan = _plan(args, is_image, cu, P)
    shard = plan.for_rank(rank)
    local = [shard.shard(t).requires_grad_() for t in (q, k, v)]
    ldout = shard.shard(dout)
    whole = [t.clone().requires_grad_() for t in (q, k, v)]

    def cp():
        extra = {"ulysses_size": args.ulysses_size} if backend == "usp" else {}
        return cp_attention(*local, shard, group, backend, args.image_attention, **extra)

    def single():
        return varlen_attention(*whole, cu, is_image, args.image_attention)[0]

    _fwd_bwd(cp, local, ldout)  # warm-up (and the schedule cache)
    cp_times, single_times, saved_cp, saved_single = [], [], 0, 0
    for _ in range(args.repeats):
        dist.barrier(group=group)
        t0 = time.perf_counter()
        saved_cp = _fwd_bwd(cp, local, ldout)
        cp_times.append(time.perf_counter() - t0)
        dist.barrier(group=group)
        if rank == 0:
            t0 = time.perf_counter()
            saved_single = _fwd_bwd(single, whole, dout)
            single_times.append(time.perf_counter() - t0)
        dist.barrier(group=group)
    return cp_times, single_times, saved_cp, saved_single


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--samples", type=int, default=1, help="packed samples of the row")
    parser.add_argument("--image-tokens", type=int, default=1024, help="image tokens opening each sample")
    parser.add_argument("--text-tokens", type=int, default=8192, help="text tokens of each sample")
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=0, help="0: same as --heads")
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float64"])
    parser.add_argument("--cp", type=int, default=2)
    parser.add_argument("--backend", default="both", choices=["ring", "ulysses", "usp", "both"],
                        help="both: ring and ulysses")
    parser.add_argument("--ulysses-size", type=int, default=None,
                        help="usp only: ranks per Ulysses group (default gcd(kv_heads, P))")
    parser.add_argument("--image-strategy", default="replicate", choices=["replicate", "shard"])
    parser.add_argument("--image-attention", default="causal", choices=["causal", "bidirectional"])
    parser.add_argument("--sample-placement", default="split", choices=["split", "whole", "auto"],
                        help="split every sample, place each whole on one rank, or let the cost model "
                             "choose per row (see vlmcp.plan_cp)")
    parser.add_argument("--repeats", type=int, default=5)


def run(args: argparse.Namespace) -> int:
    print(f"uptime: {os.popen('uptime').read().strip()}")
    is_image, cu, *_ = _row(args)
    plan = _plan(args, is_image, cu, args.cp)
    work = vlmcp.attended_pairs(plan, args.image_attention)
    share = [p / work.single_process_pairs for p in work.total_pairs]
    whole = int((plan.whole >= 0).sum())
    print(f"row: {args.samples} x ({args.image_tokens} image + {args.text_tokens} text) tokens, "
          f"{args.heads} heads of {args.head_dim}, {args.dtype}, P={args.cp}, image_strategy="
          f"{args.image_strategy}, image_attention={args.image_attention}, sample_placement="
          f"{args.sample_placement} ({whole} of {args.samples} samples whole); pair share per rank: "
          + ", ".join(f"{s:.3f}" for s in share) + f"; padding {1 - sum(work.tokens) / sum(work.slots):.2%} "
          "of the slots", flush=True)
    backends = ["ring", "ulysses"] if args.backend == "both" else [args.backend]
    for backend in backends:
        res = bench_ranks(_bench, args.cp, args, backend, name="attention", timeout=3600)
        single = statistics.median(res[0][1])
        cp = [statistics.median(r[0]) for r in res]
        # efficiency per repeat (slowest rank of that repeat), then the median
        effs = [single_t * max(share) / max(r[0][i] for r in res)
                for i, single_t in enumerate(res[0][1])]
        print(f"[{backend}] single process: {single * 1e3:.0f} ms fwd+bwd; "
              + "; ".join(f"rank {r}: {t * 1e3:.0f} ms = {t / single:.3f} x single"
                          for r, t in enumerate(cp)))
        print(f"[{backend}] efficiency (median of {args.repeats}): {statistics.median(effs):.3f} "
              f"(all: {', '.join(f'{e:.3f}' for e in effs)})")
        print(f"[{backend}] saved for backward: single {res[0][3] / 2**20:.1f} MiB; "
              + "; ".join(f"rank {r}: {x[2] / 2**20:.1f} MiB = {x[2] / res[0][3]:.3f} x"
                          for r, x in enumerate(res)), flush=True)
    return 0
