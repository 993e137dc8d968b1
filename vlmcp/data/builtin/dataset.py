"""The built-in image-caption dataset: an endless, deterministic stream of samples.

Samples look like chat data: a short prompt, then the image(s), then the answer::

    caption   <bos> describe the picture  [image]            a red circle top left ... <eos>
    compare   <bos> compare the pictures  [image][image]     first a ... second a ... <eos>
    video     <bos> describe the video    [frame][frame]...  a blue cross bottom right <eos>
    sentence  <bos> the red circle is left of the blue square <eos>            (text only)

A comparison's two pictures and a video's frames sit back to back, so their
identity is carried by ``image_ids`` (one id per image), not by runs of image tokens.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from vlmcp.data.builtin.config import ShapesConfig
from vlmcp.data.builtin.shapes import caption_words, render, sample_scene, sentence_words
from vlmcp.data.builtin.vocab import BOS_ID, EOS_ID, IMAGE_ID, encode

__all__ = ["Sample", "ShapesDataset"]


@dataclass(frozen=True, eq=False)
class Sample:
    """One sample: a prompt, its images and the answer, or a text-only sentence.

    Attributes:
        index: the sample's index in the stream (its data position).
        input_ids: ``LongTensor[n]``; image slots hold ``IMAGE_ID``.
        image_ids: ``LongTensor[n]``, the sample's image (0, 1, ...) at each image slot, -1 at text.
        images: ``FloatTensor[3, H, W]`` images in [0, 1], in order (empty for a sentence).
        grids: ``(H // patch_size, W // patch_size)`` of each image.
        text: the words of the answer or sentence (without BOS/EOS).
    """

    index: int
    input_ids: torch.Tensor
    image_ids: torch.Tensor
    images: tuple[torch.Tensor, ...]
    grids: tuple[tuple[int, int], ...]
    text: str

    def __len__(self) -> int:
        return self.input_ids.numel()

    @property
    def is_image(self) -> torch.Tensor:
        """``BoolTensor[n]``, True at image slots."""
        return self.image_ids >= 0

    @property
    def image_tokens(self) -> int:
        """Image slots of the sample (0 for a sentence)."""
        return int(self.is_image.sum())


def _sample(index: int, prompt: list[str], images: list[torch.Tensor], grids: list[tuple[int, int]],
            answer: list[str]) -> Sample:
    ids, image_ids = [BOS_ID, *encode(prompt)], [-1] * (1 + len(prompt))
    for i, (h, w) in enumerate(grids):
        ids += [IMAGE_ID] * (h * w)
        image_ids += [i] * (h * w)
    ids += [*encode(answer), EOS_ID]
    image_ids += [-1] * (len(answer) + 1)
    return Sample(index=index, input_ids=torch.tensor(ids), image_ids=torch.tensor(image_ids),
                  images=tuple(images), grids=tuple(grids), text=" ".join(answer))


class ShapesDataset:
    """Images of coloured shapes with captions that describe them, generated on the fly.

    Sample ``i`` is a pure function of ``(config.seed, i)`` (its own numpy generator
    seeded with both), so any sample can be produced without producing the ones before
    it, on any rank, in any process. The stream is endless; there is no epoch.

    Args:
        config: the dataset's :class:`ShapesConfig`.
    """

    def __init__(self, config: ShapesConfig | None = None) -> None:
        if config is not None and not isinstance(config, ShapesConfig):
            raise TypeError(f"config must be a ShapesConfig, got {type(config).__name__}")
        self.config = config or ShapesConfig()

    @property
    def max_sample_len(self) -> int:
        """Tokens of the longest sample this dataset can produce."""
        return self.config.max_sample_len

    def kind(self, index: int) -> str:
        """``"sentence"``, ``"compare"``, ``"video"`` or ``"caption"``: what sample ``index`` is."""
        cfg = self.config
        for name, k, r in (("sentence", cfg.text_only_every, 1), ("compare", cfg.compare_every, 2),
                           ("video", cfg.video_every, 3)):
            if k > 0 and index % k == k - r:
                return name
        return "caption"

    def is_text_only(self, index: int) -> bool:
        """Whether sample ``index`` is a text-only sentence."""
        return self.kind(index) == "sentence"

    def __getitem__(self, index: int) -> Sample:
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise IndexError(f"sample index must be an int >= 0, got {index!r}")
        cfg = self.config
        rng = np.random.default_rng([cfg.seed, index])
        kind = self.kind(index)
        if kind == "sentence":
            return _sample(index, [], [], [], sentence_words(rng))
        scenes = [sample_scene(cfg, rng) for _ in range(2 if kind == "compare" else 1)]
        grid = lambda h, w: (h // cfg.patch_size, w // cfg.patch_size)
        if kind == "compare":
            images = [render(cfg, h, w, objs) for h, w, objs in scenes]
            answer = ["first", *caption_words(cfg, scenes[0][2]), "second", *caption_words(cfg, scenes[1][2])]
            return _sample(index, ["compare", "the", "pictures"], images,
                           [grid(h, w) for h, w, _ in scenes], answer)
        height, width, objects = scenes[0]
        if kind == "video":
            frames = []
            for _ in range(cfg.video_frames):  # the shapes drift a little from frame to frame
                objects = [dataclasses.replace(o, offset=tuple(
                    float(np.clip(x + rng.uniform(-0.05, 0.05), -0.15, 0.15)) for x in o.offset))
                    for o in objects]
                frames.append(render(cfg, height, width, objects))
            return _sample(index, ["describe", "the", "video"], frames,
                           [grid(height, width)] * cfg.video_frames, caption_words(cfg, objects))
        return _sample(index, ["describe", "the", "picture"], [render(cfg, height, width, objects)],
                       [grid(height, width)], caption_words(cfg, objects))

    def __repr__(self) -> str:
        return f"ShapesDataset({self.config!r})"
