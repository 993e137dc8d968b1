"""The built-in shapes-and-captions data as a JSONL conversations file with PNG images and MP4 videos.

One line per sample of :class:`vlmcp.data.ShapesDataset`, in the LLaMA-Factory /
ms-swift format that :mod:`vlmcp.data.hf.reader` reads::

    {"messages": [{"role": "user", "content": "Describe the picture. <image>"},
                  {"role": "assistant", "content": "a red circle top left"}],
     "images": ["images/000000_0.png"]}

The prompt comes before the images, as in real chat data; a comparison holds two
pictures ("Compare the pictures. <image><image>", answered "first ... second ...") and
a built-in "video" its frames as images. Text-only samples (every ``text_only_every``-th)
become a conversation without images.

With ``videos``, that many real videos follow (:mod:`vlmcp.data.builtin.motion`: shapes
crossing the frame, by default 8 frames of 64x64 at 4 fps, H.264 in MP4, written with PyAV;
``video_frames`` and ``video_size`` make them longer and larger: 2400 frames are 10 minutes)::

    {"messages": [{"role": "user", "content": "Describe the video. <video>"},
                  {"role": "assistant", "content": "a red square moves left"}],
     "videos": ["videos/000000.mp4"]}
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from vlmcp.data.builtin.config import ShapesConfig
from vlmcp.data.builtin.dataset import ShapesDataset
from vlmcp.data.builtin.motion import motion_clip
from vlmcp.data.hf.video import require_av

__all__ = ["COMPARE_PROMPT", "IMAGE_PROMPT", "PROMPTS", "TEXT_PROMPT", "VIDEO_PROMPT", "export_shapes",
           "write_video"]

IMAGE_PROMPT = "Describe the picture."
COMPARE_PROMPT = "Compare the pictures."
VIDEO_PROMPT = "Describe the video."
TEXT_PROMPT = "Say something about two shapes."
PROMPTS = {"caption": IMAGE_PROMPT, "compare": COMPARE_PROMPT, "video": VIDEO_PROMPT, "sentence": TEXT_PROMPT}
"""The user's words for each kind of built-in sample (:meth:`ShapesDataset.kind`)."""


VIDEO_FPS = 4
"""Frame rate of the exported videos (8 frames: 2 seconds, 4 frames at ``--video-fps 2``)."""
VIDEO_FRAMES = 8
"""Frames of an exported video by default (``vlmcp data shapes --video-frames``)."""
VIDEO_SIZE = 64
"""Side of its frames in pixels by default (``--video-size``)."""


def export_shapes(out: str | os.PathLike, samples: int, *, seed: int = 0, videos: int = 0,
                  video_frames: int = VIDEO_FRAMES, video_size: int = VIDEO_SIZE) -> Path:
    """Write ``samples`` conversations to ``out/train.jsonl`` and their images to ``out/images/``,
    then ``videos`` video conversations with their videos in ``out/videos/``.

    Args:
        out: the directory (created).
        samples: how many samples of the stream to write (>= 0; >= 1 without videos).
        seed: the dataset seed (:attr:`ShapesConfig.seed`).
        videos: how many moving-shapes videos to write (>= 0; needs PyAV).
        video_frames: frames of each video, at :data:`VIDEO_FPS` (>= 2).
        video_size: its frames' side in pixels (even, >= 16).

    Returns:
        The path of ``train.jsonl``; image and video paths in it are relative to its directory.
    """
    if isinstance(videos, bool) or not isinstance(videos, int) or videos < 0:
        raise ValueError(f"--videos must be an integer >= 0, got {videos!r}")
    if isinstance(video_frames, bool) or not isinstance(video_frames, int) or video_frames < 2:
        raise ValueError(f"--video-frames must be an integer >= 2, got {video_frames!r}")
    if isinstance(video_size, bool) or not isinstance(video_size, int) or video_size < 16 or video_size % 2:
        raise ValueError(f"--video-size must be an even integer >= 16, got {video_size!r}")
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < (0 if videos else 1):
        raise ValueError(f"--samples must be an integer >= 1 (>= 0 with --videos), got {samples!r}")
    from PIL import Image

    if videos:
        require_av()  # before anything is written
    dataset = ShapesDataset(ShapesConfig(seed=seed))
    out = Path(out)
    (out / "images").mkdir(parents=True, exist_ok=True)
    if videos:
        (out / "videos").mkdir(exist_ok=True)
    path = out / "train.jsonl"
    temp = out / f".train.jsonl.tmp-{os.getpid()}"
    with open(temp, "w", encoding="utf-8") as f:
        for i in range(samples):
            sample, kind = dataset[i], dataset.kind(i)
            names = []
            for j, image in enumerate(sample.images):
                names.append(f"images/{i:06d}_{j}.png")
                pixels = (image.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
                Image.fromarray(pixels).save(out / names[-1])
            content = PROMPTS[kind] + (" " + "<image>" * len(names) if names else "")
            record = {"messages": [{"role": "user", "content": content},
                                   {"role": "assistant", "content": sample.text}], "images": names}
            f.write(json.dumps(record) + "\n")
        for i in range(videos):
            clip = motion_clip(seed, i, frames=video_frames, height=video_size, width=video_size)
            name = f"videos/{i:06d}.mp4"
            frames = (clip.frames.permute(0, 2, 3, 1).numpy() * 255).round().astype(np.uint8)
            write_video(out / name, frames, VIDEO_FPS)
            record = {"messages": [{"role": "user", "content": f"{VIDEO_PROMPT} <video>"},
                                   {"role": "assistant", "content": clip.caption}], "videos": [name]}
            f.write(json.dumps(record) + "\n")
    os.replace(temp, path)
    return path


_CODECS = {".mp4": "libx264", ".mov": "libx264", ".mkv": "libx264", ".avi": "mpeg4", ".webm": "libvpx-vp9"}


def write_video(path: str | Path, frames: np.ndarray, fps: int) -> Path:
    """Write ``uint8[n, H, W, 3]`` RGB frames (H and W even) as a video file, codec by suffix:
    H.264 in .mp4 / .mov / .mkv (MPEG-4 part 2 where PyAV lacks libx264), MPEG-4 part 2 in
    .avi, VP9 in .webm."""
    av = require_av()
    path = Path(path)
    codec = _CODECS.get(path.suffix.lower())
    if codec is None:
        raise ValueError(f"write_video writes {', '.join(_CODECS)} files, not {path.name}")
    if codec == "libx264" and codec not in av.codecs_available:  # an FFmpeg built without GPL codecs
        codec = "mpeg4"
    _, height, width, _ = frames.shape
    options = {"mpeg4": {"qscale": "2"}, "libx264": {"crf": "18"}, "libvpx-vp9": {"crf": "20", "b": "0"}}
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=fps, options=options[codec])
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for rgb in frames:
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    return path
