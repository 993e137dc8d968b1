"""Qwen-VL patch rows: Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5, GLM-4.1V/4.5V/4.6V, MiniMax-M3-VL, and
the long tail's M-RoPE models.

An image ``(t, h, w)`` is its patch grid: ``t*h*w`` random patch rows and ``t*h*w / merge**2``
placeholders (``vision_config.spatial_merge_size``). A video ``(t, h, w[, seconds])`` is ``t`` frame
groups of ``h x w`` patches, written as each family's processor writes it (Note [vlmcp HF videos:
frame groups are visual units]).
"""

from __future__ import annotations

import torch

from vlmcp.debug.synthetic.registry import register_images, register_video
from vlmcp.hf.adapters.generic import MRopePlaceholderAdapter

__all__ = ["glm4v_video", "minimax_images", "mrope_images", "qwen2_vl_video", "qwen3_vl_video",
           "qwen_vl_images"]


def _merge(model) -> int:
    return int(model.config.vision_config.spatial_merge_size)


def _markers(config) -> tuple[list[int], list[int]]:
    """The tokens the processor writes around a visual run (GLM-4.1V names them image start / end)."""
    start = getattr(config, "vision_start_token_id", None)
    end = getattr(config, "vision_end_token_id", None)
    return ([config.image_start_token_id if start is None else start],
            [config.image_end_token_id if end is None else end])


def _patch_width(vc) -> int:
    """Values per patch row of a Qwen-VL ViT: channels x temporal patch x patch**2."""
    return vc.in_channels * vc.temporal_patch_size * vc.patch_size ** 2


def _minimax_width(vc) -> int:
    return int(vc.num_channels * vc.temporal_patch_size * vc.patch_size ** 2)


def _any_width(vc) -> int:
    """:func:`_patch_width` for a vision config outside the Qwen family (its fields named otherwise)."""
    channels = getattr(vc, "in_channels", None) or getattr(vc, "num_channels", 3)
    return channels * getattr(vc, "temporal_patch_size", 1) * vc.patch_size ** 2


def _patch_rows(model, grid, generator, width=_patch_width) -> torch.Tensor:
    t, h, w = grid
    return torch.randn(t * h * w, width(model.config.vision_config), generator=generator, dtype=torch.float64)


def _grid_images(adapter, model, images, generator, markers, width=_patch_width):
    grids = [tuple(int(x) for x in image) for image in images]
    pv = torch.cat([_patch_rows(model, g, generator, width) for g in grids])
    start, end = _markers(model.config) if markers else ([], [])
    tid = adapter.image_token_id(model.config)
    ids = [start + [tid] * (t * h * w // _merge(model) ** 2) + end for t, h, w in grids]
    return {"pixel_values": pv, "image_grid_thw": torch.tensor(grids, dtype=torch.long)}, ids


@register_images("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe", "glm4v",
                 "glm4v_moe", "glm46v")
def qwen_vl_images(adapter, model, images, generator, *, markers=True):
    """Each image ``(t, h, w)``, its patch grid: random patch rows; ``t*h*w / merge**2`` image
    tokens, wrapped in vision start / end with ``markers`` (as the chat template writes them)."""
    return _grid_images(adapter, model, images, generator, markers)


@register_images(MRopePlaceholderAdapter)
def mrope_images(adapter, model, images, generator, *, markers=True):
    """An M-RoPE model without an adapter: Qwen-VL's images, patch rows as wide as its vision config says."""
    return _grid_images(adapter, model, images, generator, markers, _any_width)


@register_images("minimax_m3_vl")
def minimax_images(adapter, model, images, generator, *, markers=True):
    """Qwen-VL's images without markers (the tiny models have none), rows of ``num_channels``."""
    return _grid_images(adapter, model, images, generator, False, _minimax_width)


def _video_pixels(adapter, model, video, generator) -> dict:
    t, h, w = (int(x) for x in video[:3])
    pixels = {"pixel_values_videos": _patch_rows(model, (t, h, w), generator),
              "video_grid_thw": torch.tensor([[t, h, w]], dtype=torch.long)}
    if "second_per_grid_ts" in adapter.video_keys:
        pixels["second_per_grid_ts"] = torch.tensor([float(video[3]) if len(video) > 3 else 1.0])
    return pixels


@register_video("qwen2_vl", "qwen2_5_vl")
def qwen2_vl_video(adapter, model, video, generator, text):
    """``(t, h, w[, seconds])``: random patch rows; one run of ``t*h*w / merge**2`` video tokens
    between vision start and end (Qwen2-VL's and Qwen2.5-VL's processor)."""
    pixels = _video_pixels(adapter, model, video, generator)
    t, h, w = (int(x) for x in video[:3])
    start, end = _markers(model.config)
    k = h * w // _merge(model) ** 2
    return pixels, [(start, 0), ([adapter.video_token_id(model.config)] * (t * k), 2), (end, 0)]


@register_video("qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe")
def qwen3_vl_video(adapter, model, video, generator, text):
    """``(t, h, w)``: random patch rows; per frame group a ``<x.x seconds>`` timestamp (3 random text
    tokens here), vision start, ``h*w / merge**2`` video tokens, vision end (Qwen3-VL's processor)."""
    pixels = _video_pixels(adapter, model, video, generator)
    t, h, w = (int(x) for x in video[:3])
    start, end = _markers(model.config)
    k = h * w // _merge(model) ** 2
    group = [([adapter.video_token_id(model.config)] * k, 2)]
    return pixels, [run for _ in range(t) for run in [(text(3), 0), (start, 0), *group, (end, 0)]]


@register_video("glm4v", "glm4v_moe", "glm46v")
def glm4v_video(adapter, model, video, generator, text):
    """``(t, h, w)``: random patch rows; video start, then per frame group image start, ``h*w /
    merge**2`` *image* placeholders (video tokens all the same), image end and a timestamp (1 random
    text token here), then video end (GLM-4.1V's processor)."""
    pixels = _video_pixels(adapter, model, video, generator)
    t, h, w = (int(x) for x in video[:3])
    config = model.config
    start, end = _markers(config)
    k = h * w // _merge(model) ** 2
    frames = [run for _ in range(t)
              for run in [(start, 0), ([adapter.image_token_id(config)] * k, 2), (end, 0), (text(1), 0)]]
    return pixels, [([config.video_start_token_id], 0), *frames, ([config.video_end_token_id], 0)]
