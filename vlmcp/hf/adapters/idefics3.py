"""Idefics3 and SmolVLM: a SigLIP-style ViT (``model.vision_model``), pixel shuffle, ``model.connector``.

The language model is ``model.text_model``. Inputs: ``pixel_values (B, N, 3, H, W)``,
every image split into tiles (crops plus the downscaled global image), all padded to one
size; ``pixel_attention_mask (B, N, H, W)`` marks each tile's real pixels (the ViT masks
the padded patches and interpolates its positions over the real ones). Tiles whose
pixels are all zero are batch padding and dropped by the model, so vlmcp counts what the
model counts: each non-zero tile gives ``(H/patch) * (W/patch) / scale_factor**2`` tokens
(SmolVLM keeps the first tile when every one is zero). The tile is vlmcp's unit (token
counts, ``scatter``, whole placement), an image's tiles stay in order. Positions are 1-D.
The connector's only Linear, ``modality_projection.proj``, is the projector's last.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vlmcp.hf.adapters.base import HFAdapter, padded_cat

__all__ = ["IDEFICS3", "SMOLVLM", "Idefics3Adapter"]


@dataclass(frozen=True, kw_only=True)
class Idefics3Adapter(HFAdapter):
    """Idefics3 / SmolVLM: one ``pixel_values`` entry per tile, a fixed token count per real tile."""

    pixel_keys: tuple[str, ...] = ("pixel_values", "pixel_attention_mask")
    language_model: str = "model.text_model"
    vision_modules: tuple[str, ...] = ("model.vision_model", "model.connector")
    projector_last: str | None = "model.connector.modality_projection.proj"
    keeps_one_blank: bool = False
    """SmolVLM: a row whose tiles are all zero still runs its first tile (Idefics3 runs none)."""

    def _real(self, pv: torch.Tensor) -> torch.Tensor:
        """``BoolTensor[B*N]``: the tiles the model runs (not all zero), as it decides."""
        flat = pv.reshape(pv.shape[0] * pv.shape[1], -1)
        real = (flat == 0).sum(-1) != flat.shape[1]
        if self.keeps_one_blank and not bool(real.any()):
            real[0] = True
        return real.cpu()

    def image_tokens(self, model, pixels):
        pv = pixels.get("pixel_values")
        if pv is None or pv.dim() != 5:
            raise ValueError(f"{self.name} pixel_values must be (batch, tiles, channels, height, width), got "
                             f"{None if pv is None else tuple(pv.shape)}")
        mask = pixels.get("pixel_attention_mask")
        want = (*pv.shape[:2], *pv.shape[3:])
        if mask is not None and tuple(mask.shape) != want:
            raise ValueError(f"{self.name} pixel_attention_mask must be {want} like pixel_values' tiles, got "
                             f"{tuple(mask.shape)}")
        config = model.config
        patch, scale = int(config.vision_config.patch_size), int(config.scale_factor)
        h, w = pv.shape[3] // patch, pv.shape[4] // patch
        if h != w or h % scale:
            raise ValueError(f"{self.name} tiles must be square with a patch grid divisible by scale_factor "
                             f"{scale}; got {pv.shape[3]}x{pv.shape[4]} pixels")
        return [h * w // scale ** 2] * int(self._real(pv).sum())

    def select_images(self, pixels, index):
        if not pixels:
            return {}
        pv = pixels["pixel_values"]
        real = self._real(pv).nonzero()[:, 0]
        take = real[torch.as_tensor(index, dtype=torch.long)].to(pv.device)
        out = {"pixel_values": pv.flatten(0, 1)[take].unsqueeze(0)}
        mask = pixels.get("pixel_attention_mask")
        if mask is not None:
            out["pixel_attention_mask"] = mask.flatten(0, 1)[take.to(mask.device)].unsqueeze(0)
        return out

    def concat_images(self, parts):
        parts = [p for p in parts if p]
        keys = [k for k in self.pixel_keys if parts and k in parts[0]]  # tiles on dim 1, padded to h x w
        return {k: padded_cat([p[k].flatten(0, 1) for p in parts], (-2, -1)).unsqueeze(0) for k in keys}

    def dummy_images(self, model):
        vc = model.config.vision_config
        w = model.model.connector.modality_projection.proj.weight
        s = int(vc.image_size)
        # ones, not zeros: an all-zero tile is batch padding, which Idefics3 drops
        return {"pixel_values": torch.ones(1, 1, vc.num_channels, s, s, dtype=w.dtype, device=w.device),
                "pixel_attention_mask": torch.ones(1, 1, s, s, dtype=torch.bool, device=w.device)}

IDEFICS3 = Idefics3Adapter(name="idefics3", model_types=("idefics3",))
SMOLVLM = Idefics3Adapter(name="smolvlm", model_types=("smolvlm",), keeps_one_blank=True)
