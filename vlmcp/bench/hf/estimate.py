"""``vlmcp plan --model``'s memory estimate against the exact counter, on tiny models.

Run: ``vlmcp bench hf-estimate [--cp 1 2 --archs qwen2_vl qwen2_5_vl qwen3_vl llava]``.

For each architecture the estimate knows (:data:`vlmcp.estimate.towers.TOWERS`), a tiny random
model (:func:`vlmcp.debug.tiny.tiny_model`, float32) trains one step on one packed row of 4
samples, each ``[prompt, image, answer]`` (``--text-tokens`` text per sample), under each
configuration of checkpointing x vision mode x ``image_strategy``: ``vlmcp.hf.shard_inputs``,
:func:`vlmcp.hf.causal_lm_loss`, ``backward``. Each rank counts what autograd saves
(:class:`~vlmcp.debug.meters.saved_tensors.SavedTensorMeter`, parameters left out); the table gives the
busiest rank's bytes against :func:`vlmcp.estimate.estimate_memory`'s ``saved`` for the same
config (read back from the model's config, as ``vlmcp plan --model DIR`` reads config.json) and
row. The goal: within 10%.
"""

from __future__ import annotations

import argparse
import copy

import torch
import torch.distributed as dist

from vlmcp.bench import bench_ranks
from vlmcp.bench.hf import needs_transformers
from vlmcp.debug.meters.saved_tensors import SavedTensorMeter
from vlmcp.estimate import EstimateSetup, estimate_memory

NAME = "hf-estimate"
ARCHS = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "glm4v", "llava", "llava_next", "internvl", "gemma3",
         "idefics3", "smolvlm", "mistral3")
OVERRIDES = {"gemma3": {"vision_config": {"vision_use_head": False}}}  # as Gemma 3's checkpoints are
CONFIGS = (  # (activation checkpointing, vision_mode, image_strategy)
    (False, "replicate", "replicate"), (True, "replicate", "replicate"), (False, "scatter", "shard"),
    (True, "scatter", "shard"))


def _samples(arch: str, text: int) -> tuple:
    # 16 LLM tokens each (InternVL, Idefics3, SmolVLM: 4 tiles of 4; Gemma 3: 4 images of 4 in a sample;
    # LLaVA-NeXT: a 2:1 image, its tiles and base image unpadded to 56 tokens)
    image = {"llava": (1,), "internvl": (4,), "idefics3": (1, 3), "smolvlm": (1, 3),
             "mistral3": (4, 4), "llava_next": (16, 8)}.get(arch, (1, 8, 8))
    if arch == "gemma3":
        return tuple((text // 6, (1,), (1,), (1,), (1,), text - text // 6) for _ in range(4))
    before = max(1, text // 6)
    return tuple((before, image, text - before) for _ in range(4))


def _tiles(model, inputs) -> int:
    """The tiles a tiled (anyres) model's ViT encodes for ``inputs``, from one no-grad forward."""
    seen = []
    handle = model.model.vision_tower.register_forward_pre_hook(lambda m, a: seen.append(a[0].shape[0]))
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        handle.remove()
    return sum(seen)


def measure(group, archs, configs, text_tokens: int, dtype: str = "float32") -> list[dict]:
    """Every rank: per (arch, config), this rank's saved bytes and the estimate's inputs (``dtype``: the
    parameters' and pixels')."""
    import vlmcp.hf
    from vlmcp.debug.synthetic import synthetic_row
    from vlmcp.debug.tiny import tiny_config, tiny_model

    out = []
    for arch in archs:
        base = tiny_model(tiny_config(arch, **OVERRIDES.get(arch, {})), seed=0).to(getattr(torch, dtype))
        inputs, labels, cu = synthetic_row(base, _samples(arch, text_tokens))
        visual = int((inputs["input_ids"] == base.config.image_token_id).sum())
        whole = arch.startswith(("qwen", "glm", "llava", "mistral"))  # else 16: 4 tiles or images a sample
        images = _tiles(base, inputs) if arch == "llava_next" else 4 if whole else 16
        for ckpt, mode, strategy in configs:
            model = copy.deepcopy(base)
            if ckpt:
                model.train()
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            vlmcp.hf.parallelize(model, group, vision_mode=mode)
            with SavedTensorMeter(model.parameters()) as meter:
                batch = vlmcp.hf.shard_inputs(model, inputs, group, labels=labels, cu_seqlens=cu,
                                              image_strategy=strategy)
                res = vlmcp.hf.causal_lm_loss(model, batch, group)
                res.loss.backward()
            saved = torch.tensor([meter.bytes])
            if group is not None:
                dist.all_reduce(saved, op=dist.ReduceOp.MAX, group=group)
            out.append(dict(arch=arch, ckpt=ckpt, vision_mode=mode, image_strategy=strategy,
                            seq_len=int(inputs["input_ids"].shape[1]), visual=visual,
                            images=images,  # images, or the tiles the ViT encodes
                            config=base.config.to_dict(), measured=int(saved), dtype=dtype))
    return out


def predicted(row: dict, cp: int) -> int:
    """The estimate's saved bytes for a row of :func:`measure`."""
    from transformers import AutoConfig

    cfg = dict(row["config"])
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    setup = EstimateSetup(seq_len=row["seq_len"], cp=cp, visual_tokens=row["visual"], images=row["images"],
                          activation_checkpointing=row["ckpt"], dtype=row["dtype"],
                          image_strategy=row["image_strategy"], vision_mode=row["vision_mode"])
    return estimate_memory(config, setup).saved


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cp", type=int, nargs="+", default=[1, 2], help="CP sizes (default 1 2)")
    parser.add_argument("--archs", nargs="+", choices=ARCHS, default=list(ARCHS),
                        help="architectures (default: all the estimate knows)")
    parser.add_argument("--text-tokens", type=int, default=120, help="text tokens per sample (default 120)")
    parser.add_argument("--dtypes", nargs="+", choices=("float32", "bfloat16"),
                        default=["float32", "bfloat16"], help="parameter dtypes (default float32 bfloat16)")


def run(args: argparse.Namespace) -> int:
    if needs_transformers(NAME):
        return 0
    print("tiny models, one row of 4 samples [prompt, image(s), answer]; busiest rank's saved bytes")
    print("| model | dtype | P | checkpointing | vision_mode | image_strategy | measured | estimate | "
          "error |")
    print("|---|---|---|---|---|---|---|---|---|", flush=True)
    for dtype in args.dtypes:
        for P in args.cp:
            _table(P, args, dtype)
    return 0


def _table(P: int, args: argparse.Namespace, dtype: str) -> None:
    rows = (measure(None, args.archs, CONFIGS, args.text_tokens, dtype) if P == 1 else
            bench_ranks(measure, P, args.archs, CONFIGS, args.text_tokens, dtype, name="hf-estimate",
                        timeout=1800)[0])
    for row in rows:
        est = predicted(row, P)
        print(f"| {row['arch']} | {dtype} | {P} | {'yes' if row['ckpt'] else 'no'} | {row['vision_mode']} | "
              f"{row['image_strategy']} | {row['measured'] / 2**10:,.1f} KiB | {est / 2**10:,.1f} KiB | "
              f"{est / row['measured'] - 1:+.1%} |", flush=True)
