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
    """Check that ``images`` fill the plan's image spans exactly, in order.

    A sample's image span may hold several images back to back (a multi-image
    sample): images are consumed in order, each sample taking as many as fill its
    span exactly.

    Args:
        images: ``(C, H, W)`` tensors of every sample with image tokens, in row order.
        plan: the row's :class:`vlmcp.CPPlan`.
        patch_size: p; image i gives ``(H/p) * (W/p)`` tokens.
        channels: C.
        embed_dim: the vision encoder's output width, checked against ``hidden_size``
            when both are given.
        hidden_size: the LLM's hidden size.

    Returns:
        Tokens per image.

    Raises:
        ValueError, TypeError: naming the bad image, sample or width.
    """
    if embed_dim is not None and hidden_size is not None and embed_dim != hidden_size:
        raise ValueError(
            f"image embedding width {embed_dim} differs from the LLM hidden size {hidden_size}")
    tokens = image_token_counts(images, patch_size, channels)
    i = 0
    for sample, n in enumerate(plan.image_lens.tolist()):
        first, got = i, 0
        while got < n and i < len(tokens):
            got, i = got + tokens[i], i + 1
        if got != n:
            which = f"images {first}..{i - 1} give {got}" if i > first else "no image is left"
            raise ValueError(
                f"sample {sample} has {n} image tokens in the plan, but {which} "
                f"(patch {patch_size}, tokens per image {tokens[first:i]}); pass every sample's "
                "images in row order")
    if i != len(tokens):
        raise ValueError(
            f"got {len(tokens)} images but the plan's image spans take {i}: images {i}.."
            f"{len(tokens) - 1} are left over")
    return tokens
