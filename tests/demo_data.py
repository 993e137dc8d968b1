"""LLaMA-Factory's and ms-swift's shipped multimodal demo data, rebuilt in code (nothing downloaded).

LLaMA-Factory (hiyouga/LLaMA-Factory, ``data/`` at ff6d4d1) ships ``mllm_demo.json`` (6 lines:
``messages`` of user/assistant turns and ``images``; lines 1 and 4 put one image in each of two
user turns, ``<image>`` first and last, the same file twice), ``mllm_video_demo.json`` (3 lines,
one ``<video>`` each: ``1.mp4``, ``2.avi``, ``3.mp4``), their ``dataset_info.json`` entries
(sharegpt with OpenAI-style tags) and ``mllm_demo_data/``. :func:`write_llamafactory` writes
the same layout: the same keys, roles, placeholders and image counts per line (its own words,
English and Chinese lines alike), and media of the same properties, measured from that repo:

=========  =============================================  =========
file       stream                                         size
=========  =============================================  =========
1.jpg      RGB JPEG                                       300 x 168
2.jpg      RGB JPEG                                       300 x 199
3.jpg      RGB JPEG                                       300 x 166
1.mp4      H.264, 25 fps, 243 frames (9.72 s)             640 x 360
2.avi      H.264, 359/12 fps, 270 frames (9.03 s)         320 x 240
3.mp4      H.264, 24000/1001 fps, 146 frames (6.09 s)     640 x 360
4.mp4      H.264, 30 fps, 150 frames (5 s)                224 x 224
=========  =============================================  =========

ms-swift (modelscope/ms-swift, ``docs/source_en/Customization/Custom-dataset.md`` at 3602360,
"Multimodal") documents its lines as ``messages`` with top-level ``images`` / ``videos``
(absolute paths preferred): pre-training lines (one assistant message: text only, two images,
an image and a video) and fine-tuning lines (text only, two images in one turn, a system turn
with an image and a video), and videos given as lists of frame images.
:func:`write_ms_swift` writes those lines (its audio lines left out: vlmcp reads no audio).
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import numpy as np

CLIPS = {  # name: (frames, fps, width, height)
    "1.mp4": (243, Fraction(25), 640, 360),
    "2.avi": (270, Fraction(359, 12), 320, 240),
    "3.mp4": (146, Fraction(24000, 1001), 640, 360),
    "4.mp4": (150, Fraction(30), 224, 224),
}
"""LLaMA-Factory's ``mllm_demo_data`` videos."""

MORE_CLIPS = {
    "short.mp4": (45, Fraction(30), 320, 240),  # 1.5 s
    "long.mp4": (310, Fraction(25), 224, 224),  # 12.4 s: timestamps of 10 s and more
}
"""Lengths the demo lacks, for the comparisons with the processor."""

IMAGES = {"1.jpg": (300, 168), "2.jpg": (300, 199), "3.jpg": (300, 166)}
"""LLaMA-Factory's ``mllm_demo_data`` images: ``(width, height)``."""

_TAGS = {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}
DATASET_INFO = {
    "mllm_demo": {"file_name": "mllm_demo.json", "formatting": "sharegpt",
                  "columns": {"messages": "messages", "images": "images"}, "tags": _TAGS},
    "mllm_video_demo": {"file_name": "mllm_video_demo.json", "formatting": "sharegpt",
                        "columns": {"messages": "messages", "videos": "videos"}, "tags": _TAGS},
}
"""The two entries of LLaMA-Factory's ``dataset_info.json``, as shipped."""


def _background(width: int, height: int, seed: int) -> np.ndarray:
    """A colour gradient ``uint8[height, width, 3]``."""
    y, x = np.mgrid[0:height, 0:width]
    planes = [x * 255 // width, y * 255 // height, np.full_like(x, 40 * seed % 255)]
    return np.stack(planes, -1).astype(np.uint8)


def _frame(background: np.ndarray, index: int) -> np.ndarray:
    """Frame ``index`` of a clip: ``background`` and a square moving right (every frame differs)."""
    height, width, _ = background.shape
    frame = background.copy()
    side = max(8, height // 8)
    left = (7 * index) % max(1, width - side)
    frame[height // 3:height // 3 + side, left:left + side] = (230, 30, 30)
    return frame


def write_clip(path: Path, frames: int, fps: Fraction, width: int, height: int, seed: int = 0) -> Path:
    """An H.264 clip (libx264; MPEG-4 part 2 where PyAV lacks it) in ``path``'s container."""
    import av

    codec = "libx264" if "libx264" in av.codecs_available else "mpeg4"
    options = {"crf": "23", "preset": "ultrafast"} if codec == "libx264" else {"qscale": "4"}
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=fps, options=options)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        background = _background(width, height, seed)
        for i in range(frames):
            frame = av.VideoFrame.from_ndarray(_frame(background, i), format="rgb24")
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    return path


def write_image(path: Path, width: int, height: int, seed: int) -> Path:
    """An RGB JPEG of noise over a gradient."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    pixels = _frame(_background(width, height, seed), seed) // 2 + rng.integers(0, 120, (height, width, 3))
    Image.fromarray(pixels.astype(np.uint8)).save(path, "JPEG")
    return path


def write_media(root: Path, clips: dict = CLIPS) -> Path:
    """``root/mllm_demo_data/`` with :data:`IMAGES` and ``clips``."""
    media = root / "mllm_demo_data"
    media.mkdir(parents=True, exist_ok=True)
    for k, (name, (width, height)) in enumerate(IMAGES.items()):
        write_image(media / name, width, height, seed=k + 1)
    for k, (name, spec) in enumerate(clips.items()):
        write_clip(media / name, *spec, seed=k)
    return media


def _turns(*pairs: str) -> list[dict]:
    """user, assistant, user, assistant, ... as LLaMA-Factory writes them (``content`` first)."""
    return [{"content": text, "role": "user" if k % 2 == 0 else "assistant"} for k, text in enumerate(pairs)]


def write_llamafactory(root: Path) -> Path:
    """LLaMA-Factory's ``data/`` layout in ``root`` (module docstring): ``mllm_demo.json``,
    ``mllm_video_demo.json``, ``dataset_info.json`` and ``mllm_demo_data/``; returns ``root``."""
    write_media(root)
    pictures = [
        (_turns("<image>Who is in the picture?", "Two players of a football team.",
                "What are they doing?<image>", "They celebrate a goal on the pitch."),
         ["mllm_demo_data/1.jpg", "mllm_demo_data/1.jpg"]),
        (_turns("<image>Who is this?", "A player of the home team.", "Why is he lying down?",
                "He slid across the grass to celebrate."), ["mllm_demo_data/2.jpg"]),
        (_turns("<image>Please describe this image", "A person gives a speech at a lectern.",
                "What did they do before?", "They flew to a space station in 2023 and ran experiments there "
                "for several months, the first of their group to do so."), ["mllm_demo_data/3.jpg"]),
        (_turns("<image>图里是谁？", "一支球队的两名球员。",
                "他们在做什么？<image>", "他们在球场上庆祝进球。"),
         ["mllm_demo_data/1.jpg", "mllm_demo_data/1.jpg"]),
        (_turns("<image>这是谁？", "主队的一名球员。", "他为什么躺在地上？", "他滑跪庆祝。"),
         ["mllm_demo_data/2.jpg"]),
        (_turns("<image>请描述这张图片", "一个人在讲台上演讲。",
                "他之前做了什么？", "他在2023年去了空间站做实验。"),
         ["mllm_demo_data/3.jpg"]),
    ]
    (root / "mllm_demo.json").write_text(json.dumps(
        [{"messages": m, "images": i} for m, i in pictures], ensure_ascii=False, indent=2))
    videos = [(_turns("<video>Why is this video funny?", "Because a square runs across a rainbow."), "1.mp4"),
              (_turns("<video>What is she doing?", "She is cooking."), "2.avi"),
              (_turns("<video>What's in the video?", "A red square moving to the right."), "3.mp4")]
    (root / "mllm_video_demo.json").write_text(json.dumps(
        [{"messages": m, "videos": [f"mllm_demo_data/{v}"]} for m, v in videos], indent=2))
    (root / "dataset_info.json").write_text(json.dumps(DATASET_INFO, indent=2))
    return root


def write_ms_swift(root: Path, media: Path, *, videos: bool = True, mixed: bool = True) -> dict[str, Path]:
    """ms-swift's documented multimodal lines (module docstring) with absolute paths into ``media``
    (:func:`write_media`'s): ``{"pt": ..., "sft": ...}`` jsonl files.

    Args:
        videos: write the lines with videos (models whose videos vlmcp encodes).
        mixed: write the lines with an image and a video in one conversation (not GLM-4.1V).
    """
    jpg, jpg2 = str(media / "1.jpg"), str(media / "2.jpg")
    mp4 = str(media / "4.mp4")
    root.mkdir(parents=True, exist_ok=True)
    frames = media / "frames"
    if videos and not frames.is_dir():
        from PIL import Image

        frames.mkdir()
        for i in range(4):
            Image.fromarray(_frame(_background(64, 48, 5), 3 * i)).save(frames / f"{i}.png")
    say = lambda role, text: {"role": role, "content": text}
    pt = [{"messages": [say("assistant", "Pre-trained text goes here")]},
          {"messages": [say("assistant", "<image>is a puppy, <image>is a kitten")], "images": [jpg, jpg2]}]
    if videos and mixed:
        pt.append({"messages": [say("assistant", "<image>is an elephant, <video>is a lion running")],
                   "images": [jpg], "videos": [mp4]})
    sft = [{"messages": [say("user", "Where is the capital of Zhejiang?"),
                         say("assistant", "The capital of Zhejiang is Hangzhou.")]},
           {"messages": [say("user", "<image><image>What is the difference between the two images?"),
                         say("assistant", "The first one is a kitten, and the second one is a puppy.")],
            "images": [jpg, jpg2]}]
    if videos and mixed:
        sft.append({"messages": [say("system", "You are a helpful and harmless assistant."),
                                 say("user", "<image>What is in the image, <video>What is in the video?"),
                                 say("assistant", "The image shows an elephant, and the video shows a puppy "
                                                  "running on the grass.")],
                    "images": [jpg], "videos": [mp4]})
    if videos:
        sft.append({"messages": [say("user", "<video>What moves?"), say("assistant", "A red square.")],
                    "videos": [[str(frames / f"{i}.png") for i in range(4)]]})
    out = {}
    for name, lines in (("pt", pt), ("sft", sft)):
        out[name] = root / f"swift_{name}.jsonl"
        out[name].write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines))
    return out
