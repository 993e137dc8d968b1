"""Tiny Nemotron-H-Omni: Mamba-2 layers between attention, MoE and MLP layers; a small RADIO ViT.

Images are ``(h, w)`` patch grids (2x2-pixel patches, even sides), pixel-shuffled 2x2 into one
LLM token each.
"""

from __future__ import annotations

from typing import Any

from vlmcp.debug.tiny.common import IMAGE_TOKEN, VOCAB
from vlmcp.debug.tiny.registry import register_tiny

__all__: list[str] = []

LAYERS = ["linear_attention", "moe", "full_attention", "linear_attention", "mlp"]
"""Mamba-2, MoE, attention, Mamba-2, MLP: every block type of Nemotron-H."""


def _nemotron_h_omni(overrides: dict[str, Any]) -> Any:
    from transformers import NemotronH_Omni_Reasoning_V3_Config

    # Mamba-2: 12 heads of 4 in 6 groups (B, C per group), state 8, conv kernel 4, 16-token chunks; attention
    # 6 heads of 8 over 2 K/V heads, no rotary (Ulysses at P = 2 and 3: heads and groups divide); MoE 4
    # experts in 1 group, top 2, a shared expert. One MTP layer, so the model builds vision_final_layernorm.
    text = dict(vocab_size=VOCAB, hidden_size=48, layers_block_type=list(LAYERS), num_attention_heads=6,
                num_key_value_heads=2, head_dim=8, intermediate_size=64, mamba_num_heads=12, mamba_head_dim=4,
                n_groups=6, ssm_state_size=8, conv_kernel=4, chunk_size=16, n_routed_experts=4,
                num_experts_per_tok=2, moe_intermediate_size=32, moe_shared_expert_intermediate_size=32,
                n_group=1, topk_group=1, num_nextn_predict_layers=1, max_position_embeddings=512,
                pad_token_id=0, bos_token_id=1, eos_token_id=2)
    text.update(overrides.pop("text_config", {}))
    # RADIO on 2x2-px patches, an 8x8 position table interpolated to each image's grid, 2 CLS + 1 register
    vision = dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, mlp_ratio=2.0, patch_size=2,
                  image_size=16, max_img_size=16, num_cls_tokens=2, num_registers=1,
                  video_temporal_patch_size=2)
    vision.update(overrides.pop("vision_config", {}))
    kw = dict(text_config=text, vision_config=vision, vision_hidden_size=vision["hidden_size"],
              projector_hidden_size=32, downsample_ratio=0.5, image_token_id=IMAGE_TOKEN,
              video_token_id=IMAGE_TOKEN, tie_word_embeddings=False,
              experts_implementation="eager")  # grouped_mm takes no float64
    kw.update(overrides)
    return NemotronH_Omni_Reasoning_V3_Config(**kw)


def _router_dtype(model) -> None:
    """Nemotron-H's router weight is built in float32 whatever the dtype: cast it with the rest."""
    model.to(model.language_model.model.embeddings.weight.dtype)


register_tiny("nemotron_h_omni", _nemotron_h_omni, post_init=_router_dtype,
              samples=((5, (4, 4), 9), (12,), (3, (4, 8), 4, (2, 4), 7)),
              summary="Mamba-2, MoE, attention, Mamba-2, MLP layers; RADIO ViT, 2x2 pixel shuffle")
