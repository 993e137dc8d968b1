"""What a VLM's vision tower saves for backward per ViT token, from its config, per architecture.

One recipe per tower (Note [vlmcp memory estimate: saved bytes per token] in
:mod:`vlmcp.estimate.ops`); :data:`TOWERS` is the registry of the architectures ``vlmcp plan
--model`` estimates and :data:`REFUSED` names the others of the README's table, with why.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vlmcp.estimate.ops import ACC, gemma_rms, layer_norm, rms

__all__ = ["REFUSED", "TOWERS", "Tower", "tower_for"]


@dataclass(frozen=True, kw_only=True)
class Tower:
    """Saved bytes of a vision tower per ViT token (patch) and what one image or LLM token costs."""

    blocks: int
    """ViT blocks."""
    per_block: int
    """Bytes one block saves per ViT token."""
    checkpointed: int
    """Bytes one checkpointed block saves per ViT token (its input)."""
    once: int
    """Bytes per ViT token saved once (pixels, rotary tables, position interpolation, window order)."""
    rotary: int = 0
    """Of ``once``, the rotary tables' bytes, which checkpointed blocks do not save."""
    head: int
    """Bytes per ViT token of the merger or projector (and deepstack mergers), CLS tokens left out."""
    head_llm: int = 0
    """Bytes per visual LLM token of the projector beyond ``head`` (InternVL's, after the pixel shuffle)."""
    vit_per_llm_token: int
    """ViT tokens per visual LLM token (Qwen: spatial_merge_size**2; LLaVA: 1)."""
    per_image_vit: int = 0
    """ViT tokens per image beyond ``vit_per_llm_token`` per LLM token (LLaVA: the CLS token)."""
    per_image_once: int = 0
    """Bytes per image saved once (LLaVA: the pixels and the post-layernorm of the CLS token)."""
    llm_tokens_per_image: int | None = None
    """Fixed-size images: LLM tokens per image (LLaVA); None: any size (Qwen)."""
    fixed: int = 0
    """Bytes per forward with images that do not grow with them (Gemma's ``1 + w``)."""
    vit_per_image: int = 0
    """Tiled towers (LLaVA-NeXT): ViT tokens per tile, whatever the LLM tokens (unpadding and
    newlines make those differ); ``--images`` then counts tiles, and ``head`` is per tile patch.
    0: ViT tokens follow the LLM tokens (``vit_per_llm_token``)."""
    mask_bytes: int = 0
    """Bytes per element of an ``(n, n)`` attention mask over the rank's n ViT tokens, saved once,
    checkpointed or not (Pixtral's block-diagonal mask: quadratic in the patches); 0: none."""


def _qwen_tower(v: Any, b: int, e: int, *, block: int, head: int, once: int = 0, head_llm: int = 0) -> Tower:
    """A Qwen-VL-style ViT (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, GLM-4.1V) of width ``e``: ``v.depth``
    blocks of ``block`` bytes per patch (its input when checkpointed); saved once per patch, its
    pixels and the rotary table beside ``once``; ``spatial_merge_size**2`` patches per LLM token."""
    merge = v.spatial_merge_size ** 2
    pixels = b * v.in_channels * v.temporal_patch_size * v.patch_size ** 2
    rotary = 2 * b * (e // v.num_heads)
    return Tower(blocks=v.depth, per_block=block, checkpointed=b * e, once=pixels + rotary + once,
                 rotary=rotary, head=head, head_llm=head_llm, vit_per_llm_token=merge)


def _qwen2_vl(config: Any, b: int) -> Tower:
    v = config.vision_config
    if v.hidden_act != "quick_gelu":
        raise NotImplementedError(f"qwen2_vl: vision hidden_act {v.hidden_act!r} (the estimate knows "
                                  "quick_gelu)")
    e, m, heads = v.embed_dim, int(v.embed_dim * v.mlp_ratio), v.num_heads
    block = 2 * layer_norm(e, b) + 7 * b * e + ACC * heads + 3 * b * m  # q, k rotated, qkv, out, proj input
    return _qwen_tower(v, b, e, block=block, head=4 * b * e + 8)


def _qwen2_5_vl(config: Any, b: int) -> Tower:
    v = config.vision_config
    if v.hidden_act != "silu":
        raise NotImplementedError(f"qwen2_5_vl: vision hidden_act {v.hidden_act!r} (the estimate knows silu)")
    e, m, heads = v.hidden_size, v.intermediate_size, v.num_heads
    block = 2 * rms(e, b) + 7 * b * e + ACC * heads + 4 * b * m
    # the window permutation and its inverse, int64 per LLM token
    window_order = 2 * 8 // v.spatial_merge_size ** 2
    return _qwen_tower(v, b, e, block=block, once=window_order, head=ACC * e + ACC + 4 * b * e)


def _qwen3_vl(config: Any, b: int) -> Tower:
    v = config.vision_config
    if v.hidden_act != "gelu_pytorch_tanh":
        raise NotImplementedError(f"qwen3_vl: vision hidden_act {v.hidden_act!r} (the estimate knows "
                                  "gelu_pytorch_tanh)")
    e, m, heads = v.hidden_size, v.intermediate_size, v.num_heads
    block = 2 * layer_norm(e, b) + 7 * b * e + ACC * heads + 2 * b * m
    interpolation = 4 * 8 + 4 * b  # bilinear position embedding: 4 int64 indices and 4 weights per patch
    levels = len(getattr(v, "deepstack_visual_indexes", None) or ())
    deepstack = levels * (3 * b * e + 8 // v.spatial_merge_size ** 2)
    return _qwen_tower(v, b, e, block=block, once=interpolation, head=4 * b * e + 8 + deepstack)


def _clip_block(config: Any, b: int, arch: str) -> int:
    """Bytes one CLIP ViT block saves per ViT token (LLaVA's and LLaVA-NeXT's towers), its MLP's
    activation and the projector's checked."""
    v = config.vision_config
    mlp = {"quick_gelu": 3, "gelu": 2}.get(v.hidden_act)
    if mlp is None or config.projector_hidden_act != "gelu":
        raise NotImplementedError(f"{arch}: vision hidden_act {v.hidden_act!r}, projector "
                                  f"{config.projector_hidden_act!r} (the estimate knows quick_gelu or gelu, "
                                  "and gelu)")
    e, m, heads = v.hidden_size, v.intermediate_size, v.num_attention_heads
    return 2 * layer_norm(e, b) + 4 * b * e + ACC * heads + mlp * b * m  # q, k, v, out


def _llava(config: Any, b: int) -> Tower:
    v = config.vision_config
    if v.model_type != "clip_vision_model":
        raise NotImplementedError(f"llava: vision tower {v.model_type!r} (the estimate knows "
                                  "clip_vision_model)")
    if getattr(config, "vision_feature_select_strategy", "default") != "default":
        raise NotImplementedError(f"llava: vision_feature_select_strategy "
                                  f"{config.vision_feature_select_strategy!r} (the estimate knows 'default')")
    block = _clip_block(config, b, "llava")
    e, grid, h = v.hidden_size, (v.image_size // v.patch_size) ** 2, config.text_config.hidden_size
    # per ViT token: the pre-layernorm's input and statistics, the position id, the last block's output
    # (the post-layernorm reads its CLS row, a view); per LLM token: the projector's two activations
    # (b*h each), written per ViT token as there is one per LLM token; per image: pixels, the statistics
    return Tower(blocks=v.num_hidden_layers, per_block=block, checkpointed=b * e, once=2 * b * e + 8 + 8,
                 head=2 * b * h, vit_per_llm_token=1, per_image_vit=1,
                 per_image_once=b * v.num_channels * v.image_size ** 2 + 8, llm_tokens_per_image=grid)


def _pair(x) -> tuple[int, int]:
    return (x, x) if isinstance(x, int) else (int(x[0]), int(x[1]))


def _internvl(config: Any, b: int) -> Tower:
    v = config.vision_config
    for name, want in (("norm_type", "layer_norm"), ("use_qk_norm", False), ("hidden_act", "gelu"),
                       ("use_mean_pooling", True)):
        if getattr(v, name, want) != want:
            raise NotImplementedError(f"internvl: vision {name}={getattr(v, name)!r} (the estimate knows "
                                      f"{want!r})")
    if config.projector_hidden_act != "gelu" or config.vision_feature_select_strategy != "default":
        raise NotImplementedError(f"internvl: projector {config.projector_hidden_act!r}, feature strategy "
                                  f"{config.vision_feature_select_strategy!r} (the estimate knows gelu, "
                                  "default)")
    e, m, heads = v.hidden_size, v.intermediate_size, v.num_attention_heads
    (sh, sw), (ph, pw) = _pair(v.image_size), _pair(v.patch_size)
    grid = (sh // ph) * (sw // pw)
    shuffle = round(1 / config.downsample_ratio ** 2)  # patches per LLM token after the pixel shuffle
    if grid % shuffle:
        raise NotImplementedError(f"internvl: a {grid}-patch tile does not shuffle by {shuffle}")
    # LN, q, k, v, out, layer scale (lambda_1 * attn), LN, fc1, GELU, layer scale (lambda_2 * mlp)
    block = 2 * layer_norm(e, b) + 4 * b * e + ACC * heads + b * e + 2 * b * m + b * e
    h = config.text_config.hidden_size
    # projector: the pixel-shuffled copy and its LayerNorm's output (per patch), statistics and two
    # activations (per LLM token)
    return Tower(blocks=v.num_hidden_layers, per_block=block, checkpointed=b * e, once=0,
                 head=2 * b * e, head_llm=8 + 2 * b * h, vit_per_llm_token=shuffle, per_image_vit=1,
                 per_image_once=b * v.num_channels * sh * sw, llm_tokens_per_image=grid // shuffle)


def _gemma3(config: Any, b: int) -> Tower:
    v = config.vision_config
    if v.model_type != "siglip_vision_model" or v.hidden_act != "gelu_pytorch_tanh":
        raise NotImplementedError(f"gemma3: vision tower {v.model_type!r} with {v.hidden_act!r} (the "
                                  "estimate knows siglip_vision_model with gelu_pytorch_tanh)")
    if getattr(v, "vision_use_head", False):
        raise NotImplementedError("gemma3: vision_use_head=True (SigLIP's attention-pooling head, unused by "
                                  "Gemma 3's projector) is not estimated")
    e, m, heads = v.hidden_size, v.intermediate_size, v.num_attention_heads
    grid = (v.image_size // v.patch_size) ** 2
    tokens = config.mm_tokens_per_image
    if grid % tokens:
        raise NotImplementedError(f"gemma3: {grid} patches do not pool into {tokens} tokens")
    block = 2 * layer_norm(e, b) + 4 * b * e + ACC * heads + 2 * b * m  # no pre-layernorm in SigLIP
    # per patch: its position id; the post-layernorm's input and statistics, the average pool's input
    # (a transposed copy); per LLM token: mm_soft_emb_norm (Gemma's RMSNorm, then the projection matmul)
    return Tower(blocks=v.num_hidden_layers, per_block=block, checkpointed=b * e, once=8,
                 head=b * e + 8 + b * e, head_llm=gemma_rms(e, b, True), vit_per_llm_token=grid // tokens,
                 per_image_once=b * v.num_channels * v.image_size ** 2, llm_tokens_per_image=tokens,
                 fixed=ACC * e)


def _idefics3(config: Any, b: int) -> Tower:
    v, arch = config.vision_config, config.model_type
    if v.hidden_act != "gelu_pytorch_tanh":
        raise NotImplementedError(f"{arch}: vision hidden_act {v.hidden_act!r} (the estimate knows "
                                  "gelu_pytorch_tanh)")
    e, m, heads = v.hidden_size, v.intermediate_size, v.num_attention_heads
    grid, shuffle = (v.image_size // v.patch_size) ** 2, config.scale_factor ** 2
    if grid % shuffle:
        raise NotImplementedError(f"{arch}: a {grid}-patch tile does not shuffle by {shuffle}")
    block = 2 * layer_norm(e, b) + 4 * b * e + ACC * heads + 2 * b * m  # SigLIP's layer
    # per patch: its position id; the post-layernorm's input and statistics, the pixel shuffle's copy
    # (the connector's linear input)
    return Tower(blocks=v.num_hidden_layers, per_block=block, checkpointed=b * e, once=8,
                 head=b * e + 8 + b * e, vit_per_llm_token=shuffle,
                 per_image_once=b * v.num_channels * v.image_size ** 2, llm_tokens_per_image=grid // shuffle)


def _mistral3(config: Any, b: int) -> Tower:
    v = config.vision_config
    if v.model_type != "pixtral" or v.hidden_act != "gelu" or config.projector_hidden_act != "gelu":
        raise NotImplementedError(f"mistral3: vision tower {v.model_type!r} with {v.hidden_act!r}, projector "
                                  f"{config.projector_hidden_act!r} (the estimate knows pixtral, gelu, gelu)")
    e, m, heads = v.hidden_size, v.intermediate_size, v.num_attention_heads
    d = getattr(v, "head_dim", None) or e // heads
    merge = config.spatial_merge_size ** 2
    block = 2 * rms(e, b) + 4 * b * e + ACC * heads + 4 * b * m  # RMSNorms, SwiGLU (gelu-gated) MLP
    rotary = 2 * b * d
    # per patch: pixels, ln_pre (its output is block 0's input), the 2D rotary table; the projector's
    # RMSNorm and the patch merger's unfolded copy; per LLM token: the merging layer's output and two
    # activations
    return Tower(blocks=v.num_hidden_layers, per_block=block, checkpointed=b * e,
                 once=b * v.num_channels * v.patch_size ** 2 + ACC * e + ACC + b * e + rotary, rotary=rotary,
                 head=ACC * e + ACC + b * e + b * e, head_llm=b * e + 2 * b * config.text_config.hidden_size,
                 vit_per_llm_token=merge, mask_bytes=b)


def _glm4v(config: Any, b: int) -> Tower:
    v = config.vision_config
    if v.hidden_act != "silu":
        raise NotImplementedError(f"glm4v: vision hidden_act {v.hidden_act!r} (the estimate knows silu)")
    e, heads, out, ctx = v.hidden_size, v.num_heads, v.out_hidden_size, v.intermediate_size
    block = 2 * rms(e, b) + 7 * b * e + ACC * heads + 4 * b * out  # the block MLP is out_hidden_size wide
    # per patch: pixels, post_conv_layernorm (RMSNorm into the position add), the position
    # interpolation's (x, y) grid, the rotary table; post_layernorm and the downsample conv's
    # permuted input. Per LLM token: the conv's output, the projection's, its LayerNorm and GELU,
    # the merger's SwiGLU (intermediate_size wide)
    return _qwen_tower(v, b, e, block=block, once=ACC * e + ACC + b * e + 2 * b,
                       head=ACC * e + ACC + 2 * b * e, head_llm=4 * b * out + 8 + 4 * b * ctx)


def _llava_next(config: Any, b: int) -> Tower:
    v = config.vision_config
    if v.model_type != "clip_vision_model" or config.vision_feature_select_strategy != "default":
        raise NotImplementedError(f"llava_next: vision tower {v.model_type!r} with feature strategy "
                                  f"{config.vision_feature_select_strategy!r} (the estimate knows "
                                  "clip_vision_model, default)")
    block = _clip_block(config, b, "llava_next")
    e, grid, h = v.hidden_size, (v.image_size // v.patch_size) ** 2, config.text_config.hidden_size
    # per ViT token: the pre-layernorm's input and statistics, the last block's output; per tile
    # patch: the projector's input (a copy of the selected features) and its two activations; per
    # tile: pixels, the post-layernorm's statistics; once: the position ids of one tile
    return Tower(blocks=v.num_hidden_layers, per_block=block, checkpointed=b * e, once=2 * b * e + 8,
                 head=b * e + 2 * b * h, vit_per_llm_token=1, vit_per_image=grid + 1, per_image_vit=1,
                 per_image_once=b * v.num_channels * v.image_size ** 2 + 8, fixed=8 * (grid + 1))


TOWERS: dict[str, Callable[[Any, int], Tower]] = {
    "qwen2_vl": _qwen2_vl, "qwen2_5_vl": _qwen2_5_vl, "qwen3_vl": _qwen3_vl, "llava": _llava,
    "internvl": _internvl, "gemma3": _gemma3, "idefics3": _idefics3, "smolvlm": _idefics3,
    "mistral3": _mistral3, "glm4v": _glm4v, "llava_next": _llava_next}
"""``model_type`` -> the vision tower's recipe; the architectures ``vlmcp plan --model`` estimates."""

REFUSED = {
    "qwen3_vl_moe": "MoE language model (experts' routing saves per-expert tensors)",
    "qwen3_5": "Gated DeltaNet layers", "qwen3_5_moe": "Gated DeltaNet layers and MoE",
    "llava_onevision": "SigLIP 'full' features pooled by anyres_max (bilinear downsampling) not written yet",
    "kimi_k25": "MLA + MoE language model", "lfm2_vl": "short-convolution layers",
    "nemotron_h_omni": "Mamba-2 + MoE language model",
    "gemma4": "pooled patch tower, per-layer embeddings and MoE layers not written yet",
    "glm4v_moe": "MoE language model", "glm46v": "GLM-4.6V not written yet (dense or MoE language model)",
    "llama4": "chunked attention and MoE language model", "minimax_m3_vl": "MoE language model",
    "mistral4": "MLA + MoE language model (a mistral3 model whose text model is mistral4: refused by "
                "the text check)",
}
"""Architectures of the README's table the estimate refuses, and why."""


def tower_for(config: Any, b: int) -> Tower:
    """The vision tower of ``config``; raises ``NotImplementedError`` naming an architecture not estimated."""
    arch = config.model_type
    if arch in REFUSED:
        raise NotImplementedError(f"vlmcp plan --model: {arch} is not estimated: {REFUSED[arch]}")
    if arch not in TOWERS:
        raise NotImplementedError(f"vlmcp plan --model: model_type {arch!r} is not estimated (estimated: "
                                  f"{', '.join(TOWERS)})")
    return TOWERS[arch](config, b)
