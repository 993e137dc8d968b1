"""Tiny Mistral 4 (Mistral Small 4): Mistral3's Pixtral ViT and projector over a ``mistral4`` language model.

Mistral 4's checkpoints are ``Mistral3ForConditionalGeneration`` (``config.model_type`` ``"mistral3"``)
whose ``text_config`` is ``mistral4``: MLA (6 heads, q/k of 8 nope + 4 rope dims, V of 6, latent ranks 16) and
MoE (layer 0 dense, layer 1 4 routed experts in 2 groups, top 2, one shared expert), and Llama 4's
query scaling by position (``llama_4_scaling_beta``; ``original_max_position_embeddings`` 8, so the
verification row's later tokens are scaled). The registry key is ``"mistral4"``; the model's own
``model_type`` stays ``"mistral3"`` and its adapter is Mistral3's. (transformers' ``mistral4`` model
type itself is the text-only ``Mistral4ForCausalLM``: it has no vision tower.)
"""

from __future__ import annotations

from typing import Any

from vlmcp.debug.tiny.anyres import SIDE, _vit
from vlmcp.debug.tiny.common import IMAGE_TOKEN, text_config
from vlmcp.debug.tiny.registry import register_tiny

__all__: list[str] = []


def _mistral4(overrides: dict[str, Any]) -> Any:
    from transformers import Mistral3Config

    text = text_config(model_type="mistral4", num_attention_heads=6, num_key_value_heads=6, q_lora_rank=16,
                       kv_lora_rank=16, qk_rope_head_dim=4, qk_nope_head_dim=8, v_head_dim=6,
                       moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2, n_group=2,
                       topk_group=1, n_shared_experts=1, first_k_dense_replace=1, rope_interleave=True,
                       rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 64.0,
                                        "original_max_position_embeddings": 8, "max_position_embeddings": 512,
                                        "beta_fast": 32.0, "beta_slow": 1.0, "mscale_all_dim": 1.0,
                                        "mscale": 1.0, "llama_4_scaling_beta": 0.5})
    text.update(overrides.pop("text_config", {}))
    vision = _vit(model_type="pixtral", image_size=4 * SIDE, head_dim=8,
                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    vision.update(overrides.pop("vision_config", {}))
    kw = dict(text_config=text, vision_config=vision, image_token_index=IMAGE_TOKEN, spatial_merge_size=2,
              vision_feature_layer=-1, multimodal_projector_bias=True, tie_word_embeddings=False,
              experts_implementation="eager")  # grouped_mm takes no float64
    kw.update(overrides)
    return Mistral3Config(**kw)


register_tiny("mistral4", _mistral4, samples=((5, (2, 3), 9), (12,), (3, (4, 1), 4, (1, 2), 7)),
              summary="Mistral3's Pixtral over a mistral4 LM: MLA, MoE layer 1, Llama 4 query scaling")
