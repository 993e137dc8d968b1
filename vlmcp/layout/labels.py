"""Next-token labels, shifted on the global row before sharding.

A chunk's last token predicts the first token of the next chunk, which usually
lives on another rank; shifting after sharding would silently train on the wrong
targets. So labels are built here on the whole row, then sharded with
``shard.shard(labels, fill=ignore_index)``.
"""

from __future__ import annotations

import torch

from vlmcp.layout.validate import check_cu_seqlens, check_is_image

__all__ = ["IGNORE_INDEX", "shift_labels"]

IGNORE_INDEX = -100


def shift_labels(
    input_ids: torch.Tensor,
    is_image: torch.Tensor,
    cu_seqlens: torch.Tensor | None = None,
    ignore_index: int = IGNORE_INDEX,
) -> torch.Tensor:
    """Target of each position of the global row.

    ``labels[i] = input_ids[i + 1]`` when tokens i and i+1 are both text of the same
    sample; every other position (image tokens, the last token of each sample) gets
    ``ignore_index``. Padding never exists on the global row; ``shard(..., fill=
    ignore_index)`` gives it ``ignore_index`` locally.

    Args:
        input_ids: ``LongTensor[L]``.
        is_image: ``BoolTensor[L]``.
        cu_seqlens: ``IntTensor[S+1]`` or None for one sample.
        ignore_index: label of positions without a target.

    Returns:
        ``LongTensor[L]`` on the device of ``input_ids``.
    """
    check_is_image(is_image)
    if input_ids.dim() != 1 or input_ids.shape[0] != is_image.shape[0]:
        raise ValueError(
            f"input_ids must have shape ({is_image.shape[0]},) like is_image, "
            f"got {tuple(input_ids.shape)}")
    cu = check_cu_seqlens(cu_seqlens, is_image.numel()).to(input_ids.device)
    is_text = ~is_image.to(input_ids.device)
    labels = torch.full_like(input_ids, ignore_index)
    last = torch.zeros_like(is_text)
    last[cu[1:] - 1] = True  # a sample's last token has no target inside the sample
    keep = is_text[:-1] & is_text[1:] & ~last[:-1]
    labels[:-1] = torch.where(keep, input_ids[1:], labels[:-1])
    return labels
