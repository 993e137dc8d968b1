"""The ``--video-*`` flags of ``vlmcp train --model`` and ``vlmcp data show``: how videos become frames.

Each flag means the same for every video model; unset, it takes the model's own default
(Note [vlmcp data: video frames, sizes and tokens]): qwen-vl-utils' for Qwen2-VL and
Qwen2.5-VL (pixels in units of F^2, F = patch_size * merge_size, 28 there), the video
processor's for Qwen3-VL, Qwen3.5 and GLM-4.1V, 32 frames for LLaVA-OneVision.
"""

from __future__ import annotations

import argparse

from vlmcp.data.hf.video import VideoSampling

__all__ = ["add_video_arguments", "video_sampling"]

_FLAGS = (
    ("fps", float, "FPS", "frames taken per second of video (default: the model's: 2.0 for Qwen2-VL, "
     "qwen-vl-utils' FPS; the video processor's fps for Qwen3-VL, Qwen3.5, GLM-4.1V; not for "
     "LLaVA-OneVision, which takes a fixed count)"),
    ("min_frames", int, "N", "fewest frames taken from a video file that has them (default: 4, "
     "FPS_MIN_FRAMES, or the video processor's min_frames)"),
    ("max_frames", int, "N", "most frames taken from a video (default: 768, FPS_MAX_FRAMES, or the video "
     "processor's max_frames; LLaVA-OneVision: the frames it takes, 32)"),
    ("min_pixels", int, "PX", "least pixels of a frame (default: 128*F^2, F = patch_size*merge_size: 100352 "
     "for Qwen2-VL, qwen-vl-utils' VIDEO_MIN_PIXELS, bounded by the model's min_pixels and max_pixels; "
     "Qwen3-VL, GLM-4.1V: the video processor's size bounds)"),
    ("max_pixels", int, "PX", "most pixels of a frame (default: 768*F^2: 602112 for Qwen2-VL, "
     "VIDEO_MAX_PIXELS, bounded by the model's max_pixels; Qwen3-VL, GLM-4.1V: no per-frame bound)"),
    ("total_pixels", int, "PX", "pixel budget of a whole video, shared by its frames (default: "
     "0.9*128000*F^2: 90316800 for Qwen2-VL, qwen-vl-utils' total_pixels; Qwen3-VL, GLM-4.1V: the video "
     "processor's size['longest_edge']; LLaVA-OneVision: caps its frame count)"),
)
"""Each ``--video-NAME`` flag: its :class:`VideoSampling` field, type, metavar and help."""


def add_video_arguments(group) -> None:
    """Add the ``--video-*`` flags to ``group`` (a parser or an argument group)."""
    for name, kind, metavar, help in _FLAGS:
        # SUPPRESS: the defaults depend on the model, so the help names them instead of "None"
        group.add_argument(f"--video-{name.replace('_', '-')}", type=kind, default=argparse.SUPPRESS,
                           metavar=metavar, help=help)


def video_sampling(args: argparse.Namespace) -> VideoSampling:
    """The :class:`VideoSampling` the flags say (``ValueError`` naming a bad flag)."""
    return VideoSampling(**{name: getattr(args, f"video_{name}", None) for name, *_ in _FLAGS})
