"""LLaVA-OneVision videos: a fixed count of frames, uniformly, at the video processor's size.

LLaVA-OneVision was trained on videos sampled uniformly to a fixed frame count (LLaVA-NeXT's
``frames_upbound``, 32), and its video processor does not sample (``do_sample_frames`` False):
it takes the frames it is given and resizes each to its ``size`` (384x384 on the hub). So::

    frames   exactly n = --video-max-frames (default 32), at most --video-total-pixels / (S_h * S_w):
             np.linspace(0, total - 1, n, dtype=int) (LLaVA's own; a shorter video repeats frames)
    size     the video processor's size["height"] x size["width"], aspect ratio not kept
    pixels   pixel_values_videos (1, n, 3, S_h, S_w): its rescale and normalize (CLIP mean, std)
    text     the processor writes n * ceil(sqrt(num_image_tokens) / 2)^2 + 1 <video> tokens: every
             frame's features pooled 2x2, and one image_newline after the video

Every video of a row has the same n, which HF's ``get_video_features`` needs (one tensor of
videos). ``--video-fps``, ``--video-min-frames``, ``--video-min-pixels`` and
``--video-max-pixels`` do not apply to a fixed count of fixed-size frames: refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from vlmcp.data.hf.video.frames import normalized, video_processor_of
from vlmcp.data.hf.video.rules import VideoRules
from vlmcp.data.hf.video.sampling import VideoPlan

__all__ = ["FRAMES", "LLAVA_ONEVISION"]

FRAMES = 32
"""Frames of every video by default (LLaVA-NeXT's ``frames_upbound`` for OneVision)."""


@dataclass(frozen=True, kw_only=True)
class LlavaOnevisionRules(VideoRules):
    """A fixed count of frames at the video processor's fixed size (module docstring)."""

    def source(self, processor):
        return video_processor_of(processor, "LlavaOnevisionVideoProcessor")

    def check(self, processor, sampling):
        self.source(processor)
        refused = [f for f in sampling.given() if f not in ("--video-max-frames", "--video-total-pixels")]
        if refused:
            raise ValueError(f"{', '.join(refused)}: LLaVA-OneVision takes a fixed count of frames "
                             "(--video-max-frames) at its video processor's fixed size; these do not apply")

    def plan(self, processor, header, sampling):
        size = self.source(processor).size
        height, width = int(size["height"]), int(size["width"])
        n = FRAMES if sampling.max_frames is None else sampling.max_frames
        if sampling.total_pixels is not None:
            n = max(1, min(n, sampling.total_pixels // (height * width)))
        indices = tuple(int(i) for i in np.linspace(0, header.frames - 1, n, dtype=int))
        pooled = math.ceil(int(math.sqrt(processor.num_image_tokens)) / 2)
        fps = header.fps if header.fps is not None else 1.0
        return VideoPlan(indices=indices, total=header.frames, fps=fps, height=height, width=width,
                         grid_thw=None, tokens=n * pooled * pooled + 1)

    def pixels(self, processor, frames, plan):
        video = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2)
        return {"pixel_values_videos": normalized(self.source(processor), video)[None]}


LLAVA_ONEVISION = LlavaOnevisionRules(name="llava_onevision", processors=("LlavaOnevisionProcessor",))
