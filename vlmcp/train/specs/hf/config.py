"""The configuration of ``vlmcp train --model DIR --data FILE.jsonl``: the loop's fields with a
pretrained model's defaults, and the model directory's, data's and fine-tuning's own.

Everything checkable without starting a rank is checked here: a bad flag is one line
before any process spawns. The data and the model directory are checked by the
launcher (:mod:`vlmcp.train.specs.hf.launch`), also before any rank starts.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar, Literal, get_args

from vlmcp.data.hf.video import VideoSampling
from vlmcp.train.config import TrainConfig, check_int
from vlmcp.train.options import LossKind
from vlmcp.train.specs.hf.finetune_config import FINETUNE_FIELDS, check_finetune

ReportTo = Literal["none", "tensorboard"]

__all__ = ["LORA_LR", "HFTrainConfig", "ReportTo"]

LORA_LR = 1e-4
"""``--lr``'s default with ``--lora`` (a LoRA adapter trains at a higher rate than full weights)."""


@dataclass(frozen=True, kw_only=True)
class HFTrainConfig(TrainConfig):
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
    epochs: float | None = None
    """Passes over the planned rows when ``steps`` is None (None: 1); may be fractional."""
    seq_len: int = 4096
    """Tokens per packed row (one row per CP group per micro-batch)."""
    lr: float = 1e-5
    """AdamW's peak learning rate (the command line's default is 1e-4 with LoRA)."""
    max_grad_norm: float = 1.0
    """Clip the gradient to this global L2 norm before the step (0: never clip)."""
    eval_data: tuple[str, ...] = ()
    """Held-out conversations (any format ``data`` takes), planned like ``data``."""
    report_to: ReportTo = "none"
    """``tensorboard``: also write the metrics as TensorBoard scalars in ``output_dir/tensorboard``."""
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

    RESUME_FIELDS: ClassVar[tuple[str, ...]] = (
        "model", "data", "seq_len", "seed", "dtype", "image_root", "video",
        # what the rows are made of (a checkpoint from before these fields holds their defaults)
        "dataset", "dataset_dir", "max_samples", "image_max_pixels", "image_min_pixels", "truncate",
        *FINETUNE_FIELDS)
    SCHEDULE_FIELDS: ClassVar[tuple[str, ...]] = ("steps", "grad_accum", "lr", "lr_scheduler", "warmup_steps",
                                                  "warmup_ratio", "min_lr_ratio", "weight_decay")
    PATH_FIELDS: ClassVar[tuple[str, ...]] = ("model", "data", "image_root", "dataset_dir")
    EVAL_FLAGS: ClassVar[str] = "--eval-data FILE or --eval-dataset NAME"

    def __post_init__(self):
        data = [self.data] if isinstance(self.data, (str, os.PathLike)) else self.data
        if not isinstance(data, (list, tuple)) or not (data or self.dataset) or \
                not all(isinstance(p, (str, os.PathLike)) for p in data):
            raise ValueError(f"--data must be one or more file paths, got {self.data!r}")
        object.__setattr__(self, "data", tuple(str(p) for p in data))
        if isinstance(self.video, dict):  # as to_dict() (and a checkpoint's config) holds it
            object.__setattr__(self, "video", VideoSampling(**self.video))
        if not isinstance(self.video, VideoSampling):
            raise ValueError(f"video must be a VideoSampling, got {type(self.video).__name__}")
        held = (self.eval_data,) if isinstance(self.eval_data, (str, os.PathLike)) else self.eval_data
        if not isinstance(held, (list, tuple)) or not all(isinstance(x, (str, os.PathLike)) for x in held):
            raise ValueError(f"--eval-data must be file paths, got {self.eval_data!r}")
        object.__setattr__(self, "eval_data", tuple(str(x) for x in held))
        super().__post_init__()
        self._check_data()
        check_int("loss_chunk_size", self.loss_chunk_size, 1)
        if self.steps is not None and self.epochs is not None:
            raise ValueError(f"--steps {self.steps} and --epochs {self.epochs}: give one (the run's length)")
        if self.epochs is not None and not (isinstance(self.epochs, (int, float)) and self.epochs > 0):
            raise ValueError(f"--epochs must be > 0, got {self.epochs!r}")
        for name, choices in (("loss", LossKind), ("report_to", ReportTo)):
            if getattr(self, name) not in get_args(choices):
                raise ValueError(f"--{name.replace('_', '-')} must be one of {get_args(choices)}, "
                                 f"got {getattr(self, name)!r}")
        if self.attention == "usp":
            raise ValueError("--attention usp is for the reference VLM; a Hugging Face model takes ring "
                             "or ulysses")
        check_finetune(self)
        if self.fsdp and self.vision_mode in ("broadcast", "scatter"):
            # some rank skips (part of) the ViT, so FSDP's collectives would stop matching
            raise ValueError(f"--fsdp takes --vision-mode replicate, allreduce_hook or hidden_shard, got "
                             f"{self.vision_mode!r} (it runs the ViT on some ranks only)")

    def _check_data(self) -> None:
        for name in ("max_samples", "image_max_pixels", "image_min_pixels"):
            if getattr(self, name) is not None:
                check_int(name, getattr(self, name), 1)
        if self.image_max_pixels and self.image_min_pixels and self.image_min_pixels > self.image_max_pixels:
            raise ValueError(f"--image-min-pixels {self.image_min_pixels} exceeds --image-max-pixels "
                             f"{self.image_max_pixels}")

    @property
    def has_eval_data(self) -> bool:
        return bool(self.eval_data or self.eval_dataset)

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
    def checkpoints(self) -> Path:
        """The checkpoint directory in effect: ``--checkpoint-dir``, or ``OUT/checkpoints``."""
        return Path(self.checkpoint_dir) if self.checkpoint_dir else Path(self.output_dir) / "checkpoints"

    @property
    def dcp_checkpoints(self) -> bool:
        return self.fsdp

    @property
    def tensorboard_dir(self) -> Path | None:
        """``OUT/tensorboard`` with ``--report-to tensorboard``."""
        return Path(self.output_dir) / "tensorboard" if self.report_to == "tensorboard" else None

    def resume_changes(self, saved: dict) -> list[str]:
        changed = super().resume_changes(saved)
        if saved.get("fsdp") != self.fsdp:
            changed.append(f"--fsdp {saved.get('fsdp')} -> {self.fsdp}")
        return changed
