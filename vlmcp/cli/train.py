"""``vlmcp train``: train the reference VLM with context parallelism on the built-in data,
or, with ``--model DIR --data FILE.jsonl --output-dir OUT``, a Hugging Face VLM on your
conversations (:mod:`vlmcp.cli.train_hf`).

Without a launcher it spawns cp x dp gloo ranks on this machine; under torchrun it
joins the launcher's process group (NCCL when CUDA is available).
Every flag is checked before any rank starts, the paths it writes included.

One run per directory: the run locks every place it writes (the checkpoint and output
directories, the metrics file) for as long as it runs. SIGTERM finishes the step, saves
a checkpoint and exits 0 (Ctrl-C too, exiting 130; a second Ctrl-C stops at once); ranks
stop within a second when the launcher dies; a peer that
does not answer within --timeout ends the run with one line naming the step, the
collective and who did not answer.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import signal
import sys
import warnings
from pathlib import Path
from typing import get_args

from vlmcp.cli import command_help
from vlmcp.cli.config_file import add_config_arguments
from vlmcp.cli.finetune import HF_DEFAULTS, add_loop_arguments, check_no_loop_flags
from vlmcp.cli.paths import check_writable_dir, check_writable_file
from vlmcp.cli.train_hf import add_hf_arguments, check_reference_args, run_hf
from vlmcp.cli.train_hf import config_from_args as hf_config_from_args
from vlmcp.ranks import is_rank_zero, run_command, say, under_torchrun
from vlmcp.train import options
from vlmcp.train.reference.config import TrainConfig

_FIELDS = ("cp", "dp", "vision_mode", "attention", "ulysses_size", "image_attention", "image_strategy",
           "sample_placement",
           "flops_per_byte", "steps",
           "seq_len", "dtype", "seed", "lr", "hidden", "layers", "heads", "kv_heads", "checkpoint_dir",
           "checkpoint_every", "resume", "metrics_jsonl", "timeout")


def add_parser(sub) -> None:
    d = TrainConfig()
    p = sub.add_parser("train", help=command_help("train"),
                       description=__doc__)
    p.add_argument("--cp", type=int, default=d.cp, help="CP group size P")
    p.add_argument("--dp", type=int, default=d.dp, help="data-parallel replicas; world size = cp x dp")
    p.add_argument("--vision-mode", default=d.vision_mode, choices=get_args(options.VisionMode),
                   help="how the CP group computes the image embeddings")
    p.add_argument("--attention", default=d.attention, choices=get_args(options.AttentionBackend),
                   help="CP attention backend")
    p.add_argument("--ulysses-size", type=int, default=None, metavar="U",
                   help="--attention usp: ranks per Ulysses group, a divisor of --cp and --heads "
                        "(default gcd(--kv-heads, --cp)); ring across the groups")
    p.add_argument("--image-attention", default=d.image_attention,
                   choices=get_args(options.ImageAttention),
                   help="image tokens see each other causally or both ways")
    p.add_argument("--image-strategy", default=d.image_strategy,
                   choices=get_args(options.ImageStrategyChoice),
                   help="replicate image tokens (the seed), shard them with the text, or auto per row")
    p.add_argument("--sample-placement", default=d.sample_placement,
                   choices=get_args(options.SamplePlacement),
                   help="split every sample over the CP group, place each whole on one rank, or auto "
                        "(short samples whole, long ones split, by the cost model)")
    p.add_argument("--flops-per-byte", type=float, default=d.flops_per_byte,
                   help="auto only: FLOPs one communicated byte costs")
    p.add_argument("--steps", type=int, default=None,
                   help=f"total optimizer steps of the run (a resumed run finishes the same run) (default: "
                        f"{d.steps}; with --model: --epochs {HF_DEFAULTS['epochs']})")
    p.add_argument("--seq-len", type=int, default=None,
                   help=f"tokens per packed row (default: {d.seq_len}; with --model: "
                        f"{HF_DEFAULTS['seq_len']})")
    p.add_argument("--dtype", default=d.dtype, choices=get_args(options.DType), help="parameter dtype")
    p.add_argument("--seed", type=int, default=d.seed, help="model init and dataset seed")
    p.add_argument("--lr", type=float, default=None,
                   help=f"AdamW peak learning rate (default: {d.lr:g}; with --model: "
                        f"{HF_DEFAULTS['lr']:g}, or {HF_DEFAULTS['lora_lr']:g} with --lora)")
    p.add_argument("--hidden", type=int, default=d.hidden, help="LLM width")
    p.add_argument("--layers", type=int, default=d.layers, help="LLM decoder blocks")
    p.add_argument("--heads", type=int, default=d.heads, help="LLM attention heads")
    p.add_argument("--kv-heads", type=int, default=d.kv_heads, help="LLM key/value heads (GQA)")
    p.add_argument("--checkpoint-dir", default=None, help="where checkpoints go (none: no checkpoints)")
    p.add_argument("--checkpoint-every", type=int, default=0,
                   help="steps between checkpoints (0: only at the end)")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    p.add_argument("--metrics-jsonl", default=None, metavar="PATH",
                   help="one JSON object per step; a loss-curve PNG is written beside it")
    p.add_argument("--timeout", type=float, default=d.timeout,
                   help="seconds a rank waits for its peers in one collective or ring transfer (every "
                        "process group the run makes) before the run fails, naming the step and the ranks "
                        "that did not answer. It must exceed the longest time one rank can keep the others "
                        "waiting: the slowest rank's step time plus the longest checkpoint or model save "
                        "(rank 0 saves while the others wait in the next collective; minutes for a large "
                        "model on a slow disk). A few step times plus the save time is a good value; the "
                        "default suits steps of a minute and saves of several minutes")
    p.add_argument("--_fault", type=int, nargs=2, default=None, help=argparse.SUPPRESS)
    add_hf_arguments(p)
    add_loop_arguments(p)
    add_config_arguments(p)  # last: it reads every flag above


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    d = TrainConfig()  # --steps, --seq-len and --lr default to None: each trainer has its own defaults
    cfg = TrainConfig(**{f: getattr(d, f) if getattr(args, f) is None else getattr(args, f) for f in _FIELDS})
    uses_costs = cfg.image_strategy == "auto" or cfg.sample_placement != "split"
    if not uses_costs and cfg.flops_per_byte != TrainConfig().flops_per_byte:
        raise ValueError("--flops-per-byte only applies to --image-strategy auto or --sample-placement "
                         "whole/auto")
    from vlmcp.train.reference.loop import dataset_config

    dataset_config(cfg)  # raises if --seq-len cannot hold the longest built-in sample
    return cfg


def check_outputs(cfg: TrainConfig) -> None:
    """Check every path the run writes before any rank starts (see :mod:`vlmcp.cli.paths`).

    Also refuses a fresh run in a directory that holds checkpoints: its saves would
    replace and prune that run's checkpoints.
    """
    if cfg.checkpoint_dir:
        check_writable_dir("--checkpoint-dir", cfg.checkpoint_dir)
    if cfg.metrics_jsonl:
        check_writable_file("--metrics-jsonl", cfg.metrics_jsonl)
        check_writable_file("--metrics-jsonl's loss curve", cfg.loss_curve_png)


def check_fresh(cfg: TrainConfig) -> None:
    """Refuse a fresh run in a directory that holds checkpoints (its saves would replace and
    prune that run's checkpoints); checked under the lock."""
    if cfg.checkpoint_dir:
        from vlmcp.train.checkpoint import latest_checkpoint

        latest = latest_checkpoint(cfg.checkpoint_dir)
        if latest is not None and not cfg.resume:
            raise ValueError(f"--checkpoint-dir {cfg.checkpoint_dir}: already holds checkpoints (latest "
                             f"{latest.name}); pass --resume to continue that run, or choose another "
                             "directory")


def _kill_at(rank: int, step: int, this_rank: int, this_step: int) -> None:
    """The hidden ``--_fault RANK STEP`` flag: that rank dies (SIGKILL) at that step."""
    if (this_rank, this_step) == (rank, step):
        os.kill(os.getpid(), signal.SIGKILL)


def _one_line_warnings(previous):
    """A ``warnings.formatwarning``: vlmcp's own warnings as one line each, others as before."""
    ours = f"{os.sep}vlmcp{os.sep}"

    def format_warning(message, category, filename, lineno, line=None):
        if ours in filename:
            return f"vlmcp train: warning: {message}\n"
        return previous(message, category, filename, lineno, line)

    return format_warning


def _resume_preflight(cfg: TrainConfig) -> bool:
    """Check ``--resume`` before any rank starts; returns False when there is nothing to do.

    Damaged checkpoints are skipped with a warning naming the file; when checkpoints
    exist but none is good, it is an error (exit 2), never a fresh start over them.
    """
    from vlmcp.train.checkpoint import load_resume_checkpoint
    from vlmcp.train.reference.loop import check_resumable

    ckpt = load_resume_checkpoint(cfg.checkpoint_dir,
                                  report=lambda line: say(f"vlmcp train: warning: {line}", sys.stderr))
    if ckpt is None:
        say(f"vlmcp train: no checkpoint in {cfg.checkpoint_dir}; starting from step 0")
        return True
    check_resumable(ckpt, cfg)
    if ckpt.step == cfg.steps:
        say(f"vlmcp train: {ckpt.path} is at step {ckpt.step} = --steps; nothing to do")
        return False
    say(f"vlmcp train: resuming from {ckpt.path} (step {ckpt.step} of {cfg.steps})")
    return True


def _run_locks(args: argparse.Namespace) -> contextlib.ExitStack:
    """Lock every place the run writes (see :mod:`vlmcp.train.lock`); under torchrun rank 0 holds them.

    A path that cannot even be created gets no lock: the path checks that follow name the
    problem.
    """
    from vlmcp.train.lock import RunLock

    stack = contextlib.ExitStack()
    if os.environ.get("RANK", "0") != "0":
        return stack
    places = [("--checkpoint-dir", args.checkpoint_dir, False)]
    if args.output_dir is not None:
        places += [("--output-dir", args.output_dir, False),
                   ("--output-dir's checkpoints", None if args.checkpoint_dir else Path(args.output_dir)
                    / "checkpoints", False)]
    places.append(("--metrics-jsonl", args.metrics_jsonl, True))
    try:
        for what, path, file in places:
            if path is None or os.fspath(path) == "":
                continue
            lock = RunLock(path, what, file=file)
            try:
                stack.enter_context(lock)
            except OSError:
                continue
    except BaseException:
        stack.close()
        raise
    return stack


def run(args: argparse.Namespace) -> int:
    previous = warnings.formatwarning
    warnings.formatwarning = _one_line_warnings(previous)
    try:
        if any(getattr(args, f) is not None for f in ("model", "data", "output_dir")):
            hf_config_from_args(args)  # flag errors first: they create nothing, not even a lock
            with _run_locks(args):
                return run_hf(args)
        check_reference_args(args)
        check_no_loop_flags(args)
        cfg = config_from_args(args)
        with _run_locks(args):
            return _run_reference(args, cfg)
    finally:
        warnings.formatwarning = previous


def _run_reference(args: argparse.Namespace, cfg: TrainConfig) -> int:
    check_outputs(cfg)
    check_fresh(cfg)
    if cfg.resume and not _resume_preflight(cfg):
        return 0
    on_step = functools.partial(_kill_at, *args._fault) if args._fault else None
    from vlmcp.train.reference.loop import train_rank

    if not under_torchrun():
        print(f"vlmcp train: spawning {cfg.world_size} gloo ranks (cp={cfg.cp}, dp={cfg.dp}, "
              f"{max(1, (os.cpu_count() or 1) // cfg.world_size)} thread(s) each), {cfg.steps} steps of "
              f"{cfg.seq_len} tokens, vision_mode={cfg.vision_mode}, attention={cfg.attention}", flush=True)
    summary = run_command("vlmcp train", train_rank, cfg.world_size, cfg, on_step, timeout=None,
                          collective_timeout=cfg.timeout, interrupt=True,
                          world_from=f"--cp {cfg.cp} x --dp {cfg.dp} = {cfg.world_size}")
    if is_rank_zero():
        losses = summary["losses"]
        if summary["stopped"]:
            print(f"vlmcp train: {summary['stopped']}")
        if losses:
            first, last = summary["start_step"] + 1, summary["start_step"] + len(losses)
            print(f"vlmcp train: steps {first}-{last}, loss {losses[0]:.4f} -> {losses[-1]:.4f}")
        if cfg.image_strategy == "auto":
            picks = summary["image_strategies"]
            print(f"vlmcp train: image_strategy=auto chose replicate for {picks.count('replicate')} "
                  f"and shard for {picks.count('shard')} of DP replica 0's {len(picks)} rows")
        if summary["loss_curve"]:
            print(f"vlmcp train: loss curve written to {summary['loss_curve']}")
        if (summary["stopped"] or "").startswith("SIGINT"):
            return 130  # Ctrl-C: saved and stopped, as a shell expects of an interrupted command
    return 0
