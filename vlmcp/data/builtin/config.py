"""Configuration of the built-in shapes dataset."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["MAX_SENTENCE_TOKENS", "PROMPT_TOKENS", "ShapesConfig"]

MAX_SENTENCE_TOKENS = 11
PROMPT_TOKENS = 3
"""Words of the prompt before a sample's images (``describe the picture`` and the like)."""
"""Tokens of the longest text-only sentence:
``<bos> the red circle is left of the blue square <eos>``."""


def _check_int(name: str, value, minimum: int) -> None:
    # bool is an int subclass; True as a size is always a mistake.
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"ShapesConfig.{name} must be an int >= {minimum}, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class ShapesConfig:
    """Images of coloured shapes on a grid, with captions that describe them.

    Every field has a default that makes a small, quickly learnable dataset: a sample
    is at most 36 image tokens (48x48 pixels, 8x8 patches) plus 13 caption tokens.
    """

    seed: int = 0
    """Dataset seed. Sample ``i`` depends only on ``(seed, i)``."""

    patch_size: int = 8
    """Side of a ViT patch in pixels; image sides are multiples of it, and an image of
    H x W pixels becomes ``(H // patch_size) * (W // patch_size)`` image tokens."""

    min_image_size: int = 16
    """Smallest image side in pixels (a multiple of ``patch_size``)."""

    max_image_size: int = 48
    """Largest image side in pixels (a multiple of ``patch_size``). Sides are drawn
    uniformly from the multiples of ``patch_size`` in ``[min_image_size, max_image_size]``,
    so image token counts vary between samples."""

    square_images: bool = False
    """Draw one side for both height and width. By default they are drawn independently,
    which exercises non-square patch grids (and M-RoPE) downstream."""

    grid: Literal[2, 3] = 2
    """Cells per image side; each shape sits in one cell, and the caption names the cell
    ("top left", ..., or with 3: "middle center"). 2 keeps shapes large enough to
    recognise in a 16x16 image."""

    max_objects: int = 2
    """Most shapes per image (at least 1, at most ``grid**2``); the count is uniform in
    ``[1, max_objects]``. Each adds 5 or 6 caption words."""

    text_only_every: int = 4
    """Every ``text_only_every``-th sample (index ``i`` with ``i % k == k - 1``) is a
    text-only sentence without an image, so packed rows mix both. 0 disables them; 1 is
    rejected (no images at all). Because text-only samples are never adjacent, every
    packed row holds an image when ``seq_len >= max_sample_len + MAX_SENTENCE_TOKENS``,
    so the vision tower gets a gradient every step."""

    compare_every: int = 5
    """Every ``compare_every``-th sample (``i % k == k - 2``, unless text-only) asks to
    compare two pictures placed back to back (``first <caption> second <caption>``).
    0 disables them."""

    video_every: int = 7
    """Every ``video_every``-th sample (``i % k == k - 3``, unless text-only or a
    comparison) is a short "video": ``video_frames`` frames of one scene back to back,
    its shapes drifting, captioned like a picture. 0 disables them."""

    video_frames: int = 3
    """Frames of a video sample (each a separate image of the same size)."""

    def __post_init__(self) -> None:
        _check_int("seed", self.seed, 0)
        _check_int("patch_size", self.patch_size, 1)
        _check_int("min_image_size", self.min_image_size, self.patch_size)
        _check_int("max_image_size", self.max_image_size, self.min_image_size)
        for name in ("min_image_size", "max_image_size"):
            size = getattr(self, name)
            if size % self.patch_size:
                raise ValueError(
                    f"ShapesConfig.{name}={size} must be a multiple of patch_size={self.patch_size}")
        if not isinstance(self.square_images, bool):
            raise ValueError(f"ShapesConfig.square_images must be a bool, got {self.square_images!r}")
        if self.grid not in (2, 3) or isinstance(self.grid, bool):
            raise ValueError(f"ShapesConfig.grid must be 2 or 3, got {self.grid!r}")
        _check_int("max_objects", self.max_objects, 1)
        if self.max_objects > self.grid ** 2:
            raise ValueError(
                f"ShapesConfig.max_objects={self.max_objects} exceeds the {self.grid ** 2} cells "
                f"of a {self.grid}x{self.grid} grid")
        _check_int("text_only_every", self.text_only_every, 0)
        _check_int("compare_every", self.compare_every, 0)
        _check_int("video_every", self.video_every, 0)
        _check_int("video_frames", self.video_frames, 1)
        for name in ("compare_every", "video_every"):
            if 0 < getattr(self, name) < 3:
                raise ValueError(f"ShapesConfig.{name} must be 0 (off) or >= 3, got {getattr(self, name)!r}")
        if self.text_only_every == 1:
            raise ValueError(
                "ShapesConfig.text_only_every=1 makes every sample text-only (no images); "
                "use 0 for no text-only samples or k >= 2 for one in k")

    @property
    def max_image_tokens(self) -> int:
        """Image tokens of the largest image."""
        return (self.max_image_size // self.patch_size) ** 2

    @property
    def max_caption_tokens(self) -> int:
        """Tokens of the longest caption: BOS, 5 words per shape, "and" between, EOS."""
        return 2 + 5 * self.max_objects + (self.max_objects - 1)

    @property
    def max_sample_len(self) -> int:
        """Tokens of the longest sample: a prompt and its images with their caption(s), or a sentence."""
        caption = PROMPT_TOKENS + self.max_image_tokens + self.max_caption_tokens
        compare = PROMPT_TOKENS + 2 * self.max_image_tokens + 2 * self.max_caption_tokens
        video = PROMPT_TOKENS + self.video_frames * self.max_image_tokens + self.max_caption_tokens
        return max(caption, compare if self.compare_every else 0, video if self.video_every else 0,
                   MAX_SENTENCE_TOKENS)
