"""Tiny MiniMax-M3-VL: a Qwen-style patch ViT, a two-stage projector, an MoE language model.

Language model: 2 layers of full attention (6 heads of 8 over 2 K/V heads, Gemma-style q/k norms,
rotary on 4 of 8 dims), layer 0 a dense MLP, layer 1 MoE (4 experts, top 2, sigmoid router, a shared
expert). Images are ``(t, h, w)`` patch grids of 2x2-pixel patches, 2x2 merged into one token.
"""

from __future__ import annotations

from typing import Any

from vlmcp.debug.tiny.common import IMAGE_TOKEN, text_config
from vlmcp.debug.tiny.registry import register_tiny

__all__: list[str] = []


def _minimax_m3_vl(overrides: dict[str, Any]) -> Any:
    from transformers import MiniMaxM3VLConfig

    text = text_config(head_dim=8, rotary_dim=4, num_local_experts=4, num_experts_per_tok=2,
                       intermediate_size=32, dense_intermediate_size=64, shared_intermediate_size=32,
                       mlp_layer_types=["dense", "sparse"], layer_types=["full_attention"] * 2)
    text.update(overrides.pop("text_config", {}))
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                  num_channels=3, image_size=8, patch_size=2, temporal_patch_size=2, spatial_merge_size=2)
    vision.update(overrides.pop("vision_config", {}))
    kw = dict(text_config=text, vision_config=vision, image_token_index=IMAGE_TOKEN,
              video_token_index=IMAGE_TOKEN + 1, projector_hidden_size=32, tie_word_embeddings=False,
              experts_implementation="eager")  # grouped_mm takes no float64
    kw.update(overrides)
    return MiniMaxM3VLConfig(**kw)


register_tiny("minimax_m3_vl", _minimax_m3_vl,
              summary="full attention; dense then MoE MLP; 2-stage projector")
