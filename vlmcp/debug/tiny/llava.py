"""Tiny LLaVA-1.5: a CLIP tower on 8x8-pixel images (16 patch tokens, CLS dropped), a Llama LLM."""

from __future__ import annotations

from typing import Any

from vlmcp.debug.tiny.common import IMAGE_TOKEN, text_config
from vlmcp.debug.tiny.registry import register_tiny

__all__: list[str] = []


def _llava(overrides: dict[str, Any]) -> Any:
    from transformers import LlavaConfig

    text = text_config(model_type="llama", **overrides.pop("text_config", {}))
    # 8x8 px images in 2x2 patches: 16 patch tokens (+ CLS, dropped by the "default" strategy)
    vision = dict(model_type="clip_vision_model", hidden_size=16, intermediate_size=32,
                  num_hidden_layers=2, num_attention_heads=2, image_size=8, patch_size=2,
                  num_channels=3, projection_dim=16)
    vision.update(overrides.pop("vision_config", {}))
    kw = dict(text_config=text, vision_config=vision, image_token_index=IMAGE_TOKEN,
              image_seq_length=16, vision_feature_layer=-1, vision_feature_select_strategy="default",
              tie_word_embeddings=False)
    kw.update(overrides)
    return LlavaConfig(**kw)


register_tiny("llava", _llava, summary="fixed-size images of 16 tokens")
