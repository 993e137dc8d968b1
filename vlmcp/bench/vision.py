"""ViT time per rank: ``replicate`` (every rank encodes every image) against ``scatter``.

Run: ``vlmcp bench vision [--cp 2 4 --repeats 7 --json]`` (``--images K --depth D`` shrink
the run to the K smallest images and a D-block ViT, for a quick check).

Eight images of different sizes, the reference ViT + projector, forward and
backward. Under ``scatter`` each rank encodes the images :func:`assign_images`
gives it (greedy largest-first on patches^2). The ranks take turns (one computes
while the others wait at a barrier), so each rank's time is its own compute, not
a share of this machine's cores. The step waits for the slowest rank, so each
repeat takes the maximum over ranks; the table gives medians over ``--repeats``
and the median per-repeat speedup, next to the bound the cost model allows
(total patches^2 over the largest rank's: one 576-token image is a third of the
work, so P=4 cannot reach 4) and the bound if cost were linear in patches (it is
closer to that at this small width, where the MLPs outweigh attention). The
all-gather and reduce-scatter that ``scatter`` adds are not included.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import torch.distributed as dist

from vlmcp.bench import bench_ranks
from vlmcp.bench.turns import time_in_turns
from vlmcp.vision import VisionConfig, VisionEncoder, assign_images, vit_cost

PATCH = 4
# (H, W) in patches: 576, 512, 400, 288, 256, 192, 144 and 64 tokens.
IMAGES = [(24, 24), (16, 32), (20, 20), (12, 24), (16, 16), (8, 24), (12, 12), (8, 8)]
CONFIG = dict(out_dim=256, patch_size=PATCH, width=128, depth=4, heads=4, mlp_hidden=512,
              projector_hidden=256)


def _rank(group, repeats, sizes, config):
    P, r = dist.get_world_size(group), dist.get_rank(group)
    torch.manual_seed(0)
    enc = VisionEncoder(VisionConfig(**config))
    gen = torch.Generator().manual_seed(1)
    images = [torch.randn(3, h * PATCH, w * PATCH, generator=gen) for h, w in sizes]
    owner = assign_images([vit_cost(h * w) for h, w in sizes], P)
    work = {"replicate": images, "scatter": [im for im, o in zip(images, owner, strict=True) if o == r]}
    runs = {mode: (lambda imgs=imgs: enc.encode(imgs).square().mean().backward())
            for mode, imgs in work.items()}
    return time_in_turns(group, repeats, runs, lambda: enc.zero_grad(set_to_none=True)), owner


def _load(cost, sizes, owner, rank):
    return sum(cost(h * w) for (h, w), o in zip(sizes, owner, strict=True) if o == rank)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cp", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    parser.add_argument("--images", type=int, default=len(IMAGES),
                        help=f"use the K smallest of the {len(IMAGES)} images (default all)")
    parser.add_argument("--depth", type=int, default=CONFIG["depth"],
                        help=f"ViT blocks (default {CONFIG['depth']})")


def run(args: argparse.Namespace) -> int:
    if not 1 <= args.images <= len(IMAGES):
        raise ValueError(f"--images must be in 1..{len(IMAGES)}, got {args.images}")
    sizes = IMAGES[len(IMAGES) - args.images:]
    config = {**CONFIG, "depth": args.depth}
    rows = []
    for P in args.cp:
        results = bench_ranks(_rank, P, args.repeats, sizes, config, name="vision", timeout=600)
        owner = results[0][1]
        loads = [_load(vit_cost, sizes, owner, r) for r in range(P)]
        tokens = [_load(int, sizes, owner, r) for r in range(P)]
        # The step waits for the slowest rank: per repeat, the maximum over ranks.
        rep = [max(t["replicate"][i] for t, _ in results) for i in range(args.repeats)]
        sca = [max(t["scatter"][i] for t, _ in results) for i in range(args.repeats)]
        med = lambda xs: round(statistics.median(xs) * 1e3, 1)
        rows.append(dict(
            cp=P, replicate_ms=med(rep), scatter_ms=med(sca),
            scatter_ms_per_rank=[med(t["scatter"]) for t, _ in results],
            speedup=round(statistics.median(a / b for a, b in zip(rep, sca, strict=True)), 2),
            cost_bound=round(sum(loads) / max(loads), 2), token_bound=round(sum(tokens) / max(tokens), 2),
            images_per_rank=[owner.count(q) for q in range(P)]))
    if args.json:
        print(json.dumps(dict(images=len(sizes), config=config, repeats=args.repeats, results=rows)))
        return 0
    print(f"ViT + projector forward+backward, {len(sizes)} images, slowest rank, median of {args.repeats}")
    print(f"{'P':>2}  {'replicate ms':>12}  {'scatter ms':>10}  {'speedup':>7}  bound: {'p^2':>4}  "
          f"{'p':>4}  images/rank  scatter ms per rank")
    for row in rows:
        print(f"{row['cp']:>2}  {row['replicate_ms']:>12.1f}  {row['scatter_ms']:>10.1f}  "
              f"{row['speedup']:>7.2f}  {row['cost_bound']:>11.2f}  {row['token_bound']:>4.2f}  "
              f"{str(row['images_per_rank']):>11}  "
              f"{row['scatter_ms_per_rank']}")

