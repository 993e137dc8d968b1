"""Input checks a VLM runs before any collective, identically on every rank.

They read only metadata every rank holds (the plan, image shapes, config), so a
bad batch raises the same error on every rank instead of leaving some ranks
inside a collective waiting for peers that raised.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from vlmcp.layout import CPPlan
from vlmcp.vision.tower import image_token_counts

__all__ = ["check_images_match"]


def check_images_match(
    images: Sequence[torch.Tensor],
    plan: CPPlan,
    patch_size: int,
    *,
    channels: int = 3,
    embed_dim: int | None = None,
    hidden_size: int | None = None,
) -> list[int]:
    """Check that ``images`` are the plan's images, one for one, in row order.

    The plan's images are its ``image_ids`` (or each maximal run of image tokens in a
    sample, so two images placed back to back are one image unless ``image_ids``
    tells them apart).

    Args:
        images: ``(C, H, W)`` tensors, one per image of the row, in row order.
        plan: the row's :class:`vlmcp.CPPlan`.
        patch_size: p; image i gives ``(H/p) * (W/p)`` tokens.
        channels: C.
        embed_dim: the vision encoder's output width, checked against ``hidden_size``
            when both are given.
        hidden_size: the LLM's hidden size.

    Returns:
        Tokens per image.

    Raises:
        ValueError, TypeError: naming the bad image, its span or the width.
    """
    if embed_dim is not None and hidden_size is not None and embed_dim != hidden_size:
        raise ValueError(
            f"image embedding width {embed_dim} differs from the LLM hidden size {hidden_size}")
    tokens = image_token_counts(images, patch_size, channels)
    spans = plan.images.spans.tolist()
    if len(tokens) != len(spans):
        raise ValueError(
            f"got {len(tokens)} images but the row has {len(spans)} image spans (tokens per image "
            f"{tokens}, span lengths {[b - a for a, b in spans]}); pass one image per span in row "
            "order, and plan_cp(..., image_ids=...) where images sit back to back")
    for i, (n, (a, b)) in enumerate(zip(tokens, spans, strict=True)):
        if n != b - a:
            raise ValueError(
                f"image {i} gives {n} tokens (patch {patch_size}, shape {tuple(images[i].shape)}) but "
                f"its span, tokens {a}..{b - 1} of the row (sample {int(plan.images.samples[i])}), has "
                f"{b - a}; pass one image per span in row order, and plan_cp(..., image_ids=...) "
                "where images sit back to back")
    return tokens
