"""Llama 4's images: fixed-size tiles, one run of placeholders each, a separator between tiles."""

from __future__ import annotations

import torch

from vlmcp.debug.synthetic.registry import register_images

__all__ = ["llama4_images"]

_SEPARATOR = 121  # between an image's tiles


@register_images("llama4")
def llama4_images(adapter, model, images, generator, *, markers=True):
    """Each image ``(tiles,)``: that many random tiles, each a run of its placeholders; with
    ``markers``, ``<|image_start|>`` (``boi_token_index``) before and ``<|image_end|>`` after the image,
    and one separator token (121) after every tile but the last."""
    config, vc = model.config, model.config.vision_config
    counts = [int(image[0]) if image else 1 for image in images]
    pv = torch.randn(sum(counts), vc.num_channels, vc.image_size, vc.image_size, generator=generator,
                     dtype=torch.float64)
    tile = [adapter.image_token_id(config)] * adapter.image_tokens(model, {"pixel_values": pv[:1]})[0]
    ids = []
    for n in counts:  # each tile is one vlmcp image (one run of placeholders)
        run = [int(config.boi_token_index)] if markers else []
        for t in range(n):
            run += tile + ([_SEPARATOR] if t < n - 1 else [])
        ids.append(run + ([int(config.eoi_token_index)] if markers else []))
    return {"pixel_values": pv}, ids
