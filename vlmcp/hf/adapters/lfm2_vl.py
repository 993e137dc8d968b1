"""LFM2-VL: a SigLIP2 NaFlex ViT (``model.vision_tower``), pixel unshuffle, ``model.multi_modal_projector``.

The language model (``model.language_model``) mixes LFM2's short convolutions, run under CP
by :mod:`vlmcp.hf.layers.short_conv`, with attention. Inputs are per image, each image at its own
size in patches, padded to the row's largest:

* ``pixel_values (N, max_patches, channels * patch**2)``: the patchified pixels;
* ``pixel_attention_mask (N, max_patches)``: which of them are real (the ViT masks the rest);
* ``spatial_shapes (N, 2)``: each image's patch grid ``(h, w)``, to which the ViT interpolates
  its position table.

The projector unshuffles ``downsample_factor x downsample_factor`` blocks of patches, so an
image gives ``(h // factor) * (w // factor)`` LLM tokens, computed from ``spatial_shapes`` as
the model's ``get_image_features`` does. The image is vlmcp's unit. Positions are 1-D. The
projector's last Linear is ``linear_2``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from vlmcp.hf.adapters.base import HFAdapter

__all__ = ["LFM2_VL", "Lfm2VlAdapter"]


@dataclass(frozen=True, kw_only=True)
class Lfm2VlAdapter(HFAdapter):
    """LFM2-VL: one ``pixel_values`` row per image; an ``(h, w)`` patch grid gives ``(h//f) * (w//f)``
    tokens."""

    pixel_keys: tuple[str, ...] = ("pixel_values", "pixel_attention_mask", "spatial_shapes")
    vision_modules: tuple[str, ...] = ("model.vision_tower", "model.multi_modal_projector")
    projector_last: str | None = "model.multi_modal_projector.linear_2"

    def image_tokens(self, model, pixels):
        shapes = pixels.get("spatial_shapes")
        pv = pixels.get("pixel_values")
        if shapes is None or shapes.dim() != 2 or shapes.shape[1] != 2:
            raise ValueError(f"{self.name} needs spatial_shapes (images, 2), got "
                             f"{None if shapes is None else tuple(shapes.shape)}")
        if pv is not None and (pv.dim() != 3 or pv.shape[0] != shapes.shape[0]):
            raise ValueError(f"{self.name} pixel_values must be (images, patches, channels * patch**2), one "
                             f"row per spatial_shapes entry ({shapes.shape[0]}); got {tuple(pv.shape)}")
        factor = int(model.config.downsample_factor)
        return (shapes.cpu().long() // factor).prod(-1).tolist()

    def select_images(self, pixels, index):
        if not pixels:
            return {}
        take = torch.as_tensor(index, dtype=torch.long)
        return {k: pixels[k][take.to(pixels[k].device)] for k in self.pixel_keys if k in pixels}

    def concat_images(self, parts):
        parts = [p for p in parts if p]
        if not parts:
            return {}
        n = max(p["pixel_values"].shape[1] for p in parts)

        def pad(k, x):  # patches on dim 1, padding masked out
            return x if k == "spatial_shapes" else F.pad(x, (0, 0) * (x.dim() - 2) + (0, n - x.shape[1]))

        return {k: torch.cat([pad(k, p[k]) for p in parts]) for k in self.pixel_keys if k in parts[0]}

    def dummy_images(self, model):
        config, vc = model.config, model.config.vision_config
        w = model.model.multi_modal_projector.linear_2.weight
        f = int(config.downsample_factor)
        width = int(vc.num_channels) * int(vc.patch_size) ** 2
        return {"pixel_values": torch.ones(1, f * f, width, dtype=w.dtype, device=w.device),
                "pixel_attention_mask": torch.ones(1, f * f, dtype=torch.int32, device=w.device),
                "spatial_shapes": torch.tensor([[f, f]], dtype=torch.long, device=w.device)}

LFM2_VL = Lfm2VlAdapter(name="lfm2_vl", model_types=("lfm2_vl",))
