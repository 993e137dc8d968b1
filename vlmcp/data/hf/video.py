"""Videos: which frames to take and at what size (from headers only), and their decoding with PyAV.

Note [vlmcp data: video frames, sizes and tokens]
-------------------------------------------------
vlmcp samples a video the way qwen-vl-utils' ``fetch_video`` does (what Qwen2-VL and
Qwen2.5-VL were trained with, and what ms-swift uses), with T the model's temporal patch
size (2) and F = patch_size * merge_size (28 for Qwen2-VL)::

    frames   n = total / video_fps * fps, clamped to [ceil_T(min_frames), floor_T(min(max_frames, total))]
                 and to total, then floored to a multiple of T; fewer than T frames: refused
    which    linspace(0, total - 1, n), rounded (torch's round: half to even)
    size     min_px = min_pixels (default 128 * F^2)
             max_px = max(min(max_pixels (768 * F^2), total_pixels (0.9 * 128000 * F^2) / n * T),
                          int(1.05 * min_px))
             both then bounded by the model's own [min_pixels, max_pixels] (its image processor's,
             which transformers' Qwen2-VL video processor shares), and
             (H', W') = smart_resize(H, W, F, min_px, max_px), the image processor's own rule
    tokens   (n / T) * (H' / patch) * (W' / patch) / merge^2
    fps      sampled fps = n / total * video_fps; Qwen2.5-VL's second_per_grid_ts = T / sampled fps

A video given as frames (a directory or a list) has no fps: all its frames are taken,
the last repeated up to a multiple of T (qwen-vl-utils' rule), or, past ``max_frames``,
``floor_T(max_frames)`` of them evenly (vlmcp's rule: qwen-vl-utils takes them all); they
count as sampled at ``fps``.

Everything above needs only the header: frame count, frame rate and size (PyAV's stream
metadata; a container that does not store the count, like WebM, has its packets counted,
which reads the file but decodes nothing; for frames, the images' headers). So planning
knows every video's token count without decoding, and the ranks decode their row later
(:func:`decode_frames`), each frame resized to (H', W') with the image processor's resample.
A stream that ends before a planned frame is a decode failure, as is any PyAV error.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from vlmcp.data.hf.schema import Media

__all__ = ["Patching", "VideoHeader", "VideoPlan", "VideoSampling", "decode_frames", "frame_bounds",
           "plan_video", "read_header", "require_av", "sample_indices"]

VIDEO_MIN_TOKENS = 128
"""qwen-vl-utils' ``VIDEO_MIN_TOKEN_NUM``: the default least pixels of a frame, in F^2 units."""
VIDEO_MAX_TOKENS = 768
"""qwen-vl-utils' ``VIDEO_MAX_TOKEN_NUM``: the default most pixels of a frame, in F^2 units."""
MODEL_SEQ_LEN = 128000
"""qwen-vl-utils' ``MODEL_SEQ_LEN``: a video's default pixel budget is 90% of this many F^2 units."""


def require_av():
    """The ``av`` module (PyAV), or an error that says which extra brings it."""
    try:
        import av
    except ModuleNotFoundError as err:
        raise ModuleNotFoundError("videos are decoded with PyAV, which is not installed: "
                                  "pip install 'vlmcp[hf]' (or pip install av)", name="av") from err
    return av


@dataclass(frozen=True, kw_only=True)
class VideoSampling:
    """How videos become frames (``--video-*``; see Note [vlmcp data: video frames, sizes and tokens])."""

    fps: float = 2.0
    """Frames taken per second of video (qwen-vl-utils' ``FPS``)."""
    min_frames: int = 4
    """Fewest frames taken from a video file (``FPS_MIN_FRAMES``), if it has them."""
    max_frames: int = 768
    """Most frames taken from a video (``FPS_MAX_FRAMES``)."""
    min_pixels: int | None = None
    """Least pixels of a frame; None: 128 * F^2 (qwen-vl-utils' ``VIDEO_MIN_PIXELS``, 100352 for Qwen2-VL)."""
    max_pixels: int | None = None
    """Most pixels of a frame; None: 768 * F^2 (``VIDEO_MAX_PIXELS``, 602112 for Qwen2-VL)."""
    total_pixels: int | None = None
    """Pixel budget of a whole video, shared by its frames; None: 0.9 * 128000 * F^2."""

    def __post_init__(self):
        if isinstance(self.fps, bool) or not isinstance(self.fps, (int, float)) or not self.fps > 0 \
                or not math.isfinite(self.fps):
            raise ValueError(f"--video-fps must be a number > 0, got {self.fps!r}")
        for name, least in (("min_frames", 1), ("max_frames", 2), ("min_pixels", 1), ("max_pixels", 1),
                            ("total_pixels", 1)):
            value = getattr(self, name)
            if value is None and name.endswith("pixels"):
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"--video-{name.replace('_', '-')} must be an integer >= {least}, got "
                                 f"{value!r}")
        if self.min_frames > self.max_frames:
            raise ValueError(f"--video-min-frames {self.min_frames} is more than --video-max-frames "
                             f"{self.max_frames}")
        if self.min_pixels is not None and self.max_pixels is not None and self.min_pixels > self.max_pixels:
            raise ValueError(f"--video-min-pixels {self.min_pixels} is more than --video-max-pixels "
                             f"{self.max_pixels}")


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
    """One video's frames and size, from its header (Note [vlmcp data: video frames, sizes and tokens])."""

    indices: tuple[int, ...]
    """The frames taken, in order (a multiple of T of them; a frame list's last may repeat)."""
    total: int
    """Frames in the video."""
    fps: float
    """Its frame rate (for frames: the sampling fps they count as)."""
    height: int
    """Resized frame height H'."""
    width: int
    """Resized frame width W'."""
    grid_thw: tuple[int, int, int]
    """``(n / T, H' / patch, W' / patch)``: the model's ``video_grid_thw`` row."""
    tokens: int
    """``<|video_pad|>`` tokens of the video."""

    @property
    def sample_fps(self) -> float:
        """Frames taken per second of video (Qwen2.5-VL's ``second_per_grid_ts`` is T over it)."""
        return len(self.indices) / self.total * self.fps


def _floor(x: float, k: int) -> int:
    return math.floor(x / k) * k


def _ceil(x: float, k: int) -> int:
    return math.ceil(x / k) * k


def sample_indices(header: VideoHeader, sampling: VideoSampling, temporal: int) -> tuple[int, ...]:
    """The frames taken from a video (see the Note).

    Raises:
        ValueError: a video with fewer frames than ``temporal`` to take.
    """
    import torch

    total = header.frames
    if header.fps is None:  # frames given as images: all of them, or max_frames of them evenly
        cap = _floor(sampling.max_frames, temporal)
        if total > cap:
            return tuple(torch.linspace(0, total - 1, cap).round().long().tolist())
        return tuple(range(total)) + (total - 1,) * (_ceil(total, temporal) - total)
    least = _ceil(sampling.min_frames, temporal)
    most = _floor(min(sampling.max_frames, total), temporal)
    n = _floor(min(max(total / header.fps * sampling.fps, least), most, total), temporal)
    if n < temporal:
        raise ValueError(f"{total} frame(s): too few to take {temporal}")
    return tuple(torch.linspace(0, total - 1, n).round().long().tolist())


def frame_bounds(frames: int, sampling: VideoSampling, patching: Patching) -> tuple[int, int]:
    """``(min_px, max_px)`` of each of a video's ``frames`` sampled frames (see the Note)."""
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
    return VideoPlan(indices=indices, total=header.frames,
                     fps=header.fps if header.fps is not None else float(sampling.fps), height=height,
                     width=width, grid_thw=grid, tokens=math.prod(grid) // patching.merge_size ** 2)


def _open(av, media: Media):
    return av.open(str(media.path) if media.data is None else io.BytesIO(media.data))


def read_header(media: Media) -> VideoHeader:
    """A video's frame count, frame rate and size, without decoding a frame.

    Raises:
        ModuleNotFoundError: PyAV is not installed (the message says how to install it).
        Exception: whatever PyAV or PIL raise on an unreadable header, and ValueError for a
            header without a video stream, a frame rate or frames, or frames of different sizes.
    """
    if media.frames is not None:
        from PIL import Image

        sizes = []
        for frame in media.frames:
            with Image.open(frame) as im:
                sizes.append((im.height, im.width))
        if len(set(sizes)) > 1:
            k = next(i for i, s in enumerate(sizes) if s != sizes[0])
            raise ValueError(f"frame {media.frames[k]} is {sizes[k][1]}x{sizes[k][0]}, frame "
                             f"{media.frames[0]} {sizes[0][1]}x{sizes[0][0]}: a video's frames share one "
                             "size")
        return VideoHeader(frames=len(sizes), fps=None, height=sizes[0][0], width=sizes[0][1])
    av = require_av()
    with _open(av, media) as container:
        if not container.streams.video:
            raise ValueError("no video stream")
        stream = container.streams.video[0]
        rate = stream.average_rate or stream.guessed_rate
        if not rate or rate <= 0:
            raise ValueError("no frame rate in its header")
        height, width = stream.codec_context.height, stream.codec_context.width
        frames = stream.frames or sum(1 for packet in container.demux(stream) if packet.size)
    if not frames or not height or not width:
        raise ValueError(f"its header says {frames} frames of {width}x{height}")
    return VideoHeader(frames=frames, fps=float(rate), height=height, width=width)


def decode_frames(media: Media, plan: VideoPlan, resample: int) -> np.ndarray:
    """The planned frames, decoded and resized to the plan's size: ``uint8[n, H', W', 3]`` (RGB).

    Raises:
        ModuleNotFoundError: PyAV is not installed.
        Exception: whatever PyAV or PIL raise, and ValueError when the stream ends before a
            planned frame.
    """
    from PIL import Image

    def resized(rgb) -> np.ndarray:
        image = rgb if isinstance(rgb, Image.Image) else Image.fromarray(rgb)
        return np.asarray(image.convert("RGB").resize((plan.width, plan.height), resample=resample))

    wanted = set(plan.indices)
    last = max(wanted)
    got: dict[int, np.ndarray] = {}
    if media.frames is not None:
        for i in sorted(wanted):
            with Image.open(media.frames[i]) as im:
                got[i] = resized(im)
    else:
        av = require_av()
        seen = 0
        with _open(av, media) as container:
            stream = container.streams.video[0]
            stream.thread_type = "AUTO"
            for seen, frame in enumerate(container.decode(stream), start=1):
                if seen - 1 in wanted:
                    got[seen - 1] = resized(frame.to_ndarray(format="rgb24"))
                if seen > last:
                    break
        if len(got) < len(wanted):
            raise ValueError(f"the stream ends after {seen} frames; its header says {plan.total}")
    return np.stack([got[i] for i in plan.indices])
