"""LLaVA: a CLIP-style ``model.vision_tower`` and ``model.multi_modal_projector`` (last Linear ``linear_2``).

Inputs: ``pixel_values (n, 3, H, W)``, one row per image, each giving
``(image_size / patch_size)**2`` LLM tokens (plus one with the ``"full"`` feature
strategy, which keeps CLS). Positions are 1-D, restarting per sample. The processor's
``input_ids``, ``attention_mask`` and ``pixel_values`` are all it takes (the base
defaults); LLaVA-NeXT's ``image_sizes`` is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from vlmcp.hf.adapters.base import HFAdapter, blank_image, fixed_image_tokens, fixed_size_images, select_rows

__all__ = ["LLAVA", "LlavaAdapter"]


@dataclass(frozen=True, kw_only=True)
class LlavaAdapter(HFAdapter):
    """LLaVA-1.5 style models (one fixed-size image per ``pixel_values`` row)."""

    vision_modules: tuple[str, ...] = ("model.vision_tower", "model.multi_modal_projector")
    projector_last: str | None = "model.multi_modal_projector.linear_2"

    def image_tokens(self, model, pixels):
        return [fixed_image_tokens(model.config)] * fixed_size_images(pixels, model.config, "LLaVA").shape[0]

    def select_images(self, pixels, index):
        return select_rows(pixels, index)

    def dummy_images(self, model):
        side = model.config.vision_config.image_size
        return blank_image(model.config, model.model.multi_modal_projector.linear_1.weight, side, side)


LLAVA = LlavaAdapter(name="llava", model_types=("llava",))
