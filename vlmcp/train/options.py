"""The option types both trainers (and ``vlmcp verify``) share: one ``Literal`` per choice."""

from __future__ import annotations

from typing import Literal

import torch

from vlmcp.attention.dispatch import Backend as AttentionBackend
from vlmcp.layout.sample_placement import SamplePlacement
from vlmcp.layout.work import ImageAttention
from vlmcp.vision.placement import VisionMode

__all__ = ["TORCH_DTYPES", "AttentionBackend", "DType", "ImageAttention", "ImageStrategyChoice", "LossKind",
           "SamplePlacement", "VisionMode"]

DType = Literal["float32", "float64", "bfloat16"]
"""A run's parameter dtype, by name."""
ImageStrategyChoice = Literal["replicate", "shard", "auto"]
"""A layout (:data:`~vlmcp.layout.plan.ImageStrategy`) or ``"auto"`` (the cost model picks per row)."""
LossKind = Literal["chunked", "full"]
"""The LM head's loss: a chunk of tokens at a time (:func:`vlmcp.hf.causal_lm_loss`), or the full logits."""
TORCH_DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}
""":data:`DType` -> ``torch.dtype``."""
