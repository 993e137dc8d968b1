"""Nemotron-H-Omni (Nemotron 3 Nano Omni): a RADIO ViT, pixel shuffle, an MLP projector, a Nemotron-H LLM.

The top-level model owns everything (``base_model`` is the model itself): ``vision_model``
(RADIO, its input normalisation done by the processor), ``vision_final_layernorm`` (built only
when the language model has MTP layers, ``num_nextn_predict_layers > 0``),
``multi_modal_projector`` (RMSNorm, ``linear_1``, ReLU², ``linear_2``, the projector's last Linear)
and ``language_model``, a ``NemotronHForCausalLM`` whose blocks are Mamba-2 mixers (run under CP
by :mod:`vlmcp.hf.layers.mamba2`), attention without rotary embeddings, MoE and MLP layers. Its
``lm_head`` is the LM head; its forward casts the logits to float32, which the float32 loss of
:func:`vlmcp.hf.causal_lm_loss` passes through unchanged.

Images: ``pixel_values (patches, channels * patch**2)`` holds the patches of every image in order
(image i has ``h*w`` rows of ``image_grid_hw[i] = (h, w)``), each image at its own resolution; the
ViT attends within each image (``cu_seqlens`` per image) and interpolates its position table to
the image's grid, so images are independent ViT units. Pixel shuffle merges 2x2 patches, so an
image gives ``h*w / 4`` LLM tokens, which the processor writes between ``<img>`` and ``</img>``
(text tokens). Positions are 1-D (the LLM has no rotary embedding).

Refused by name: videos (``pixel_values_videos``: tubelets written with the image placeholder,
and Efficient Video Sampling drops tokens inside the forward, which a CP layout cannot follow)
and audio (``input_features``, ``input_features_mask``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from vlmcp.hf.adapters.base import HFAdapter

__all__ = ["NEMOTRON_H_OMNI", "NemotronHOmniAdapter"]

_MERGE = 2  # pixel shuffle of downsample_ratio 0.5: 2x2 patches per LLM token


@dataclass(frozen=True, kw_only=True)
class NemotronHOmniAdapter(HFAdapter):
    """Nemotron-H-Omni images: packed patch rows + ``image_grid_hw``, ``h*w / 4`` tokens each."""

    pixel_keys: tuple[str, ...] = ("pixel_values", "image_grid_hw")
    video_keys: tuple[str, ...] = ("pixel_values_videos",)
    base_model: str = ""
    language_model: str = "language_model"
    vision_modules: tuple[str, ...] = ("vision_model", "multi_modal_projector")
    projector_last: str | None = "multi_modal_projector.linear_2"
    lm_head: str = "language_model.lm_head"

    def vision_module_paths(self, model):
        norm = getattr(model, "vision_final_layernorm", None)
        return self.vision_modules + (("vision_final_layernorm",) if norm is not None else ())

    def _grid(self, model, pixels: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """``image_grid_hw`` (CPU, long), checked against ``pixel_values`` and the pixel shuffle."""
        grid, pv = pixels.get("image_grid_hw"), pixels.get("pixel_values")
        if grid is None or pv is None:
            raise ValueError(f"{self.name} images need both pixel_values and image_grid_hw")
        grid = torch.as_tensor(grid).cpu().long()
        if grid.dim() != 2 or grid.shape[1] != 2 or pv.dim() != 2 or pv.shape[0] != int(grid.prod(-1).sum()):
            raise ValueError(f"{self.name} pixel_values must be (patches, channels * patch**2) with one row "
                             f"per patch of image_grid_hw (images, 2); got {tuple(pv.shape)} and "
                             f"{tuple(grid.shape)}")
        ratio = float(model.config.downsample_ratio)
        if ratio != 1 / _MERGE:
            raise ValueError(f"{self.name}: downsample_ratio {ratio}: the model's get_image_features splits "
                             f"its features by {_MERGE}x{_MERGE} patches per token, only 0.5 is consistent")
        if bool((grid % _MERGE).any()) or bool((grid <= 0).any()):
            raise ValueError(f"{self.name} image_grid_hw {grid.tolist()}: each side must be a positive "
                             f"multiple of {_MERGE} (the pixel shuffle)")
        return grid

    def image_tokens(self, model, pixels):
        return (self._grid(model, pixels).prod(-1) // _MERGE ** 2).tolist()

    def select_images(self, pixels, index):
        if not pixels:
            return {}
        grid = torch.as_tensor(pixels["image_grid_hw"]).cpu().long()
        ends = torch.cumsum(grid.prod(-1), 0)
        rows = torch.cat([torch.arange(int(ends[i]) - int(grid[i].prod()), int(ends[i])) for i in index]) \
            if index else torch.zeros(0, dtype=torch.long)
        pv = pixels["pixel_values"]
        take = torch.as_tensor(index, dtype=torch.long)
        return {"pixel_values": pv[rows.to(pv.device)],
                "image_grid_hw": pixels["image_grid_hw"][take.to(pixels["image_grid_hw"].device)]}

    def dummy_images(self, model):
        vc = model.config.vision_config
        w = model.multi_modal_projector.linear_2.weight
        width = int(vc.num_channels) * int(vc.patch_size) ** 2
        return {"pixel_values": torch.zeros(_MERGE ** 2, width, dtype=w.dtype, device=w.device),
                "image_grid_hw": torch.tensor([[_MERGE, _MERGE]], device=w.device)}

NEMOTRON_H_OMNI = NemotronHOmniAdapter(name="nemotron_h_omni", model_types=("nemotron_h_omni",))
