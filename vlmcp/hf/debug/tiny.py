"""Tiny random Hugging Face VLM configs, built in code (no hub download).

For tests, ``vlmcp verify --model hf:ARCH`` and ``vlmcp init-model``: a couple of
decoder layers, a small hidden size, GQA in the LLM (2 K/V heads for 6 query heads)
and a small ViT, so a float64 training step runs in milliseconds on a CPU.
:data:`TINY_ARCHS` are the architectures of the generic tests (``tests/test_hf.py``);
:data:`MROPE_ARCHS` (Qwen3-VL with deepstack, its MoE variant, GLM-4.1V) are built the
same way and tested in ``tests/test_hf_qwen3.py``; :data:`HYBRID_ARCHS` (Qwen3.5: Gated DeltaNet
layers between gated attention layers; LFM2-VL: short convolutions between attention layers) in
``tests/test_hf_qwen3_5.py`` and ``tests/test_hf_lfm2_vl.py``;
:data:`~vlmcp.hf.debug.tiny_anyres.ANYRES_ARCHS` (InternVL, LLaVA-OneVision/NeXT, SmolVLM/Idefics3,
Mistral3) in :mod:`vlmcp.hf.debug.tiny_anyres`, tested in ``tests/test_hf_more_archs.py``; :data:`MLA_ARCHS`
(Kimi-K2.5: DeepSeek-V3 MLA and MoE) in ``tests/test_hf_kimi.py``.

``tiny_config("qwen2_vl")`` -> ``Qwen2VLConfig``; ``tiny_model("llava", torch.float64)``
-> a seeded ``LlavaForConditionalGeneration`` in eval mode (no dropout anywhere).
"""

from __future__ import annotations

from typing import Any

import torch

from vlmcp.hf.debug.tiny_anyres import ANYRES_ARCHS, anyres_config

__all__ = ["ANYRES_ARCHS", "HYBRID_ARCHS", "HYBRID_SAMPLES", "MLA_ARCHS", "MROPE_ARCHS", "TINY_ARCHS",
           "WINDOW_ARCHS", "WINDOW_SAMPLES", "tiny_config", "tiny_model"]

TINY_ARCHS = ("qwen2_vl", "qwen2_5_vl", "llava")
"""Architectures of the generic HF tests (``config.model_type`` values); :func:`tiny_config` builds them."""
MROPE_ARCHS = ("qwen3_vl", "qwen3_vl_moe", "glm4v")
"""Interleaved-M-RoPE architectures :func:`tiny_config` builds too (Qwen3-VL: deepstack at ViT block 0)."""
HYBRID_ARCHS = ("qwen3_5", "lfm2_vl")
"""Hybrid language models :func:`tiny_config` builds too (Qwen3.5: three Gated DeltaNet layers, then one
gated attention layer; LFM2-VL: short convolutions in layers 0 and 2, attention in 1 and 3)."""
HYBRID_SAMPLES = {"lfm2_vl": ((5, (2, 4), 9), (12,), (3, (4, 4), 4, (2, 2), 7))}
"""The verification row of the :data:`HYBRID_ARCHS` whose images are not Qwen grids (``vlmcp verify
--model``): LFM2-VL's images are ``(h, w)`` patch grids. Keyed by model_type."""
WINDOW_ARCHS = ("gemma3",)
"""Sliding-window language models :func:`tiny_config` builds too (Gemma 3: sliding layers of window 4
between full layers, bidirectional attention within each image; ``tests/test_hf_gemma3.py``)."""
MLA_ARCHS = ("kimi_k25",)
"""MLA language models :func:`tiny_config` builds too (Kimi-K2.5: a DeepSeek-V3 LLM, one dense layer then
one MoE layer; ``tests/test_hf_kimi.py``)."""
WINDOW_SAMPLES = {"gemma3": ((5, (1,), 9), (12,), (3, (1,), 4, (1,), 7))}
"""The verification row of each :data:`WINDOW_ARCHS` model (``vlmcp verify --model``): an image sample,
a text-only sample, a two-image sample (Gemma 3's image tuples carry no size). Keyed by model_type."""

_VOCAB = 128
_IMAGE_TOKEN = 120  # Qwen: image, video, vision start/end are 120..123; LLaVA: image only


def _text(**overrides: Any) -> dict[str, Any]:
    # 6 query heads over 2 K/V heads (GQA): Ulysses and hidden_shard work at P = 2 and 3
    text = dict(vocab_size=_VOCAB, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=512,
                rms_norm_eps=1e-6, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    text.update(overrides)
    return text


def _qwen(arch: str, overrides: dict[str, Any]) -> Any:
    from transformers import Qwen2_5_VLConfig, Qwen2VLConfig

    # head_dim 8: M-RoPE sections (temporal, height, width) over head_dim / 2 = 4 frequencies
    text = _text(rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
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
    kw = dict(text_config=text, vision_config=vision, image_token_id=_IMAGE_TOKEN,
              video_token_id=_IMAGE_TOKEN + 1, vision_start_token_id=_IMAGE_TOKEN + 2,
              vision_end_token_id=_IMAGE_TOKEN + 3, tie_word_embeddings=False)
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
        text = _text(hidden_size=96, **overrides.pop("text_config", {}))
    else:
        rope["mrope_interleaved"] = True
        text = _text(head_dim=8, **overrides.pop("text_config", {}))
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
    kw = dict(text_config=text, vision_config=vision, image_token_id=_IMAGE_TOKEN,
              video_token_id=_IMAGE_TOKEN + 1, tie_word_embeddings=False)
    if glm:
        kw.update(image_start_token_id=_IMAGE_TOKEN + 2, image_end_token_id=_IMAGE_TOKEN + 3,
                  video_start_token_id=_IMAGE_TOKEN + 4, video_end_token_id=_IMAGE_TOKEN + 5)
    else:
        kw.update(vision_start_token_id=_IMAGE_TOKEN + 2, vision_end_token_id=_IMAGE_TOKEN + 3)
    kw.update(overrides)
    if arch == "qwen3_vl_moe":  # the default grouped_mm experts take no float64
        kw["experts_implementation"] = "eager"
    cls = {"qwen3_vl": Qwen3VLConfig, "qwen3_vl_moe": Qwen3VLMoeConfig, "glm4v": Glm4vConfig}[arch]
    return cls(**kw)


def _lfm2_vl(overrides: dict[str, Any]) -> Any:
    from transformers import Lfm2VlConfig

    # 4 attention heads (Ulysses at P = 2 and 4); SigLIP2 NaFlex in 2x2-px patches, a 4x4 position table
    # interpolated to each image's patch grid, 2x2 patches unshuffled into one token
    text = dict(vocab_size=_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                block_auto_adjust_ff_dim=False, layer_types=["conv", "full_attention"] * 2, pad_token_id=0,
                bos_token_id=1, eos_token_id=2)
    text.update(overrides.pop("text_config", {}))
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                  num_patches=16, patch_size=2, num_channels=3)
    vision.update(overrides.pop("vision_config", {}))
    kw = dict(text_config=text, vision_config=vision, image_token_id=_IMAGE_TOKEN, projector_hidden_size=32,
              downsample_factor=2, tie_word_embeddings=False)
    kw.update(overrides)
    return Lfm2VlConfig(**kw)


def _hybrid(arch: str, overrides: dict[str, Any]) -> Any:
    from transformers import Qwen3_5Config

    if arch == "lfm2_vl":
        return _lfm2_vl(overrides)

    # Layers: three Gated DeltaNet, then one gated attention (Qwen3.5's default full_attention_interval 4).
    # Attention: 6 heads of 32 (q_proj gives query and gate); partial rotary 1/4 -> 8 dims, 4 frequencies
    # interleaved T/H/W as mrope_section [2, 1, 1]. Gated DeltaNet: 2 q/k heads of 8 serving 4 value heads
    # of 8, conv kernel 4.
    text = _text(**{"head_dim": 32, "linear_key_head_dim": 8, "linear_value_head_dim": 8,
                    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_conv_kernel_dim": 4,
                    "num_hidden_layers": 4,
                    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                        "partial_rotary_factor": 0.25, "mrope_section": [2, 1, 1],
                                        "mrope_interleaved": True},
                    **overrides.pop("text_config", {})})
    vision = dict(depth=2, hidden_size=16, intermediate_size=32, num_heads=2, in_channels=3, patch_size=2,
                  spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=text["hidden_size"],
                  num_position_embeddings=16)
    vision.update(overrides.pop("vision_config", {}))
    kw = dict(text_config=text, vision_config=vision, image_token_id=_IMAGE_TOKEN,
              video_token_id=_IMAGE_TOKEN + 1, vision_start_token_id=_IMAGE_TOKEN + 2,
              vision_end_token_id=_IMAGE_TOKEN + 3, tie_word_embeddings=False)
    kw.update(overrides)
    return Qwen3_5Config(**kw)


def _llava(overrides: dict[str, Any]) -> Any:
    from transformers import LlavaConfig

    text = _text(model_type="llama", **overrides.pop("text_config", {}))
    # 8x8 px images in 2x2 patches: 16 patch tokens (+ CLS, dropped by the "default" strategy)
    vision = dict(model_type="clip_vision_model", hidden_size=16, intermediate_size=32,
                  num_hidden_layers=2, num_attention_heads=2, image_size=8, patch_size=2,
                  num_channels=3, projection_dim=16)
    vision.update(overrides.pop("vision_config", {}))
    kw = dict(text_config=text, vision_config=vision, image_token_index=_IMAGE_TOKEN,
              image_seq_length=16, vision_feature_layer=-1, vision_feature_select_strategy="default",
              tie_word_embeddings=False)
    kw.update(overrides)
    return LlavaConfig(**kw)


def _gemma3(overrides: dict[str, Any]) -> Any:
    from transformers import Gemma3Config

    # window 4: the test rows' samples (9 to 16 tokens) are cut by it; sliding and full layers interleaved
    text = _text(head_dim=8, num_hidden_layers=4, sliding_window=4, query_pre_attn_scalar=8,
                 layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"])
    text.update(overrides.pop("text_config", {}))
    # SigLIP on 8x8 px in 2x2 patches: a 4x4 patch grid pooled to 2x2 = 4 tokens per image
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                  image_size=8, patch_size=2, num_channels=3)
    vision.update(overrides.pop("vision_config", {}))
    kw = dict(text_config=text, vision_config=vision, image_token_index=_IMAGE_TOKEN, boi_token_index=121,
              eoi_token_index=122, mm_tokens_per_image=4, tie_word_embeddings=False)
    kw.update(overrides)
    return Gemma3Config(**kw)


def _kimi_k25(overrides: dict[str, Any]) -> Any:
    from transformers import Kimi_K25Config

    # MLA: 4 heads, q/k of 8 nope + 4 rope dims, V of 6 (a head dim of its own), latent ranks 16; layer 0
    # dense, layer 1 MoE (4 routed experts in 2 groups, top 2, one shared expert)
    text = _text(model_type="deepseek_v3", num_attention_heads=4, num_key_value_heads=4, q_lora_rank=16,
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
              image_token_id=_IMAGE_TOKEN, video_token_id=_IMAGE_TOKEN + 1,
              vision_start_token_id=_IMAGE_TOKEN + 2, vision_end_token_id=_IMAGE_TOKEN + 3,
              tie_word_embeddings=False, experts_implementation="eager")  # grouped_mm takes no float64
    kw.update(overrides)
    return Kimi_K25Config(**kw)


def tiny_config(arch: str, **overrides: Any) -> Any:
    """A tiny random-weight transformers config of ``arch``.

    Args:
        arch: one of :data:`TINY_ARCHS`, :data:`MROPE_ARCHS`, :data:`HYBRID_ARCHS`,
            :data:`ANYRES_ARCHS`, :data:`WINDOW_ARCHS` or :data:`MLA_ARCHS`.
        **overrides: top-level config fields; ``text_config={...}`` and
            ``vision_config={...}`` update the sub-configs field by field.

    Returns:
        ``Qwen2VLConfig``, ``Qwen2_5_VLConfig``, ``LlavaConfig``, ``Qwen3VLConfig``,
        ``Qwen3VLMoeConfig``, ``Glm4vConfig``, ``Qwen3_5Config``, ``Lfm2VlConfig``, ``Gemma3Config``,
        ``Kimi_K25Config`` or an
        any-resolution config (:mod:`vlmcp.hf.debug.tiny_anyres`). Token ids: vocabulary 128, image token 120
        (Qwen, Kimi-K2.5: video 121, vision start 122, vision end 123; GLM: video 121, image start/end
        122/123, video start/end 124/125; Gemma 3: start/end of image 121/122), pad 0.
    """
    known = TINY_ARCHS + MROPE_ARCHS + HYBRID_ARCHS + ANYRES_ARCHS + WINDOW_ARCHS + MLA_ARCHS
    if arch not in known:
        raise ValueError(f"tiny_config: unknown arch {arch!r}; choose one of {known}")
    overrides = dict(overrides)
    if arch in ANYRES_ARCHS:
        return anyres_config(arch, _text(), overrides)
    if arch == "llava":
        return _llava(overrides)
    if arch in WINDOW_ARCHS:
        return _gemma3(overrides)
    if arch in MLA_ARCHS:
        return _kimi_k25(overrides)
    if arch in HYBRID_ARCHS:
        return _hybrid(arch, overrides)
    return _mrope(arch, overrides) if arch in MROPE_ARCHS else _qwen(arch, overrides)


def tiny_model(arch_or_config: Any, dtype: torch.dtype = torch.float32, seed: int = 0,
               attn_implementation: str = "sdpa") -> Any:
    """A seeded tiny model in ``dtype`` and eval mode (the same weights for the same seed).

    Args:
        arch_or_config: an arch name for :func:`tiny_config`, or a config.
        dtype: parameter dtype.
        seed: ``torch.manual_seed`` before building (restored afterwards).
        attn_implementation: the attention of every sub-model before :func:`vlmcp.hf.parallelize`.
    """
    from transformers import AutoModelForImageTextToText

    config = tiny_config(arch_or_config) if isinstance(arch_or_config, str) else arch_or_config
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForImageTextToText.from_config(config, attn_implementation=attn_implementation,
                                                        dtype=dtype)
        projector = getattr(model.model, "multi_modal_projector", None)
        projection = getattr(projector, "mm_input_projection_weight", None)
        if projection is not None:  # Gemma 3 initializes it to zeros: the ViT would get no gradient
            torch.nn.init.normal_(projection, std=0.1)
        if config.model_type in MLA_ARCHS:  # DeepSeek-V3's router weight is built in float32 whatever dtype
            model.to(dtype)
    return model.eval()
