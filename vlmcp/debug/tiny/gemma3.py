"""Tiny Gemma 3: sliding (window 4) and full layers interleaved, images bidirectional within each image.

Images are fixed-size (4 tokens each); the row's image tuples carry no size.
"""

from __future__ import annotations

from typing import Any

import torch

from vlmcp.debug.tiny.common import IMAGE_TOKEN, text_config
from vlmcp.debug.tiny.registry import register_tiny

__all__: list[str] = []


def _gemma3(overrides: dict[str, Any]) -> Any:
    from transformers import Gemma3Config

    # window 4: the test rows' samples (9 to 16 tokens) are cut by it; sliding and full layers interleaved
    text = text_config(head_dim=8, num_hidden_layers=4, sliding_window=4, query_pre_attn_scalar=8,
                 layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"])
    text.update(overrides.pop("text_config", {}))
    # SigLIP on 8x8 px in 2x2 patches: a 4x4 patch grid pooled to 2x2 = 4 tokens per image
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                  image_size=8, patch_size=2, num_channels=3)
    vision.update(overrides.pop("vision_config", {}))
    kw = dict(text_config=text, vision_config=vision, image_token_index=IMAGE_TOKEN, boi_token_index=121,
              eoi_token_index=122, mm_tokens_per_image=4, tie_word_embeddings=False)
    kw.update(overrides)
    return Gemma3Config(**kw)


def _projection_init(model) -> None:
    """Gemma 3 initializes ``mm_input_projection_weight`` to zeros: the ViT would get no gradient."""
    torch.nn.init.normal_(model.model.multi_modal_projector.mm_input_projection_weight, std=0.1)


register_tiny("gemma3", _gemma3, post_init=_projection_init,
              samples=((5, (1,), 9), (12,), (3, (1,), 4, (1,), 7)),
              summary="sliding window 4 and full layers; bidirectional images")
