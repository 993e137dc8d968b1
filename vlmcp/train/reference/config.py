"""The configuration of a ``vlmcp train`` run (one frozen dataclass, validated up front).

Everything that can be checked without starting a rank is checked here, so a bad
flag is a one-line error before any process spawns.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import get_args

from vlmcp.layout.cost import DEFAULT_FLOPS_PER_BYTE
from vlmcp.train.options import (
    AttentionBackend,
    DType,
    ImageAttention,
    ImageStrategyChoice,
    SamplePlacement,
    VisionMode,
)

__all__ = ["TrainConfig"]


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """One training run of the reference VLM with context parallelism."""

    cp: int = 2
    """CP group size P: ranks sharing one packed row."""
    dp: int = 1
    """Data-parallel replicas; the world size is ``cp * dp``."""
    vision_mode: VisionMode = "replicate"
    """How the CP group computes the complete image embeddings (Note [vlmcp vision placement modes])."""
    attention: AttentionBackend = "ring"
    """CP attention backend."""
    ulysses_size: int | None = None
    """``attention="usp"`` only: ranks per Ulysses group U (a divisor of ``cp`` and of
    ``heads``); None: ``gcd(kv_heads, cp)``, ms-swift's choice (no K/V head repeated)."""
    image_attention: ImageAttention = "causal"
    """Whether image tokens of one image see each other in both directions."""
    image_strategy: ImageStrategyChoice = "replicate"
    """Replicate image tokens on every CP rank (the seed), zigzag them with the text
    (``shard``), or let the cost model pick per row (``auto``, weights of this model)."""
    sample_placement: SamplePlacement = "split"
    """Split every sample over the CP group, place each whole on one rank (balanced by
    cost), or ``auto``: short samples whole, long ones split (Note [vlmcp whole-sample
    placement])."""
    flops_per_byte: float = DEFAULT_FLOPS_PER_BYTE
    """``auto`` only: compute FLOPs one communicated byte costs (achieved FLOP/s over link
    bytes/s; 4,000 is an H100-class GPU on a 100 GB/s link). Lower makes sharding images
    cheaper; with the default, this tiny model replicates images under ~4,000 tokens."""
    steps: int = 60
    """Total optimizer steps of the run (a resumed run with the same value finishes it)."""
    seq_len: int = 1024
    """Tokens per packed row (one row per CP group per step)."""
    dtype: DType = "float32"
    """Parameter and activation dtype."""
    seed: int = 0
    """Seed of the model initialization and the built-in dataset."""
    lr: float = 3e-3
    """AdamW learning rate (cosine decay to 10% after a short warm-up)."""
    hidden: int = 64
    """LLM width (the projector's output width)."""
    layers: int = 2
    """LLM decoder blocks."""
    heads: int = 4
    """LLM attention heads."""
    kv_heads: int = 2
    """LLM key/value heads (GQA)."""
    checkpoint_dir: str | None = None
    """Where checkpoints go (None: no checkpoints)."""
    checkpoint_every: int = 0
    """Write a checkpoint every this many steps (0: only at the end, if a directory is set)."""
    resume: bool = False
    """Continue from the latest checkpoint in ``checkpoint_dir``."""
    metrics_jsonl: str | None = None
    """Append one JSON object per step here; a loss-curve PNG is written beside it
    (:attr:`loss_curve_png`)."""
    timeout: float = 600.0
    """Seconds a rank waits for its peers in one collective or ring transfer, in every process
    group of the run, before the run fails naming the step and who did not answer. Must
    exceed the slowest rank's step time plus the longest checkpoint save (rank 0 saves while
    the others wait in the next collective)."""

    def __post_init__(self):
        for name in ("cp", "dp", "steps", "seq_len", "hidden", "layers", "heads", "kv_heads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be an integer >= 1, got {value!r}")
        for name, choices in (("vision_mode", VisionMode), ("attention", AttentionBackend),
                              ("dtype", DType), ("image_strategy", ImageStrategyChoice),
                              ("sample_placement", SamplePlacement)):
            if getattr(self, name) not in get_args(choices):
                raise ValueError(f"--{name.replace('_', '-')} must be one of {get_args(choices)}, "
                                 f"got {getattr(self, name)!r}")
        if self.image_attention not in get_args(ImageAttention):
            raise ValueError(f"--image-attention must be one of {get_args(ImageAttention)}, "
                             f"got {self.image_attention!r}")
        if not self.flops_per_byte > 0:
            raise ValueError(f"--flops-per-byte must be > 0, got {self.flops_per_byte}")
        if self.lr <= 0:
            raise ValueError(f"--lr must be > 0, got {self.lr}")
        if self.checkpoint_every < 0:
            raise ValueError(f"--checkpoint-every must be >= 0, got {self.checkpoint_every}")
        if self.checkpoint_every and not self.checkpoint_dir:
            raise ValueError("--checkpoint-every needs --checkpoint-dir")
        if self.resume and not self.checkpoint_dir:
            raise ValueError("--resume needs --checkpoint-dir")
        for name in ("checkpoint_dir", "metrics_jsonl"):
            if getattr(self, name) == "":  # an empty shell variable: no silent "no checkpoints"
                raise ValueError(f"--{name.replace('_', '-')} needs a path, got ''")
        if self.metrics_jsonl is not None and self.loss_curve_png == Path(self.metrics_jsonl):
            raise ValueError(f"--metrics-jsonl {self.metrics_jsonl}: the loss curve would be drawn over it; "
                             "give the metrics another suffix, e.g. .jsonl")
        if self.timeout <= 0:
            raise ValueError(f"--timeout must be > 0, got {self.timeout}")
        if self.hidden % self.heads or (self.hidden // self.heads) % 2:
            raise ValueError(f"--hidden {self.hidden} must split into --heads {self.heads} of even size")
        if self.heads % self.kv_heads:
            raise ValueError(f"--heads {self.heads} is not divisible by --kv-heads {self.kv_heads}")
        if self.attention == "ulysses" and self.heads % self.cp:
            # kv_heads need not divide: Ulysses replicates K/V heads then
            raise ValueError(
                f"--attention ulysses needs --heads ({self.heads}) divisible by --cp ({self.cp})")
        if self.ulysses_size is not None:
            if self.attention != "usp":
                raise ValueError(f"--ulysses-size needs --attention usp, got --attention {self.attention}")
            U = self.ulysses_size
            if isinstance(U, bool) or not isinstance(U, int) or U < 1 or self.cp % U or self.heads % U:
                raise ValueError(f"--ulysses-size must divide --cp ({self.cp}) and --heads ({self.heads}), "
                                 f"got {U!r}")
        if self.vision_mode == "hidden_shard" and self.hidden % self.cp:
            raise ValueError(f"--vision-mode hidden_shard needs --hidden ({self.hidden}) divisible by "
                             f"--cp ({self.cp})")
        if self.seq_len < 8 * self.cp:
            raise ValueError(f"--seq-len {self.seq_len} is too short for --cp {self.cp}: each sample's "
                             f"text is cut into 2P={2 * self.cp} chunks; use at least {8 * self.cp}")

    @property
    def loss_curve_png(self) -> Path | None:
        """The loss-curve picture beside :attr:`metrics_jsonl` (its suffix replaced by ``.png``)."""
        return None if self.metrics_jsonl is None else Path(self.metrics_jsonl).with_suffix(".png")

    @property
    def usp_size(self) -> int | None:
        """The Ulysses group size in effect under ``attention="usp"`` (None for other backends)."""
        if self.attention != "usp":
            return None
        return self.ulysses_size if self.ulysses_size is not None else math.gcd(self.kv_heads, self.cp)

    @property
    def world_size(self) -> int:
        return self.cp * self.dp

    def to_dict(self) -> dict:
        return asdict(self)
