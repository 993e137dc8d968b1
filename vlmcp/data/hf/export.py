"""The built-in shapes-and-captions data as a JSONL conversations file with PNG images.

One line per sample of :class:`vlmcp.data.ShapesDataset`, in the LLaMA-Factory /
ms-swift format that :mod:`vlmcp.data.hf.conversations` reads::

    {"messages": [{"role": "user", "content": "Describe the picture. <image>"},
                  {"role": "assistant", "content": "a red circle top left"}],
     "images": ["images/000000_0.png"]}

The prompt comes before the images, as in real chat data; a comparison holds two
pictures ("Compare the pictures. <image><image>", answered "first ... second ...") and
a video its frames as images. Text-only samples (every ``text_only_every``-th) become
a conversation without images.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from vlmcp.data.builtin.config import ShapesConfig
from vlmcp.data.builtin.dataset import ShapesDataset

__all__ = ["COMPARE_PROMPT", "IMAGE_PROMPT", "PROMPTS", "TEXT_PROMPT", "VIDEO_PROMPT", "export_shapes"]

IMAGE_PROMPT = "Describe the picture."
COMPARE_PROMPT = "Compare the pictures."
VIDEO_PROMPT = "Describe the video."
TEXT_PROMPT = "Say something about two shapes."
PROMPTS = {"caption": IMAGE_PROMPT, "compare": COMPARE_PROMPT, "video": VIDEO_PROMPT, "sentence": TEXT_PROMPT}
"""The user's words for each kind of built-in sample (:meth:`ShapesDataset.kind`)."""


def export_shapes(out: str | os.PathLike, samples: int, *, seed: int = 0) -> Path:
    """Write ``samples`` conversations to ``out/train.jsonl`` and their images to ``out/images/``.

    Args:
        out: the directory (created).
        samples: how many samples of the stream to write (>= 1).
        seed: the dataset seed (:attr:`ShapesConfig.seed`).

    Returns:
        The path of ``train.jsonl``; image paths in it are relative to its directory.
    """
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ValueError(f"--samples must be an integer >= 1, got {samples!r}")
    from PIL import Image

    dataset = ShapesDataset(ShapesConfig(seed=seed))
    out = Path(out)
    (out / "images").mkdir(parents=True, exist_ok=True)
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
    os.replace(temp, path)
    return path
