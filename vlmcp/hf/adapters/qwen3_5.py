"""Qwen3.5: Qwen3-VL's ViT without deepstack, and a hybrid language model.

The vision side is Qwen3-VL's (``qwen3_vl.py``, itself Qwen2-VL's inputs): ``pixel_values``
+ ``image_grid_thw``, ``t*h*w / merge**2`` LLM tokens per image, the projector's last
Linear ``model.visual.merger.linear_fc2``, interleaved M-RoPE ``(3, L)`` from the model's
own ``get_rope_index`` per sample; no deepstack levels. The language model interleaves
Gated DeltaNet layers (three in four) with gated softmax attention: the attention goes
through vlmcp attention like any other (its output gate and partial rotary are per-token
steps HF does around the call), the Gated DeltaNet through :mod:`vlmcp.hf.mixers.gdn`.
Qwen3.5-MoE (``qwen3_5_moe``) is not served yet (no parity test).
"""

from __future__ import annotations

from dataclasses import dataclass

from vlmcp.hf.adapters.qwen2_vl import QwenVLAdapter

__all__ = ["QWEN3_5", "Qwen3_5Adapter"]


@dataclass(frozen=True, kw_only=True)
class Qwen3_5Adapter(QwenVLAdapter):
    """Qwen3.5 (images; videos, with their timestamps, are not supported under CP yet)."""

    projector_last: str | None = "model.visual.merger.linear_fc2"


QWEN3_5 = Qwen3_5Adapter(name="qwen3_5", model_types=("qwen3_5",))
