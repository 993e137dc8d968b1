"""Tiny LFM2-VL: short convolutions in layers 0 and 2, attention in 1 and 3; SigLIP2 NaFlex images.

Images are ``(h, w)`` patch grids (2x2-pixel patches, unshuffled 2x2 into one token).
"""

from __future__ import annotations

from typing import Any

from vlmcp.debug.tiny.common import IMAGE_TOKEN, VOCAB
from vlmcp.debug.tiny.registry import register_tiny

__all__: list[str] = []


def _lfm2_vl(overrides: dict[str, Any]) -> Any:
    from transformers import Lfm2VlConfig

    # 4 attention heads (Ulysses at P = 2 and 4); SigLIP2 NaFlex in 2x2-px patches, a 4x4 position table
    # interpolated to each image's patch grid, 2x2 patches unshuffled into one token
    text = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                block_auto_adjust_ff_dim=False, layer_types=["conv", "full_attention"] * 2, pad_token_id=0,
                bos_token_id=1, eos_token_id=2)
    text.update(overrides.pop("text_config", {}))
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                  num_patches=16, patch_size=2, num_channels=3)
    vision.update(overrides.pop("vision_config", {}))
    kw = dict(text_config=text, vision_config=vision, image_token_id=IMAGE_TOKEN, projector_hidden_size=32,
              downsample_factor=2, tie_word_embeddings=False)
    kw.update(overrides)
    return Lfm2VlConfig(**kw)


register_tiny("lfm2_vl", _lfm2_vl, samples=((5, (2, 4), 9), (12,), (3, (4, 4), 4, (2, 2), 7)),
              summary="short convs in layers 0 and 2, attention in 1 and 3")
