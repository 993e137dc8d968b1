"""``TrainConfig``: the fields of the one training loop, shared by every spec.

A spec's config subclasses it with its own fields and its own defaults
(:class:`~vlmcp.train.specs.reference.config.ReferenceTrainConfig`: the built-in VLM, 60 steps of
1,024 tokens at 3e-3; :class:`~vlmcp.train.specs.hf.config.HFTrainConfig`: a model directory's
fine-tuning defaults). Everything checkable without starting a rank is checked in
``__post_init__``, so a bad flag is one line before any process spawns; a flag a spec cannot take
is not one of its config's fields, and the command line refuses it by name
(:mod:`vlmcp.cli.train`).
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar, get_args

from vlmcp.train.options import AttentionBackend, DType, ImageStrategyChoice, SamplePlacement, VisionMode
from vlmcp.train.schedule import LRScheduler

__all__ = ["TrainConfig", "check_int"]


def check_int(name: str, value, least: int) -> None:
    """Raise unless ``value`` is an int (not a bool) of at least ``least``, naming the flag."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"--{name.replace('_', '-')} must be an integer >= {least}, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """The loop's part of one training run (a spec's config adds the model's part)."""

    cp: int = 2
    """CP group size P: ranks sharing one packed row."""
    dp: int = 1
    """Data-parallel replicas; the world size is ``cp * dp``."""
    vision_mode: VisionMode = "replicate"
    """How the CP group computes the complete image embeddings (Note [vlmcp vision placement modes])."""
    attention: AttentionBackend = "ring"
    """CP attention backend."""
    image_strategy: ImageStrategyChoice = "replicate"
    """Replicate image tokens on every CP rank (the seed), zigzag them with the text (``shard``), or let
    the cost model pick per row (``auto``)."""
    sample_placement: SamplePlacement = "split"
    """Split every sample over the CP group, place each whole on one rank, or ``auto`` (short samples
    whole, long ones split, by the cost model; Note [vlmcp whole-sample placement])."""
    steps: int | None = None
    """Total optimizer steps of the run (a spec may resolve None from its data: ``--epochs``)."""
    seq_len: int = 1024
    """Tokens per packed row (one row per CP group per micro-batch)."""
    dtype: DType = "float32"
    """Parameter dtype."""
    seed: int = 0
    """Seed of the model initialization and of the data order."""
    lr: float = 3e-3
    """AdamW's peak learning rate."""
    lr_scheduler: LRScheduler = "cosine"
    """After the warm-up: ``cosine`` or ``linear`` decay to ``min_lr_ratio * lr``, or ``constant``
    (:mod:`vlmcp.train.schedule`)."""
    warmup_steps: int | None = None
    """Linear warm-up steps (None: from ``warmup_ratio``, else 0)."""
    warmup_ratio: float | None = None
    """Warm-up as a fraction of ``steps``, rounded up (transformers' ``warmup_ratio``)."""
    min_lr_ratio: float = 0.0
    """Where the decay ends, as a fraction of ``lr`` (transformers' ``min_lr_rate``)."""
    weight_decay: float = 0.0
    """AdamW's decoupled weight decay (which parameters get it is the spec's optimizer's choice)."""
    max_grad_norm: float = 0.0
    """Clip the gradient to this global L2 norm before the step (0: never). The norm is the exact one
    over every parameter (CP shares summed, DP, FSDP shards and ``hidden_shard`` slices counted once),
    computed in the step's one all-reduce and logged (``grad_norm``) before clipping."""
    grad_accum: int = 1
    """Rows per DP replica per optimizer step; the global batch is ``dp * grad_accum`` rows, its loss
    normalised once over all of them (Note [vlmcp HF global batch: one normaliser])."""
    save_total_limit: int = 3
    """Checkpoints kept (the newest ones); 0 keeps all."""
    eval_every: int = 0
    """Steps between evaluations of the held-out rows (0: only at the end; with held-out rows an
    evaluation always runs at the end)."""
    log_every: int = 0
    """Steps between the progress lines when the output is not a terminal (0: about 20 per run)."""
    checkpoint_dir: str | None = None
    """Where checkpoints go (the spec's :attr:`checkpoints` says what None means)."""
    checkpoint_every: int = 0
    """Steps between checkpoints (0: only at the end, and when a SIGTERM stops the run)."""
    resume: bool = False
    """Continue from the newest good checkpoint."""
    metrics_jsonl: str | None = None
    """One JSON object per step; a loss-curve PNG is written beside it (:attr:`loss_curve_png`)."""
    timeout: float = 600.0
    """Seconds a rank waits for its peers in one collective or ring transfer, in every process
    group of the run, before the run fails naming the step and who did not answer. Must exceed the
    slowest rank's step time plus the longest save (rank 0 writes a checkpoint, or the final model,
    while the others wait in the next collective)."""

    RESUME_FIELDS: ClassVar[tuple[str, ...]] = ()
    """The fields a resumed run must keep (a checkpoint that lacks one holds its default)."""
    SCHEDULE_FIELDS: ClassVar[tuple[str, ...]] = ("grad_accum", "lr_scheduler", "warmup_steps",
                                                  "warmup_ratio", "min_lr_ratio", "weight_decay")
    """Fields a resumed run must keep where the checkpoint holds them (older ones do not): the
    optimizer state keeps its weight decay, the schedule its shape."""
    PATH_FIELDS: ClassVar[tuple[str, ...]] = ()
    """Resume fields compared as resolved paths."""

    def __post_init__(self):
        for name in ("cp", "dp", "grad_accum", "seq_len") + (("steps",) if self.steps is not None else ()):
            check_int(name, getattr(self, name), 1)
        for name in ("eval_every", "save_total_limit", "log_every") + \
                (("warmup_steps",) if self.warmup_steps is not None else ()):
            check_int(name, getattr(self, name), 0)
        for name, choices in (("vision_mode", VisionMode), ("attention", AttentionBackend), ("dtype", DType),
                              ("image_strategy", ImageStrategyChoice), ("sample_placement", SamplePlacement),
                              ("lr_scheduler", LRScheduler)):
            if getattr(self, name) not in get_args(choices):
                raise ValueError(f"--{name.replace('_', '-')} must be one of {get_args(choices)}, "
                                 f"got {getattr(self, name)!r}")
        self._check_schedule()
        self._check_outputs()
        if self.timeout <= 0:
            raise ValueError(f"--timeout must be > 0, got {self.timeout}")
        if self.seq_len < 8 * self.cp:
            raise ValueError(f"--seq-len {self.seq_len} is too short for --cp {self.cp}: each sample's text "
                             f"is cut into 2P={2 * self.cp} chunks; use at least {8 * self.cp}")
        if self.eval_every and not self.has_eval_data:
            raise ValueError(f"--eval-every {self.eval_every} needs held-out data: {self.EVAL_FLAGS}")

    def _check_schedule(self) -> None:
        if self.warmup_steps is not None and self.warmup_ratio is not None:
            raise ValueError(f"--warmup-steps {self.warmup_steps} and --warmup-ratio {self.warmup_ratio}: "
                             "give one")
        for name in ("warmup_ratio", "min_lr_ratio"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= 1:
                raise ValueError(f"--{name.replace('_', '-')} must be in [0, 1], got {value}")
        for name in ("weight_decay", "max_grad_norm"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(self, name)}")
        if self.lr <= 0:
            raise ValueError(f"--lr must be > 0, got {self.lr}")

    def _check_outputs(self) -> None:
        if self.checkpoint_every < 0:
            raise ValueError(f"--checkpoint-every must be >= 0, got {self.checkpoint_every}")
        for name in ("checkpoint_dir", "metrics_jsonl"):
            if getattr(self, name) == "":  # an empty shell variable: no silent "no checkpoints"
                raise ValueError(f"--{name.replace('_', '-')} needs a path, got ''")
        if self.metrics_jsonl is not None and self.loss_curve_png == Path(self.metrics_jsonl):
            raise ValueError(f"--metrics-jsonl {self.metrics_jsonl}: the loss curve would be drawn over it; "
                             "give the metrics another suffix, e.g. .jsonl")

    EVAL_FLAGS: ClassVar[str] = "held-out rows"
    """How the message of ``--eval-every`` without held-out data names the flags that give them."""

    @property
    def has_eval_data(self) -> bool:
        """Whether the run has held-out rows to evaluate (the spec's config says where they come from)."""
        return False

    @property
    def world_size(self) -> int:
        return self.cp * self.dp

    @property
    def rows_per_step(self) -> int:
        """Rows of one global batch: ``dp * grad_accum``."""
        return self.dp * self.grad_accum

    @property
    def warmup(self) -> int:
        """Warm-up steps in effect: ``warmup_steps``, or ``ceil(warmup_ratio * steps)``, or 0."""
        if self.warmup_steps is not None:
            return self.warmup_steps
        if self.warmup_ratio is not None and self.steps is not None:
            return math.ceil(self.warmup_ratio * self.steps)
        return 0

    @property
    def checkpoints(self) -> Path | None:
        """The checkpoint directory in effect (None: the run writes no checkpoints)."""
        return Path(self.checkpoint_dir) if self.checkpoint_dir else None

    @property
    def dcp_checkpoints(self) -> bool:
        """Whether checkpoints are ``torch.distributed.checkpoint`` directories, one shard per rank
        (FSDP), rather than single files (:mod:`vlmcp.train.checkpoint.run`)."""
        return False

    @property
    def saves_checkpoints(self) -> bool:
        """Whether checkpoints are due every ``checkpoint_every`` steps and at the end (a SIGTERM saves
        one wherever :attr:`checkpoints` is a directory)."""
        return self.checkpoints is not None and bool(self.checkpoint_dir or self.checkpoint_every)

    @property
    def tensorboard_dir(self) -> Path | None:
        """Where the metrics also go as TensorBoard scalars (None: nowhere)."""
        return None

    @property
    def loss_curve_png(self) -> Path | None:
        """The loss-curve picture beside :attr:`metrics_jsonl` (its suffix replaced by ``.png``)."""
        return None if self.metrics_jsonl is None else Path(self.metrics_jsonl).with_suffix(".png")

    def to_dict(self) -> dict:
        return asdict(self)

    def resume_changes(self, saved: dict) -> list[str]:
        """What differs between a checkpoint's config ``saved`` and this run, ``--flag old -> new`` each."""
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        names = self.RESUME_FIELDS + tuple(f for f in self.SCHEDULE_FIELDS if f in saved)
        return [f"--{f.replace('_', '-')} {saved.get(f, defaults.get(f))!r} -> {getattr(self, f)!r}"
                for f in names if not self._same(f, saved.get(f, defaults.get(f)), getattr(self, f))]

    def _same(self, field: str, a, b) -> bool:
        """Paths compare resolved (``data/x.jsonl`` is ``/work/data/x.jsonl`` from /work)."""
        if field in self.PATH_FIELDS and a is not None and b is not None:
            # a repeatable path flag holds a list of files; older checkpoints hold one string
            resolve = lambda v: [os.path.realpath(x) for x in ([v] if isinstance(v, str) else v)]  # noqa: E731
            return resolve(a) == resolve(b)
        if dataclasses.is_dataclass(b) and not isinstance(b, type):  # saved as to_dict() made it
            b = dataclasses.asdict(b)
        if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
            return tuple(a) == tuple(b)
        return a == b
