"""The training loop's flags of ``vlmcp train``: run length, global batch, optimizer, schedule,
evaluation and reporting (:class:`vlmcp.train.config.TrainConfig` documents each).

The flags whose default differs between the two models (``--lr``, ``--seq-len``, ``--steps``,
``--weight-decay``, ``--max-grad-norm``, ``--warmup-steps``, ``--min-lr-ratio``) default to None on
the parser, so that each model's config fills in its own; their help names both defaults, read
from the two configs (:func:`defaults`).
"""

from __future__ import annotations

import argparse
import dataclasses

__all__ = ["add_loop_arguments", "defaults"]


def defaults() -> tuple[dict, dict]:
    """``(reference VLM's, a model directory's)`` defaults of every config field, by name."""
    from vlmcp.train.specs.hf.config import LORA_LR, HFTrainConfig
    from vlmcp.train.specs.reference.config import ReferenceTrainConfig

    ref, hf = ({f.name: f.default for f in dataclasses.fields(c)}
               for c in (ReferenceTrainConfig, HFTrainConfig))
    return ref, {**hf, "lora_lr": LORA_LR}


def add_loop_arguments(p: argparse.ArgumentParser) -> None:
    """The loop's flags, in a group of their own."""
    ref, hf = defaults()
    g = p.add_argument_group(
        "training loop of both models, defaults as in the fine-tuning loop (with --model)",
        "One optimizer step takes --grad-accum rows on each of the --dp replicas; the loss is normalised "
        "once over that whole global batch (a model directory's by its target tokens, the reference VLM's "
        "rows each by one). --epochs, --eval-data and --report-to need --model; --eval-rows is the "
        "reference VLM's held-out data. Where the reference VLM's default differs, the flag's help names "
        "it. A --resume must keep --grad-accum and the learning-rate schedule (and with --model, --steps "
        "and --lr).")
    g.add_argument("--epochs", type=float, default=None,
                   help="passes over the planned rows, when --steps is not given (default: 1)")
    g.add_argument("--grad-accum", type=int, default=1, metavar="N",
                   help="rows per DP replica per optimizer step (gradient accumulation)")
    g.add_argument("--weight-decay", type=float, default=None,
                   help=f"AdamW weight decay: with --model on matrices only, biases, norms and other "
                        f"1-D parameters get none (default: {hf['weight_decay']}); the reference VLM "
                        f"decays every parameter, its default {ref['weight_decay']:g}")
    g.add_argument("--max-grad-norm", type=float, default=None,
                   help=f"clip the gradient to this global L2 norm (exact over CP, DP, FSDP shards and "
                        f"hidden_shard slices; logged as grad_norm before clipping); 0: no clipping "
                        f"(default: {hf['max_grad_norm']}); the reference VLM's default is "
                        f"{ref['max_grad_norm']:g}, no clipping")
    g.add_argument("--warmup-steps", type=int, default=None, metavar="N",
                   help=f"linear warm-up steps (default: 0, or from --warmup-ratio; the reference VLM: "
                        f"{ref['warmup_steps']})")
    g.add_argument("--warmup-ratio", type=float, default=None, metavar="R",
                   help="warm-up as a fraction of the run's steps, rounded up (default: 0)")
    g.add_argument("--lr-scheduler", choices=("cosine", "linear", "constant"), default="cosine",
                   help="the learning rate after the warm-up: cosine or linear decay to --min-lr-ratio, or "
                        "constant (default: cosine)")
    g.add_argument("--min-lr-ratio", type=float, default=None, metavar="F",
                   help=f"where the decay ends, as a fraction of --lr (default: {hf['min_lr_ratio']:g}; the "
                        f"reference VLM: {ref['min_lr_ratio']:g})")
    g.add_argument("--save-total-limit", type=int, default=3, metavar="N",
                   help="checkpoints kept, the newest (0: all) (default: 3)")
    g.add_argument("--eval-data", action="append", default=None, metavar="FILE",
                   help="held-out conversations (any format --data takes; repeatable): the token-weighted "
                        "eval loss under CP, without gradients, every --eval-every steps and at the end "
                        "(default: none)")
    g.add_argument("--eval-every", type=int, default=0, metavar="K",
                   help="steps between evaluations of the held-out rows, --eval-data or --eval-rows (0: only "
                        "at the end) (default: 0)")
    g.add_argument("--report-to", choices=("none", "tensorboard"), default="none",
                   help="tensorboard: the metrics also as TensorBoard scalars in OUT/tensorboard "
                        "(pip install 'vlmcp[tensorboard]') (default: none)")
    g.add_argument("--log-every", type=int, default=0, metavar="N",
                   help="steps between progress lines when the output is not a terminal (0: about 20 per "
                        "run); the metrics JSONL gets every step (default: 0)")
