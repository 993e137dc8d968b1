"""What a VLM's language model saves for backward per token, from its config (Note [vlmcp memory
estimate: saved bytes per token] in :mod:`vlmcp.estimate.ops`).

One recipe per family of decoder layers: the dense Llama block (Qwen2/2.5/3-VL, LLaVA's,
InternVL's, Idefics3's, Mistral3's language models), Gemma 3's (four norms, q/k norms, gated GELU)
and GLM-4's (sandwich norms, fused gate_up).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vlmcp.estimate.ops import ACC, gemma_rms, rms

__all__ = ["DENSE_TEXT_TYPES", "TextBlocks", "text_blocks"]

DENSE_TEXT_TYPES = ("qwen2_vl_text", "qwen2_5_vl_text", "qwen3_vl_text", "qwen2", "qwen3", "llama", "mistral")
"""Language models whose decoder layers are the dense Llama block (pre-norm RMSNorm, GQA, SwiGLU)."""


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
    fixed: int = 0
    """Bytes per forward that do not grow with the tokens (Gemma's ``1 + w`` of every norm)."""
    fixed_checkpointed: int = 0
    """The same under checkpointing (outside the layers)."""
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
    if text.model_type == "gemma3_text":
        return _gemma3(arch, text, b)
    if text.model_type == "glm4v_text":
        return _glm4v(arch, text, b)
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
    per_layer = 2 * rms(h, b) + b * (2 * nh * d + 2 * kv * d) + ACC * nh + 4 * b * f
    if text.model_type.startswith("qwen3"):  # q_norm and k_norm over each head
        per_layer += (ACC + b) * (nh + kv) * d + ACC * (nh + kv)
    ids = 8  # int64 input ids, saved by the embedding
    return TextBlocks(layers=_field(text, "num_hidden_layers", arch), per_layer=per_layer, checkpointed=b * h,
                      once=ids + 2 * b * d, once_checkpointed=ids, final_norm=rms(h, b), hidden=h,
                      vocab=_field(text, "vocab_size", arch),
                      softcap=getattr(text, "final_logit_softcapping", None))


def _gemma3(arch: str, text: Any, b: int) -> TextBlocks:
    """Gemma 3's decoder layer: input, post-attention, pre- and post-feedforward RMSNorms, q/k norms,
    sliding and full attention (each with its rotary table), a gated GELU MLP. The VLM's forward
    applies no final logit softcap (Note [vlmcp HF causal LM loss: the chunked loss runs as the LM
    head]), so the loss has none."""
    act = getattr(text, "hidden_activation", None)
    if act != "gelu_pytorch_tanh":
        raise NotImplementedError(f"{arch}: text hidden_activation {act!r} (the estimate knows "
                                  "gelu_pytorch_tanh)")
    if getattr(text, "attn_logit_softcapping", None):
        raise NotImplementedError(f"{arch}: attn_logit_softcapping is not estimated")
    names = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size")
    h, nh, kv, d, f = (_field(text, n, arch) for n in names)
    per_layer = (2 * gemma_rms(h, b, True) + 2 * gemma_rms(h, b, False)  # input, pre-ff; post-attn, post-ff
                 + 2 * ACC * (nh + kv) * d + ACC * (nh + kv)  # q_norm, k_norm
                 + b * (2 * nh * d + 2 * kv * d) + ACC * nh + 4 * b * f)
    tables = len(set(getattr(text, "layer_types", None) or ["full_attention"]))  # one rotary table per type
    layers = _field(text, "num_hidden_layers", arch)
    outside = ACC * h + ACC  # the final norm's 1 + w; the embedding scale
    fixed = layers * ACC * (4 * h + 2 * d) + outside  # and 1 + w of each layer's norms
    return TextBlocks(layers=layers, per_layer=per_layer, checkpointed=b * h, once=8 + tables * 2 * b * d,
                      once_checkpointed=8, final_norm=gemma_rms(h, b, True), fixed=fixed,
                      fixed_checkpointed=outside, hidden=h,
                      vocab=_field(text, "vocab_size", arch), softcap=None)


def _glm4v(arch: str, text: Any, b: int) -> TextBlocks:
    """GLM-4's decoder layer: input and post-attention RMSNorms before the linears, sandwich norms after
    attention and MLP (post_self_attn, post_mlp: no linear reads them), a fused gate_up SwiGLU (its
    2f output one storage: 4*b*f in all), partial rotary."""
    if getattr(text, "hidden_act", "silu") != "silu":
        raise NotImplementedError(f"{arch}: text hidden_act {text.hidden_act!r} (the estimate knows silu)")
    names = ("hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size")
    h, nh, kv, f = (_field(text, n, arch) for n in names)
    d = getattr(text, "head_dim", None) or h // nh
    rope = getattr(text, "rope_parameters", None) or {}
    rot = int(d * rope.get("partial_rotary_factor", getattr(text, "partial_rotary_factor", 1.0)))
    sandwich = ACC * h + ACC + b * h  # fp32 x, rsqrt, x * rsqrt in b
    per_layer = 2 * rms(h, b) + 2 * sandwich + b * (2 * nh * d + 2 * kv * d) + ACC * nh + 4 * b * f
    return TextBlocks(layers=_field(text, "num_hidden_layers", arch), per_layer=per_layer, checkpointed=b * h,
                      once=8 + 2 * b * rot, once_checkpointed=8, final_norm=rms(h, b), hidden=h,
                      vocab=_field(text, "vocab_size", arch), softcap=None)
