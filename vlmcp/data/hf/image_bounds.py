"""``--image-max-pixels`` / ``--image-min-pixels``: images scaled into a pixel range before the processor.

LLaMA-Factory's rule (its ``image_max_pixels`` / ``image_min_pixels``), aspect ratio kept::

    if h * w > max_pixels:  f = sqrt(max_pixels / (h * w)); h, w = int(h * f), int(w * f)
    if h * w < min_pixels:  f = sqrt(min_pixels / (h * w)); h, w = int(h * f), int(w * f)

The model's processor then sizes the scaled image by its own rules (Qwen's ``smart_resize``,
LLaVA's fixed size). Planning counts an image's tokens at :meth:`ImageBounds.size` of its
header's size, and training resizes the decoded image to that same size
(:meth:`ImageBounds.apply`), so both always agree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["ImageBounds"]


@dataclass(frozen=True)
class ImageBounds:
    """The pixel range images are scaled into (None: no bound on that side)."""

    min_pixels: int | None = None
    """Scale an image with fewer pixels up to at least about this many."""
    max_pixels: int | None = None
    """Scale an image with more pixels down to at most this many."""

    def __post_init__(self):
        for name in ("min_pixels", "max_pixels"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"--image-{name.replace('_', '-')} must be an integer >= 1, got {value!r}")
        if self.min_pixels and self.max_pixels and self.min_pixels > self.max_pixels:
            raise ValueError(f"--image-min-pixels {self.min_pixels} exceeds --image-max-pixels "
                             f"{self.max_pixels}")

    def size(self, height: int, width: int) -> tuple[int, int]:
        """``(height, width)`` of an image of that size after scaling (unchanged when within bounds)."""
        if self.max_pixels is not None and height * width > self.max_pixels:
            f = math.sqrt(self.max_pixels / (height * width))
            height, width = max(1, int(height * f)), max(1, int(width * f))
        if self.min_pixels is not None and height * width < self.min_pixels:
            f = math.sqrt(self.min_pixels / (height * width))
            height, width = max(1, int(height * f)), max(1, int(width * f))
        return height, width

    def apply(self, image):
        """The PIL ``image`` resized to :meth:`size` (the same object when within bounds)."""
        height, width = self.size(image.height, image.width)
        if (height, width) == (image.height, image.width):
            return image
        return image.resize((width, height))
