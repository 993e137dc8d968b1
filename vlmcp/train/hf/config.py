"""The configuration of ``vlmcp train --model DIR --data FILE.jsonl`` (validated up front).

Everything checkable without starting a rank is checked here: a bad flag is one line
before any process spawns. The data and the model directory are checked by the
command line (:mod:`vlmcp.cli.train_hf`), also before any rank starts.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Literal, get_args

from vlmcp.data.hf.video import VideoSampling
from vlmcp.train.hf.finetune_config import check_finetune
from vlmcp.train.options import (
    AttentionBackend,
    DType,
    ImageStrategyChoice,
    LossKind,
    SamplePlacement,
    VisionMode,
)
from vlmcp.train.schedule import LRScheduler

ReportTo = Literal["none", "tensorboard"]

__all__ = ["HFTrainConfig", "ReportTo"]


@dataclass(frozen=True, kw_only=True)
class HFTrainConfig:
    """One training run of a Hugging Face VLM with context parallelism."""

    model: str
    """The model directory (``config.json``, weights, processor)."""
    data: tuple[str, ...]
    """The conversations files (``--data``, repeatable), read in order; one path (a string)
    is taken as a one-file tuple. May be empty when ``dataset`` names the data."""
    output_dir: str
    """Where the trained model and processor are written with ``save_pretrained``."""
    dataset: str | None = None
    """LLaMA-Factory dataset names, comma-separated, in ``dataset_dir/dataset_info.json``
    (:mod:`vlmcp.data.hf.dataset_info`), read after ``data``."""
    dataset_dir: str | None = None
    """The directory of ``dataset_info.json`` (default ``data``, as in LLaMA-Factory)."""
    eval_dataset: str | None = None
    """Held-out LLaMA-Factory dataset names, evaluated with ``eval_data``."""
    max_samples: int | None = None
    """Read only the first lines of each data file and dataset."""
    image_max_pixels: int | None = None
    """Scale every image down to at most this many pixels before the processor (planning too)."""
    image_min_pixels: int | None = None
    """Scale every image up to at least this many pixels before the processor (planning too)."""
    truncate: bool = False
    """Cut a conversation longer than ``seq_len`` at ``seq_len`` (never inside an image or video)
    instead of skipping it."""
    image_root: str | None = None
    """Directory relative image paths start from (default: the JSONL file's)."""
    strict: bool = False
    """Stop before training on a conversation longer than ``seq_len`` or an image or video that
    cannot be read or decoded (every image and video is decoded up front), instead of skipping it."""
    video: VideoSampling = VideoSampling()
    """How videos become frames (``--video-*``): frames per second, frame counts, pixels."""
    cp: int = 2
    """CP group size P."""
    dp: int = 1
    """Data-parallel replicas; the world size is ``cp * dp``."""
    vision_mode: VisionMode = "replicate"
    """How the CP group computes the image features (``vlmcp.hf.parallelize``)."""
    attention: AttentionBackend = "ring"
    """CP attention backend of the language model."""
    sample_placement: SamplePlacement = "split"
    """Split every conversation over the CP group, place each whole on one rank, or ``auto``
    (short ones whole, long ones split, by the cost model): ``vlmcp.hf.shard_inputs``."""
    image_strategy: ImageStrategyChoice = "replicate"
    """Where a split conversation's image and video tokens live: on every rank, zigzagged with the
    text, or ``auto`` (the cost model, per row): ``vlmcp.hf.shard_inputs``."""
    steps: int | None = None
    """Total optimizer steps; None: ``epochs`` passes over the rows (:meth:`with_steps`). A resumed
    run must keep it, and the rest of the schedule (:func:`vlmcp.train.hf.checkpoint.check_resumable`)."""
    epochs: float | None = None
    """Passes over the planned rows when ``steps`` is None (None: 1); may be fractional."""
    grad_accum: int = 1
    """Rows per DP replica per optimizer step; the global batch is ``dp * grad_accum`` rows and the
    loss is normalised by its target tokens (Note [vlmcp HF global batch: one normaliser])."""
    seq_len: int = 4096
    """Tokens per packed row (one row per CP group per micro-batch)."""
    dtype: DType = "float32"
    """Parameter dtype; ``bfloat16`` keeps bf16 parameters, gradients are reduced in fp32."""
    seed: int = 0
    """Seed of the row order."""
    lr: float = 1e-5
    """AdamW peak learning rate (the command line's default is 1e-4 with LoRA)."""
    lr_scheduler: LRScheduler = "cosine"
    """After the warm-up: ``cosine`` or ``linear`` decay to 0, or ``constant``
    (:mod:`vlmcp.train.schedule`)."""
    warmup_steps: int | None = None
    """Linear warm-up steps (None: from ``warmup_ratio``, else 0)."""
    warmup_ratio: float | None = None
    """Warm-up as a fraction of ``steps``, rounded up (transformers' ``warmup_ratio``)."""
    weight_decay: float = 0.0
    """AdamW's decoupled weight decay; biases, norms and other 1-D parameters get none."""
    max_grad_norm: float = 1.0
    """Clip the gradient to this global L2 norm before the step (0: never clip). The norm is the exact one
    over every parameter (CP shares summed, DP, FSDP shards and ``hidden_shard`` slices counted once),
    computed once per step and logged (``grad_norm``) before clipping."""
    save_total_limit: int = 3
    """Checkpoints kept (the newest ones); 0 keeps all."""
    eval_data: tuple[str, ...] = ()
    """Held-out conversations (any format ``data`` takes), planned like ``data``."""
    eval_every: int = 0
    """Steps between evaluations of ``eval_data`` (0: only at the end; it always runs at the end)."""
    report_to: ReportTo = "none"
    """``tensorboard``: also write the metrics as TensorBoard scalars in ``output_dir/tensorboard``."""
    log_every: int = 0
    """Steps between the progress lines when the output is not a terminal (0: about 20 per run)."""
    fsdp: bool = False
    """FSDP2 ``fully_shard`` over the DP x CP ranks (loss scaled by P), sharded checkpoints."""
    activation_checkpointing: bool = False
    """Recompute each decoder block in backward."""
    offload_activations: bool = False
    """Keep the tensors the forward saves for backward (with activation checkpointing: the blocks'
    inputs) in pinned host memory until backward (:func:`vlmcp.hf.offload_activations`); exact."""
    loss: LossKind = "chunked"
    """``chunked``: :func:`vlmcp.hf.causal_lm_loss` computes the LM head and the loss
    ``loss_chunk_size`` target tokens at a time, never the ``tokens x vocab`` logits; ``full``:
    the model's logits and :func:`vlmcp.cp_cross_entropy` (the same loss, for comparison)."""
    loss_chunk_size: int = 4096
    """Target tokens per chunk of logits of the ``chunked`` loss (a chunk holds ``size x vocab`` floats)."""
    checkpoint_dir: str | None = None
    """Where checkpoints go (default ``output_dir/checkpoints``)."""
    checkpoint_every: int = 0
    """Steps between checkpoints (0: only at the end, and on SIGTERM)."""
    resume: bool = False
    """Continue from the latest checkpoint."""
    metrics_jsonl: str | None = None
    """One JSON object per step; a loss-curve PNG is written beside it."""
    timeout: float = 600.0
    """Seconds a rank waits for its peers in one collective or ring transfer, in every process
    group of the run (FSDP's mesh is the world group), before the run fails naming the step
    and who did not answer. Must exceed the slowest rank's step time plus the longest save
    (a checkpoint, or the final ``save_pretrained``: rank 0 writes while the others wait in
    a barrier); raise it for a large model on a slow disk."""
    freeze: tuple[str, ...] = ()
    """Parts kept as loaded (``--freeze``, repeatable): ``vision``, ``projector``, ``llm``
    (:mod:`vlmcp.hf.freeze`); with ``lora``, the parts that get no adapter."""
    lora: bool = False
    """Train LoRA adapters (:mod:`vlmcp.hf.peft`) on a frozen base; the output is a PEFT adapter."""
    lora_rank: int = 8
    """LoRA rank r."""
    lora_alpha: float = 16.0
    """LoRA alpha (the update is scaled by ``alpha / r``)."""
    lora_dropout: float = 0.0
    """Dropout on the LoRA branch's input."""
    lora_targets: str = "all"
    """The language model's adapted layers: ``all`` (every Linear but the LM head), ``attn``,
    ``mlp`` or comma-separated module names."""
    lora_vision: str | None = None
    """Adapters in the vision tower too: ``all`` or comma-separated module names (None: none)."""
    lora_projector: str | None = None
    """Adapters in the projector too: ``all`` or comma-separated module names (None: none)."""
    merge_lora: bool = False
    """Save the merged weights (a plain model) instead of the PEFT adapter."""
    nan_at_step: int | None = None
    """Tests only: rank 1 (or 0) makes the loss of this step NaN."""

    def __post_init__(self):
        data = [self.data] if isinstance(self.data, (str, os.PathLike)) else self.data
        if not isinstance(data, (list, tuple)) or not (data or self.dataset) or \
                not all(isinstance(p, (str, os.PathLike)) for p in data):
            raise ValueError(f"--data must be one or more file paths, got {self.data!r}")
        for name in ("max_samples", "image_max_pixels", "image_min_pixels"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"--{name.replace('_', '-')} must be an integer >= 1, got {value!r}")
        if self.image_max_pixels and self.image_min_pixels and self.image_min_pixels > self.image_max_pixels:
            raise ValueError(f"--image-min-pixels {self.image_min_pixels} exceeds --image-max-pixels "
                             f"{self.image_max_pixels}")
        object.__setattr__(self, "data", tuple(str(p) for p in data))
        if isinstance(self.video, dict):  # as to_dict() (and a checkpoint's config) holds it
            object.__setattr__(self, "video", VideoSampling(**self.video))
        if not isinstance(self.video, VideoSampling):
            raise ValueError(f"video must be a VideoSampling, got {type(self.video).__name__}")
        held = (self.eval_data,) if isinstance(self.eval_data, (str, os.PathLike)) else self.eval_data
        if not isinstance(held, (list, tuple)) or not all(isinstance(x, (str, os.PathLike)) for x in held):
            raise ValueError(f"--eval-data must be file paths, got {self.eval_data!r}")
        object.__setattr__(self, "eval_data", tuple(str(x) for x in held))
        for name in ("cp", "dp", "grad_accum", "seq_len", "loss_chunk_size") + \
                (("steps",) if self.steps is not None else ()):
            _check_int(name, getattr(self, name), 1)
        for name in ("eval_every", "save_total_limit", "log_every") + \
                (("warmup_steps",) if self.warmup_steps is not None else ()):
            _check_int(name, getattr(self, name), 0)
        if self.steps is not None and self.epochs is not None:
            raise ValueError(f"--steps {self.steps} and --epochs {self.epochs}: give one (the run's length)")
        if self.epochs is not None and not (isinstance(self.epochs, (int, float)) and self.epochs > 0):
            raise ValueError(f"--epochs must be > 0, got {self.epochs!r}")
        if self.warmup_steps is not None and self.warmup_ratio is not None:
            raise ValueError(f"--warmup-steps {self.warmup_steps} and --warmup-ratio {self.warmup_ratio}: "
                             "give one")
        if self.warmup_ratio is not None and not 0 <= self.warmup_ratio <= 1:
            raise ValueError(f"--warmup-ratio must be in [0, 1], got {self.warmup_ratio}")
        if self.eval_every and not self.eval_data and not self.eval_dataset:
            raise ValueError(f"--eval-every {self.eval_every} needs held-out data: --eval-data FILE or "
                             "--eval-dataset NAME")
        for name in ("weight_decay", "max_grad_norm"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(self, name)}")
        for name, choices in (("vision_mode", VisionMode), ("attention", AttentionBackend), ("dtype", DType),
                              ("sample_placement", SamplePlacement),
                              ("image_strategy", ImageStrategyChoice), ("loss", LossKind),
                              ("lr_scheduler", LRScheduler), ("report_to", ReportTo)):
            if getattr(self, name) not in get_args(choices):
                raise ValueError(f"--{name.replace('_', '-')} must be one of {get_args(choices)}, "
                                 f"got {getattr(self, name)!r}")
        if self.attention == "usp":
            raise ValueError("--attention usp is for the reference VLM; a Hugging Face model takes ring "
                             "or ulysses")
        if self.lr <= 0:
            raise ValueError(f"--lr must be > 0, got {self.lr}")
        if self.checkpoint_every < 0:
            raise ValueError(f"--checkpoint-every must be >= 0, got {self.checkpoint_every}")
        if self.timeout <= 0:
            raise ValueError(f"--timeout must be > 0, got {self.timeout}")
        if self.seq_len < 8 * self.cp:
            raise ValueError(f"--seq-len {self.seq_len} is too short for --cp {self.cp}: use at least "
                             f"{8 * self.cp}")
        check_finetune(self)
        if self.fsdp and self.vision_mode in ("broadcast", "scatter"):
            # some rank skips (part of) the ViT, so FSDP's collectives would stop matching
            raise ValueError(f"--fsdp takes --vision-mode replicate, allreduce_hook or hidden_shard, got "
                             f"{self.vision_mode!r} (it runs the ViT on some ranks only)")

    @property
    def world_size(self) -> int:
        return self.cp * self.dp

    @property
    def rows_per_step(self) -> int:
        """Rows of one global batch: ``dp * grad_accum``."""
        return self.dp * self.grad_accum

    def with_steps(self, rows: int) -> HFTrainConfig:
        """This run with ``steps`` set: as given, or ``epochs`` (default 1) passes over ``rows`` planned
        rows, ``ceil(epochs * rows / rows_per_step)`` steps (a last partial batch is a full step of the
        rows that follow, from the next epoch's order). The result carries ``steps`` only."""
        if self.steps is not None:
            return self
        if rows < 1:
            raise ValueError("the data planned no row to train on")
        epochs = 1.0 if self.epochs is None else float(self.epochs)
        return replace(self, epochs=None, steps=max(1, math.ceil(epochs * rows / self.rows_per_step - 1e-9)))

    @property
    def warmup(self) -> int:
        """Warm-up steps in effect: ``warmup_steps``, or ``ceil(warmup_ratio * steps)``, or 0."""
        if self.warmup_steps is not None:
            return self.warmup_steps
        if self.warmup_ratio is not None and self.steps is not None:
            return math.ceil(self.warmup_ratio * self.steps)
        return 0

    @property
    def checkpoints(self) -> Path:
        """The checkpoint directory in effect."""
        return Path(self.checkpoint_dir) if self.checkpoint_dir else Path(self.output_dir) / "checkpoints"

    def to_dict(self) -> dict:
        return asdict(self)


def _check_int(name: str, value, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"--{name.replace('_', '-')} must be an integer >= {least}, got {value!r}")
