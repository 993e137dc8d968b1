"""Tiny Kimi-K2.5: a DeepSeek-V3 language model (MLA, one dense then one MoE layer) and MoonViT."""

from __future__ import annotations

from typing import Any

from vlmcp.debug.tiny.common import IMAGE_TOKEN, text_config
from vlmcp.debug.tiny.registry import register_tiny

__all__: list[str] = []


def _kimi_k25(overrides: dict[str, Any]) -> Any:
    from transformers import Kimi_K25Config

    # MLA: 4 heads, q/k of 8 nope + 4 rope dims, V of 6 (a head dim of its own), latent ranks 16; layer 0
    # dense, layer 1 MoE (4 routed experts in 2 groups, top 2, one shared expert)
    text = text_config(model_type="deepseek_v3", num_attention_heads=4, num_key_value_heads=4, q_lora_rank=16,
                 kv_lora_rank=16, qk_rope_head_dim=4, qk_nope_head_dim=8, v_head_dim=6,
                 moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2, n_group=2, topk_group=1,
                 n_shared_experts=1,
                 first_k_dense_replace=1, rope_interleave=True,
                 rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    text.update(overrides.pop("text_config", {}))
    # MoonViT on 2x2 px patches, a 4x4 learned position table, merged 2x2 patches per LLM token
    vision = dict(patch_size=2, pos_emb_height=4, pos_emb_width=4, pos_emb_time=4, num_attention_heads=2,
                  num_hidden_layers=2, hidden_size=16, intermediate_size=32, merge_kernel_size=[2, 2],
                  rope_parameters={"rope_type": "axial", "rope_theta": 10000.0})
    vision.update(overrides.pop("vision_config", {}))
    kw = dict(text_config=text, vision_config=vision, projection_hidden_size=vision["hidden_size"],
              image_token_id=IMAGE_TOKEN, video_token_id=IMAGE_TOKEN + 1,
              vision_start_token_id=IMAGE_TOKEN + 2, vision_end_token_id=IMAGE_TOKEN + 3,
              tie_word_embeddings=False, experts_implementation="eager")  # grouped_mm takes no float64
    kw.update(overrides)
    return Kimi_K25Config(**kw)


def _router_dtype(model) -> None:
    """DeepSeek-V3's router weight is built in float32 whatever the dtype: cast it with the rest."""
    model.to(next(model.model.language_model.embed_tokens.parameters()).dtype)


register_tiny("kimi_k25", _kimi_k25, post_init=_router_dtype, summary="MLA (V head dim 6), MoE layer 1")
