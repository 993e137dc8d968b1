"""The ``--video-*`` flags of ``vlmcp train --model`` and ``vlmcp data show``: how videos become frames.

They follow qwen-vl-utils (Note [vlmcp data: video frames, sizes and tokens]); the pixel
defaults are in units of the model's F^2 (F = patch_size * merge_size, 28 for Qwen2-VL
and Qwen2.5-VL), as qwen-vl-utils counts them.
"""

from __future__ import annotations

import argparse

from vlmcp.data.hf.video import VideoSampling

__all__ = ["add_video_arguments", "video_sampling"]

_PIXELS = ("min_pixels", "max_pixels", "total_pixels")


def add_video_arguments(group) -> None:
    """Add the ``--video-*`` flags to ``group`` (a parser or an argument group)."""
    d = VideoSampling()
    group.add_argument("--video-fps", type=float, default=d.fps, metavar="FPS",
                       help="frames taken per second of video (qwen-vl-utils' FPS)")
    group.add_argument("--video-min-frames", type=int, default=d.min_frames, metavar="N",
                       help="fewest frames taken from a video file that has them (FPS_MIN_FRAMES)")
    group.add_argument("--video-max-frames", type=int, default=d.max_frames, metavar="N",
                       help="most frames taken from a video (FPS_MAX_FRAMES)")
    # SUPPRESS: the default depends on the model, so the help names it instead of "None"
    group.add_argument("--video-min-pixels", type=int, default=argparse.SUPPRESS, metavar="PX",
                       help="least pixels of a frame (default: 128*F^2, F = patch_size*merge_size: 100352 "
                            "for Qwen2-VL, qwen-vl-utils' VIDEO_MIN_PIXELS); bounded by the model's "
                            "min_pixels and max_pixels")
    group.add_argument("--video-max-pixels", type=int, default=argparse.SUPPRESS, metavar="PX",
                       help="most pixels of a frame (default: 768*F^2: 602112 for Qwen2-VL, "
                            "VIDEO_MAX_PIXELS); bounded by the model's max_pixels")
    group.add_argument("--video-total-pixels", type=int, default=argparse.SUPPRESS, metavar="PX",
                       help="pixel budget of a whole video, shared by its frames (default: 0.9*128000*F^2: "
                            "90316800 for Qwen2-VL, qwen-vl-utils' total_pixels)")


def video_sampling(args: argparse.Namespace) -> VideoSampling:
    """The :class:`VideoSampling` the flags say (``ValueError`` naming a bad flag)."""
    return VideoSampling(fps=args.video_fps, min_frames=args.video_min_frames,
                         max_frames=args.video_max_frames,
                         **{name: getattr(args, f"video_{name}", None) for name in _PIXELS})
