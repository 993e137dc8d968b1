"""Tiny random Hugging Face VLM configs, built in code (no hub download): one registry by model type.

For tests, ``vlmcp verify --model hf:ARCH`` and ``vlmcp init-model``: a couple of decoder layers,
a small hidden size, GQA in the LLM (2 K/V heads for 6 query heads where the family allows) and a
small ViT, so a float64 training step runs in milliseconds on a CPU. Each family file registers
its model types (:func:`~vlmcp.debug.tiny.registry.register_tiny`); :func:`tiny_config` builds
one, :func:`tiny_model` a seeded model of it, :func:`tiny_archs` lists them::

    tiny_config("qwen2_vl")                  -> Qwen2VLConfig
    tiny_model("llava", torch.float64)       -> a seeded LlavaForConditionalGeneration, eval mode
    tiny_arch("gemma3").samples              -> vlmcp verify's packed row in Gemma 3's image terms

Token ids: vocabulary 128, image token 120 (Qwen, Kimi-K2.5: video 121, vision start 122, vision
end 123; GLM: video 121, image start/end 122/123, video start/end 124/125; Gemma 3: start/end of
image 121/122; the any-resolution families: :mod:`.anyres`), pad 0.
"""

from __future__ import annotations

from typing import Any

import torch

from vlmcp.debug.tiny import (  # noqa: F401  (registration)
    anyres,
    gemma3,
    gemma4,
    glm,
    kimi_k25,
    lfm2_vl,
    llama4,
    llava,
    minimax,
    mistral4,
    nemotron,
    qwen,
)
from vlmcp.debug.tiny.registry import (
    DEFAULT_SAMPLES,
    VIDEO_ONLY_SAMPLES,
    VIDEO_SAMPLES,
    TinyArch,
    register_tiny,
    tiny_arch,
    tiny_archs,
)

__all__ = ["DEFAULT_SAMPLES", "VIDEO_ONLY_SAMPLES", "VIDEO_SAMPLES", "TinyArch", "register_tiny", "tiny_arch",
           "tiny_archs", "tiny_config", "tiny_model"]


def tiny_config(arch: str, **overrides: Any) -> Any:
    """A tiny random-weight transformers config of ``arch`` (a registered ``config.model_type``).

    Args:
        arch: one of :func:`tiny_archs`.
        **overrides: top-level config fields; ``text_config={...}`` and ``vision_config={...}``
            update the sub-configs field by field.
    """
    return tiny_arch(arch).build(dict(overrides))


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
        arch = arch_or_config if isinstance(arch_or_config, str) else config.model_type
        if arch in tiny_archs() and tiny_arch(arch).post_init is not None:
            tiny_arch(arch).post_init(model)
    return model.eval()
