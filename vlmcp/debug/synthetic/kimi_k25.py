"""Kimi-K2.5's images: MoonViT patches with ``image_grid_thw``, between ``<|media_begin|>`` and
``<|media_end|>``."""

from __future__ import annotations

import torch

from vlmcp.debug.synthetic.registry import register_images

__all__ = ["kimi_k25_images"]


@register_images("kimi_k25")
def kimi_k25_images(adapter, model, images, generator, *, markers=True):
    """Each image ``(t, h, w)``, its patch grid: random patches; tokens ``vision_start``,
    ``h*w / (kh*kw)`` image tokens, ``vision_end`` (``<|media_begin|>``/``<|media_end|>``)."""
    config = model.config
    p = int(config.vision_config.patch_size)
    grid = torch.tensor([[int(x) for x in image] for image in images], dtype=torch.long)
    pv = torch.randn(int(grid.prod(-1).sum()), 3, p, p, generator=generator, dtype=torch.float64)
    pixels = {"pixel_values": pv, "image_grid_thw": grid}
    run = [[int(config.vision_start_token_id)] + [adapter.image_token_id(config)] * k
           + [int(config.vision_end_token_id)] for k in adapter.image_tokens(model, pixels)]
    return pixels, run
