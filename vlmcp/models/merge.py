"""Step 3 of the data flow: merge the complete image embeddings into a rank's local row.

The vision placement hands every rank the embeddings of *all* image tokens of the
row, ``(I, hidden)``, images concatenated in row order. A local image slot at global
position t takes row ``(image tokens before t)``, wherever its image sits in its
sample. Under ``image_strategy="replicate"`` that is every row; under ``"shard"``
each rank takes its own subset.

The selection is an ``index_select`` even when a rank selects no row, so every
rank's backward reaches the placement's dual collective (a rank whose graph
skipped it would leave its peers waiting forever).
"""

from __future__ import annotations

import torch

from vlmcp.layout import RankShard

__all__ = ["image_rows", "merge_embeddings"]


def image_rows(shard: RankShard) -> torch.Tensor:
    """``LongTensor[N]``: the image-embedding row of each local image slot, -1 elsewhere."""
    before = torch.cumsum(shard.plan.is_image.long(), 0) - 1
    return torch.where(shard.is_image, before[shard.positions.clamp(min=0)], -1)


def merge_embeddings(
    text_embeds: torch.Tensor, image_embeds: torch.Tensor, shard: RankShard
) -> torch.Tensor:
    """Put image embeddings into the image slots of the local row.

    Args:
        text_embeds: ``(N, hidden)`` token embeddings of the local row (image and
            padding slots hold whatever the embedding of their id is; they are replaced
            or masked).
        image_embeds: ``(I, hidden)``, every image token of the row, in row order.
        shard: this rank's :class:`RankShard`.

    Returns:
        ``(N, hidden)``: image slots from ``image_embeds``, text slots from
        ``text_embeds``, padding slots zero.
    """
    total = int(shard.image_lens.sum())
    if image_embeds.dim() != 2 or image_embeds.shape[0] != total:
        raise ValueError(
            f"image_embeds must have shape ({total}, hidden) for the plan's {total} image tokens, "
            f"got {tuple(image_embeds.shape)}")
    if text_embeds.shape != (shard.num_tokens, image_embeds.shape[1]):
        raise ValueError(
            f"image embedding width {image_embeds.shape[1]} does not match the LLM: text embeddings "
            f"have shape {tuple(text_embeds.shape)}, expected ({shard.num_tokens}, hidden)")
    rows = image_rows(shard).to(text_embeds.device)
    slots = torch.nonzero(rows >= 0).flatten()
    keep = (shard.is_text.to(text_embeds.device)).unsqueeze(1).to(text_embeds.dtype)
    merged = text_embeds * keep
    return merged.index_put((slots,), image_embeds.index_select(0, rows[slots]).to(merged.dtype))
