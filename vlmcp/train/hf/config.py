"""The configuration of ``vlmcp train --model DIR --data FILE.jsonl`` (validated up front).

Everything checkable without starting a rank is checked here: a bad flag is one line
before any process spawns. The data and the model directory are checked by the
command line (:mod:`vlmcp.cli.train_hf`), also before any rank starts.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import get_args

from vlmcp.data.hf.video import VideoSampling
from vlmcp.train.options import (
    AttentionBackend,
    DType,
    ImageStrategyChoice,
    LossKind,
    SamplePlacement,
    VisionMode,
)

__all__ = ["HFTrainConfig"]


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
    steps: int = 100
    """Total optimizer steps (a resumed run with the same value finishes it)."""
    seq_len: int = 2048
    """Tokens per packed row (one row per CP group per step)."""
    dtype: DType = "float32"
    """Parameter dtype; ``bfloat16`` keeps bf16 parameters, gradients are reduced in fp32."""
    seed: int = 0
    """Seed of the row order."""
    lr: float = 1e-4
    """AdamW peak learning rate (warm-up, then cosine decay to 10%)."""
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
        for name in ("cp", "dp", "steps", "seq_len", "loss_chunk_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be an integer >= 1, got {value!r}")
        for name, choices in (("vision_mode", VisionMode), ("attention", AttentionBackend), ("dtype", DType),
                              ("sample_placement", SamplePlacement),
                              ("image_strategy", ImageStrategyChoice), ("loss", LossKind)):
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
        if self.fsdp and self.vision_mode in ("broadcast", "scatter"):
            # some rank skips (part of) the ViT, so FSDP's collectives would stop matching
            raise ValueError(f"--fsdp takes --vision-mode replicate, allreduce_hook or hidden_shard, got "
                             f"{self.vision_mode!r} (it runs the ViT on some ranks only)")

    @property
    def world_size(self) -> int:
        return self.cp * self.dp

    @property
    def checkpoints(self) -> Path:
        """The checkpoint directory in effect."""
        return Path(self.checkpoint_dir) if self.checkpoint_dir else Path(self.output_dir) / "checkpoints"

    def to_dict(self) -> dict:
        return asdict(self)
