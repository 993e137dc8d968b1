"""Benchmarks of Hugging Face VLMs under vlmcp (``vlmcp bench hf-memory``, ``hf-vision``, ``hf-loss``).

* :mod:`vlmcp.bench.hf.memory`: busiest rank's saved-for-backward bytes of one training
  step over one process, per ``image_strategy`` and vision mode, on a long-video row and
  on a packed image row;
* :mod:`vlmcp.bench.hf.vision`: ViT time per rank for one long video, ``replicate``
  against ``scatter`` (frame groups spread over the group);
* :mod:`vlmcp.bench.hf.loss`: what the LM head and its loss save for backward at a real
  vocabulary, full logits against the chunked loss.

Both build a scaled-down Qwen2-VL in code (:func:`bench_model`), so they run offline.
"""

from __future__ import annotations

import importlib.util
from typing import Any

__all__ = ["bench_model", "needs_transformers"]


def needs_transformers(name: str) -> bool:
    """True when transformers is missing (the caller skips, saying so on stderr)."""
    if importlib.util.find_spec("transformers") is not None:
        return False
    import sys

    print(f"vlmcp bench {name}: skipped: needs transformers (pip install 'vlmcp[hf]')", file=sys.stderr)
    return True


def bench_model(hidden: int = 512, layers: int = 4, vit_width: int = 256, vit_depth: int = 4,
                patch: int = 14, seed: int = 0, vocab: int = 128) -> Any:
    """A seeded float32 Qwen2-VL: an LLM of ``hidden`` width and ``layers`` layers (8 heads over 2
    K/V heads, SwiGLU 2x) and a ``vocab``-entry vocabulary, a ViT of ``vit_width`` and ``vit_depth``
    blocks on ``patch``-px patches."""
    from vlmcp.hf.debug.tiny import tiny_config, tiny_model

    heads = 8 if hidden % 8 == 0 and hidden >= 64 else 2
    config = tiny_config("qwen2_vl", text_config=dict(
        hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=2, max_position_embeddings=1 << 15, vocab_size=vocab), vision_config=dict(
        embed_dim=vit_width, depth=vit_depth, num_heads=4 if vit_width % 4 == 0 else 1, hidden_size=hidden,
        patch_size=patch))
    half = hidden // heads // 2  # M-RoPE sections (temporal, height, width) over head_dim / 2 frequencies
    config.text_config.rope_parameters = {**config.text_config.rope_parameters,
                                          "mrope_section": [half - 2 * (half // 4), half // 4, half // 4]}
    return tiny_model(config, seed=seed)
