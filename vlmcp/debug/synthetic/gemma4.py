"""Gemma 4's images: padded patch rows with their positions, pooled ``k x k``."""

from __future__ import annotations

import torch

from vlmcp.debug.synthetic.registry import register_images

__all__ = ["gemma4_images"]


@register_images("gemma4")
def gemma4_images(adapter, model, images, generator, *, markers=True):
    """Each image ``(h, w)`` in patches (multiples of the pooling kernel): random pixels padded to the
    sample's largest image; tokens ``<boi>``, ``h * w / k**2`` image tokens, ``<eoi>``."""
    config = model.config
    sizes = [(int(h), int(w)) for h, w in images]
    pixels = adapter.blank_patches(config, sizes, torch.float64)
    pv = pixels["pixel_values"]
    for i, (h, w) in enumerate(sizes):
        pv[i, :h * w] = torch.rand(h * w, pv.shape[-1], generator=generator, dtype=torch.float64)
    tid = adapter.image_token_id(config)
    ids = [[int(config.boi_token_id)] + [tid] * n + [int(config.eoi_token_id)]
           for n in adapter.image_tokens(model, pixels)]
    return pixels, ids
