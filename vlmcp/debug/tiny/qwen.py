"""Tiny Qwen-VL family configs: Qwen2-VL, Qwen2.5-VL, Qwen3-VL (and its MoE), GLM-4.1V, Qwen3.5 (and its MoE).

Images are patch grids ``(t, h, w)`` of 2x2-pixel patches merged 2x2 into LLM tokens; the
M-RoPE sections run over 4 rotary frequencies. Qwen3-VL has deepstack at ViT block 0; Qwen3.5
has three Gated DeltaNet layers, then one gated attention layer; the MoE variants make every
MLP sparse (4 experts, top 2).
"""

from __future__ import annotations

import functools
from typing import Any

from vlmcp.debug.tiny.common import IMAGE_TOKEN, text_config
from vlmcp.debug.tiny.registry import register_tiny

__all__: list[str] = []

_QWEN_TOKENS = dict(image_token_id=IMAGE_TOKEN, video_token_id=IMAGE_TOKEN + 1,
                    vision_start_token_id=IMAGE_TOKEN + 2, vision_end_token_id=IMAGE_TOKEN + 3)


def _qwen(arch: str, overrides: dict[str, Any]) -> Any:
    from transformers import Qwen2_5_VLConfig, Qwen2VLConfig

    # head_dim 8: M-RoPE sections (temporal, height, width) over head_dim / 2 = 4 frequencies
    text = text_config(rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                  "mrope_section": [2, 1, 1]},
                 **overrides.pop("text_config", {}))
    vision = dict(depth=2, embed_dim=16, hidden_size=text["hidden_size"], num_heads=2, in_channels=3,
                  patch_size=2, spatial_merge_size=2, temporal_patch_size=2)
    cls = Qwen2VLConfig
    if arch == "qwen2_5_vl":
        cls = Qwen2_5_VLConfig
        # window 8 px = 4 patches = 2 merged tokens per side; block 1 is full attention
        vision.update(intermediate_size=32, out_hidden_size=text["hidden_size"], window_size=8,
                      fullatt_block_indexes=[1])
        del vision["embed_dim"]
        vision["hidden_size"] = 16
    else:
        vision["mlp_ratio"] = 2
    vision.update(overrides.pop("vision_config", {}))
    kw = dict(text_config=text, vision_config=vision, **_QWEN_TOKENS, tie_word_embeddings=False)
    kw.update(overrides)
    return cls(**kw)


def _mrope(arch: str, overrides: dict[str, Any]) -> Any:
    from transformers import Glm4vConfig, Qwen3VLConfig, Qwen3VLMoeConfig

    glm = arch == "glm4v"
    # Qwen3-VL: head_dim 8 -> 4 rotary frequencies, interleaved T/H/W as mrope_section [2, 1, 1] says.
    # GLM-4.1V rotates half of each head (partial_rotary_factor 0.5): head_dim 16 -> 4 frequencies.
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]}
    if glm:
        rope["partial_rotary_factor"] = 0.5
        text = text_config(hidden_size=96, **overrides.pop("text_config", {}))
    else:
        rope["mrope_interleaved"] = True
        text = text_config(**{"head_dim": 8, **overrides.pop("text_config", {})})
        if arch == "qwen3_vl_moe":  # every layer sparse: 4 experts, top 2
            text.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, decoder_sparse_step=1)
    text["rope_parameters"] = rope
    vision = dict(depth=2, hidden_size=16, intermediate_size=32, num_heads=2, in_channels=3, patch_size=2,
                  spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=text["hidden_size"])
    if glm:  # learned positions on a 4x4 patch grid (8x8 px), interpolated per image
        vision.update(image_size=8)
    else:  # 4x4 learned positions; deepstack: block 0's output, merged, is added after LLM layer 0
        vision.update(num_position_embeddings=16, deepstack_visual_indexes=[0])
    vision.update(overrides.pop("vision_config", {}))
    kw = dict(text_config=text, vision_config=vision, image_token_id=IMAGE_TOKEN,
              video_token_id=IMAGE_TOKEN + 1, tie_word_embeddings=False)
    if glm:
        kw.update(image_start_token_id=IMAGE_TOKEN + 2, image_end_token_id=IMAGE_TOKEN + 3,
                  video_start_token_id=IMAGE_TOKEN + 4, video_end_token_id=IMAGE_TOKEN + 5)
    else:
        kw.update(vision_start_token_id=IMAGE_TOKEN + 2, vision_end_token_id=IMAGE_TOKEN + 3)
    kw.update(overrides)
    if arch == "qwen3_vl_moe":  # the default grouped_mm experts take no float64
        kw["experts_implementation"] = "eager"
    cls = {"qwen3_vl": Qwen3VLConfig, "qwen3_vl_moe": Qwen3VLMoeConfig, "glm4v": Glm4vConfig}[arch]
    return cls(**kw)


def _qwen3_5(overrides: dict[str, Any], moe: bool = False) -> Any:
    from transformers import Qwen3_5Config, Qwen3_5MoeConfig

    # Layers: three Gated DeltaNet, then one gated attention (Qwen3.5's default full_attention_interval 4).
    # Attention: 6 heads of 32 (q_proj gives query and gate); partial rotary 1/4 -> 8 dims, 4 frequencies
    # interleaved T/H/W as mrope_section [2, 1, 1]. Gated DeltaNet: 2 q/k heads of 8 serving 4 value heads
    # of 8, conv kernel 4.
    text = text_config(**{"head_dim": 32, "linear_key_head_dim": 8, "linear_value_head_dim": 8,
                    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_conv_kernel_dim": 4,
                    "num_hidden_layers": 4,
                    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                        "partial_rotary_factor": 0.25, "mrope_section": [2, 1, 1],
                                        "mrope_interleaved": True},
                    **overrides.pop("text_config", {})})
    if moe:  # every layer's MLP sparse: 4 experts, top 2, and a gated shared expert
        text.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                    shared_expert_intermediate_size=32)
    vision = dict(depth=2, hidden_size=16, intermediate_size=32, num_heads=2, in_channels=3, patch_size=2,
                  spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=text["hidden_size"],
                  num_position_embeddings=16)
    vision.update(overrides.pop("vision_config", {}))
    kw = dict(text_config=text, vision_config=vision, **_QWEN_TOKENS, tie_word_embeddings=False)
    kw.update(overrides)
    if moe:  # the default grouped_mm experts take no float64
        kw["experts_implementation"] = "eager"
    return (Qwen3_5MoeConfig if moe else Qwen3_5Config)(**kw)


for _arch in ("qwen2_vl", "qwen2_5_vl"):
    register_tiny(_arch, functools.partial(_qwen, _arch), summary="2 layers; ViT of 2 blocks, 2x2 merge")
for _arch in ("qwen3_vl", "qwen3_vl_moe", "glm4v"):
    register_tiny(_arch, functools.partial(_mrope, _arch), summary="interleaved M-RoPE; Qwen3-VL: deepstack")
register_tiny("qwen3_5", _qwen3_5, summary="3 Gated DeltaNet layers, then 1 gated attention layer")
register_tiny("qwen3_5_moe", functools.partial(_qwen3_5, moe=True),
              summary="Qwen3.5's layers with sparse MoE MLPs (4 experts, top 2, a shared expert)")
