"""``vlmcp plan --model DIR``: a CP rank's predicted memory for one training step, before any GPU is rented.

Reads ``DIR/config.json`` only (no weights; the parameters are counted on the meta device) and
prints the busiest rank's peak term by term (:func:`vlmcp.estimate.estimate_memory`, Note [vlmcp
memory estimate: a rank's peak]), the per-layer bytes per token with and without checkpointing,
the rank's tokens with visual tokens replicated and sharded, the ViT's bytes under each vision
mode, and the longest ``--seq-len`` that fits ``--gpu-memory``.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from vlmcp.estimate import EstimateSetup, estimate_memory, max_seq_len, model_states
from vlmcp.estimate.peak import DTYPE_BYTES, VISION_MODES
from vlmcp.estimate.text import text_blocks
from vlmcp.estimate.towers import tower_for

# The layout view's flags (vlmcp plan without --model); given with --model they are refused.
LAYOUT_ONLY = ("prompt_tokens", "image_tokens", "text_tokens", "image_attention", "sample_placement", "width",
               "kv_heads", "head_dim", "hidden_size", "mlp_ratio", "flops_per_byte", "out")
# The estimate's flags; given without --model they are refused.
MODEL_ONLY = ("seq_len", "dp", "fsdp", "activation_checkpointing", "offload_activations", "gpu_memory",
              "visual_tokens", "images", "vision_mode", "loss_chunk_size", "attention")


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("memory estimate (--model)")
    g.add_argument("--model", metavar="DIR", default=None,
                   help="a Hugging Face VLM directory: print a CP rank's predicted peak memory for one "
                        "training step instead of a row's layout (reads config.json only)")
    g.add_argument("--seq-len", type=int, default=None,
                   help="--model: tokens of the row (visual ones included)")
    g.add_argument("--dp", type=int, default=1, help="--model: data-parallel replicas D")
    g.add_argument("--fsdp", action="store_true",
                   help="--model: FSDP2 over all D*P ranks (as vlmcp train --fsdp)")
    g.add_argument("--activation-checkpointing", action="store_true", help="--model: checkpoint every block")
    g.add_argument("--offload-activations", action="store_true",
                   help="--model: the saved tensors live in host memory (vlmcp train --offload-activations)")
    g.add_argument("--gpu-memory", type=float, default=80.0, help="--model: GiB per GPU, for the fit")
    g.add_argument("--visual-tokens", type=int, default=0, help="--model: the row's visual LLM tokens")
    g.add_argument("--images", type=int, default=None,
                   help="--model: images (or video frame groups; tiles for InternVL, Idefics3, SmolVLM) the "
                        "visual tokens come in (unset: one, or visual tokens / tokens per image for "
                        "fixed-size images)")
    g.add_argument("--vision-mode", choices=VISION_MODES, default="replicate", help="--model: vision_mode")
    g.add_argument("--loss-chunk-size", type=int, default=4096,
                   help="--model: the chunked loss' targets per chunk")
    g.add_argument("--attention", choices=("ring", "ulysses", "usp"), default="ring",
                   help="--model: CP attention (ring only is estimated)")


def check_flags(args: argparse.Namespace, defaults: dict) -> None:
    """Refuse the flags of the other view (never ignore one silently)."""
    if args.model is None:
        given = [n for n in MODEL_ONLY if getattr(args, n) != defaults[n]]
        if given:
            raise ValueError(", ".join("--" + n.replace("_", "-") for n in given) + " need --model DIR")
        return
    given = [n for n in LAYOUT_ONLY if getattr(args, n) != defaults[n]]
    if given:
        raise ValueError(", ".join("--" + n.replace("_", "-") for n in given) + " apply to the layout view, "
                         "not to --model (give --visual-tokens and --images instead)")
    if args.seq_len is None:
        raise ValueError("--model needs --seq-len")
    if args.image_strategy == "auto":
        raise ValueError("--model: --image-strategy auto is not estimated; give replicate or shard (the "
                         "estimate prints the rank's tokens under both)")
    if args.dtype == "float64":
        raise ValueError("--model: --dtype float64 is not estimated (bfloat16, float32)")
    if args.gpu_memory <= 0:
        raise ValueError(f"--gpu-memory must be > 0, got {args.gpu_memory}")


def _gib(n: int) -> str:
    return f"{n / 2**30:,.2f} GiB"


def load_config(path: str):
    """The HF config of ``path`` (config.json only, no network)."""
    from transformers import AutoConfig

    if not (Path(path) / "config.json").is_file():
        raise ValueError(f"--model {path}: no config.json there")
    return AutoConfig.from_pretrained(path, local_files_only=True)


def run(args: argparse.Namespace) -> int:
    config = load_config(args.model)
    setup = EstimateSetup(seq_len=args.seq_len, cp=args.cp, dp=args.dp, visual_tokens=args.visual_tokens,
                          images=args.images, fsdp=args.fsdp,
                          activation_checkpointing=args.activation_checkpointing,
                          offload_activations=args.offload_activations, dtype=args.dtype,
                          image_strategy=args.image_strategy, vision_mode=args.vision_mode,
                          chunk_size=args.loss_chunk_size, attention=args.attention)
    b = DTYPE_BYTES[args.dtype]
    tower = tower_for(config, b)  # first: it names a refused architecture
    text = text_blocks(config, b)
    states = model_states(config)
    est = estimate_memory(config, setup, states)
    t = est.terms
    world = args.dp * args.cp if args.fsdp else 1
    on = {True: "on", False: "off"}
    print(f"vlmcp plan --model {args.model}: {config.model_type}, {states.params / 1e9:.3f}B parameters; "
          f"row of {args.seq_len:,} tokens ({args.visual_tokens:,} visual), P={args.cp}, D={args.dp}, "
          f"{args.dtype}, image_strategy={args.image_strategy}, vision_mode={args.vision_mode}, "
          f"checkpointing {on[args.activation_checkpointing]}, FSDP {on[args.fsdp]}, "
          f"offload {on[args.offload_activations]}")
    other = "shard" if args.image_strategy == "replicate" else "replicate"
    alt = estimate_memory(config, replace(setup, image_strategy=other), states)
    print(f"busiest rank: {est.llm_tokens:,} LLM tokens ({est.visual_on_rank:,} visual; under {other}: "
          f"{alt.llm_tokens:,}), {est.targets:,} targets, {est.vit_tokens:,} ViT tokens")
    print(f"LLM layer: {text.per_layer:,} B per token, checkpointed {text.checkpointed:,} B; x {text.layers} "
          f"layers. ViT block: {tower.per_block:,} B per ViT token, checkpointed {tower.checkpointed:,} B; x "
          f"{tower.blocks} blocks")
    ckpt = "checkpointed " if args.activation_checkpointing else ""
    per = f"{states.params:,} x {b} B" + (f" / {world} (FSDP)" if world > 1 else "")
    rows = [
        ("parameters", t["params"], per), ("gradients", t["grads"], per),
        ("AdamW moments", t["adamw"], "2 x " + per),
        ("FSDP unsharded", t["fsdp_unsharded"], "root unit's params and grads + 2 blocks" if args.fsdp
         else "no FSDP"),
        ("LLM saved", t["llm"], f"{est.llm_tokens:,} tokens x {text.layers} {ckpt}layers + embedding, norm"),
        ("ViT saved", t["vit"], f"{est.vit_tokens:,} ViT tokens x {tower.blocks} {ckpt}blocks + merger"),
        ("loss saved", t["loss"], f"{est.targets:,} targets x 20 B"),
        ("loss chunk (transient)", t["loss_chunk"], f"min({args.loss_chunk_size}, targets) x {text.vocab:,} "
                                                     "logits, the head's gradient accumulator"),
        ("recompute (transient)", t["recompute"], "one block's full set" if args.activation_checkpointing
         else "one block's set copied back" if args.offload_activations else "no checkpointing"),
    ]
    print("| term | bytes | from |")
    print("|---|---|---|")
    for name, n, how in rows:
        print(f"| {name} | {_gib(n)} | {how} |")
    saved_note = f"on the host: {_gib(est.saved)}" if args.offload_activations else "on the device"
    print(f"| saved activations | {_gib(est.saved)} | {saved_note} |")
    print(f"| **peak** | **{_gib(est.peak)}** | states + saved on the device + the larger transient |")
    modes = []
    for mode in VISION_MODES:
        if args.fsdp and mode in ("broadcast", "scatter"):
            continue
        m = estimate_memory(config, replace(setup, vision_mode=mode), states)
        modes.append(f"{mode} {_gib(m.terms['vit'])}")
    print("ViT saved per vision mode (busiest rank" + (", those --fsdp takes" if args.fsdp else "") + "): "
          + ", ".join(modes))
    budget = int(args.gpu_memory * 2**30)
    longest = max_seq_len(config, setup, budget, states)
    verdict = "fits" if est.peak <= budget else "does NOT fit"
    if longest:
        print(f"--gpu-memory {args.gpu_memory:g} GiB: {verdict}; the longest --seq-len that fits (visual "
              f"tokens as given): {longest:,}")
    else:
        shortest = estimate_memory(config, replace(setup, seq_len=args.visual_tokens + 1), states)
        print(f"--gpu-memory {args.gpu_memory:g} GiB: {verdict}; no --seq-len fits with "
              f"{args.visual_tokens:,} visual tokens (the shortest such row peaks at {_gib(shortest.peak)}; "
              f"the states alone are {_gib(est.states)})")
    return 0
