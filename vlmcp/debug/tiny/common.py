"""What every tiny config shares: a small GQA language model and the token ids of the rows."""

from __future__ import annotations

from typing import Any

__all__ = ["IMAGE_TOKEN", "VOCAB", "text_config"]

VOCAB = 128
IMAGE_TOKEN = 120
"""The image placeholder; Qwen-style models: video 121, vision start 122, vision end 123."""


def text_config(**overrides: Any) -> dict[str, Any]:
    """The tiny language model's fields: 2 layers, hidden 48, 6 query heads over 2 K/V heads (GQA:
    Ulysses and ``hidden_shard`` work at P = 2 and 3), vocabulary :data:`VOCAB`; ``overrides`` win."""
    text = dict(vocab_size=VOCAB, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=512,
                rms_norm_eps=1e-6, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    text.update(overrides)
    return text
