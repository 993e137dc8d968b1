"""The processor's own text expansion and call, with vlmcp's video pixels in place of its video processor.

transformers' video processors resize with torchvision, which is not installable for every
torch (CPU-only machines); vlmcp makes the pixels itself (:mod:`vlmcp.data.hf.video`, one
family per module), on every machine alike, so that the ranks of a CP group (and a run with
and without torchvision) build identical rows. The text is still the processor's: a shallow
copy of it gets :class:`FramesVideoProcessor` as its video processor, a stand-in that returns
the precomputed pixels, grids and metadata, so ``<|video_pad|>`` runs, Qwen3-VL's
``<t seconds>`` timestamps, GLM-4.1V's frame markers, ``mm_token_type_ids`` and Qwen2.5-VL's
``second_per_grid_ts`` all come from transformers' own code:

* planning (headers only): :func:`replacement_texts`, the processor's ``replace_video_token``
  on each plan's grid and metadata, put in place by its own ``get_text_with_replacements``
  (:mod:`vlmcp.data.hf.expand`);
* training: :func:`process`, the processor called with the pixels (the caller's processor is
  left as it was).
"""

from __future__ import annotations

import copy
import math

import torch

from vlmcp.data.hf.video import VideoRules, video_processors, video_rules
from vlmcp.data.hf.video.qwen2_vl import patching as _qwen2_patching
from vlmcp.data.hf.video.qwen2_vl import video_pixels
from vlmcp.data.hf.video.sampling import VideoPlan

__all__ = ["VIDEO_PROCESSORS", "FramesVideoProcessor", "patching", "process", "replacement_texts",
           "video_pixels"]

VIDEO_PROCESSORS: tuple[str, ...] = video_processors()
"""Processors whose videos vlmcp encodes (the registered families of :mod:`vlmcp.data.hf.video`)."""


def patching(processor):
    """The Qwen2-VL patching of ``processor``'s videos (its image processor's parameters).

    Raises:
        ValueError: a processor whose videos vlmcp does not encode.
    """
    video_rules(processor)
    return _qwen2_patching(processor)


class FramesVideoProcessor:
    """Stands in for a processor's video processor: returns pixels vlmcp made, and their metadata.

    Args:
        source: the sub-processor whose ``merge_size`` and ``temporal_patch_size`` the
            processor's expansion reads (the model's video processor, or Qwen2-VL's image processor).
        rules: the videos' family.
        plans: each video's plan, in the order of the ``videos`` the processor is called with.
        pixels: each video's inputs (:meth:`VideoRules.pixels`); None at planning (no pixels).
    """

    def __init__(self, source, rules: VideoRules, plans: list[VideoPlan],
                 pixels: list[dict] | None = None) -> None:
        self.rules, self.plans, self.pixels = rules, plans, pixels
        self.merge_size = getattr(source, "merge_size", None)
        self.temporal_patch_size = getattr(source, "temporal_patch_size", None)

    def outputs(self) -> dict:
        """What the video processor returns: the pixels (placeholders without them), grids, metadata."""
        out = {"video_metadata": [self.rules.metadata(plan) for plan in self.plans]}
        if self.plans[0].grid_thw is not None:
            out["video_grid_thw"] = torch.tensor([list(plan.grid_thw) for plan in self.plans])
        if self.pixels is None:  # planning: what the expansion reads of the pixels is their frame count
            out["pixel_values_videos"] = [[None] * len(plan.indices) for plan in self.plans]
            return out
        for plan, values in zip(self.plans, self.pixels, strict=True):
            grid = values.get("video_grid_thw")
            if grid is not None and tuple(grid[0].tolist()) != plan.grid_thw:
                raise ValueError(f"video grid {grid[0].tolist()}, planned {list(plan.grid_thw)}")
        out["pixel_values_videos"] = torch.cat([values["pixel_values_videos"] for values in self.pixels])
        return out

    def __call__(self, videos, **kwargs):
        from transformers import BatchFeature

        if len(videos) != len(self.plans):
            raise ValueError(f"{len(videos)} videos for {len(self.plans)} plans")
        return BatchFeature(self.outputs())


def _with_videos(processor, plans: list[VideoPlan], pixels: list[dict] | None):
    rules = video_rules(processor)
    out = copy.copy(processor)
    out.video_processor = FramesVideoProcessor(rules.source(processor), rules, plans, pixels)
    return out


def replacement_texts(processor, plans: list[VideoPlan]) -> list[str]:
    """The text the processor writes for each planned video (its own ``replace_video_token``).

    Raises:
        ValueError: a processor whose videos vlmcp does not encode.
    """
    if not plans:
        return []
    with_videos = _with_videos(processor, plans, None)
    inputs = with_videos.video_processor.outputs()
    return [with_videos.replace_video_token(inputs, video_idx=i) for i in range(len(plans))]


_PER_SAMPLE_IMAGES = ("LlavaOnevisionProcessor",)
"""Processors that read a flat image list as one image per sample (LLaVA-OneVision's
``batch_num_images``); they get the sample's images as one nested list."""


def process(processor, text: str, images: list, videos: list[tuple[dict, VideoPlan]]):
    """``processor(text=[text], images=..., videos=..., return_tensors="pt")`` with vlmcp's video pixels.

    Args:
        processor: the model's processor (left as it was).
        text: the chat template's text, one placeholder per image and video.
        images: PIL images.
        videos: per video, its inputs (:meth:`VideoRules.pixels`) and its plan.
    """
    if images and type(processor).__name__ in _PER_SAMPLE_IMAGES:
        images = [images]  # this one text's images: a multi-image sample, not images of several samples
    if not videos:
        return processor(text=[text], images=images or None, return_tensors="pt")
    plans = [plan for _, plan in videos]
    with_videos = _with_videos(processor, plans, [pixels for pixels, _ in videos])
    stand_ins = [torch.zeros(len(plan.indices), 1, 1, 3, dtype=torch.uint8).numpy() for plan in plans]
    out = with_videos(text=[text], images=images or None, videos=stand_ins, return_tensors="pt")
    if "second_per_grid_ts" in out:  # Qwen2.5-VL: T / sampled fps, one per video
        want = [processor.image_processor.temporal_patch_size / plan.sample_fps for plan in plans]
        if not all(math.isclose(float(a), b, rel_tol=1e-6) for a, b in zip(out["second_per_grid_ts"], want,
                                                                              strict=True)):
            raise ValueError(f"second_per_grid_ts {out['second_per_grid_ts'].tolist()}, expected {want}")
    return out
