"""The built-in image-caption dataset: an endless, deterministic stream of samples."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from vlmcp.data.config import ShapesConfig
from vlmcp.data.shapes import caption_words, render, sample_scene, sentence_words
from vlmcp.data.vocab import BOS_ID, EOS_ID, IMAGE_ID, encode

__all__ = ["Sample", "ShapesDataset"]


@dataclass(frozen=True, eq=False)
class Sample:
    """One sample: ``[image tokens | <bos> caption <eos>]``, or a text-only sentence.

    Attributes:
        index: the sample's index in the stream (its data position).
        input_ids: ``LongTensor[n]``; the first ``image_tokens`` entries are ``IMAGE_ID``.
        image: ``FloatTensor[3, H, W]`` in [0, 1], or None for a text-only sample.
        image_tokens: ``(H // patch_size) * (W // patch_size)``, 0 without an image.
        grid_hw: ``(H // patch_size, W // patch_size)``, ``(0, 0)`` without an image.
        text: the words of the caption or sentence (without BOS/EOS).
    """

    index: int
    input_ids: torch.Tensor
    image: torch.Tensor | None
    image_tokens: int
    grid_hw: tuple[int, int]
    text: str

    def __len__(self) -> int:
        return self.input_ids.numel()


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

    def is_text_only(self, index: int) -> bool:
        """Whether sample ``index`` is a text-only sentence."""
        k = self.config.text_only_every
        return k > 0 and index % k == k - 1

    def __getitem__(self, index: int) -> Sample:
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise IndexError(f"sample index must be an int >= 0, got {index!r}")
        cfg = self.config
        rng = np.random.default_rng([cfg.seed, index])
        if self.is_text_only(index):
            words = sentence_words(rng)
            return Sample(index=index, input_ids=torch.tensor([BOS_ID, *encode(words), EOS_ID]),
                          image=None, image_tokens=0, grid_hw=(0, 0), text=" ".join(words))
        height, width, objects = sample_scene(cfg, rng)
        grid_hw = (height // cfg.patch_size, width // cfg.patch_size)
        n_image = grid_hw[0] * grid_hw[1]
        words = caption_words(cfg, objects)
        ids = [IMAGE_ID] * n_image + [BOS_ID, *encode(words), EOS_ID]
        return Sample(index=index, input_ids=torch.tensor(ids), image=render(cfg, height, width, objects),
                      image_tokens=n_image, grid_hw=grid_hw, text=" ".join(words))

    def __repr__(self) -> str:
        return f"ShapesDataset({self.config!r})"
