"""Busiest rank's saved-for-backward bytes of a Hugging Face VLM's training step, over one process.

Run: ``vlmcp bench hf-memory [--arch qwen2_vl|qwen3_vl|qwen3_5 --row video|images --cp 2 4
--configs shard:scatter ...]``.

A scaled-down Qwen2-VL, Qwen3-VL or Qwen3.5 (``--arch``; :func:`vlmcp.bench.hf.bench_model`:
LLM hidden 512, 4 layers, Qwen3.5's three in four Gated DeltaNet; ViT width 256, 4 blocks,
Qwen3-VL's deepstack after the first) trains one step on one row through ``vlmcp.hf.shard_inputs`` and
``cp_cross_entropy``, once per ``image_strategy:vision_mode`` pair; each rank counts the
bytes autograd saves (:class:`vlmcp.debug.meters.saved_tensors.SavedTensorMeter`, exact, parameters left out)
and the table gives the largest rank's over the same step on one process (vlmcp at P=1,
the same kernels). Rows (the issue's):

* ``video``: one sample, ``--text-tokens`` text (default 148, the vision markers
  included) around one video of ``--video-groups`` frame groups of 16x16 patches (64 LLM
  tokens each; default 16: 1,024 video tokens; Qwen3-VL and Qwen3.5 add each group's
  timestamp and markers, 5 text tokens);
* ``images``: ``--images`` samples (default 4), each one 28x48-patch image (336 tokens)
  and ``--text-tokens / images`` text (default 2,544 in all): 1,344 image tokens in a
  3,888-token row.

Under ``auto`` the table names the layout the default cost model chose. The ideal for
replicated visual tokens is ``(I + T/P) / (I + T)``; sharding them aims at ``1/P``.
"""

from __future__ import annotations

import argparse
import copy

import torch
import torch.distributed as dist

from vlmcp.bench import bench_ranks
from vlmcp.bench.hf import ARCHS, bench_model, needs_transformers
from vlmcp.debug.meters.saved_tensors import SavedTensorMeter

NAME = "hf-memory"


def _samples(args) -> tuple:
    if args.row == "video":
        text = 148 if args.text_tokens is None else args.text_tokens
        if text < 4:
            raise ValueError(f"--text-tokens must be >= 4 for the video row, got {text}")
        before = max(1, (text - 2) // 7)
        return ((before, ("video", args.video_groups, 16, 16), text - 2 - before),)
    text = 2544 if args.text_tokens is None else args.text_tokens
    per = text // args.images
    if per < 4 or per * args.images != text:
        raise ValueError(f"--text-tokens {text} must split into --images {args.images} equal parts of >= 4")
    before = max(1, (per - 2) // 12)
    return tuple((before, (1, 28, 48), per - 2 - before) for _ in range(args.images))


def _saved(model, inputs, labels, cu, group, strategy) -> tuple[int, str]:
    import vlmcp.hf

    with SavedTensorMeter(model.parameters()) as meter:
        batch = vlmcp.hf.shard_inputs(model, inputs, group, labels=labels, cu_seqlens=cu,
                                      image_strategy=strategy)
        loss, _ = vlmcp.cp_cross_entropy(model(**batch.model_inputs).logits[0], batch.labels, group)
        loss.backward()
    return meter.bytes, batch.shard.plan.image_strategy


def _rank(group, samples, configs, sizes):
    import vlmcp.hf
    from vlmcp.debug.synthetic import synthetic_row

    rank = dist.get_rank(group)
    base = bench_model(**sizes)
    inputs, labels, cu = synthetic_row(base, samples)
    out = {"tokens": int(inputs["input_ids"].shape[1]),
           "visual": int((inputs["mm_token_type_ids"] > 0).sum())}
    if rank == 0:
        out["single"] = _saved(vlmcp.hf.parallelize(copy.deepcopy(base), None), inputs, labels, cu, None,
                               "replicate")[0]
    for strategy, mode in configs:
        model = vlmcp.hf.parallelize(copy.deepcopy(base), group, vision_mode=mode)
        saved, chosen = _saved(model, inputs, labels, cu, group, strategy)
        largest = torch.tensor([saved])
        dist.all_reduce(largest, op=dist.ReduceOp.MAX, group=group)
        out[(strategy, mode)] = (int(largest), chosen)
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--arch", choices=ARCHS, default="qwen2_vl", help="the model (default qwen2_vl)")
    parser.add_argument("--row", choices=("video", "images"), default="video", help="the row (default video)")
    parser.add_argument("--cp", type=int, nargs="+", default=[2, 4], help="CP sizes (default 2 4)")
    parser.add_argument("--configs", nargs="+", default=None, metavar="STRATEGY:MODE",
                        help="image_strategy:vision_mode pairs (default: replicate:replicate "
                             "replicate:scatter shard:replicate shard:scatter auto:scatter)")
    parser.add_argument("--video-groups", type=int, default=16, help="video row: frame groups of 64 tokens")
    parser.add_argument("--images", type=int, default=4, help="images row: samples, one image each")
    parser.add_argument("--text-tokens", type=int, default=None,
                        help="text tokens in the row (default 148 for video, 2544 for images)")
    parser.add_argument("--hidden", type=int, default=512, help="LLM width (default 512)")
    parser.add_argument("--layers", type=int, default=4, help="LLM layers (default 4)")
    parser.add_argument("--vit-width", type=int, default=256, help="ViT width (default 256)")
    parser.add_argument("--vit-depth", type=int, default=4, help="ViT blocks (default 4)")


def run(args: argparse.Namespace) -> int:
    if needs_transformers(NAME):
        return 0
    configs = args.configs or ["replicate:replicate", "replicate:scatter", "shard:replicate", "shard:scatter",
                               "auto:scatter"]
    pairs = [tuple(c.split(":")) for c in configs]
    if any(len(p) != 2 for p in pairs):
        raise ValueError(f"--configs takes STRATEGY:MODE pairs, got {configs}")
    samples = _samples(args)
    sizes = dict(hidden=args.hidden, layers=args.layers, vit_width=args.vit_width, vit_depth=args.vit_depth,
                 arch=args.arch)
    print(f"row {args.row}: {samples}; {args.arch} LLM hidden {args.hidden} x {args.layers} layers, ViT "
          f"{args.vit_width} x {args.vit_depth}; saved-for-backward bytes of one step, float32")
    print("| P | image_strategy (chosen) | vision_mode | largest rank | one process | ratio | "
          "ideal replicated |")
    print("|---|---|---|---|---|---|---|", flush=True)
    for P in args.cp:
        res = bench_ranks(_rank, P, samples, pairs, sizes, name="hf-memory", timeout=1800)[0]
        single, L, I = res["single"], res["tokens"], res["visual"]  # noqa: E741 - I as in docs/benchmarks.md
        for strategy, mode in pairs:
            saved, chosen = res[(strategy, mode)]
            print(f"| {P} | {strategy} ({chosen}) | {mode} | {saved / 2**20:.1f} MiB | "
                  f"{single / 2**20:.1f} MiB | {saved / single:.3f} | {(I + (L - I) / P) / L:.3f} |",
                  flush=True)
    return 0
