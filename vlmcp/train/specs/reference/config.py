"""The reference VLM's configuration: the loop's fields with its own defaults, and its model's.

Its defaults are the numbers its runs have always had (``make demo``): 60 steps of 1,024-token
rows at ``--lr 3e-3``, 5 warm-up steps and a cosine to 10%, AdamW's weight decay 0.01 on every
parameter, no clipping.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, get_args

from vlmcp.layout.cost import DEFAULT_FLOPS_PER_BYTE
from vlmcp.train.config import TrainConfig, check_int
from vlmcp.train.options import ImageAttention

__all__ = ["EVAL_SEED", "ReferenceTrainConfig"]

EVAL_SEED = 2**31 - 1
"""Added to ``--seed`` for the held-out rows' stream (``--eval-rows``), which no training run with a
seed below it reads."""


@dataclass(frozen=True, kw_only=True)
class ReferenceTrainConfig(TrainConfig):
    """One training run of the reference VLM on the built-in data."""

    steps: int = 60
    """Total optimizer steps of the run (a resumed run may change it: the state is layout-free)."""
    seq_len: int = 1024
    """Tokens per packed row."""
    lr: float = 3e-3
    """AdamW's peak learning rate."""
    warmup_steps: int | None = 5
    """Linear warm-up steps (None: from ``warmup_ratio``)."""
    min_lr_ratio: float = 0.1
    """Where the decay ends, as a fraction of ``lr``."""
    weight_decay: float = 0.01
    """AdamW's decoupled weight decay, on every parameter (as the reference VLM always had it)."""
    ulysses_size: int | None = None
    """``attention="usp"`` only: ranks per Ulysses group U (a divisor of ``cp`` and of
    ``heads``); None: ``gcd(kv_heads, cp)``, ms-swift's choice (no K/V head repeated)."""
    image_attention: ImageAttention = "causal"
    """Whether image tokens of one image see each other in both directions."""
    flops_per_byte: float = DEFAULT_FLOPS_PER_BYTE
    """``auto`` only: compute FLOPs one communicated byte costs (achieved FLOP/s over link
    bytes/s; 4,000 is an H100-class GPU on a 100 GB/s link). Lower makes sharding images
    cheaper; with the default, this tiny model replicates images under ~4,000 tokens."""
    hidden: int = 64
    """LLM width (the projector's output width)."""
    layers: int = 2
    """LLM decoder blocks."""
    heads: int = 4
    """LLM attention heads."""
    kv_heads: int = 2
    """LLM key/value heads (GQA)."""
    eval_rows: int = 0
    """Held-out built-in rows evaluated with ``eval_every`` and at the end (0: none), packed from a
    stream of another seed (``seed + EVAL_SEED``) than the training rows."""

    RESUME_FIELDS: ClassVar[tuple[str, ...]] = ("seed", "seq_len", "dp", "hidden", "layers", "heads",
                                                "kv_heads", "dtype")
    """CP size, vision mode, attention backend, steps and rate may change (the state is layout-free)."""
    EVAL_FLAGS: ClassVar[str] = "--eval-rows N"

    def __post_init__(self):
        super().__post_init__()
        for name in ("hidden", "layers", "heads", "kv_heads"):
            check_int(name, getattr(self, name), 1)
        check_int("eval_rows", self.eval_rows, 0)
        if self.image_attention not in get_args(ImageAttention):
            raise ValueError(f"--image-attention must be one of {get_args(ImageAttention)}, "
                             f"got {self.image_attention!r}")
        if not self.flops_per_byte > 0:
            raise ValueError(f"--flops-per-byte must be > 0, got {self.flops_per_byte}")
        uses_costs = self.image_strategy == "auto" or self.sample_placement != "split"
        if not uses_costs and self.flops_per_byte != DEFAULT_FLOPS_PER_BYTE:
            raise ValueError("--flops-per-byte only applies to --image-strategy auto or --sample-placement "
                             "whole/auto")
        if self.checkpoint_every and not self.checkpoint_dir:
            raise ValueError("--checkpoint-every needs --checkpoint-dir")
        if self.resume and not self.checkpoint_dir:
            raise ValueError("--resume needs --checkpoint-dir")
        self._check_shapes()

    def _check_shapes(self) -> None:
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
        from vlmcp.data import ShapesConfig

        longest = ShapesConfig(seed=self.seed, patch_size=8).max_sample_len
        if self.seq_len < longest:
            raise ValueError(f"--seq-len {self.seq_len} is shorter than the longest built-in sample "
                             f"({longest} tokens)")

    @property
    def has_eval_data(self) -> bool:
        return self.eval_rows > 0

    @property
    def usp_size(self) -> int | None:
        """The Ulysses group size in effect under ``attention="usp"`` (None for other backends)."""
        if self.attention != "usp":
            return None
        return self.ulysses_size if self.ulysses_size is not None else math.gcd(self.kv_heads, self.cp)
