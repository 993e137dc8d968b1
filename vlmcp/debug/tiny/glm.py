"""Tiny GLM-4.5V (``glm4v_moe``) and GLM-4.6V (``glm46v``): GLM-4.1V's ViT, an MoE or dense language model.

``glm4v_moe``: layer 0 dense, layer 1 MoE (4 routed experts in 2 groups, top 2, sigmoid router with a
score-correction bias, one shared expert), GLM's partial rotary M-RoPE (half of each head).
``glm46v``: GLM-4.6V's own wrapper over a ``glm4v_text`` language model (GLM-4.6V-Flash's dense layout)
and ``glm4v_vision`` ViT. Token ids as :mod:`.qwen`'s GLM-4.1V: video 121, image start/end 122/123,
video start/end 124/125.
"""

from __future__ import annotations

from typing import Any

from vlmcp.debug.tiny.common import IMAGE_TOKEN, text_config
from vlmcp.debug.tiny.registry import register_tiny

__all__: list[str] = []


def _glm(arch: str, overrides: dict[str, Any]) -> Any:
    import transformers

    # head_dim 16, rotating half (partial_rotary_factor 0.5): 4 frequencies in mrope_section [2, 1, 1]
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1],
            "partial_rotary_factor": 0.5}
    text = text_config(hidden_size=96, rope_parameters=rope)
    if arch == "glm4v_moe":
        text.update(model_type="glm4v_moe_text", moe_intermediate_size=32, n_routed_experts=4,
                    num_experts_per_tok=2, n_group=2, topk_group=1, n_shared_experts=1,
                    first_k_dense_replace=1, head_dim=16)
    else:
        text.update(model_type="glm4v_text")
    text.update(overrides.pop("text_config", {}))
    # learned positions on a 4x4 patch grid (8x8 px), interpolated per image
    vision = dict(model_type=f"{'glm4v_moe' if arch == 'glm4v_moe' else 'glm4v'}_vision", depth=2,
                  hidden_size=16, intermediate_size=32, num_heads=2, in_channels=3, patch_size=2,
                  spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=text["hidden_size"],
                  image_size=8)
    vision.update(overrides.pop("vision_config", {}))
    kw = dict(text_config=text, vision_config=vision, image_token_id=IMAGE_TOKEN,
              video_token_id=IMAGE_TOKEN + 1, image_start_token_id=IMAGE_TOKEN + 2,
              image_end_token_id=IMAGE_TOKEN + 3, video_start_token_id=IMAGE_TOKEN + 4,
              video_end_token_id=IMAGE_TOKEN + 5, tie_word_embeddings=False)
    if arch == "glm4v_moe":
        kw["experts_implementation"] = "eager"  # grouped_mm takes no float64
    kw.update(overrides)
    cls = transformers.Glm4vMoeConfig if arch == "glm4v_moe" else transformers.Glm46VConfig
    return cls(**kw)


def _router_dtype(model) -> None:
    """GLM-4.5V's router weight is built in float32 whatever the dtype: cast it with the rest."""
    model.to(model.model.language_model.embed_tokens.weight.dtype)


register_tiny("glm4v_moe", lambda o: _glm("glm4v_moe", o), post_init=_router_dtype,
              summary="GLM-4.1V's ViT; layer 0 dense, layer 1 MoE (sigmoid router, 4 experts, top 2)")
register_tiny("glm46v", lambda o: _glm("glm46v", o), summary="GLM-4.6V's wrapper over a dense glm4v_text LM")
