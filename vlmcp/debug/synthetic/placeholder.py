"""LLaVA-style images: the default of every adapter, and the long tail's placeholder models.

The default (any adapter without a writer of its own, LLaVA 1.5's): every image one fixed-size
``pixel_values`` row of ``vision_config.image_size``, :func:`~vlmcp.hf.adapters.base.fixed_image_tokens`
placeholders, no markers. A model without an adapter (:class:`~vlmcp.hf.PlaceholderAdapter`) gets as
many placeholders as its own ``get_image_features`` gives an image features.
"""

from __future__ import annotations

import torch

from vlmcp.debug.synthetic.registry import register_images
from vlmcp.hf.adapters import HFAdapter, PlaceholderAdapter
from vlmcp.hf.adapters.base import fixed_image_tokens

__all__ = ["fixed_size_images", "probed_images"]


@register_images(HFAdapter)
def fixed_size_images(adapter, model, images, generator, *, markers=True):
    """Each image any tuple (the size is fixed): random pixels; ``fixed_image_tokens`` placeholders."""
    vc = model.config.vision_config
    pv = torch.randn(len(images), vc.num_channels, vc.image_size, vc.image_size, generator=generator,
                     dtype=torch.float64)
    ids = [adapter.image_token_id(model.config)] * fixed_image_tokens(model.config)
    return {"pixel_values": pv}, [list(ids) for _ in images]


@register_images(PlaceholderAdapter)
def probed_images(adapter, model, images, generator, *, markers=True):
    """Random ``vision_config.image_size`` images; each one run of as many placeholders as the model's
    own ``get_image_features`` gives it features (probed once, without gradient)."""
    vc = model.config.vision_config
    side = vc.image_size if isinstance(vc.image_size, int) else vc.image_size[0]
    pv = torch.randn(len(images), getattr(vc, "num_channels", 3), side, side, generator=generator,
                     dtype=torch.float64)
    with torch.no_grad():
        dtype = next(model.parameters()).dtype
        feats = model.model.get_image_features(pixel_values=pv[:1].to(dtype))
    feats = getattr(feats, "pooler_output", feats)
    n = (feats[0] if isinstance(feats, (tuple, list)) else feats).reshape(-1, feats[0].shape[-1]).shape[0]
    return {"pixel_values": pv}, [[adapter.image_token_id(model.config)] * n for _ in images]
