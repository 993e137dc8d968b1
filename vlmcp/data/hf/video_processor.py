"""Video pixels for Qwen2-VL and Qwen2.5-VL without torchvision, and the processor call that takes them.

transformers' ``Qwen2VLVideoProcessor`` needs torchvision, which is not installable for
every torch (CPU-only machines). vlmcp makes the same inputs from the model's image
processor instead, on every machine alike, so that the ranks of a CP group (and a run
with and without torchvision) build identical rows.

Note [vlmcp data: video pixels from the image processor]
--------------------------------------------------------
A still image is a video of T identical frames: the image processor writes each patch row
as ``(C, T, p, p)`` with the frame repeated over T. A video's row holds T consecutive
frames there instead::

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

The text is expanded by the processor itself: :func:`process` calls it with a stand-in for
its video processor (:class:`FramesVideoProcessor`) that returns these pixels, so
``<|video_pad|>`` runs, ``mm_token_type_ids`` (2 on video tokens, which Qwen2-VL's
``get_rope_index`` reads to take the video grid) and Qwen2.5-VL's ``second_per_grid_ts``
(T / sampled fps) come from transformers' own code.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import torch

from vlmcp.data.hf.video import Patching, VideoPlan

__all__ = ["VIDEO_PROCESSORS", "FramesVideoProcessor", "patching", "process", "video_pixels"]

VIDEO_PROCESSORS: tuple[str, ...] = ("Qwen2VLProcessor", "Qwen2_5_VLProcessor")
"""Processors whose videos vlmcp encodes: Qwen2-VL's video layout (Qwen3-VL and GLM-4.1V put
timestamps between frame groups and size frames by other rules: not yet)."""


def patching(processor) -> Patching:
    """The patching of ``processor``'s videos (its image processor's parameters).

    Raises:
        ValueError: a processor whose videos vlmcp does not encode.
    """
    name = type(processor).__name__
    if name not in VIDEO_PROCESSORS or getattr(processor, "video_token", None) is None:
        raise ValueError(f"vlmcp encodes videos for {' and '.join(VIDEO_PROCESSORS)}, not {name}; drop the "
                         "video lines, or give the frames as images")
    ip = processor.image_processor
    return Patching(patch_size=ip.patch_size, merge_size=ip.merge_size,
                    temporal_patch_size=ip.temporal_patch_size, min_pixels=ip.size["shortest_edge"],
                    max_pixels=ip.size["longest_edge"], resample=int(ip.resample))


def video_pixels(image_processor, frames: np.ndarray, chunk: int = 32) -> tuple[torch.Tensor, list[int]]:
    """``(pixel_values_videos, video_grid_thw row)`` of resized frames (see the Note).

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


class FramesVideoProcessor:
    """Stands in for a processor's video processor: returns pixels made by :func:`video_pixels`.

    Args:
        image_processor: the model's image processor (its ``merge_size`` and
            ``temporal_patch_size`` are the processor's expansion rule).
        plans: each video's plan, in the order of the ``videos`` the processor is called with.
    """

    def __init__(self, image_processor, plans: list[VideoPlan]) -> None:
        self.image_processor, self.plans = image_processor, plans
        self.merge_size = image_processor.merge_size
        self.temporal_patch_size = image_processor.temporal_patch_size

    def __call__(self, videos, **kwargs):
        from transformers import BatchFeature
        from transformers.video_utils import VideoMetadata

        if len(videos) != len(self.plans):
            raise ValueError(f"{len(videos)} videos for {len(self.plans)} plans")
        pixels, grids, metadata = [], [], []
        for frames, plan in zip(videos, self.plans, strict=True):
            values, grid = video_pixels(self.image_processor, frames)
            if tuple(grid) != plan.grid_thw:
                raise ValueError(f"video grid {grid}, planned {list(plan.grid_thw)}")
            pixels.append(values)
            grids.append(grid)
            metadata.append(VideoMetadata(total_num_frames=plan.total, fps=plan.fps, height=plan.height,
                                          width=plan.width, frames_indices=list(plan.indices)))
        return BatchFeature({"pixel_values_videos": torch.cat(pixels), "video_grid_thw": torch.tensor(grids),
                             "video_metadata": metadata})


_PER_SAMPLE_IMAGES = ("LlavaOnevisionProcessor",)
"""Processors that read a flat image list as one image per sample (LLaVA-OneVision's
``batch_num_images``); they get the sample's images as one nested list."""


def process(processor, text: str, images: list, videos: list[tuple[np.ndarray, VideoPlan]]):
    """``processor(text=[text], images=..., videos=..., return_tensors="pt")`` with vlmcp's video pixels.

    The processor is copied (shallow) with :class:`FramesVideoProcessor` as its video
    processor; the caller's processor is left as it was.
    """
    if images and type(processor).__name__ in _PER_SAMPLE_IMAGES:
        images = [images]  # this one text's images: a multi-image sample, not images of several samples
    if not videos:
        return processor(text=[text], images=images or None, return_tensors="pt")
    with_videos = copy.copy(processor)
    plans = [plan for _, plan in videos]
    with_videos.video_processor = FramesVideoProcessor(processor.image_processor, plans)
    out = with_videos(text=[text], images=images or None, videos=[frames for frames, _ in videos],
                      return_tensors="pt")
    if "second_per_grid_ts" in out:  # Qwen2.5-VL: T / sampled fps, one per video
        want = [processor.image_processor.temporal_patch_size / plan.sample_fps for _, plan in videos]
        if not all(math.isclose(float(a), b, rel_tol=1e-6) for a, b in zip(out["second_per_grid_ts"], want,
                                                                              strict=True)):
            raise ValueError(f"second_per_grid_ts {out['second_per_grid_ts'].tolist()}, expected {want}")
    return out
