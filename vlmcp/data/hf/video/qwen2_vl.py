"""Qwen2-VL and Qwen2.5-VL videos: qwen-vl-utils' sampling, pixels from the image processor.

vlmcp samples these videos the way qwen-vl-utils' ``fetch_video`` does (what Qwen2-VL and
Qwen2.5-VL were trained with, and what ms-swift uses), with T the model's temporal patch
size (2) and F = patch_size * merge_size (28 for Qwen2-VL)::

    frames   n = total / video_fps * fps, clamped to [ceil_T(min_frames), floor_T(min(max_frames, total))]
                 and to total, then floored to a multiple of T; fewer than T frames: refused
                 (defaults fps 2, min_frames 4, max_frames 768)
    which    linspace(0, total - 1, n), rounded (torch's round: half to even)
    size     min_px = min_pixels (default 128 * F^2)
             max_px = max(min(max_pixels (768 * F^2), total_pixels (0.9 * 128000 * F^2) / n * T),
                          int(1.05 * min_px))
             both then bounded by the model's own [min_pixels, max_pixels] (its image processor's,
             which transformers' Qwen2-VL video processor shares), and
             (H', W') = smart_resize(H, W, F, min_px, max_px), the image processor's own rule
    tokens   (n / T) * (H' / patch) * (W' / patch) / merge^2
    fps      sampled fps = n / total * video_fps; Qwen2.5-VL's second_per_grid_ts = T / sampled fps

A video given as frames takes all its frames, the last repeated up to a multiple of T
(qwen-vl-utils' rule), or, past ``max_frames``, ``floor_T(max_frames)`` of them evenly
(vlmcp's rule: qwen-vl-utils takes them all).

Note [vlmcp data: video pixels from the image processor]
--------------------------------------------------------
transformers' ``Qwen2VLVideoProcessor`` needs torchvision, which is not installable for
every torch (CPU-only machines). vlmcp makes the same inputs from the model's image
processor instead, on every machine alike, so that the ranks of a CP group (and a run
with and without torchvision) build identical rows. A still image is a video of T
identical frames: the image processor writes each patch row as ``(C, T, p, p)`` with the
frame repeated over T. A video's row holds T consecutive frames there instead::

    frames uint8[n, H', W', 3], resized by vlmcp.data.hf.video.decode_frames
      -> image processor, do_resize=False (its own rescale and normalize), T at a time
         rows (n, H'/pm, W'/pm, m, m, C, T, p, p), each frame repeated over T      (m = merge)
      -> keep each frame once, group the frames T by T
         (t, T, H'/pm, W'/pm, m, m, C, p, p)       t = n / T
      -> (t, H'/pm, W'/pm, m, m, C, T, p, p)  ->  pixel_values_videos [t * H'/p * W'/p, C*T*p*p]

which is ``Qwen2VLVideoProcessor.patchify``'s layout, with ``video_grid_thw = (t, H'/p, W'/p)``.
So two identical frames give exactly the image processor's rows for that frame.

What is exact (``tests/test_video_data.py``): two identical frames give the image
processor's rows for that frame bit for bit. Against transformers' own
``Qwen2VLVideoProcessor`` (its module run without torchvision; ``tvF.normalize`` is
``(x - mean) / std``) on the same sampled, resized frames: the same ``video_grid_thw`` and
layout, values within 2e-6 (it fuses the 1/255 rescale into mean and std: float32
rounding), the same token count (``get_num_of_video_patches``) and frame count. What is not:
the resize (PIL's bicubic here, the image processor's; torchvision's antialiased bicubic
in qwen-vl-utils and the video processor: at most 1 level of 255 apart where a frame is
resized, measured on 480x640 -> 476x644 and the like), the video processor's own frame
picks (``arange(0, total, total / n)``; here qwen-vl-utils' ``linspace(0, total - 1, n)``
rounded: the same n frames, other indices) and its own size bounds (without
qwen-vl-utils' per-video pixel budget unless ``cap_pixels_per_frame``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from vlmcp.data.hf.video.rules import VideoRules
from vlmcp.data.hf.video.sampling import (
    VideoHeader,
    VideoPlan,
    VideoSampling,
    ceil_to,
    floor_to,
    listed_frames,
)

__all__ = ["QWEN2_VL", "Patching", "frame_bounds", "patching", "plan_video", "sample_indices", "video_pixels"]

FPS, MIN_FRAMES, MAX_FRAMES = 2.0, 4, 768
"""qwen-vl-utils' ``FPS``, ``FPS_MIN_FRAMES``, ``FPS_MAX_FRAMES``: the defaults of an unset flag."""
VIDEO_MIN_TOKENS = 128
"""qwen-vl-utils' ``VIDEO_MIN_TOKEN_NUM``: the default least pixels of a frame, in F^2 units."""
VIDEO_MAX_TOKENS = 768
"""qwen-vl-utils' ``VIDEO_MAX_TOKEN_NUM``: the default most pixels of a frame, in F^2 units."""
MODEL_SEQ_LEN = 128000
"""qwen-vl-utils' ``MODEL_SEQ_LEN``: a video's default pixel budget is 90% of this many F^2 units."""


class Patching(NamedTuple):
    """What a model's image processor says about patches (Qwen2-VL's parameters)."""

    patch_size: int
    merge_size: int
    temporal_patch_size: int
    min_pixels: int
    """The image processor's least pixels (``size["shortest_edge"]``)."""
    max_pixels: int
    """The image processor's most pixels (``size["longest_edge"]``)."""
    resample: int
    """PIL's resampling filter, as the image processor resizes."""

    @property
    def factor(self) -> int:
        """F: image sides are multiples of it after resizing."""
        return self.patch_size * self.merge_size


def patching(processor) -> Patching:
    """The patching of a Qwen2-VL-style processor's videos (its image processor's parameters)."""
    ip = processor.image_processor
    return Patching(patch_size=ip.patch_size, merge_size=ip.merge_size,
                    temporal_patch_size=ip.temporal_patch_size, min_pixels=ip.size["shortest_edge"],
                    max_pixels=ip.size["longest_edge"], resample=int(ip.resample))


def sample_indices(header: VideoHeader, sampling: VideoSampling, temporal: int) -> tuple[int, ...]:
    """The frames taken from a video (module docstring).

    Raises:
        ValueError: a video with fewer frames than ``temporal`` to take.
    """
    fps = FPS if sampling.fps is None else sampling.fps
    min_frames = MIN_FRAMES if sampling.min_frames is None else sampling.min_frames
    max_frames = MAX_FRAMES if sampling.max_frames is None else sampling.max_frames
    total = header.frames
    if header.fps is None:  # frames given as images: all of them, or max_frames of them evenly
        return listed_frames(total, max_frames, temporal)
    least = ceil_to(min_frames, temporal)
    most = floor_to(min(max_frames, total), temporal)
    n = floor_to(min(max(total / header.fps * fps, least), most, total), temporal)
    if n < temporal:
        raise ValueError(f"{total} frame(s): too few to take {temporal}")
    return tuple(torch.linspace(0, total - 1, n).round().long().tolist())


def frame_bounds(frames: int, sampling: VideoSampling, patching: Patching) -> tuple[int, int]:
    """``(min_px, max_px)`` of each of a video's ``frames`` sampled frames (module docstring)."""
    units = patching.factor ** 2
    least = sampling.min_pixels if sampling.min_pixels is not None else VIDEO_MIN_TOKENS * units
    most = sampling.max_pixels if sampling.max_pixels is not None else VIDEO_MAX_TOKENS * units
    total = sampling.total_pixels if sampling.total_pixels is not None else MODEL_SEQ_LEN * units * 0.9
    most = max(min(most, total / frames * patching.temporal_patch_size), int(least * 1.05))
    bound = lambda px: min(max(px, patching.min_pixels), patching.max_pixels)
    return bound(least), bound(most)


def plan_video(header: VideoHeader, sampling: VideoSampling, patching: Patching) -> VideoPlan:
    """The frames, size and tokens of a video with this header.

    Raises:
        ValueError: too few frames, or a size the model's ``smart_resize`` refuses (aspect
            ratio over 200).
    """
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    indices = sample_indices(header, sampling, patching.temporal_patch_size)
    least, most = frame_bounds(len(indices), sampling, patching)
    height, width = smart_resize(header.height, header.width, factor=patching.factor, min_pixels=least,
                                 max_pixels=most)
    grid = (len(indices) // patching.temporal_patch_size, height // patching.patch_size,
            width // patching.patch_size)
    fps = header.fps if header.fps is not None else float(FPS if sampling.fps is None else sampling.fps)
    return VideoPlan(indices=indices, total=header.frames, fps=fps, height=height, width=width, grid_thw=grid,
                     tokens=math.prod(grid) // patching.merge_size ** 2)


def video_pixels(image_processor, frames: np.ndarray, chunk: int = 32) -> tuple[torch.Tensor, list[int]]:
    """``(pixel_values_videos, video_grid_thw row)`` of resized frames (Note above).

    Args:
        image_processor: the model's (Qwen2-VL's) image processor.
        frames: ``uint8[n, H', W', 3]``, n a multiple of its ``temporal_patch_size``, H' and W'
            multiples of ``patch_size * merge_size``.
        chunk: frames per image-processor call (bounds the memory of the repeated frames).

    Returns:
        ``FloatTensor[t * H'/p * W'/p, C * T * p * p]`` and ``[t, H'/p, W'/p]``.
    """
    from PIL import Image

    p, m, T = image_processor.patch_size, image_processor.merge_size, image_processor.temporal_patch_size
    n, height, width, _ = frames.shape
    if n % T or height % (p * m) or width % (p * m):
        raise ValueError(f"{n} frames of {width}x{height}: need a multiple of {T} frames and sides that are "
                         f"multiples of {p * m}")
    gh, gw = height // p, width // p
    parts = []
    for start in range(0, n, chunk):
        images = [Image.fromarray(f) for f in frames[start:start + chunk]]
        rows = image_processor(images=images, do_resize=False, return_tensors="pt")["pixel_values"]
        rows = rows.view(len(images), gh // m, gw // m, m, m, -1, T, p, p)
        parts.append(rows[:, :, :, :, :, :, 0])  # each frame once: (k, gh/m, gw/m, m, m, C, p, p)
    single = torch.cat(parts).view(n // T, T, gh // m, gw // m, m, m, -1, p, p)
    video = single.permute(0, 2, 3, 4, 5, 6, 1, 7, 8)  # (t, gh/m, gw/m, m, m, C, T, p, p)
    return video.reshape(n // T * gh * gw, -1).contiguous(), [n // T, gh, gw]


@dataclass(frozen=True, kw_only=True)
class Qwen2VLRules(VideoRules):
    """qwen-vl-utils' sampling, the image processor's sizes and pixels (module docstring)."""

    def plan(self, processor, header, sampling):
        return plan_video(header, sampling, patching(processor))

    def pixels(self, processor, frames, plan):
        values, grid = video_pixels(processor.image_processor, frames)
        return {"pixel_values_videos": values, "video_grid_thw": torch.tensor([grid])}


QWEN2_VL = Qwen2VLRules(name="qwen2_vl", processors=("Qwen2VLProcessor", "Qwen2_5_VLProcessor"))
