"""What every video family shares: the ``--video-*`` settings, a video's header and its plan.

The flags mean the same thing for every model (Note [vlmcp data: video frames, sizes and
tokens]); an unset one (None) takes the model's own default, which each family's rules
name (:mod:`vlmcp.data.hf.video.rules`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

__all__ = ["VideoHeader", "VideoPlan", "VideoSampling", "ceil_to", "floor_to", "listed_frames"]


def floor_to(x: float, k: int) -> int:
    """The largest multiple of ``k`` that is at most ``x``."""
    return math.floor(x / k) * k


def ceil_to(x: float, k: int) -> int:
    """The smallest multiple of ``k`` that is at least ``x``."""
    return math.ceil(x / k) * k


@dataclass(frozen=True, kw_only=True)
class VideoSampling:
    """How videos become frames (``--video-*``; see Note [vlmcp data: video frames, sizes and tokens]).

    None: the model's own default (Qwen2-VL: qwen-vl-utils'; Qwen3-VL, Qwen3.5, GLM-4.1V:
    the model's video processor's; LLaVA-OneVision: 32 frames).
    """

    fps: float | None = None
    """Frames taken per second of video (qwen-vl-utils' ``FPS``, the video processors' ``fps``)."""
    min_frames: int | None = None
    """Fewest frames taken from a video file (``FPS_MIN_FRAMES``, ``min_frames``), if it has them."""
    max_frames: int | None = None
    """Most frames taken from a video (``FPS_MAX_FRAMES``, ``max_frames``; LLaVA-OneVision: the
    frames it takes)."""
    min_pixels: int | None = None
    """Least pixels of a frame."""
    max_pixels: int | None = None
    """Most pixels of a frame."""
    total_pixels: int | None = None
    """Pixel budget of a whole video, shared by its frames."""

    def __post_init__(self):
        if self.fps is not None and (isinstance(self.fps, bool) or not isinstance(self.fps, (int, float))
                                     or not self.fps > 0 or not math.isfinite(self.fps)):
            raise ValueError(f"--video-fps must be a number > 0, got {self.fps!r}")
        for name, least in (("min_frames", 1), ("max_frames", 2), ("min_pixels", 1), ("max_pixels", 1),
                            ("total_pixels", 1)):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"--video-{name.replace('_', '-')} must be an integer >= {least}, got "
                                 f"{value!r}")
        if self.min_frames is not None and self.max_frames is not None and self.min_frames > self.max_frames:
            raise ValueError(f"--video-min-frames {self.min_frames} is more than --video-max-frames "
                             f"{self.max_frames}")
        if self.min_pixels is not None and self.max_pixels is not None and self.min_pixels > self.max_pixels:
            raise ValueError(f"--video-min-pixels {self.min_pixels} is more than --video-max-pixels "
                             f"{self.max_pixels}")

    def given(self) -> list[str]:
        """The flags set (not None), as ``--video-*`` names."""
        names = ("fps", "min_frames", "max_frames", "min_pixels", "max_pixels", "total_pixels")
        return [f"--video-{name.replace('_', '-')}" for name in names if getattr(self, name) is not None]


class VideoHeader(NamedTuple):
    """What a video's header says."""

    frames: int
    """Frames in the video (a video given as frames: how many)."""
    fps: float | None
    """Its frame rate; None for a video given as frames."""
    height: int
    width: int


@dataclass(frozen=True)
class VideoPlan:
    """One video's frames, size and tokens, from its header (Note [vlmcp data: video frames, sizes and
    tokens])."""

    indices: tuple[int, ...]
    """The frames taken, in order (a frame list's last may repeat)."""
    total: int
    """Frames in the video."""
    fps: float
    """Its frame rate (for frames given as images: the sampling fps they count as)."""
    height: int
    """Resized frame height H'."""
    width: int
    """Resized frame width W'."""
    grid_thw: tuple[int, int, int] | None
    """The model's ``video_grid_thw`` row, ``(t, H' / patch, W' / patch)``; None where the model
    has none (LLaVA-OneVision)."""
    tokens: int
    """Video placeholder tokens of the video (GLM-4.1V: the image placeholders of its frames)."""
    timestamps: tuple[float, ...] = ()
    """Seconds of each frame group, as the processor writes them (Qwen3-VL ``<t seconds>``,
    GLM-4.1V's whole seconds); empty where it writes none."""

    @property
    def sample_fps(self) -> float:
        """Frames taken per second of video (Qwen2.5-VL's ``second_per_grid_ts`` is T over it)."""
        return len(self.indices) / self.total * self.fps

    def describe(self) -> str:
        """One line: frames taken, size, grid, tokens and timestamps (``vlmcp data show``)."""
        grid = "" if self.grid_thw is None else f", grid {tuple(self.grid_thw)}"
        stamps = ""
        if self.timestamps:
            shown = [f"{t:g}" for t in self.timestamps[:8]]
            more = f" ... ({len(self.timestamps)} in all)" if len(self.timestamps) > 8 else ""
            stamps = f"; frame groups at {', '.join(shown)}{more} s"
        return (f"{len(self.indices)} of {self.total} frames ({self.sample_fps:.3g} per second of video), "
                f"{self.width}x{self.height}{grid}: {self.tokens} tokens{stamps}")


def listed_frames(total: int, most: int, temporal: int) -> tuple[int, ...]:
    """The frames taken from a video given as ``total`` images: all of them, the last repeated up to
    a multiple of ``temporal``, or past ``most`` (floored to a multiple of ``temporal``) that many
    evenly (``linspace`` rounded)."""
    import torch

    cap = floor_to(most, temporal)
    if total > cap:
        return tuple(torch.linspace(0, total - 1, cap).round().long().tolist())
    return tuple(range(total)) + (total - 1,) * (ceil_to(total, temporal) - total)
