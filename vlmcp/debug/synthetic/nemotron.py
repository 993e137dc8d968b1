"""Nemotron-H-Omni's images: RADIO patch rows with ``image_grid_hw``, between ``<img>`` and ``</img>``."""

from __future__ import annotations

import torch

from vlmcp.debug.synthetic.registry import register_images

__all__ = ["nemotron_h_omni_images"]

_START, _END = 121, 122  # <img>, </img>


@register_images("nemotron_h_omni")
def nemotron_h_omni_images(adapter, model, images, generator, *, markers=True):
    """Each image ``(h, w)``: its patch grid (even sides), random patches; tokens ``<img>`` (121),
    ``h*w / 4`` placeholders, ``</img>`` (122)."""
    vc = model.config.vision_config
    width = int(vc.num_channels) * int(vc.patch_size) ** 2
    grid = torch.tensor([[int(h), int(w)] for h, w in images], dtype=torch.long)
    pv = torch.randn(int(grid.prod(-1).sum()), width, generator=generator, dtype=torch.float64)
    pixels = {"pixel_values": pv, "image_grid_hw": grid}
    image_id = adapter.image_token_id(model.config)
    return pixels, [[_START] + [image_id] * n + [_END] for n in adapter.image_tokens(model, pixels)]
