"""GLM-4.1V: a Qwen-VL-style ViT (``model.visual``) with a gated-MLP projector.

Inputs, token counts and image selection are Qwen2-VL's (``qwen2_vl.py``): patch rows
of all images in ``pixel_values`` with ``image_grid_thw``, ``t*h*w / merge**2`` LLM
tokens per image. The ViT ends in a strided convolution (``downsample``) and
``merger`` (``proj`` -> norm -> gated MLP), whose last Linear is ``merger.down_proj``.
Positions: M-RoPE ``(3, L)`` from the model's own ``get_rope_index`` per sample (GLM's
text model rotates half of each head, interleaving the T/H/W sections);
``(3, 1, N)`` into the text model, without the text row.
"""

from __future__ import annotations

from dataclasses import dataclass

from vlmcp.hf.adapters.qwen2_vl import QwenVLAdapter

__all__ = ["GLM4V", "Glm4vAdapter"]


@dataclass(frozen=True, kw_only=True)
class Glm4vAdapter(QwenVLAdapter):
    """GLM-4.1V (images; videos are not supported under CP yet)."""

    projector_last: str | None = "model.visual.merger.down_proj"


GLM4V = Glm4vAdapter(name="glm4v", model_types=("glm4v",))
