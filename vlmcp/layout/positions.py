"""Position ids computed on the global row (before sharding).

Rotary position ids restart at 0 in every packed sample. Qwen2-VL's M-RoPE gives
each token three ids (temporal, height, width): an image token at grid cell
(t, h, w) gets (t, h, w); the text after the image continues from
max(T, H, W) on all three axes. Computing them per rank after sharding would
lose the image grid; shard them with ``shard.shard_position_ids``.
"""

from __future__ import annotations

import torch

from vlmcp.layout.validate import check_cu_seqlens, check_is_image, image_prefix_lens

__all__ = ["mrope_position_ids", "position_ids"]


def _sample_offsets(cu: torch.Tensor, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    seqlens = cu[1:] - cu[:-1]
    sid = torch.repeat_interleave(torch.arange(seqlens.numel()), seqlens, output_size=seq_len)
    return sid, torch.arange(seq_len) - cu[:-1][sid]


def position_ids(seq_len: int, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
    """``LongTensor[L]``: each token's offset within its sample."""
    return _sample_offsets(check_cu_seqlens(cu_seqlens, seq_len), seq_len)[1]


def mrope_position_ids(
    is_image: torch.Tensor,
    image_grid_thw: torch.Tensor,
    cu_seqlens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Qwen2-VL M-RoPE ids of a packed row whose images are sample prefixes.

    Args:
        is_image: ``BoolTensor[L]``.
        image_grid_thw: ``LongTensor[num_images, 3]``, the (t, h, w) token grid of each
            image, one row per sample that has image tokens, in sample order, with
            ``t * h * w`` equal to that sample's image token count.
        cu_seqlens: ``IntTensor[S+1]`` or None.

    Returns:
        ``LongTensor[3, L]``.
    """
    check_is_image(is_image)
    is_image = is_image.cpu()
    seq_len = is_image.numel()
    cu = check_cu_seqlens(cu_seqlens, seq_len)
    image_lens, first_bad = image_prefix_lens(is_image, cu)
    if first_bad >= 0:
        raise NotImplementedError(f"sample {first_bad} has image tokens after text")
    grids = torch.as_tensor(image_grid_thw, dtype=torch.long).cpu()
    with_image = torch.nonzero(image_lens > 0).flatten()
    if grids.dim() != 2 or grids.shape[1] != 3 or grids.shape[0] != with_image.numel():
        raise ValueError(
            f"image_grid_thw must have shape ({with_image.numel()}, 3), one (t, h, w) per "
            f"sample with images, got {tuple(grids.shape)}")
    wrong = grids.prod(dim=1) != image_lens[with_image]
    if bool(wrong.any()):
        i = int(torch.nonzero(wrong)[0])
        raise ValueError(
            f"image_grid_thw[{i}]={grids[i].tolist()} has {int(grids[i].prod())} tokens but "
            f"sample {int(with_image[i])} has {int(image_lens[with_image[i]])} image tokens")
    grid = torch.zeros(image_lens.numel(), 3, dtype=torch.long)
    grid[with_image] = grids
    sid, off = _sample_offsets(cu, seq_len)
    g = grid[sid]
    hw = (g[:, 1] * g[:, 2]).clamp(min=1)
    w = g[:, 2].clamp(min=1)
    image_ids = torch.stack([off // hw, (off // w) % g[:, 1].clamp(min=1), off % w])
    text_start = g.max(dim=1).values
    text_ids = (text_start + off - image_lens[sid]).expand(3, -1)
    return torch.where(is_image, image_ids, text_ids)
