"""Tiny Gemma 4: sliding (window 4) and full layers interleaved, bidirectional images, per-layer inputs.

Language model: 4 layers, 6 heads over 2 K/V heads, head size 8 on sliding layers and 16 on full ones
(``global_head_dim``, proportional rotary), per-layer embeddings of 8, an MoE block beside every MLP
(4 experts, top 2: the 26B-A4B layout). ViT: 2x2-pixel patches with 2-D
position embeddings (a table of 64), pooled 2x2: an image of ``(h, w)`` patches gives ``h * w / 4`` tokens.
Token ids: image 120, begin/end of image 121/122 (video, audio and their markers 123-126, unused).
"""

from __future__ import annotations

from typing import Any

from vlmcp.debug.tiny.common import IMAGE_TOKEN, text_config
from vlmcp.debug.tiny.registry import register_tiny

__all__: list[str] = []


def _gemma4(overrides: dict[str, Any]) -> Any:
    from transformers import Gemma4Config

    text = text_config(head_dim=8, global_head_dim=16, num_hidden_layers=4, sliding_window=4,
                       layer_types=["sliding_attention", "full_attention"] * 2,
                       vocab_size_per_layer_input=128, hidden_size_per_layer_input=8,
                       use_bidirectional_attention="vision", bos_token_id=2, eos_token_id=1,
                       enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=32)
    text.update(overrides.pop("text_config", {}))
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=2, head_dim=8, pooling_kernel_size=2, patch_size=2,
                  position_embedding_size=64)
    vision.update(overrides.pop("vision_config", {}))
    kw = dict(text_config=text, vision_config=vision, image_token_id=IMAGE_TOKEN,
              boi_token_id=IMAGE_TOKEN + 1, eoi_token_id=IMAGE_TOKEN + 2, video_token_id=IMAGE_TOKEN + 3,
              audio_token_id=IMAGE_TOKEN + 4, experts_implementation="eager",  # grouped_mm: no float64
              boa_token_id=IMAGE_TOKEN + 5, eoa_token_index=IMAGE_TOKEN + 6, tie_word_embeddings=False)
    kw.update(overrides)
    return Gemma4Config(**kw)


register_tiny("gemma4", _gemma4, samples=((5, (4, 4), 9), (12,), (3, (2, 4), 4, (4, 2), 7)),
              summary="sliding window 4 and full layers; bidirectional images; 2x2-pooled patches")
