"""``vlmcp train``: train the reference VLM with context parallelism on the built-in data,
or, with ``--model DIR --data FILE.jsonl --output-dir OUT``, a Hugging Face VLM on your
conversations. One loop trains both (``vlmcp.train``); every flag works for both, or is
refused by name for the one that cannot take it.

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
import dataclasses
import os
import sys
import warnings
from pathlib import Path
from typing import get_args

from vlmcp.cli import command_help
from vlmcp.cli.config_file import add_config_arguments
from vlmcp.cli.data_options import DATA_FLAGS
from vlmcp.cli.finetune import add_loop_arguments, defaults
from vlmcp.cli.paths import check_writable_dir, check_writable_file
from vlmcp.cli.train_model_args import add_model_arguments
from vlmcp.ranks import is_rank_zero, run_command, say, under_torchrun
from vlmcp.train import options

__all__ = ["add_parser", "config_from_args", "resume_preflight", "run"]

_DEFAULTS: dict[str, object] = {}
"""Every flag's parser default, by dest (what "not given" looks like)."""

_CHUNKED = "the reference VLM always computes its head and loss a chunk of tokens at a time"
_WHY_NOT = {"loss": _CHUNKED, "loss_chunk_size": _CHUNKED,
            **{dest: "the reference VLM trains its built-in data" for dest in DATA_FLAGS}}
"""Why the reference VLM refuses a flag, where there is more to say than that it has no such flag."""


def add_parser(sub) -> None:
    ref, hf = defaults()
    p = sub.add_parser("train", help=command_help("train"), description=__doc__)
    p.add_argument("--cp", type=int, default=ref["cp"], help="CP group size P")
    p.add_argument("--dp", type=int, default=ref["dp"], help="data-parallel replicas; world size = cp x dp")
    p.add_argument("--vision-mode", default=ref["vision_mode"], choices=get_args(options.VisionMode),
                   help="how the CP group computes the image embeddings")
    p.add_argument("--attention", default=ref["attention"], choices=get_args(options.AttentionBackend),
                   help="CP attention backend (usp: the reference VLM only)")
    p.add_argument("--image-strategy", default=ref["image_strategy"],
                   choices=get_args(options.ImageStrategyChoice),
                   help="replicate image tokens (the seed), shard them with the text, or auto per row")
    p.add_argument("--sample-placement", default=ref["sample_placement"],
                   choices=get_args(options.SamplePlacement),
                   help="split every sample over the CP group, place each whole on one rank, or auto "
                        "(short samples whole, long ones split, by the cost model)")
    p.add_argument("--steps", type=int, default=None,
                   help=f"total optimizer steps of the run (a resumed run finishes the same run) (default: "
                        f"{ref['steps']}; with --model: --epochs 1)")
    p.add_argument("--seq-len", type=int, default=None,
                   help=f"tokens per packed row (default: {ref['seq_len']}; with --model: {hf['seq_len']})")
    p.add_argument("--dtype", default=ref["dtype"], choices=get_args(options.DType), help="parameter dtype")
    p.add_argument("--seed", type=int, default=ref["seed"], help="model init and dataset seed")
    p.add_argument("--lr", type=float, default=None,
                   help=f"AdamW peak learning rate (default: {ref['lr']:g}; with --model: "
                        f"{hf['lr']:g}, or {hf['lora_lr']:g} with --lora)")
    p.add_argument("--checkpoint-dir", default=None, help="where checkpoints go (none: no checkpoints; with "
                                                          "--model: OUT/checkpoints)")
    p.add_argument("--checkpoint-every", type=int, default=0,
                   help="steps between checkpoints (0: only at the end)")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    p.add_argument("--metrics-jsonl", default=None, metavar="PATH",
                   help="one JSON object per step; a loss-curve PNG is written beside it")
    p.add_argument("--timeout", type=float, default=ref["timeout"],
                   help="seconds a rank waits for its peers in one collective or ring transfer (every "
                        "process group the run makes) before the run fails, naming the step and the ranks "
                        "that did not answer. It must exceed the longest time one rank can keep the others "
                        "waiting: the slowest rank's step time plus the longest checkpoint or model save "
                        "(rank 0 saves while the others wait in the next collective; minutes for a large "
                        "model on a slow disk). A few step times plus the save time is a good value; the "
                        "default suits steps of a minute and saves of several minutes")
    _add_reference_arguments(p, ref)
    add_model_arguments(p)
    add_loop_arguments(p)
    add_config_arguments(p)  # last: it reads every flag above
    _DEFAULTS.update({a.dest: a.default for a in p._actions
                      if a.option_strings and a.dest not in ("help", "config")})


def _add_reference_arguments(p: argparse.ArgumentParser, ref: dict) -> None:
    g = p.add_argument_group("the reference VLM (without --model)",
                             "Its size, its attention and its held-out rows; with --model these are refused.")
    g.add_argument("--ulysses-size", type=int, default=None, metavar="U",
                   help="--attention usp: ranks per Ulysses group, a divisor of --cp and --heads "
                        "(default gcd(--kv-heads, --cp)); ring across the groups")
    g.add_argument("--image-attention", default=ref["image_attention"],
                   choices=get_args(options.ImageAttention),
                   help="image tokens see each other causally or both ways")
    g.add_argument("--flops-per-byte", type=float, default=ref["flops_per_byte"],
                   help="auto only: FLOPs one communicated byte costs")
    g.add_argument("--hidden", type=int, default=ref["hidden"], help="LLM width")
    g.add_argument("--layers", type=int, default=ref["layers"], help="LLM decoder blocks")
    g.add_argument("--heads", type=int, default=ref["heads"], help="LLM attention heads")
    g.add_argument("--kv-heads", type=int, default=ref["kv_heads"], help="LLM key/value heads (GQA)")
    g.add_argument("--eval-rows", type=int, default=ref["eval_rows"], metavar="N",
                   help="held-out built-in rows (another seed's stream), evaluated every --eval-every steps "
                        "and at the end (0: no evaluation)")


def _family(args: argparse.Namespace) -> str:
    """``hf`` when a model directory, its data or an output directory is named; else ``reference``."""
    named = any(getattr(args, f, None) is not None for f in ("model", "data", "output_dir"))
    return "hf" if named else "reference"


def _given(args: argparse.Namespace, dest: str) -> bool:
    default = _DEFAULTS[dest]
    if default is argparse.SUPPRESS:
        return hasattr(args, dest)
    return getattr(args, dest) != default


def _refusal(dest: str, family: str) -> str:
    flag = "--" + dest.replace("_", "-")
    if family == "hf":
        return f"{flag} applies to the built-in reference VLM, not --model"
    if dest.startswith("video_"):
        return "the --video-* flags need --model (the reference VLM's videos are its own frames)"
    if dest in ("freeze", "merge_lora") or dest.startswith("lora"):
        return f"{flag} needs --model (the reference VLM trains every weight)"
    return f"{flag} needs --model ({_WHY_NOT.get(dest, 'the reference VLM has no such flag')})"


def config_from_args(args: argparse.Namespace):
    """The run's config, of the family the flags name; a flag that family cannot take is refused by name."""
    from vlmcp.cli.video import video_sampling
    from vlmcp.train.specs import launcher

    family = _family(args)
    spec = launcher(family)
    fields = {f.name for f in dataclasses.fields(spec.CONFIG)}
    values = {}
    for dest in _DEFAULTS:
        taken = dest in fields or (dest.startswith("video_") and "video" in fields)
        if not taken and _given(args, dest):
            raise ValueError(_refusal(dest, family))
        if dest in fields and getattr(args, dest, None) is not None:
            values[dest] = getattr(args, dest)
    if "video" in fields:
        values["video"] = video_sampling(args)
    return spec.CONFIG(**spec.config_values(values))


def check_outputs(cfg, spec) -> None:
    """Every path the run writes, before any rank starts (see :mod:`vlmcp.cli.paths`)."""
    for flag, path in spec.outputs(cfg):
        check_writable_dir(flag, path)
    if cfg.checkpoints is not None:
        check_writable_dir("--checkpoint-dir" if cfg.checkpoint_dir else "--output-dir's checkpoints",
                           cfg.checkpoints)
    if cfg.metrics_jsonl:
        check_writable_file("--metrics-jsonl", cfg.metrics_jsonl)
        check_writable_file("--metrics-jsonl's loss curve", cfg.loss_curve_png)


def _one_line_warnings(previous):
    """A ``warnings.showwarning``: vlmcp's own warnings as one line each on stderr, others as before."""
    ours = f"{os.sep}vlmcp{os.sep}"

    def show_warning(message, category, filename, lineno, file=None, line=None):
        if ours in filename:
            print(f"vlmcp train: warning: {message}", file=sys.stderr, flush=True)
        else:
            previous(message, category, filename, lineno, file, line)

    return show_warning


def resume_preflight(cfg) -> bool:
    """Check the checkpoint directory before any rank starts; False: nothing to do.

    A fresh run refuses a directory that holds checkpoints (its saves would replace and prune
    them). With ``--resume`` a damaged checkpoint is skipped with a warning (the one before it is
    used); when checkpoints exist but none is good, it is an error, never a fresh start over them.
    A run whose last checkpoint is at ``--steps`` but whose final output is missing or incomplete
    goes on: its ranks load that checkpoint and write it.
    """
    from vlmcp.train.checkpoint.run import check_resumable, checkpoint_count, latest_step
    from vlmcp.train.specs import launcher_for

    family, where, dcp = launcher_for(cfg), cfg.checkpoints, cfg.dcp_checkpoints
    if where is None:
        return True
    count = checkpoint_count(where, dcp)
    name = lambda step: where / (f"step_{step:08d}" + ("" if dcp else ".pt"))  # noqa: E731
    if not cfg.resume:
        if count:
            from vlmcp.train.checkpoint.dcp import dcp_dirs
            from vlmcp.train.checkpoint.files import latest_checkpoint

            latest = dcp_dirs(where)[-1][1] if dcp else latest_checkpoint(where)
            flag = "--checkpoint-dir" if cfg.checkpoint_dir else "--output-dir's checkpoints"
            raise ValueError(f"{flag} {where}: already holds checkpoints (latest {latest.name}); pass "
                             "--resume to continue that run, or choose another directory")
        return True
    found = latest_step(where, dcp)
    if found is None:
        if count:
            raise ValueError(f"--resume: none of the {count} checkpoint(s) in {where} is readable (see the "
                             "warnings); not starting over from step 0 on top of them: move them away to "
                             "start a new run")
        say(f"vlmcp train: no checkpoint in {where}; starting from step 0")
        return True
    step = found[0]
    check_resumable(found[1], cfg, step, where)
    if step == cfg.steps:
        if family.finished(cfg):
            say(f"vlmcp train: {name(step)} is at step {step} = --steps; nothing to do")
            return False
        say(f"vlmcp train: {name(step)} is at step {step} = --steps, but the model in "
            f"{family.record_dir(cfg)} is missing or incomplete; writing it from that checkpoint")
        return True
    say(f"vlmcp train: resuming from {name(step)} (step {step} of {cfg.steps})")
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
            try:
                stack.enter_context(RunLock(path, what, file=file))
            except OSError:
                continue
    except BaseException:
        stack.close()
        raise
    return stack


def run(args: argparse.Namespace) -> int:
    from vlmcp.train.specs import launcher

    with warnings.catch_warnings():  # restores the filters and showwarning
        warnings.showwarning = _one_line_warnings(warnings.showwarning)
        warnings.filterwarnings("always", category=UserWarning, module=r"vlmcp\.")  # each run says each one
        spec = launcher(_family(args))
        cfg = config_from_args(args)  # flag errors first: they create nothing, not even a lock
        with _run_locks(args):
            return _launch(args, spec, cfg)


def _launch(args: argparse.Namespace, family, cfg) -> int:
    from vlmcp.cli.config_file import write_resolved_config
    from vlmcp.train.loop import train_rank

    check_outputs(cfg, family)
    spec = family.prepare(cfg, say)
    cfg = spec.cfg  # with a model directory: --epochs resolved into --steps
    if not resume_preflight(cfg):
        return 0
    record = family.record_dir(cfg)
    if record is not None and is_rank_zero():  # every check has passed: the run starts
        write_resolved_config(args, record)
    family.announce(spec, say, spawning=not under_torchrun())
    ranks = dict(timeout=None, collective_timeout=cfg.timeout, interrupt=True,
                 world_from=f"--cp {cfg.cp} x --dp {cfg.dp} = {cfg.world_size}")
    summary = run_command("vlmcp train", train_rank, cfg.world_size, spec, **ranks)
    return family.report(spec, summary) if is_rank_zero() else 0
