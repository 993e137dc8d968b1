"""Qwen3-VL, Qwen3-VL-MoE, Qwen3.5 and Qwen3.5-MoE videos: ``Qwen3VLVideoProcessor``'s rules.

All four ship ``Qwen3VLProcessor`` with a ``Qwen3VLVideoProcessor``; vlmcp runs that video
processor's own code on the header (transformers 5.24 and 5.25 alike)::

    frames   its sample_frames on the header's metadata (total, fps, duration = total / fps):
             n = int(total / video_fps * fps), then min(max(n, min_frames), max_frames, total);
             linspace(0, total - 1, n) rounded (numpy: half to even); n need not be even
             (defaults: the video processor's fps 2, min_frames 4, max_frames 768)
    size     its smart_resize(n, H, W, T, F = patch * merge, lo, hi), which bounds the whole
             video, round(n / T) * T * H' * W', by [lo, hi]: lo = size["shortest_edge"],
             hi = size["longest_edge"] (with its cap_pixels_per_frame: hi = n * max(min(
             max_video_tokens * F^2, longest // n), int(1.05 * shortest))); vlmcp's flags:
             --video-total-pixels replaces longest_edge, --video-max-pixels caps hi at n times
             itself, --video-min-pixels sets lo to n times itself
    grid     (ceil(n / T), H' / patch, W' / patch): patchify repeats the last frame up to a
             multiple of T
    text     per frame group "<t seconds>" (the mean of its first and last frame's time, one
             decimal: the processor's _calculate_timestamps) + vision start + H'W' / (patch
             merge)^2 video pads + vision end: the processor's own replace_video_token; where it
             goes is the processor's own get_text_with_replacements (transformers 5.24 replaces
             the template's <|video_pad|> alone, 5.25 the template's vision start, pad and end:
             Note [vlmcp data: the processor's own expansion])

Frames given as images (no fps) take all their frames (past ``max_frames``, that many
evenly) at ``--video-fps`` (default the video processor's), which also dates them. The
pixels are :func:`vlmcp.data.hf.video.frames.patchified` (the processor's own ``patchify``).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

from vlmcp.data.hf.video.frames import patchified, video_processor_of
from vlmcp.data.hf.video.rules import VideoRules
from vlmcp.data.hf.video.sampling import VideoPlan, listed_frames

__all__ = ["QWEN3_VL", "Qwen3VLRules", "pixel_bounds"]


def pixel_bounds(vp, frames: int, sampling) -> tuple[int, int]:
    """``(lo, hi)``: the least and most pixels of a whole video of ``frames`` sampled frames (module doc)."""
    factor = vp.patch_size * vp.merge_size
    lo, hi = vp.size["shortest_edge"], vp.size["longest_edge"]
    if sampling.total_pixels is not None:
        hi = sampling.total_pixels
    elif getattr(vp, "cap_pixels_per_frame", None):  # the processor's own per-frame cap, as its resize
        per_frame = max(min(vp.max_video_tokens * factor * factor, hi // frames), int(lo * 1.05))
        hi = per_frame * frames
    if sampling.max_pixels is not None:
        hi = min(hi, sampling.max_pixels * frames)
    if sampling.min_pixels is not None:
        lo = sampling.min_pixels * frames
    return lo, hi


@dataclass(frozen=True, kw_only=True)
class Qwen3VLRules(VideoRules):
    """``Qwen3VLVideoProcessor``'s sampling and sizes, the processor's timestamps (module docstring)."""

    video_processor: str = "Qwen3VLVideoProcessor"
    """The video processor class whose config rules these videos."""

    def source(self, processor):
        return video_processor_of(processor, self.video_processor)

    def indices(self, vp, header, sampling) -> tuple[tuple[int, ...], float]:
        """The frames taken and the fps their times count at."""
        from transformers.video_utils import VideoMetadata

        fps = vp.fps if sampling.fps is None else sampling.fps
        sampler = copy.copy(vp)
        if sampling.min_frames is not None:
            sampler.min_frames = sampling.min_frames
        if sampling.max_frames is not None:
            sampler.max_frames = sampling.max_frames
        if header.fps is None:
            return listed_frames(header.frames, sampler.max_frames, 1), float(fps)
        metadata = VideoMetadata(total_num_frames=header.frames, fps=header.fps, height=header.height,
                                 width=header.width, duration=header.frames / header.fps)
        return tuple(int(i) for i in sampler.sample_frames(metadata, fps=fps)), header.fps

    def smart_resize(self):
        """The video processor module's own ``smart_resize``."""
        from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize

        return smart_resize

    def timestamps(self, processor, indices, fps: float, groups: int) -> tuple[float, ...]:
        """Each frame group's seconds, as the processor writes them (its ``_calculate_timestamps``)."""
        T = self.source(processor).temporal_patch_size
        stamps = processor._calculate_timestamps(list(indices), fps, T)
        return tuple(float(f"{s:.1f}") for s in stamps)

    def plan(self, processor, header, sampling):
        vp = self.source(processor)
        indices, fps = self.indices(vp, header, sampling)
        T, p, m = vp.temporal_patch_size, vp.patch_size, vp.merge_size
        lo, hi = pixel_bounds(vp, len(indices), sampling)
        height, width = self.smart_resize()(len(indices), header.height, header.width, temporal_factor=T,
                                            factor=p * m, min_pixels=lo, max_pixels=hi)
        grid = (math.ceil(len(indices) / T), height // p, width // p)
        return VideoPlan(indices=indices, total=header.frames, fps=fps, height=height, width=width,
                         grid_thw=grid, tokens=math.prod(grid) // m ** 2,
                         timestamps=self.timestamps(processor, indices, fps, grid[0]))

    def pixels(self, processor, frames, plan):
        import torch

        values, grid = patchified(self.source(processor), frames)
        return {"pixel_values_videos": values, "video_grid_thw": torch.tensor([grid])}


QWEN3_VL = Qwen3VLRules(name="qwen3_vl", processors=("Qwen3VLProcessor",))
