"""ViT time per rank for one long video: ``replicate`` (every rank encodes every frame) against ``scatter``.

Run: ``vlmcp bench hf-vision [--arch qwen2_vl|qwen3_vl|qwen3_5 --cp 2 4 --frame-groups 32
--repeats 5 --json]``.

One video of ``--frame-groups`` temporal patch groups of ``--side`` x ``--side`` patches
through a Qwen2-VL, Qwen3-VL (deepstack mergers included) or Qwen3.5 ViT + merger
(:func:`vlmcp.bench.hf.bench_model`; width 256, 4 blocks),
forward and backward, called as vlmcp's vision wrapper calls it (the class's
``get_video_features`` on the selected frames, :meth:`HFAdapter.select_frames`). Under
``scatter`` each rank encodes the frame groups :func:`vlmcp.vision.assign_images` gives it
(Note [vlmcp HF videos: frame groups are visual units]); before, a video was one unit and
one rank encoded all of it, so ``replicate`` is also what the old ``scatter`` cost the rank
that owned the video. The ranks take turns (one computes while the others wait at a
barrier), so a rank's time is its own compute, not a share of this machine's cores; within
a turn the two modes run back to back, each first in every other repeat. The step waits
for the slowest rank, so each repeat takes the maximum over ranks; the table gives
medians over ``--repeats`` and the median per-repeat speedup. The all-gather and
reduce-scatter that ``scatter`` adds are not included.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import torch.distributed as dist

from vlmcp.bench import bench_ranks
from vlmcp.bench.hf import ARCHS, bench_model, needs_transformers
from vlmcp.bench.turns import time_in_turns
from vlmcp.vision import assign_images, vit_cost

NAME = "hf-vision"


def _rank(group, groups, side, repeats, sizes):
    from vlmcp.debug.synthetic import synthetic_row
    from vlmcp.hf.adapters import adapter_for

    P, r = dist.get_world_size(group), dist.get_rank(group)
    model = bench_model(**sizes)
    base, adapter = model.model, adapter_for(model)
    inputs, _, _ = synthetic_row(model, ((2, ("video", groups, side, side), 2),))
    videos = {k: inputs[k] for k in adapter.video_pixel_keys}
    units = [(v, g, n) for v, (t, n) in enumerate(adapter.frame_groups(model, videos)) for g in range(t)]
    owner = assign_images([vit_cost(n) for _, _, n in units], P)
    mine = adapter.select_frames(videos, [u[:2] for u, o in zip(units, owner, strict=True) if o == r])
    work = {"replicate": videos, "scatter": mine}
    call = type(base).get_video_features

    def run(sub):
        out = call(base, sub["pixel_values_videos"], sub["video_grid_thw"])
        deepstack = getattr(out, adapter.deepstack_output) if adapter.deepstack_output else ()
        levels = [out.pooler_output, *deepstack]
        sum(torch.cat(list(f)).square().mean() for f in levels).backward()

    runs = {mode: (lambda sub=sub: run(sub)) for mode, sub in work.items()}
    times = time_in_turns(group, repeats, runs, lambda: model.zero_grad(set_to_none=True))
    return times, [owner.count(q) for q in range(P)]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--arch", choices=ARCHS, default="qwen2_vl", help="the model (default qwen2_vl)")
    parser.add_argument("--cp", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--frame-groups", type=int, default=32, help="temporal patch groups of the video")
    parser.add_argument("--side", type=int, default=16, help="patches per side of a frame (default 16)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--vit-width", type=int, default=256)
    parser.add_argument("--vit-depth", type=int, default=4)
    parser.add_argument("--json", action="store_true", help="one JSON object instead of a table")


def run(args: argparse.Namespace) -> int:
    if needs_transformers(NAME):
        return 0
    if args.frame_groups < 1 or args.side < 2 or args.side % 2:
        raise ValueError(f"--frame-groups must be >= 1 and --side even, got {args.frame_groups}, {args.side}")
    sizes = dict(hidden=64, layers=1, vit_width=args.vit_width, vit_depth=args.vit_depth, arch=args.arch)
    rows = []
    for P in args.cp:
        results = bench_ranks(_rank, P, args.frame_groups, args.side, args.repeats, sizes, name="hf-vision",
                              timeout=1800)
        rep = [max(t["replicate"][i] for t, _ in results) for i in range(args.repeats)]
        sca = [max(t["scatter"][i] for t, _ in results) for i in range(args.repeats)]
        med = lambda xs: round(statistics.median(xs) * 1e3, 1)  # noqa: E731
        rows.append(dict(cp=P, replicate_ms=med(rep), scatter_ms=med(sca),
                         scatter_ms_per_rank=[med(t["scatter"]) for t, _ in results],
                         speedup=round(statistics.median(a / b for a, b in zip(rep, sca, strict=True)), 2),
                         frame_groups_per_rank=results[0][1]))
    if args.json:
        print(json.dumps(dict(arch=args.arch, frame_groups=args.frame_groups, side=args.side,
                              repeats=args.repeats, vit=dict(width=args.vit_width, depth=args.vit_depth),
                              results=rows)))
        return 0
    print(f"{args.arch} ViT + merger forward+backward, one video of {args.frame_groups} frame groups of "
          f"{args.side}x{args.side} patches, slowest rank, median of {args.repeats}")
    print(f"{'P':>2}  {'replicate ms':>12}  {'scatter ms':>10}  {'speedup':>7}  groups/rank  "
          "scatter ms per rank")
    for row in rows:
        print(f"{row['cp']:>2}  {row['replicate_ms']:>12.1f}  {row['scatter_ms']:>10.1f}  "
              f"{row['speedup']:>7.2f}  {str(row['frame_groups_per_rank']):>11}  "
              f"{row['scatter_ms_per_rank']}")
    return 0
