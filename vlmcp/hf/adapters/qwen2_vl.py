"""Qwen2-VL and Qwen2.5-VL: the ViT is ``model.visual`` (its last Linear ``merger.mlp[-1]``).

Inputs: ``pixel_values`` holds the patch rows of all images in order (image i has
``t*h*w`` rows of ``image_grid_thw[i]``) and each image gives ``t*h*w / merge**2`` LLM
tokens. Positions are M-RoPE ``(3, L)`` from the model's own ``get_rope_index`` per
sample (it needs ``mm_token_type_ids``, 1 at image tokens, which ``shard_inputs`` consumes
on the global row). Qwen2.5-VL's windowed ViT needs nothing extra: it runs whole images,
with its own attention. Videos (``pixel_values_videos``, ``video_grid_thw``,
``second_per_grid_ts``) are refused for now.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from vlmcp.hf.adapters.base import HFAdapter

__all__ = ["QWEN2_5_VL", "QWEN2_VL", "QwenVLAdapter"]


@dataclass(frozen=True, kw_only=True)
class QwenVLAdapter(HFAdapter):
    """Qwen2-VL / Qwen2.5-VL (images; videos are not supported under CP yet)."""

    pixel_keys: tuple[str, ...] = ("pixel_values", "image_grid_thw")
    consumed_keys: tuple[str, ...] = ("attention_mask", "mm_token_type_ids")
    video_keys: tuple[str, ...] = ("pixel_values_videos", "video_grid_thw", "second_per_grid_ts")
    vision_modules: tuple[str, ...] = ("model.visual",)
    projector_last: str | None = "model.visual.merger.mlp.2"

    def _merge(self, model) -> int:
        return int(model.config.vision_config.spatial_merge_size)

    def image_tokens(self, model, pixels: Mapping[str, torch.Tensor]) -> list[int]:
        grid = pixels.get("image_grid_thw")
        if grid is None or pixels.get("pixel_values") is None:
            raise ValueError("Qwen-VL images need both pixel_values and image_grid_thw")
        grid = torch.as_tensor(grid)
        if grid.dim() != 2 or grid.shape[1] != 3:
            raise ValueError(f"image_grid_thw must be (num_images, 3), got {tuple(grid.shape)}")
        rows = int(grid.prod(-1).sum())
        if pixels["pixel_values"].shape[0] != rows:
            raise ValueError(f"pixel_values has {pixels['pixel_values'].shape[0]} patch rows but "
                             f"image_grid_thw {grid.tolist()} needs {rows}")
        return (grid.prod(-1) // self._merge(model) ** 2).tolist()

    def select_images(self, pixels, index):
        grid = torch.as_tensor(pixels["image_grid_thw"])
        rows = grid.prod(-1)
        starts = torch.cumsum(rows, 0) - rows
        pv = pixels["pixel_values"]
        take = [torch.arange(int(starts[i]), int(starts[i] + rows[i])) for i in index]
        sel = torch.cat(take).to(pv.device) if take else torch.zeros(0, dtype=torch.long, device=pv.device)
        return {"pixel_values": pv.index_select(0, sel), "image_grid_thw": grid[index]}

    def dummy_images(self, model):
        vc = model.config.vision_config
        m = self._merge(model)
        width = vc.in_channels * vc.temporal_patch_size * vc.patch_size ** 2
        dtype = next(model.model.visual.parameters()).dtype
        return {"pixel_values": torch.zeros(m * m, width, dtype=dtype, device=model.device),
                "image_grid_thw": torch.tensor([[1, m, m]], device=model.device)}

    def position_ids(self, model, input_ids, token_type, pixels):
        grid = pixels.get("image_grid_thw")
        pos, _ = model.model.get_rope_index(
            input_ids.unsqueeze(0), mm_token_type_ids=token_type.unsqueeze(0),
            image_grid_thw=None if grid is None or len(grid) == 0 else grid)
        return pos[:, 0]  # (3, Ls)

    def model_position_ids(self, local):
        return local.unsqueeze(1)  # (3, 1, N): three rows, no text row (the mask is the plan's)


QWEN2_VL = QwenVLAdapter(name="qwen2_vl", model_types=("qwen2_vl",))
QWEN2_5_VL = QwenVLAdapter(name="qwen2_5_vl", model_types=("qwen2_5_vl",))
