"""LLaVA: a CLIP-style ``model.vision_tower`` and ``model.multi_modal_projector`` (last Linear ``linear_2``).

Inputs: ``pixel_values (n, 3, H, W)``, one row per image, each giving
``(image_size / patch_size)**2`` LLM tokens (plus one with the ``"full"`` feature
strategy, which keeps CLS). Positions are 1-D, restarting per sample. The processor's
``input_ids``, ``attention_mask`` and ``pixel_values`` are all it takes (the base
defaults); LLaVA-NeXT's ``image_sizes`` is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vlmcp.hf.adapters.base import HFAdapter

__all__ = ["LLAVA", "LlavaAdapter"]


@dataclass(frozen=True, kw_only=True)
class LlavaAdapter(HFAdapter):
    """LLaVA-1.5 style models (one fixed-size image per ``pixel_values`` row)."""

    vision_modules: tuple[str, ...] = ("model.vision_tower", "model.multi_modal_projector")
    projector_last: str | None = "model.multi_modal_projector.linear_2"

    def image_tokens(self, model, pixels):
        pv = pixels.get("pixel_values")
        if pv is None or pv.dim() != 4:
            raise ValueError("LLaVA pixel_values must be (num_images, channels, height, width), got "
                             f"{None if pv is None else tuple(pv.shape)}")
        vc = model.config.vision_config
        if tuple(pv.shape[2:]) != (vc.image_size, vc.image_size):
            raise ValueError(f"LLaVA pixel_values must be {vc.image_size}x{vc.image_size} images, got "
                             f"{tuple(pv.shape[2:])}")
        per = (vc.image_size // vc.patch_size) ** 2
        if model.config.vision_feature_select_strategy == "full":
            per += 1
        return [per] * pv.shape[0]

    def select_images(self, pixels, index):
        pv = pixels["pixel_values"]
        return {"pixel_values": pv[torch.as_tensor(index, dtype=torch.long, device=pv.device)]}

    def dummy_images(self, model):
        vc = model.config.vision_config
        w = model.model.multi_modal_projector.linear_1.weight
        return {"pixel_values": torch.zeros(1, vc.num_channels, vc.image_size, vc.image_size,
                                            dtype=w.dtype, device=w.device)}


LLAVA = LlavaAdapter(name="llava", model_types=("llava",))
