"""Kimi-K2.5: a MoonViT ``model.vision_tower``, ``model.mm_projector``, a DeepSeek-V3 (MLA + MoE) LLM.

Inputs: ``pixel_values (patches, 3, p, p)`` holds the patch rows of all images in order
(image i has ``t*h*w`` rows of ``image_grid_thw[i]``, as Qwen-VL's, but each row a
``3 x p x p`` patch rather than a flat vector). The ViT attends within each image
(``cu_seqlens`` per image) and its positions (an interpolated learned table and an axial
rotary) depend on the image's own grid only, so the images are independent ViT units.
``temporal_merge`` averages the ``t`` frames and groups each ``kh x kw`` block
(``vision_config.merge_kernel_size``): an image gives ``h*w / (kh*kw)`` LLM tokens, read
from ``image_grid_thw`` alone. The projector ends in ``mm_projector.out_proj``, an
``nn.Linear`` (so ``hidden_shard`` works).

The language model's attention is DeepSeek-V3's MLA (Note [vlmcp HF token mixers]): K and
the query have ``qk_nope_head_dim + qk_rope_head_dim`` per head, V ``v_head_dim``, all
heads expanded before the attention interface, which ``cp_attention`` takes as they are.
Positions are 1-D. Videos (timestamped chunks) are not supported by this adapter.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from vlmcp.hf.adapters.qwen2_vl import QwenVLAdapter, _rows

__all__ = ["KIMI_K25", "KimiK25Adapter"]


@dataclass(frozen=True, kw_only=True)
class KimiK25Adapter(QwenVLAdapter):
    """Kimi-K2.5 images (``pixel_values`` patch rows + ``image_grid_thw``), 1-D positions."""

    video_keys: tuple[str, ...] = ()
    video_pixel_keys: tuple[str, ...] = ()
    vision_modules: tuple[str, ...] = ("model.vision_tower", "model.mm_projector")
    projector_last: str | None = "model.mm_projector.out_proj"

    def _kernel(self, model) -> tuple[int, int]:
        kh, kw = model.config.vision_config.merge_kernel_size
        return int(kh), int(kw)

    def image_tokens(self, model, pixels: Mapping[str, torch.Tensor]) -> list[int]:
        grid = _rows(pixels, "pixel_values", "image_grid_thw", "images")
        kh, kw = self._kernel(model)
        if bool(((grid[:, 1] % kh) != 0).any() or ((grid[:, 2] % kw) != 0).any()):
            raise ValueError(f"Kimi-K2.5 image_grid_thw {grid.tolist()}: h and w must be multiples of "
                             f"merge_kernel_size ({kh}, {kw})")
        return (grid[:, 1] * grid[:, 2] // (kh * kw)).tolist()

    def dummy_images(self, model):
        kh, kw = self._kernel(model)
        p = int(model.config.vision_config.patch_size)
        dtype = next(model.model.vision_tower.parameters()).dtype
        return {"pixel_values": torch.zeros(kh * kw, 3, p, p, dtype=dtype, device=model.device),
                "image_grid_thw": torch.tensor([[1, kh, kw]], device=model.device)}

    def position_ids(self, model, input_ids, token_type, pixels, videos=None):
        return torch.arange(input_ids.numel(), device=input_ids.device).unsqueeze(0)

    def model_position_ids(self, local):
        return local


KIMI_K25 = KimiK25Adapter(name="kimi_k25", model_types=("kimi_k25",))
