"""LFM2-VL's images: SigLIP2 NaFlex patch rows at each image's own size, masked padding."""

from __future__ import annotations

import torch

from vlmcp.debug.synthetic.registry import register_images

__all__ = ["lfm2_vl_images"]

_START, _END = 121, 122  # <|image_start|>, <|image_end|>


@register_images("lfm2_vl")
def lfm2_vl_images(adapter, model, images, generator, *, markers=True):
    """Each image ``(h, w)``: its patch grid (multiples of ``downsample_factor``), random patches padded
    to the sample's largest image. Tokens: ``<|image_start|>`` (121), the placeholders,
    ``<|image_end|>`` (122)."""
    config, vc = model.config, model.config.vision_config
    f = int(config.downsample_factor)
    width = int(vc.num_channels) * int(vc.patch_size) ** 2
    shapes = torch.tensor([[int(h), int(w)] for h, w in images], dtype=torch.long)
    if bool((shapes % f).any()) or bool((shapes <= 0).any()):
        raise ValueError(f"{adapter.name} synthetic images are (h, w) patch grids in positive multiples of "
                         f"downsample_factor {f}, got {[tuple(s) for s in shapes.tolist()]}")
    n = int(shapes.prod(-1).max())
    real = torch.arange(n)[None] < shapes.prod(-1)[:, None]
    pv = torch.randn(len(images), n, width, generator=generator, dtype=torch.float64) * real[..., None]
    ids = [[_START] + [adapter.image_token_id(config)] * k + [_END]
           for k in adapter.image_tokens(model, {"spatial_shapes": shapes})]
    return {"pixel_values": pv, "pixel_attention_mask": real.int(), "spatial_shapes": shapes}, ids
