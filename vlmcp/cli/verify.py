"""``vlmcp verify``: gradient parity of one training step, CP on P ranks against one process.

Runs the reference VLM on a built-in packed row (3 samples, one without an image,
odd text lengths) and prints one JSON object (``--json``) or a short report.
Exit code 0 only when the CP loss and every parameter gradient (ViT and projector
included) match the single process within the dtype's tolerance.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import get_args

from vlmcp.cli import command_help
from vlmcp.layout.plan import ImageStrategy
from vlmcp.ranks import run_command
from vlmcp.train.options import AttentionBackend, DType, ImageAttention, VisionMode
from vlmcp.train.specs.hf.model_check import check_model_dir


def add_parser(sub) -> None:
    p = sub.add_parser("verify", help=command_help("verify"),
                       description=__doc__)
    p.add_argument("--cp", type=int, default=2, help="CP group size P (default 2)")
    p.add_argument("--vision-mode", default="replicate", choices=get_args(VisionMode))
    p.add_argument("--attention", default="ring", choices=get_args(AttentionBackend))
    p.add_argument("--ulysses-size", type=int, default=None, metavar="U",
                   help="--attention usp: ranks per Ulysses group, a divisor of --cp and of the model's "
                        "heads (default gcd(kv_heads, --cp))")
    p.add_argument("--dtype", default="float64", choices=get_args(DType))
    p.add_argument("--image-strategy", default="replicate", choices=(*get_args(ImageStrategy), "auto"),
                   help="image layout (auto: the default cost model picks)")
    p.add_argument("--image-attention", default="causal", choices=get_args(ImageAttention))
    p.add_argument("--sample-placement", default="split", choices=("split", "whole", "auto"),
                   help="split every sample, place each whole on one rank, or auto (the cost model)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds before a hang fails the check")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    from vlmcp.debug.tiny import tiny_archs  # the registry; builders import transformers lazily

    p.add_argument("--model", default=None, metavar="hf:ARCH|DIR",
                   help="check a Hugging Face VLM instead (vlmcp[hf]): "
                        + ", ".join(f"hf:{a}" for a in tiny_archs())
                        + " (a tiny random model) or a local model directory, against the unmodified model "
                        "(float64 or float32; --image-attention causal)")
    p.add_argument("--video", action="store_true",
                   help="with --model: a row with videos (a video sample, a text-only sample, a sample "
                        "mixing images and a video; videos only where the model cannot mix them, GLM-4.1V): "
                        "Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5 (and their MoE), GLM-4.1V, LLaVA-OneVision")


def run(args: argparse.Namespace) -> int:
    from vlmcp.debug.parity.vlm import ParityCase, parity_case, verify_model_config

    if args.cp < 1:
        raise ValueError(f"--cp must be >= 1, got {args.cp}")
    if not args.timeout > 0:
        raise ValueError(f"--timeout must be > 0, got {args.timeout}")
    if args.ulysses_size is not None and args.attention != "usp":
        raise ValueError(f"--ulysses-size needs --attention usp, got --attention {args.attention}")
    if args.model is not None:
        return _run_hf(args)
    if args.video:
        raise ValueError("--video needs --model (the reference VLM has no videos)")
    llm = verify_model_config().llm
    ulysses_size = None
    if args.attention == "usp":
        ulysses_size = math.gcd(llm.kv_heads, args.cp) if args.ulysses_size is None else args.ulysses_size
        if ulysses_size < 1 or args.cp % ulysses_size or llm.heads % ulysses_size:
            raise ValueError(f"--ulysses-size must divide --cp {args.cp} and the verification model's "
                             f"{llm.heads} heads, got {ulysses_size}")
    if args.attention == "ulysses" and llm.heads % args.cp:
        raise ValueError(f"--attention ulysses needs the verification model's {llm.heads} heads "
                         f"divisible by --cp {args.cp}")
    if args.vision_mode == "hidden_shard" and llm.hidden % args.cp:
        raise ValueError(f"--vision-mode hidden_shard needs the verification model's hidden size "
                         f"{llm.hidden} divisible by --cp {args.cp}")
    case = ParityCase(vision_mode=args.vision_mode, attention=args.attention, dtype=args.dtype,
                      image_strategy=args.image_strategy, image_attention=args.image_attention,
                      sample_placement=args.sample_placement,
                      seed=args.seed, ulysses_size=ulysses_size)
    result = run_command("vlmcp verify", parity_case, args.cp, case, timeout=args.timeout, torchrun=False)
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        tol = result["tolerance"]
        tol = f"{tol:.0e}" if isinstance(tol, float) else tol
        usp = f" ulysses_size={ulysses_size}" if ulysses_size is not None else ""
        print(f"vlmcp verify: P={result['cp']} vision_mode={case.vision_mode} "
              f"attention={case.attention}{usp} "
              f"dtype={case.dtype}: loss {result['loss']:.6f} (abs error {result['loss_abs_error']:.2e}), "
              f"max relative gradient error {result['max_rel_grad_error']:.2e} over "
              f"{result['params_checked']} parameters (tolerance: {tol}), "
              f"vision grad norm {result['vision_grad_norm']:.4f} (single process "
              f"{result['ref_vision_grad_norm']:.4f}): {'PASSED' if result['passed'] else 'FAILED'}")
    return 0 if result["passed"] else 1


def _run_hf(args: argparse.Namespace) -> int:
    """``--model``: :func:`vlmcp.debug.parity.hf.hf_parity` on P spawned ranks."""
    if args.dtype not in ("float64", "float32"):
        raise ValueError(f"--model checks float64 or float32, got --dtype {args.dtype}")
    if args.attention == "usp":
        raise ValueError("--attention usp is for the reference VLM; --model takes ring or ulysses")
    if args.image_attention != "causal":
        raise ValueError("--model keeps the model's own causal attention (--image-attention causal)")
    try:
        from vlmcp.debug.parity.hf import HFParityCase, hf_parity
        from vlmcp.debug.tiny import (
            DEFAULT_SAMPLES,
            VIDEO_ONLY_SAMPLES,
            VIDEO_SAMPLES,
            tiny_arch,
            tiny_archs,
            tiny_config,
        )
        from vlmcp.hf.adapters import adapter_for
    except ImportError as err:
        raise ValueError(f"--model needs transformers: pip install 'vlmcp[hf]' ({err})") from err
    if args.model.startswith("hf:"):
        archs = tiny_archs()
        if args.model[3:] not in archs:
            raise ValueError(f"--model {args.model}: choose hf:{', hf:'.join(archs)} "
                             "or a directory")
        config = tiny_config(args.model[3:])
    else:
        import os

        if not os.path.isdir(args.model):
            raise ValueError(f"--model {args.model!r} is neither hf:ARCH nor a local model directory")
        config = check_model_dir(args.model, cp=args.cp, attention=args.attention,
                                 vision_mode=args.vision_mode)
    heads = getattr(getattr(config, "text_config", None), "num_attention_heads", None)
    if args.attention == "ulysses" and heads and heads % args.cp:
        raise ValueError(f"--attention ulysses needs the model's {heads} attention heads divisible by "
                         f"--cp {args.cp}")
    # the row's images in the adapter's terms (any-resolution models: tiles, sizes), else Qwen grids
    model_type = getattr(config, "model_type", None)
    samples = tiny_arch(model_type).samples if model_type in tiny_archs() else DEFAULT_SAMPLES
    if args.video:
        import types

        adapter = adapter_for(types.SimpleNamespace(config=config, model=None))
        if not adapter.takes_videos:
            raise ValueError(f"--video: {args.model} (model_type={config.model_type!r}) takes no videos "
                             "under vlmcp; Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5, GLM-4.1V and "
                             "LLaVA-OneVision do")
        own = tiny_arch(model_type).video_samples if model_type in tiny_archs() else None
        samples = own or (VIDEO_SAMPLES if adapter.mixes_images_and_videos else VIDEO_ONLY_SAMPLES)
    case = HFParityCase(model=args.model, attention=args.attention, vision_mode=args.vision_mode,
                        dtype=args.dtype, seed=args.seed, sample_placement=args.sample_placement,
                        image_strategy=args.image_strategy, samples=samples)
    result = run_command("vlmcp verify", hf_parity, args.cp, case, timeout=args.timeout, torchrun=False)
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        print(f"vlmcp verify: {args.model} P={result['cp']} vision_mode={case.vision_mode} "
              f"attention={case.attention} dtype={case.dtype} sample_placement={case.sample_placement} "
              f"(whole: {result['whole']}) image_strategy={case.image_strategy} ({result['strategy']})"
              f"{' with videos' if args.video else ''}: loss {result['loss']:.6f} (relative error "
              f"{result['loss_rel_error']:.2e}), max relative gradient error "
              f"{result['max_rel_grad_error']:.2e} "
              f"over {result['params_checked']} parameters, worst {result['worst_param']} (tolerance "
              f"{result['tolerance']:.0e}), against the unmodified model: "
              f"{'PASSED' if result['passed'] else 'FAILED'}")
    return 0 if result["passed"] else 1
