"""Input checks a VLM runs before any collective, identically on every rank.

They read only metadata every rank holds (the plan, image shapes, config), so a
bad batch raises the same error on every rank instead of leaving some ranks
inside a collective waiting for peers that raised.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from vlmcp.layout import CPPlan

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
    """Check that ``images`` fill the plan's image spans exactly, one image per span.

    Args:
        images: ``(C, H, W)`` tensors, one per sample with image tokens, in sample order.
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
    if isinstance(images, torch.Tensor) or not isinstance(images, Sequence):
        raise TypeError(f"images must be a list of (C, H, W) tensors, got {type(images).__name__}")
    spans = [(s, int(n)) for s, n in enumerate(plan.image_lens.tolist()) if n > 0]
    if len(images) != len(spans):
        raise ValueError(
            f"got {len(images)} images but the plan has {len(spans)} samples with image tokens "
            f"(samples {[s for s, _ in spans]}); pass one image per such sample, in sample order")
    tokens = []
    for i, (img, (sample, n)) in enumerate(zip(images, spans, strict=True)):
        if not isinstance(img, torch.Tensor) or img.dim() != 3 or img.shape[0] != channels:
            shape = tuple(img.shape) if isinstance(img, torch.Tensor) else type(img).__name__
            raise ValueError(f"image {i} must be a ({channels}, H, W) tensor, got {shape}")
        h, w = img.shape[1:]
        if h % patch_size or w % patch_size:
            raise ValueError(
                f"image {i} has size {h}x{w}, not a multiple of patch_size={patch_size}")
        t = (h // patch_size) * (w // patch_size)
        if t != n:
            raise ValueError(
                f"image {i} ({h}x{w}, patch {patch_size}) gives {t} tokens but sample {sample} "
                f"has {n} image tokens in the plan")
        tokens.append(t)
    return tokens
