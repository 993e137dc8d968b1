"""Tiny Llama 4: RoPE layers chunked (chunk 32), a NoPE layer with temperature tuning, MoE layers.

Language model: 4 layers, 6 heads of 8 over 2 K/V heads; layers 0-2 RoPE with ``chunked_attention``
(``attention_chunk_size`` 32: every sample of the verification row fits one chunk), layer 3 NoPE
``full_attention`` with ``attn_temperature_tuning`` and ``floor_scale`` 4 (the row's queries from
position 3 on are scaled); layers 1 and 3 MoE (4 experts, top 1, a shared expert). ViT: 8x8-px tiles
in 2x2 patches, pixel-shuffled 0.5: 4 tokens per tile. Token ids: image start/end 122/123, tile
separator 121.
"""

from __future__ import annotations

from typing import Any

from vlmcp.debug.tiny.common import IMAGE_TOKEN, text_config
from vlmcp.debug.tiny.registry import register_tiny

__all__: list[str] = []


def _llama4(overrides: dict[str, Any]) -> Any:
    from transformers import Llama4Config

    text = text_config(head_dim=8, num_hidden_layers=4, intermediate_size=32, intermediate_size_mlp=96,
                       num_local_experts=4, num_experts_per_tok=1, interleave_moe_layer_step=2,
                       no_rope_layers=[1, 1, 1, 0], attention_chunk_size=32, attn_temperature_tuning=True,
                       floor_scale=4, attn_scale=0.5, use_qk_norm=True,
                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    text.update(overrides.pop("text_config", {}))
    # intermediate 4 x hidden: the encoder MLP's and the pixel-shuffled width (0.5 per side), as released
    vision = dict(hidden_size=16, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                  image_size=8, patch_size=2, pixel_shuffle_ratio=0.5, projector_input_dim=32,
                  projector_output_dim=32, vision_output_dim=32,
                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    vision.update(overrides.pop("vision_config", {}))
    kw = dict(text_config=text, vision_config=vision, image_token_index=IMAGE_TOKEN,
              boi_token_index=IMAGE_TOKEN + 2, eoi_token_index=IMAGE_TOKEN + 3, tie_word_embeddings=False)
    kw.update(overrides)
    return Llama4Config(**kw)


def _mended(model) -> None:
    """transformers 5.24's forward raises on every call: the same one-read mend ``parallelize`` applies."""
    from vlmcp.hf.adapters.llama4 import fix_forward

    fix_forward(model)


register_tiny("llama4", _llama4, post_init=_mended, samples=((5, (1,), 9), (12,), (3, (2,), 4, (1,), 7)),
              summary="chunked RoPE layers (chunk 32), a NoPE layer with temperature tuning, MoE")
