"""Hugging Face VLMs under vlmcp (``vlmcp bench hf-memory``, ``hf-vision``, ``hf-loss``, ``hf-step``).

* :mod:`vlmcp.bench.hf.saved_bytes`: busiest rank's saved-for-backward bytes of one training
  step over one process, per ``image_strategy`` and vision mode, on a long-video row and
  on a packed image row;
* :mod:`vlmcp.bench.hf.vision`: ViT time per rank for one long video, ``replicate``
  against ``scatter`` (frame groups spread over the group);
* :mod:`vlmcp.bench.hf.loss`: what the LM head and its loss save for backward at a real
  vocabulary, full logits against the chunked loss.

They build a scaled-down Qwen2-VL (memory and vision: also Qwen3-VL or Qwen3.5, ``--arch``)
in code (:func:`bench_model`), so they run offline.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from vlmcp.deps import check_versions

__all__ = ["ARCHS", "bench_model", "needs_transformers"]

ARCHS = ("qwen2_vl", "qwen3_vl", "qwen3_5")
"""The architectures the HF benchmarks build (``--arch``)."""


def needs_transformers(name: str) -> bool:
    """True when transformers is missing (the caller skips, saying so on stderr)."""
    if importlib.util.find_spec("transformers") is not None:
        check_versions("transformers")
        return False
    import sys

    print(f"vlmcp bench {name}: skipped: needs transformers (pip install 'vlmcp[hf]')", file=sys.stderr)
    return True


def bench_model(hidden: int = 512, layers: int = 4, vit_width: int = 256, vit_depth: int = 4,
                patch: int = 14, seed: int = 0, vocab: int = 128, arch: str = "qwen2_vl") -> Any:
    """A seeded float32 ``arch`` (:data:`ARCHS`): an LLM of ``hidden`` width and ``layers`` layers (8
    heads over 2 K/V heads, SwiGLU 2x; Qwen3.5: three Gated DeltaNet layers in four, 4 key and 8
    value heads) and a ``vocab``-entry vocabulary, a ViT of ``vit_width`` and ``vit_depth`` blocks
    on ``patch``-px patches (Qwen3-VL: deepstack after its first block; Qwen3-VL and Qwen3.5:
    16x16 learned positions, interpolated)."""
    from vlmcp.debug.tiny import tiny_config, tiny_model

    if arch not in ARCHS:
        raise ValueError(f"--arch must be one of {ARCHS}, got {arch!r}")
    heads = 8 if hidden % 8 == 0 and hidden >= 64 else 2
    head_dim = hidden // heads
    text = dict(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=2, max_position_embeddings=1 << 15,
                vocab_size=vocab)
    vit_heads = 4 if vit_width % 4 == 0 else 1
    if arch == "qwen2_vl":
        vision = dict(embed_dim=vit_width, depth=vit_depth, num_heads=vit_heads, hidden_size=hidden,
                      patch_size=patch)
        rotary = head_dim
    else:
        vision = dict(hidden_size=vit_width, intermediate_size=2 * vit_width, depth=vit_depth,
                      num_heads=vit_heads, out_hidden_size=hidden, patch_size=patch,
                      num_position_embeddings=256)
        text["head_dim"] = head_dim
        rotary = head_dim
        if arch == "qwen3_vl":
            vision["deepstack_visual_indexes"] = [0]
        else:  # Qwen3.5: partial rotary (1/4 of each head), Gated DeltaNet heads of head_dim
            rotary = head_dim // 4
            text.update(linear_key_head_dim=head_dim, linear_value_head_dim=head_dim, linear_num_key_heads=4,
                        linear_num_value_heads=8, linear_conv_kernel_dim=4)
    config = tiny_config(arch, text_config=text, vision_config=vision)
    half = rotary // 2  # M-RoPE sections (temporal, height, width) over the rotary frequencies
    config.text_config.rope_parameters = {**config.text_config.rope_parameters,
                                          "mrope_section": [half - 2 * (half // 4), half // 4, half // 4]}
    return tiny_model(config, seed=seed)
