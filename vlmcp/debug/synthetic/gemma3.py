"""Gemma 3's images: fixed-size SigLIP images between ``<start_of_image>`` and ``<end_of_image>``."""

from __future__ import annotations

import torch

from vlmcp.debug.synthetic.registry import register_images

__all__ = ["gemma3_images"]


@register_images("gemma3")
def gemma3_images(adapter, model, images, generator, *, markers=True):
    """Each image ``()`` (any tuple: the size is fixed): random pixels; tokens
    ``<start_of_image>``, ``mm_tokens_per_image`` image tokens, ``<end_of_image>``."""
    config, vc = model.config, model.config.vision_config
    pv = torch.randn(len(images), vc.num_channels, vc.image_size, vc.image_size, generator=generator,
                     dtype=torch.float64)
    run = [int(config.boi_token_index)] + [adapter.image_token_id(config)] * int(config.mm_tokens_per_image)
    return {"pixel_values": pv}, [run + [int(config.eoi_token_index)] for _ in images]
