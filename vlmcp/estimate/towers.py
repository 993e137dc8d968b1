"""What one block of a VLM's language model or vision tower saves for backward, per token, from its config.

Note [vlmcp memory estimate: saved bytes per token]
---------------------------------------------------
Megatron-LM's theoretical memory report (``megatron/training/theoretical_memory_usage.py``,
``compute_activation_memory``, after Korthikanti et al. 2022, Table 2) writes a transformer's
activations as ``seq x hidden x (bytes per token per layer) x layers``, plus the embedding's
input and the output layer and loss, and its weights as a byte count per parameter. vlmcp keeps
that shape but counts what *these* kernels save, tensor by tensor, as
:class:`~vlmcp.checks.saved_tensors.SavedTensorMeter` sees it (each storage once; ``b`` the
dtype's bytes, ``h`` the width, ``nh``/``kv`` query and K/V heads of ``d``, ``f`` the MLP width)::

    RMSNorm + the linear after it   4h (fp32 copy of x) + 4 (rsqrt) + b*h (x*rsqrt in b)
                                    + b*h (weight * ..., the linear's input)
    LayerNorm + the linear after    b*h (x) + 8 (mean, rstd in fp32) + b*h (output)
    vlmcp attention                 q, k, v, out in b, lse in fp32: b*(2*nh*d + 2*kv*d) + 4*nh
    q/k RMSNorm (Qwen3)             (4 + b)*(nh + kv)*d + 4*(nh + kv)  (the normed q/k is rotated,
                                    and a rotation saves only cos and sin)
    SwiGLU MLP                      4*b*f  (gate, silu(gate), up, their product)
    GELU (tanh or erf) MLP          2*b*f  (fc1's output, the GELU's);  quick_gelu: 3*b*f

No dropout, no attention matrix (vlmcp's kernels keep the log-sum-exp, flash-style), no
Megatron ``18 + 4f/h`` with its bf16 masks: those are for Megatron's own kernels. Under
activation checkpointing (HF's, non-reentrant) a block saves only its input, ``b*h`` per token,
and backward recomputes one block at a time (its full set, a transient). The towers (ViTs and
their mergers) are written the same way per patch, in their module's functions below; an
architecture whose blocks are not written here is refused by name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["ACC", "REFUSED", "TOWERS", "TextBlocks", "Tower", "text_blocks", "tower_for"]

DENSE_TEXT_TYPES = ("qwen2_vl_text", "qwen2_5_vl_text", "qwen3_vl_text", "qwen2", "qwen3", "llama", "mistral")
"""Language models whose decoder layers are the dense Llama block (pre-norm RMSNorm, GQA, SwiGLU)."""

ACC = 4  # bytes of the fp32 statistics and copies the norms and the attention keep


def _rms(width: int, b: int) -> int:
    return ACC * width + ACC + 2 * b * width


def _layer_norm(width: int, b: int) -> int:
    return 2 * b * width + 8


@dataclass(frozen=True, kw_only=True)
class TextBlocks:
    """Saved bytes per token of the language model (Note [vlmcp memory estimate: saved bytes per token])."""

    layers: int
    """Decoder layers."""
    per_layer: int
    """Bytes one layer saves per token."""
    checkpointed: int
    """Bytes one checkpointed layer saves per token (its input)."""
    once: int
    """Bytes per token saved once per forward, without checkpointing (rotary cos and sin, the ids)."""
    once_checkpointed: int
    """The same under checkpointing (the ids)."""
    final_norm: int
    """The final norm's bytes per token."""
    hidden: int
    """H, the LM head's input width."""
    vocab: int
    """V, the LM head's output width."""
    softcap: float | None
    """The config's final logit softcap (the chunked loss' transient depends on it)."""


def _field(cfg: Any, name: str, arch: str) -> Any:
    value = getattr(cfg, name, None)
    if value is None:
        raise ValueError(f"{arch}: the text config has no {name!r}; the memory estimate needs it")
    return value


def text_blocks(config: Any, b: int) -> TextBlocks:
    """The language model's per-token bytes of ``config`` (a VLM config) at ``b`` bytes per element."""
    arch = config.model_type
    text = getattr(config, "text_config", None)
    if text is None:
        raise ValueError(f"{arch}: no text_config; vlmcp plan --model estimates vision-language models")
    if text.model_type not in DENSE_TEXT_TYPES:
        raise NotImplementedError(f"{arch}: its language model ({text.model_type}) is not a dense "
                                  f"Llama-style block the estimate knows ({', '.join(DENSE_TEXT_TYPES)})")
    for moe in ("num_experts", "n_routed_experts", "num_local_experts"):
        if getattr(text, moe, None):
            raise NotImplementedError(f"{arch}: {text.model_type} with {moe}={getattr(text, moe)} (MoE "
                                      "layers): not estimated")
    act = getattr(text, "hidden_act", "silu")
    if act != "silu":
        raise NotImplementedError(f"{arch}: text hidden_act {act!r}: the estimate knows SwiGLU (silu) "
                                  "MLPs only")
    h = _field(text, "hidden_size", arch)
    nh = _field(text, "num_attention_heads", arch)
    kv = getattr(text, "num_key_value_heads", None) or nh
    d = getattr(text, "head_dim", None) or h // nh
    f = _field(text, "intermediate_size", arch)
    per_layer = 2 * _rms(h, b) + b * (2 * nh * d + 2 * kv * d) + ACC * nh + 4 * b * f
    if text.model_type.startswith("qwen3"):  # q_norm and k_norm over each head
        per_layer += (ACC + b) * (nh + kv) * d + ACC * (nh + kv)
    ids = 8  # int64 input ids, saved by the embedding
    return TextBlocks(layers=_field(text, "num_hidden_layers", arch), per_layer=per_layer, checkpointed=b * h,
                      once=ids + 2 * b * d, once_checkpointed=ids, final_norm=_rms(h, b), hidden=h,
                      vocab=_field(text, "vocab_size", arch),
                      softcap=getattr(text, "final_logit_softcapping", None))


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


def _qwen_common(v: Any, b: int) -> tuple[int, int, int]:
    """Qwen ViTs: ``(patches per LLM token, pixel bytes per patch, heads)``."""
    merge = v.spatial_merge_size ** 2
    pixels = b * v.in_channels * v.temporal_patch_size * v.patch_size ** 2
    return merge, pixels, v.num_heads


def _qwen2_vl(config: Any, b: int) -> Tower:
    v = config.vision_config
    if v.hidden_act != "quick_gelu":
        raise NotImplementedError(f"qwen2_vl: vision hidden_act {v.hidden_act!r} (the estimate knows "
                                  "quick_gelu)")
    e, m = v.embed_dim, int(v.embed_dim * v.mlp_ratio)
    merge, pixels, heads = _qwen_common(v, b)
    block = 2 * _layer_norm(e, b) + 7 * b * e + ACC * heads + 3 * b * m  # q, k rotated, qkv, out, proj input
    rotary = 2 * b * (e // heads)
    return Tower(blocks=v.depth, per_block=block, checkpointed=b * e, once=pixels + rotary, rotary=rotary,
                 head=4 * b * e + 8, vit_per_llm_token=merge)


def _qwen2_5_vl(config: Any, b: int) -> Tower:
    v = config.vision_config
    if v.hidden_act != "silu":
        raise NotImplementedError(f"qwen2_5_vl: vision hidden_act {v.hidden_act!r} (the estimate knows silu)")
    e, m = v.hidden_size, v.intermediate_size
    merge, pixels, heads = _qwen_common(v, b)
    block = 2 * _rms(e, b) + 7 * b * e + ACC * heads + 4 * b * m
    window_order = 2 * 8 // merge  # the window permutation and its inverse, int64 per LLM token
    return Tower(blocks=v.depth, per_block=block, checkpointed=b * e,
                 once=pixels + 2 * b * (e // heads) + window_order, rotary=2 * b * (e // heads),
                 head=ACC * e + ACC + 4 * b * e,
                 vit_per_llm_token=merge)


def _qwen3_vl(config: Any, b: int) -> Tower:
    v = config.vision_config
    if v.hidden_act != "gelu_pytorch_tanh":
        raise NotImplementedError(f"qwen3_vl: vision hidden_act {v.hidden_act!r} (the estimate knows "
                                  "gelu_pytorch_tanh)")
    e, m = v.hidden_size, v.intermediate_size
    merge, pixels, heads = _qwen_common(v, b)
    block = 2 * _layer_norm(e, b) + 7 * b * e + ACC * heads + 2 * b * m
    interpolation = 4 * 8 + 4 * b  # bilinear position embedding: 4 int64 indices and 4 weights per patch
    deepstack = len(getattr(v, "deepstack_visual_indexes", None) or ()) * (3 * b * e + 8 // merge)
    return Tower(blocks=v.depth, per_block=block, checkpointed=b * e,
                 once=pixels + 2 * b * (e // heads) + interpolation, rotary=2 * b * (e // heads),
                 head=4 * b * e + 8 + deepstack,
                 vit_per_llm_token=merge)


def _llava(config: Any, b: int) -> Tower:
    v = config.vision_config
    if v.model_type != "clip_vision_model":
        raise NotImplementedError(f"llava: vision tower {v.model_type!r} (the estimate knows "
                                  "clip_vision_model)")
    if getattr(config, "vision_feature_select_strategy", "default") != "default":
        raise NotImplementedError(f"llava: vision_feature_select_strategy "
                                  f"{config.vision_feature_select_strategy!r} (the estimate knows 'default')")
    mlp = {"quick_gelu": 3, "gelu": 2}.get(v.hidden_act)
    if mlp is None or config.projector_hidden_act != "gelu":
        raise NotImplementedError(f"llava: vision hidden_act {v.hidden_act!r}, projector "
                                  f"{config.projector_hidden_act!r} (the estimate knows quick_gelu or gelu, "
                                  "and gelu)")
    e, m, heads = v.hidden_size, v.intermediate_size, v.num_attention_heads
    grid = (v.image_size // v.patch_size) ** 2
    block = 2 * _layer_norm(e, b) + 4 * b * e + ACC * heads + mlp * b * m  # q, k, v, out
    h = config.text_config.hidden_size
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
    block = 2 * _layer_norm(e, b) + 4 * b * e + ACC * heads + b * e + 2 * b * m + b * e
    h = config.text_config.hidden_size
    # projector: the pixel-shuffled copy and its LayerNorm's output (per patch), statistics and two
    # activations (per LLM token)
    return Tower(blocks=v.num_hidden_layers, per_block=block, checkpointed=b * e, once=0,
                 head=2 * b * e, head_llm=8 + 2 * b * h, vit_per_llm_token=shuffle, per_image_vit=1,
                 per_image_once=b * v.num_channels * sh * sw, llm_tokens_per_image=grid // shuffle)


TOWERS: dict[str, Callable[[Any, int], Tower]] = {
    "qwen2_vl": _qwen2_vl, "qwen2_5_vl": _qwen2_5_vl, "qwen3_vl": _qwen3_vl, "llava": _llava,
    "internvl": _internvl}
"""``model_type`` -> the vision tower's recipe; the architectures ``vlmcp plan --model`` estimates."""

REFUSED = {
    "qwen3_vl_moe": "MoE language model (experts' routing saves per-expert tensors)",
    "glm4v": "GLM-4 decoder layers (sandwich norms, fused gate_up) not written yet",
    "qwen3_5": "Gated DeltaNet layers", "qwen3_5_moe": "Gated DeltaNet layers and MoE",
    "llava_next": "anyres tiling (tiles per image depend on the image size)",
    "llava_onevision": "anyres tiling (tiles per image depend on the image size)",
"idefics3": "Idefics3 vision tower not written yet",
    "smolvlm": "Idefics3 vision tower not written yet", "mistral3": "Pixtral tower not written yet",
    "gemma3": "Gemma 3 decoder layers (four norms, softcap) and SigLIP tower not written yet",
    "kimi_k25": "MLA + MoE language model", "lfm2_vl": "short-convolution layers",
    "nemotron_h_omni": "Mamba-2 + MoE language model",
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
