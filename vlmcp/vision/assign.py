"""Which rank encodes which image under ``scatter``: a pure function of metadata.

A full-attention ViT costs about (patches)^2 per image. Greedy largest-first (LPT):
take images from the most to the least expensive and give each to the rank with
the least work so far (lowest rank on ties). The result is within 4/3 of the best
possible maximum load and is computed identically on every rank, so no rank ever
waits for an image its peers think it owns.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["assign_images", "vit_cost"]


def vit_cost(tokens: int) -> int:
    """Estimated ViT cost of an image of ``tokens`` patches: attention dominates, patches^2."""
    return tokens * tokens


def assign_images(costs: Sequence[int], num_ranks: int) -> list[int]:
    """Assign images to ranks, balancing the summed cost (greedy largest-first).

    Args:
        costs: estimated cost of each image (e.g. :func:`vit_cost` of its tokens).
        num_ranks: P >= 1.

    Returns:
        ``owner[i]``, the rank that encodes image i. Ranks may get no image.
    """
    if isinstance(num_ranks, bool) or not isinstance(num_ranks, int) or num_ranks < 1:
        raise ValueError(f"num_ranks must be an int >= 1, got {num_ranks!r}")
    if any(c < 0 for c in costs):
        raise ValueError(f"costs must be >= 0, got {list(costs)}")
    load = [0] * num_ranks
    owner = [0] * len(costs)
    # Stable: equal costs keep image order, so the result is deterministic everywhere.
    for i in sorted(range(len(costs)), key=lambda i: -costs[i]):
        r = min(range(num_ranks), key=lambda r: (load[r], r))
        owner[i] = r
        load[r] += costs[i]
    return owner
