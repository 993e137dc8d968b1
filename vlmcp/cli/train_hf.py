"""``vlmcp train --model DIR --data FILE.jsonl``: train a Hugging Face VLM with CP.

Before any rank starts, the launching process checks every flag and every path the
run writes, loads the processor, reads and checks every line of the data, measures
every conversation and plans the packed rows; all ranks then share that plan. Under
torchrun each rank makes the same checks and the same plan itself.

Bad samples never stop a long run silently, nor train wrongly: a conversation longer than
``--seq-len``, or with an image or video whose header cannot be read, is skipped at
planning; one whose image or video fails to decode during training is skipped then, on
every rank of its CP group. Each is named (``file:line`` and the file) and counted in the
opening plan line and the final summary. ``--strict`` turns all of them into one-line
errors before any rank starts (it decodes every image and video up front).

Videos are sampled by the ``--video-*`` flags (:mod:`vlmcp.cli.video`), as the model's processor does.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from vlmcp.cli.data_options import DATA_FLAGS, add_data_arguments
from vlmcp.cli.data_options import check_reference as check_reference_data
from vlmcp.cli.finetune import hf_shared_values, loop_options
from vlmcp.cli.model_check import check_model_dir
from vlmcp.cli.paths import check_writable_dir, check_writable_file
from vlmcp.cli.train_lora_args import add_lora_arguments, check_no_lora, lora_fields
from vlmcp.cli.video import add_video_arguments, video_sampling
from vlmcp.data.hf.video import VideoSampling
from vlmcp.ranks import is_rank_zero, run_command, say, under_torchrun
from vlmcp.train.hf.config import HFTrainConfig
from vlmcp.train.reference.config import TrainConfig

__all__ = ["add_hf_arguments", "check_reference_args", "run_hf"]

# flags of the built-in reference VLM that mean nothing for a model directory
_REFERENCE_ONLY = ("hidden", "layers", "heads", "kv_heads", "image_attention", "flops_per_byte",
                   "ulysses_size")


def add_hf_arguments(p: argparse.ArgumentParser) -> None:
    """The flags ``vlmcp train`` adds for a Hugging Face model directory."""
    g = p.add_argument_group(
        "Hugging Face model (with --model)",
        "The shared flags above apply too. Checkpoints go to --checkpoint-dir (default OUT/checkpoints): "
        "every --checkpoint-every steps and at the end when either flag is given, and always when a SIGTERM "
        "stops the run. --image-strategy replicate|shard|auto is passed to vlmcp.hf.shard_inputs.")
    g.add_argument("--model", default=None, metavar="DIR",
                   help="a local HF VLM directory (any architecture with a vlmcp adapter: Qwen2/2.5/3-VL, "
                        "Qwen3.5, GLM-4.1V, LLaVA, LLaVA-NeXT/OneVision, InternVL, SmolVLM, Mistral3, "
                        "Gemma 3, Kimi-K2.5, LFM2-VL); none: the reference VLM")
    g.add_argument("--data", default=None, action="append", metavar="FILE.jsonl",
                   help="conversations: LLaMA-Factory/ms-swift messages+images+videos or LLaVA "
                        "conversations; repeat for several files, read in order")
    g.add_argument("--output-dir", default=None, metavar="OUT",
                   help="where the trained model and processor are saved (save_pretrained)")
    g.add_argument("--image-root", default=None, metavar="DIR",
                   help="relative image and video paths start here; none: the JSONL file's directory")
    g.add_argument("--strict", action="store_true",
                   help="stop before training on a conversation longer than --seq-len or an image or video "
                        "that cannot be read or decoded (every image and video is decoded up front), instead "
                        "of skipping it")
    g.add_argument("--fsdp", action="store_true",
                   help="FSDP2 over the DP x CP ranks (loss scaled by P), sharded checkpoints")
    g.add_argument("--activation-checkpointing", action="store_true",
                   help="recompute each decoder block in backward")
    g.add_argument("--offload-activations", action="store_true",
                   help="keep the tensors saved for backward (with --activation-checkpointing: the blocks' "
                        "inputs) in pinned CPU memory until backward; exact")
    g.add_argument("--loss", choices=("chunked", "full"), default="chunked",
                   help="chunked (default): the LM head and the cross-entropy --loss-chunk-size target "
                        "tokens at a time, never the tokens x vocab logits; full: the model's logits "
                        "(for comparison)")
    g.add_argument("--loss-chunk-size", type=int, default=4096, metavar="N",
                   help="target tokens per chunk of logits of --loss chunked (default 4096)")
    add_data_arguments(g)
    g.add_argument("--_nan-at-step", dest="nan_at_step", type=int, default=None, help=argparse.SUPPRESS)
    add_lora_arguments(p)
    add_video_arguments(p.add_argument_group(
        "videos (with --model)", "How a video becomes frames, as the model's own processor samples them "
        "(qwen-vl-utils for Qwen2-VL and Qwen2.5-VL; the video processor for Qwen3-VL, Qwen3.5 and GLM-4.1V; "
        "a fixed count for LLaVA-OneVision): frames at --video-fps within the frame bounds, each resized to "
        "a multiple of F = patch_size*merge_size pixels per side within the pixel bounds."))


def check_reference_args(args: argparse.Namespace) -> None:
    """Without ``--model``, the Hugging Face flags are a mistake: say so."""
    for flag in ("image_root", "nan_at_step"):
        if getattr(args, flag) is not None:
            raise ValueError(f"--{flag.replace('_', '-')} needs --model")
    for flag, default in (("loss", "chunked"), ("loss_chunk_size", 4096)):
        if getattr(args, flag) != default:
            raise ValueError(f"--{flag.replace('_', '-')} needs --model (the reference VLM always computes "
                             "its head and loss a chunk of tokens at a time)")
    for flag in ("strict", "fsdp", "activation_checkpointing", "offload_activations"):
        if getattr(args, flag):
            raise ValueError(f"--{flag.replace('_', '-')} needs --model (the reference VLM has no such flag)")
    check_no_lora(args)
    check_reference_data(args)
    if video_sampling(args) != VideoSampling():
        raise ValueError("the --video-* flags need --model (the reference VLM's videos are its own frames)")


def config_from_args(args: argparse.Namespace) -> HFTrainConfig:
    if args.model is None or (args.data is None and args.dataset is None) or args.output_dir is None:
        raise ValueError("--model, --data (or --dataset) and --output-dir go together (a model directory, "
                         "its training data and where the trained model goes)")
    defaults = TrainConfig()
    for name in _REFERENCE_ONLY:
        if getattr(args, name) != getattr(defaults, name):
            raise ValueError(f"--{name.replace('_', '-')} applies to the built-in reference VLM, not --model")
    fields = ("cp", "dp", "vision_mode", "attention", "sample_placement", "image_strategy",
              "dtype", "seed", "fsdp", "activation_checkpointing", "offload_activations",
              "loss", "loss_chunk_size", "checkpoint_dir",
              "checkpoint_every", "resume", "metrics_jsonl", "timeout", "image_root", "strict", "nan_at_step",
              *DATA_FLAGS)
    if not (Path(args.model) / "config.json").is_file():
        raise ValueError(f"--model {args.model}: not a model directory (no config.json)")
    check_output_outside_model(args.output_dir, args.model)
    return HFTrainConfig(model=str(args.model), data=tuple(args.data or ()), output_dir=str(args.output_dir),
                         video=video_sampling(args), **{f: getattr(args, f) for f in fields},
                         **hf_shared_values(args), **loop_options(args), **lora_fields(args))


def check_output_outside_model(output_dir, model) -> None:
    """``--output-dir`` that is, or lies inside, ``--model`` would overwrite the model it starts from."""
    out, src = Path(os.path.realpath(output_dir)), Path(os.path.realpath(model))
    if out == src or src in out.parents:
        where = "is" if out == src else "lies inside"
        raise ValueError(f"--output-dir {output_dir} {where} --model {model}: "
                         "the trained model would overwrite (or mix with) the model it starts from; choose "
                         "another directory")


def check_outputs(cfg: HFTrainConfig) -> None:
    """Every path the run writes, before any rank starts (see :mod:`vlmcp.cli.paths`)."""
    check_writable_dir("--output-dir", cfg.output_dir)
    check_writable_dir("--checkpoint-dir" if cfg.checkpoint_dir else "--output-dir's checkpoints",
                       cfg.checkpoints)
    if cfg.metrics_jsonl:
        check_writable_file("--metrics-jsonl", cfg.metrics_jsonl)
        check_writable_file("--metrics-jsonl's loss curve", Path(cfg.metrics_jsonl).with_suffix(".png"))
    if cfg.report_to == "tensorboard":
        import importlib.util

        if importlib.util.find_spec("tensorboard") is None:
            raise ValueError("--report-to tensorboard needs the tensorboard package: pip install "
                             "'vlmcp[tensorboard]'")
        from vlmcp.train.hf.feedback import tensorboard_dir

        check_writable_dir("--report-to tensorboard's directory", tensorboard_dir(cfg))


def plan_data(cfg: HFTrainConfig):
    """Load the processor, read and check the data, plan the rows (errors name the line)."""
    return _plan(cfg)[1]


def _plan(cfg: HFTrainConfig):
    """``(processor, index)``; with ``--strict`` every image is decoded too."""
    check_model_dir(cfg.model, cp=cfg.cp, attention=cfg.attention, vision_mode=cfg.vision_mode)
    from vlmcp.data.hf.dataset_info import resolve_datasets
    from vlmcp.data.hf.image_bounds import ImageBounds
    from vlmcp.data.hf.processor import load_processor
    from vlmcp.data.hf.reader import read_conversations
    from vlmcp.data.hf.rows import build_index

    processor = load_processor(cfg.model)
    sources = [*cfg.data, *resolve_datasets(cfg.dataset or (), cfg.dataset_dir)]
    data = read_conversations(sources, cfg.image_root, max_samples=cfg.max_samples)
    source = " ".join(([f"--data {', '.join(cfg.data)}"] if cfg.data else [])
                      + ([f"--dataset {cfg.dataset}"] if cfg.dataset else []))
    bounds = ImageBounds(min_pixels=cfg.image_min_pixels, max_pixels=cfg.image_max_pixels)
    index = build_index(processor, data, cfg.seq_len, strict=cfg.strict, source=source, video=cfg.video,
                        images=bounds, truncate=cfg.truncate)
    if cfg.strict:
        _decode_every_image(processor, index)
    return processor, index


def plan_eval(cfg: HFTrainConfig, processor):
    """The planned ``--eval-data`` and ``--eval-dataset`` (None without them); read and checked like
    ``--data``, with the same image bounds, truncation and ``--max-samples``."""
    if not cfg.eval_data and not cfg.eval_dataset:
        return None
    from vlmcp.data.hf.dataset_info import resolve_datasets
    from vlmcp.data.hf.image_bounds import ImageBounds
    from vlmcp.data.hf.reader import read_conversations
    from vlmcp.data.hf.rows import build_index

    sources = [*cfg.eval_data, *resolve_datasets(cfg.eval_dataset or (), cfg.dataset_dir)]
    data = read_conversations(sources, cfg.image_root, max_samples=cfg.max_samples)
    bounds = ImageBounds(min_pixels=cfg.image_min_pixels, max_pixels=cfg.image_max_pixels)
    source = " ".join(([f"--eval-data {', '.join(cfg.eval_data)}"] if cfg.eval_data else [])
                      + ([f"--eval-dataset {cfg.eval_dataset}"] if cfg.eval_dataset else []))
    return build_index(processor, data, cfg.seq_len, strict=cfg.strict, source=source, video=cfg.video,
                       images=bounds, truncate=cfg.truncate)


def _decode_every_image(processor, index) -> None:
    """``--strict``: decode every image and video now, with a progress line; the first failure
    is the error."""
    from vlmcp.data.hf.encode import MediaError, check_pixels

    total = sum(len(c.images) + len(c.videos) for c in index.conversations)
    if not total:
        return
    one = "image and video" if _has_videos(index) else "image"
    what = "images and videos" if _has_videos(index) else "images"
    tty = os.environ.get("RANK", "0") == "0" and sys.stdout.isatty()
    say(f"vlmcp train: --strict: decoding {total} {what} before training")
    done = 0
    for conv in index.conversations:
        try:
            check_pixels(conv, processor, index.video)
        except MediaError as err:
            if tty:
                print(flush=True)
            raise ValueError(f"{err} (--strict decodes every {one} before training)") from None
        done += len(conv.images) + len(conv.videos)
        if tty:
            print(f"\rvlmcp train: --strict: {done}/{total} {what} decoded", end="", flush=True)
    if tty:
        print(flush=True)
    say(f"vlmcp train: --strict: all {total} {what} decode")


def _has_videos(index) -> bool:
    """Whether the data has videos (kept, or skipped at planning for one)."""
    return any(c.videos for c in index.conversations) or \
        any(s.reason.startswith(("cannot read video", "cannot sample video")) for s in index.unreadable)


def _where(skips, most: int = 5) -> str:
    if not skips:
        return ""
    names = ", ".join(s.where for s in skips[:most])
    return f" ({names}{', ...' if len(skips) > most else ''})"


def _skips(cfg: HFTrainConfig, index, decode_skipped=None) -> str:
    """How many conversations are (or were) left out, by cause, and the turns a format dropped."""
    media = "image or video" if _has_videos(index) else "image"
    causes = [(f"longer than --seq-len {cfg.seq_len}", index.too_long),
              (f"with an unreadable {media}", index.unreadable)]
    if decode_skipped is not None:
        causes.append((f"whose {media} failed to decode in training", decode_skipped))
    causes.append(("by a format rule", index.format_skipped))
    named = decode_skipped is not None  # the final summary names them; the plan line counts them
    parts = [f"{len(skips)} {what}{_where(skips) if named else ''}" for what, skips in causes]
    cut = f"; conversations cut at --seq-len: {sum(c is not None for c in index.cuts)}" \
        if cfg.truncate else ""
    return (f"conversations skipped: {', '.join(parts)}; turns dropped by a format rule: "
            f"{index.dropped_turns}{cut}")


def _first_view(cfg: HFTrainConfig, processor, index) -> str:
    """What the run's first conversation trains (``vlmcp data show``'s view, one screen at most)."""
    from vlmcp.data.hf.rows import row_at
    from vlmcp.data.hf.show import view_conversation

    i = index.rows[row_at(index, cfg.seed, 0)][0]
    conv = index.conversations[i]
    more = f"; vlmcp data show --model {cfg.model} --data {conv.source} --line {conv.line} prints it all"
    view = view_conversation(processor, conv, index.video, index.images).plain(max_lines=30, max_chars=2400,
                                                                              more=more)
    cut = index.cuts[i] if index.cuts else None
    cut = f"\n(--truncate trains its first {cut.tokens} tokens)" if cut else ""
    return f"vlmcp train: the first conversation as the model sees it ([[...]] carries loss):\n{view}{cut}"


def _resume_preflight(cfg: HFTrainConfig) -> bool:
    """Check ``--resume`` (or a fresh run's empty checkpoint dir); False: nothing to do.

    A damaged checkpoint is skipped with a warning (the one before it is used); when
    checkpoints exist but none is good, ``--resume`` is an error, never a fresh start over
    them. A run whose last checkpoint is at ``--steps`` but whose final model is missing or
    incomplete goes on: its ranks load that checkpoint and write the model.
    """
    from vlmcp.train.hf.checkpoint import check_resumable, checkpoint_count, latest_step
    from vlmcp.train.hf.final_model import final_model_complete

    count = checkpoint_count(cfg.checkpoints, cfg.fsdp)
    if not cfg.resume:
        if count:
            raise ValueError(f"{cfg.checkpoints} already holds checkpoints; pass --resume to continue that "
                             "run, or choose another --output-dir/--checkpoint-dir")
        return True
    found = latest_step(cfg.checkpoints, cfg.fsdp)
    if found is None:
        if count:
            raise ValueError(f"--resume: none of the {count} checkpoint(s) in {cfg.checkpoints} is readable "
                             "(see the warnings); not starting over from step 0 on top of them: move them "
                             "away to start a new run")
        say(f"vlmcp train: no checkpoint in {cfg.checkpoints}; starting from step 0")
        return True
    check_resumable(found[1], cfg, found[0], cfg.checkpoints)
    if found[0] == cfg.steps:
        if final_model_complete(cfg.output_dir, cfg.steps):
            say(f"vlmcp train: {cfg.checkpoints} is at step {found[0]} = --steps and the model is saved; "
                 "nothing to do")
            return False
        say(f"vlmcp train: {cfg.checkpoints} is at step {found[0]} = --steps, but the model in "
             f"{cfg.output_dir} is missing or incomplete; writing it from that checkpoint")
        return True
    say(f"vlmcp train: resuming from step {found[0]} of {cfg.steps} in {cfg.checkpoints}")
    return True


def preload_model_code(model_dir: str) -> None:
    """Import transformers and the model's code in the fork server, once, not in every rank.

    ``vlmcp.launch`` starts ranks from a fork server (forkserver context, the same object
    for every caller); modules it imported before forking cost a rank nothing.
    """
    import json
    import multiprocessing

    model_type = json.loads((Path(model_dir) / "config.json").read_text()).get("model_type", "")
    modules = ["torch", "torch.distributed", "vlmcp", "vlmcp.hf", "transformers",
               "transformers.models.auto.modeling_auto"]
    if model_type.isidentifier():
        modules.append(f"transformers.models.{model_type}.modeling_{model_type}")
    multiprocessing.get_context("forkserver").set_forkserver_preload(modules)


def _peak(peak: dict | None) -> str:
    """``, peak memory 1.23 GiB per rank (resident, busiest rank)`` or nothing."""
    if not peak:
        return ""
    return f", peak memory {peak['bytes'] / 2**30:.2f} GiB per rank ({peak['kind']}, busiest rank)"


def _report(cfg: HFTrainConfig, index, s: dict) -> int:
    if s["message"]:
        failed = s["stopped"] in ("nonfinite", "no_targets")
        print(f"vlmcp train: {s['message']}", file=sys.stderr if failed else sys.stdout)
    losses = s["losses"]
    rate = s["tokens"] / s["seconds"] if s["seconds"] > 0 else 0.0
    targets = f" ({s['target_tokens']:,} trained)" if "target_tokens" in s else ""
    print(f"vlmcp train: steps {s['start_step'] + 1}-{s['step']} of {s['steps']}, {s['tokens']:,} "
          f"tokens{targets}, {rate:,.0f} tokens/s"
          + (f", loss {losses[0]:.4f} -> {losses[-1]:.4f}" if losses else "")
          + _peak(s.get("peak_memory")))
    print(f"vlmcp train: {_skips(cfg, index, s.get('decode_skipped', []))}")
    if s["model_dir"]:
        print(f"vlmcp train: model and processor saved to {s['model_dir']}")
    if s["checkpoint"]:
        print(f"vlmcp train: checkpoints in {cfg.checkpoints}")
    if s["loss_curve"]:
        print(f"vlmcp train: loss curve written to {s['loss_curve']}")
    if s.get("evals"):
        last = s["evals"][-1]
        print(f"vlmcp train: eval loss {last['eval_loss']:.4f} after step {last['step']} over "
              f"{last['eval_tokens']:,} target tokens ({last['eval_rows']} rows of --eval-data)")
    return {"nonfinite": 1, "no_targets": 1, "sigint": 130}.get(s["stopped"], 0)


def run_hf(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local directory: nothing to download
    from vlmcp.train.hf.loop import train_hf_rank

    check_outputs(cfg)
    processor, index = _plan(cfg)
    cfg = cfg.with_steps(len(index.rows))  # --epochs: the steps of that many passes over the rows
    from vlmcp.train.hf.finetune import check_model

    check_model(cfg)  # --freeze, --lora on the architecture (meta device)
    eval_index = plan_eval(cfg, processor)
    if cfg.strict and eval_index is not None:
        _decode_every_image(processor, eval_index)
    if not _resume_preflight(cfg):
        return 0
    fill = index.tokens / (len(index.rows) * cfg.seq_len)
    say(f"vlmcp train: {cfg.model} on {len(index.conversations)} conversations in {len(index.rows)} rows "
         f"of {cfg.seq_len} tokens ({fill:.0%} filled); {_skips(cfg, index)}")
    say(f"vlmcp train: {cfg.steps} steps of {cfg.rows_per_step} rows (--dp {cfg.dp} x --grad-accum "
        f"{cfg.grad_accum}), {cfg.steps * cfg.rows_per_step / len(index.rows):.3g} epochs; lr {cfg.lr:g}, "
        f"{cfg.lr_scheduler} after {cfg.warmup} warm-up steps, weight decay {cfg.weight_decay:g}, "
        f"max grad norm {cfg.max_grad_norm:g}"
        + (f"; eval on {len(eval_index.rows)} rows of --eval-data "
           f"{'every ' + str(cfg.eval_every) + ' steps and ' if cfg.eval_every else ''}at the end"
           if eval_index is not None else ""))
    for skip in index.unreadable[:5]:
        say(f"vlmcp train: warning: {skip.where}: {skip.reason}; skipped")
    if len(index.unreadable) > 5:
        say(f"vlmcp train: warning: ... and {len(index.unreadable) - 5} more conversations with an "
             f"unreadable {'image or video' if _has_videos(index) else 'image'}")
    say(_first_view(cfg, processor, index))
    if is_rank_zero():  # every check has passed: the run starts
        from vlmcp.cli.config_file import write_resolved_config

        write_resolved_config(args, cfg.output_dir)
    if not under_torchrun():
        print(f"vlmcp train: spawning {cfg.world_size} gloo ranks (cp={cfg.cp}, dp={cfg.dp}"
              f"{', fsdp' if cfg.fsdp else ''}), {cfg.steps} steps", flush=True)
        preload_model_code(cfg.model)
    summary = run_command("vlmcp train", train_hf_rank, cfg.world_size, cfg, index, None, eval_index,
                          timeout=None, collective_timeout=cfg.timeout, interrupt=True,
                          world_from=f"--cp {cfg.cp} x --dp {cfg.dp} = {cfg.world_size}")
    return _report(cfg, index, summary) if is_rank_zero() else 0
