"""Qwen2-VL and Qwen2.5-VL: the ViT is ``model.visual`` (its last Linear ``merger.mlp[-1]``).

Inputs: ``pixel_values`` holds the patch rows of all images in order (image i has
``t*h*w`` rows of ``image_grid_thw[i]``) and each image gives ``t*h*w / merge**2`` LLM
tokens. Videos likewise: ``pixel_values_videos`` with ``video_grid_thw``, one contiguous
run of ``t*h*w / merge**2`` video tokens per video, frame group after frame group (rows
``t``-major), and Qwen2.5-VL's ``second_per_grid_ts`` (seconds per temporal patch group:
the spacing of the temporal position ids). The ViT attends within each temporal patch
group (``cu_seqlens`` of ``h*w`` per ``t``) and its rotary / window indices repeat per
``t``, so a video's frame groups run as independent ``(1, h, w)`` grids give the same
features: they are the ViT units of ``scatter`` (Note [vlmcp HF videos: frame groups are
visual units]). Positions are M-RoPE ``(3, L)`` from the model's own ``get_rope_index`` per
sample (it needs ``mm_token_type_ids``, 1 at image and 2 at video tokens, which
``shard_inputs`` consumes on the global row). Qwen2.5-VL's windowed ViT needs nothing
extra: it runs whole frames, with its own attention.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from vlmcp.hf.adapters.base import HFAdapter

__all__ = ["QWEN2_5_VL", "QWEN2_VL", "QwenVLAdapter"]


def _rows(pixels: Mapping[str, torch.Tensor], values: str, grid_key: str, what: str) -> torch.Tensor:
    """The checked ``(n, 3)`` grid of ``pixels[grid_key]`` (``pixels[values]`` has its patch rows)."""
    grid = pixels.get(grid_key)
    if grid is None or pixels.get(values) is None:
        raise ValueError(f"Qwen-VL {what} need both {values} and {grid_key}")
    grid = torch.as_tensor(grid)
    if grid.dim() != 2 or grid.shape[1] != 3:
        raise ValueError(f"{grid_key} must be (num_{what}, 3), got {tuple(grid.shape)}")
    rows = int(grid.prod(-1).sum())
    if pixels[values].shape[0] != rows:
        raise ValueError(f"{values} has {pixels[values].shape[0]} patch rows but {grid_key} "
                         f"{grid.tolist()} needs {rows}")
    return grid


def _spans(grid: torch.Tensor, index) -> list[tuple[int, int]]:
    """Patch-row spans ``[start, end)`` of the images (videos) ``index`` of ``grid (n, 3)``, in that order."""
    rows = grid.prod(-1)
    starts = torch.cumsum(rows, 0) - rows
    return [(int(starts[i]), int(starts[i] + rows[i])) for i in index]


def _take(pv: torch.Tensor, spans: list[tuple[int, int]]) -> torch.Tensor:
    take = [torch.arange(a, b) for a, b in spans]
    sel = torch.cat(take).to(pv.device) if take else torch.zeros(0, dtype=torch.long, device=pv.device)
    return pv.index_select(0, sel)


@dataclass(frozen=True, kw_only=True)
class QwenVLAdapter(HFAdapter):
    """Qwen2-VL / Qwen2.5-VL: images and videos."""

    pixel_keys: tuple[str, ...] = ("pixel_values", "image_grid_thw")
    consumed_keys: tuple[str, ...] = ("attention_mask", "mm_token_type_ids")
    video_keys: tuple[str, ...] = ("pixel_values_videos", "video_grid_thw")
    video_pixel_keys: tuple[str, ...] = ("pixel_values_videos", "video_grid_thw")
    vision_modules: tuple[str, ...] = ("model.visual",)
    projector_last: str | None = "model.visual.merger.mlp.2"

    def _merge(self, model) -> int:
        return int(model.config.vision_config.spatial_merge_size)

    def image_tokens(self, model, pixels: Mapping[str, torch.Tensor]) -> list[int]:
        grid = _rows(pixels, "pixel_values", "image_grid_thw", "images")
        return (grid.prod(-1) // self._merge(model) ** 2).tolist()

    def select_images(self, pixels, index):
        grid = torch.as_tensor(pixels["image_grid_thw"])
        return {"pixel_values": _take(pixels["pixel_values"], _spans(grid, index)),
                "image_grid_thw": grid[index]}

    def video_tokens(self, model, videos):
        grid = _rows(videos, "pixel_values_videos", "video_grid_thw", "videos")
        seconds = videos.get("second_per_grid_ts")
        if seconds is not None and torch.as_tensor(seconds).numel() != grid.shape[0]:
            raise ValueError(f"second_per_grid_ts has {torch.as_tensor(seconds).numel()} entries but "
                             f"video_grid_thw has {grid.shape[0]} videos")
        return (grid.prod(-1) // self._merge(model) ** 2).tolist()

    def select_videos(self, videos, index):
        grid = torch.as_tensor(videos["video_grid_thw"])
        out = {"pixel_values_videos": _take(videos["pixel_values_videos"], _spans(grid, index)),
               "video_grid_thw": grid[index]}
        if videos.get("second_per_grid_ts") is not None:
            seconds = torch.as_tensor(videos["second_per_grid_ts"])
            out["second_per_grid_ts"] = seconds[torch.as_tensor(index, dtype=torch.long).to(seconds.device)]
        return out

    def frame_groups(self, model, videos):
        grid = _rows(videos, "pixel_values_videos", "video_grid_thw", "videos")
        return [(int(t), int(h * w) // self._merge(model) ** 2) for t, h, w in grid.tolist()]

    def select_frames(self, videos, units):
        grid = torch.as_tensor(videos["video_grid_thw"])
        rows = grid.prod(-1)
        starts = (torch.cumsum(rows, 0) - rows).tolist()
        per_group = (grid[:, 1] * grid[:, 2]).tolist()
        spans = [(starts[v] + g * per_group[v], starts[v] + (g + 1) * per_group[v]) for v, g in units]
        one = grid[[v for v, _ in units]].clone() if units else grid[:0].clone()
        one[:, 0] = 1
        return {"pixel_values_videos": _take(videos["pixel_values_videos"], spans), "video_grid_thw": one}

    def dummy_images(self, model):
        vc = model.config.vision_config
        m = self._merge(model)
        width = vc.in_channels * vc.temporal_patch_size * vc.patch_size ** 2
        dtype = next(model.model.visual.parameters()).dtype
        return {"pixel_values": torch.zeros(m * m, width, dtype=dtype, device=model.device),
                "image_grid_thw": torch.tensor([[1, m, m]], device=model.device)}

    def position_ids(self, model, input_ids, token_type, pixels, videos=None):
        grid = pixels.get("image_grid_thw")
        videos = videos or {}
        vgrid = videos.get("video_grid_thw")
        extra = {}
        if videos.get("second_per_grid_ts") is not None:
            extra["second_per_grid_ts"] = videos["second_per_grid_ts"]
        pos, _ = model.model.get_rope_index(
            input_ids.unsqueeze(0), mm_token_type_ids=token_type.unsqueeze(0),
            image_grid_thw=None if grid is None or len(grid) == 0 else grid,
            video_grid_thw=None if vgrid is None or len(vgrid) == 0 else torch.as_tensor(vgrid).clone(),
            **extra)
        return pos[:, 0]  # (3, Ls)

    def model_position_ids(self, local):
        return local.unsqueeze(1)  # (3, 1, N): three rows, no text row (the mask is the plan's)


QWEN2_VL = QwenVLAdapter(name="qwen2_vl", model_types=("qwen2_vl",))
QWEN2_5_VL = QwenVLAdapter(name="qwen2_5_vl", model_types=("qwen2_5_vl",),
                           video_keys=("pixel_values_videos", "video_grid_thw", "second_per_grid_ts"))
