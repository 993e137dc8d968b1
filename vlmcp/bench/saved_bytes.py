"""Saved-for-backward bytes per rank of one VLM training step, CP against one process.

Run: ``vlmcp bench memory [--cp 2 4 --image-tokens 2048 --text-tokens 16384]``.

A packed row of 8 samples, each one image (``image-tokens / 8`` patches) and
``text-tokens / 8`` text tokens, through the reference VLM (scaled-down widths:
hidden 64, 2 layers, the ViT of ``vlmcp train``). The counter is exact
(:class:`vlmcp.debug.meters.saved_tensors.SavedTensorMeter`: distinct storages autograd saves, the
parameters left out), so the figures do not depend on machine noise. Each CP figure is the
largest rank's. The ideal for replicated images is ``(I + T/P) / (I + T)`` on the
LLM's tokens; the ViT's own activations are replicated under ``replicate`` and
spread under ``scatter``.
"""

from __future__ import annotations

import argparse
import copy
import math

import torch
import torch.distributed as dist

from vlmcp.bench import bench_ranks
from vlmcp.data import PackedRow, random_row
from vlmcp.debug.meters.saved_tensors import SavedTensorMeter
from vlmcp.models import VLM
from vlmcp.train.specs.reference.config import ReferenceTrainConfig as TrainConfig
from vlmcp.train.specs.reference.spec import model_config
from vlmcp.train.specs.reference.step import forward_backward
from vlmcp.vision import place_vision

PATCH = 8


def make_row(image_tokens: int, text_tokens: int, samples: int = 8) -> PackedRow:
    side = math.isqrt(image_tokens // samples)
    if side * side * samples != image_tokens:
        raise ValueError(f"--image-tokens {image_tokens} must be {samples} x a square number of patches")
    layout = [[(side * PATCH, side * PATCH), text_tokens // samples]] * samples
    return random_row(layout, PATCH, torch.Generator().manual_seed(0))


def _saved(model, row, plan, rank, group):
    with SavedTensorMeter(model.parameters()) as meter:
        forward_backward(model, row, plan.for_rank(rank), group)
    return meter.bytes


def _rank(group, row, modes):
    P, rank = dist.get_world_size(group), dist.get_rank(group)
    torch.manual_seed(0)
    base = VLM(model_config(TrainConfig()))
    single = _saved(copy.deepcopy(base), row, row.plan(1), 0, None) \
        if rank == 0 else 0
    out = {"single": single}
    for mode in modes:
        model = copy.deepcopy(base)
        place_vision(model.vision, mode=mode, group=group)
        saved = torch.tensor([_saved(model, row, row.plan(P), rank, group)])
        dist.all_reduce(saved, op=dist.ReduceOp.MAX, group=group)
        out[mode] = int(saved)
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cp", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--image-tokens", type=int, default=2048)
    parser.add_argument("--text-tokens", type=int, default=16384)
    parser.add_argument("--modes", nargs="+", default=["replicate", "scatter"])


def run(args: argparse.Namespace) -> int:
    row = make_row(args.image_tokens, args.text_tokens)
    I, T = args.image_tokens, args.text_tokens  # noqa: E741 - I and T as in docs/benchmarks.md
    print(f"row: {I:,} image + {T:,} text tokens in 8 samples; saved-for-backward bytes of one step")
    print("| P | mode | largest rank | single process | ratio | ideal (I + T/P)/(I + T) |")
    print("|---|---|---|---|---|---|", flush=True)
    for P in args.cp:
        res = bench_ranks(_rank, P, row, args.modes, name="memory", timeout=1200)[0]
        for mode in args.modes:
            print(f"| {P} | {mode} | {res[mode] / 2**20:.1f} MiB | {res['single'] / 2**20:.1f} MiB | "
                  f"{res[mode] / res['single']:.3f} | {(I + T / P) / (I + T):.3f} |", flush=True)
    return 0
