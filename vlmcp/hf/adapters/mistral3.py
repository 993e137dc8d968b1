"""Mistral3 (Mistral Small 3.1): a Pixtral ViT at native resolution (``model.vision_tower``).

Inputs: ``pixel_values (images, 3, H, W)`` padded to the largest image and
``image_sizes (images, 2)``, each image's real height and width: the ViT crops every image
to its size, runs them as one sequence with attention within each image, and the
projector (``model.multi_modal_projector``: norm, ``patch_merger`` of
``spatial_merge_size``\\ :sup:`2` patches, ``linear_1``, ``linear_2``) gives
``(h // (patch * merge)) * (w // (patch * merge))`` tokens per image. So token counts,
and which images a subset takes (``scatter``, per-sample references), come from
``image_sizes``. The processor writes each image as rows of ``[IMG]`` tokens, each row
ended by ``[IMG_BREAK]`` and the last by ``[IMG_END]``: those two are text tokens (sharded
like text; only ``[IMG]`` is filled with features), so an image's placeholders are
several runs. Positions are 1-D.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vlmcp.hf.adapters.base import HFAdapter, padded_cat

__all__ = ["MISTRAL3", "Mistral3Adapter"]


@dataclass(frozen=True, kw_only=True)
class Mistral3Adapter(HFAdapter):
    """Mistral3: one padded ``pixel_values`` row per image, its size in ``image_sizes``."""

    pixel_keys: tuple[str, ...] = ("pixel_values", "image_sizes")
    vision_modules: tuple[str, ...] = ("model.vision_tower", "model.multi_modal_projector")
    projector_last: str | None = "model.multi_modal_projector.linear_2"

    def _unit(self, config) -> int:
        """Pixels per side of one LLM token (patch x spatial merge)."""
        return int(config.vision_config.patch_size) * int(config.spatial_merge_size)

    def image_tokens(self, model, pixels):
        pv, sizes = pixels.get("pixel_values"), pixels.get("image_sizes")
        if pv is None or sizes is None:
            raise ValueError("Mistral3 images need both pixel_values and image_sizes")
        sizes = torch.as_tensor(sizes)
        if pv.dim() != 4 or sizes.dim() != 2 or sizes.shape != (pv.shape[0], 2):
            raise ValueError(f"Mistral3 pixel_values must be (images, 3, H, W) and image_sizes (images, 2), "
                             f"got {tuple(pv.shape)} and {tuple(sizes.shape)}")
        if bool((sizes > torch.tensor(pv.shape[2:])).any()):
            raise ValueError(f"Mistral3 image_sizes {sizes.tolist()} exceed pixel_values' "
                             f"{tuple(pv.shape[2:])}")
        return (sizes // self._unit(model.config)).prod(-1).tolist()

    def select_images(self, pixels, index):
        if not pixels:
            return {}
        pv = pixels["pixel_values"]
        take = torch.as_tensor(index, dtype=torch.long)
        return {"pixel_values": pv[take.to(pv.device)],
                "image_sizes": torch.as_tensor(pixels["image_sizes"])[take]}

    def concat_images(self, parts):
        parts = [p for p in parts if p]
        if not parts:
            return {}
        return {"pixel_values": padded_cat([p["pixel_values"] for p in parts], (-2, -1)),
                "image_sizes": torch.cat([p["image_sizes"] for p in parts])}

    def dummy_images(self, model):
        vc = model.config.vision_config
        u = self._unit(model.config)
        w = model.model.multi_modal_projector.linear_1.weight
        # two tokens, not one: Mistral3Model.get_image_features squeezes a lone token's row away
        return {"pixel_values": torch.zeros(1, vc.num_channels, u, 2 * u, dtype=w.dtype, device=w.device),
                "image_sizes": torch.tensor([[u, 2 * u]], device=w.device)}

MISTRAL3 = Mistral3Adapter(name="mistral3", model_types=("mistral3",))
