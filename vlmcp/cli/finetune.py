"""The fine-tuning loop's flags of ``vlmcp train --model``: run length, global batch, optimizer,
schedule, evaluation and reporting (:class:`vlmcp.train.hf.config.HFTrainConfig` documents each).

The three flags the reference VLM shares (``--lr``, ``--seq-len``, ``--steps``) default to None on
the parser, so that each trainer fills in its own defaults: :data:`HF_DEFAULTS` for a model
directory, :class:`~vlmcp.train.reference.config.TrainConfig`'s for the reference VLM.
"""

from __future__ import annotations

import argparse

__all__ = ["HF_DEFAULTS", "LOOP_FIELDS", "add_loop_arguments", "check_no_loop_flags", "hf_shared_values",
           "loop_options"]

HF_DEFAULTS = {"lr": 1e-5, "lora_lr": 1e-4, "seq_len": 4096, "epochs": 1}
"""``--model``'s defaults of the shared flags: full fine-tuning's rate, LoRA's, the row length, and
the run length when ``--steps`` is not given."""

LOOP_FIELDS = ("epochs", "grad_accum", "weight_decay", "max_grad_norm", "warmup_steps", "warmup_ratio",
               "lr_scheduler", "save_total_limit", "eval_every", "report_to", "log_every")
"""The :class:`~vlmcp.train.hf.config.HFTrainConfig` fields these flags set (``--eval-data`` too)."""

_DEFAULTS = {"epochs": None, "grad_accum": 1, "weight_decay": 0.0, "max_grad_norm": 1.0, "warmup_steps": None,
             "warmup_ratio": None, "lr_scheduler": "cosine", "save_total_limit": 3, "eval_every": 0,
             "report_to": "none", "log_every": 0, "eval_data": None}


def add_loop_arguments(p: argparse.ArgumentParser) -> None:
    """The fine-tuning loop's flags, in a group of their own."""
    g = p.add_argument_group(
        "fine-tuning loop (with --model)",
        f"With --model the shared flags default to --lr {HF_DEFAULTS['lr']:g} "
        f"({HF_DEFAULTS['lora_lr']:g} with --lora), --seq-len {HF_DEFAULTS['seq_len']} and a run of "
        f"--epochs {HF_DEFAULTS['epochs']} (or "
        "--steps). One optimizer step takes --grad-accum rows on each of the --dp replicas; the loss is "
        "normalised by the target tokens of that whole global batch. A --resume must keep --steps, "
        "--grad-accum and the learning-rate schedule.")
    g.add_argument("--epochs", type=float, default=None,
                   help="passes over the planned rows, when --steps is not given (default: 1)")
    g.add_argument("--grad-accum", type=int, default=1, metavar="N",
                   help="rows per DP replica per optimizer step (gradient accumulation)")
    g.add_argument("--weight-decay", type=float, default=0.0,
                   help="AdamW weight decay (biases, norms and other 1-D parameters get none)")
    g.add_argument("--max-grad-norm", type=float, default=1.0,
                   help="clip the gradient to this global L2 norm (exact over CP, DP, FSDP shards and "
                        "hidden_shard slices; logged as grad_norm before clipping); 0: no clipping")
    g.add_argument("--warmup-steps", type=int, default=None, metavar="N",
                   help="linear warm-up steps (default: 0, or from --warmup-ratio)")
    g.add_argument("--warmup-ratio", type=float, default=None, metavar="R",
                   help="warm-up as a fraction of the run's steps, rounded up (default: 0)")
    g.add_argument("--lr-scheduler", choices=("cosine", "linear", "constant"), default="cosine",
                   help="the learning rate after the warm-up: cosine or linear decay to 0, or constant")
    g.add_argument("--save-total-limit", type=int, default=3, metavar="N",
                   help="checkpoints kept, the newest (0: all)")
    g.add_argument("--eval-data", action="append", default=None, metavar="FILE",
                   help="held-out conversations (any format --data takes; repeatable): the token-weighted "
                        "eval loss under CP, without gradients, every --eval-every steps and at the end "
                        "(default: none)")
    g.add_argument("--eval-every", type=int, default=0, metavar="K",
                   help="steps between evaluations of --eval-data (0: only at the end)")
    g.add_argument("--report-to", choices=("none", "tensorboard"), default="none",
                   help="tensorboard: the metrics also as TensorBoard scalars in OUT/tensorboard "
                        "(pip install 'vlmcp[tensorboard]')")
    g.add_argument("--log-every", type=int, default=0, metavar="N",
                   help="steps between progress lines when the output is not a terminal (0: about 20 per "
                        "run); the metrics JSONL gets every step")


def check_no_loop_flags(args: argparse.Namespace) -> None:
    """Without ``--model`` these flags are a mistake: the first one given is the error."""
    for name, default in _DEFAULTS.items():
        if getattr(args, name, default) != default:
            raise ValueError(f"--{name.replace('_', '-')} needs --model (the reference VLM has no such flag)")


def hf_shared_values(args: argparse.Namespace) -> dict:
    """``lr``, ``seq_len`` and ``steps`` for a model directory: the flags, or :data:`HF_DEFAULTS`."""
    lora = bool(getattr(args, "lora", False))
    lr = args.lr if args.lr is not None else HF_DEFAULTS["lora_lr" if lora else "lr"]
    seq_len = args.seq_len if args.seq_len is not None else HF_DEFAULTS["seq_len"]
    return {"lr": lr, "seq_len": seq_len, "steps": args.steps}


def loop_options(args: argparse.Namespace) -> dict:
    """The :class:`~vlmcp.train.hf.config.HFTrainConfig` fields of these flags."""
    return {**{f: getattr(args, f) for f in LOOP_FIELDS}, "eval_data": tuple(args.eval_data or ())}
