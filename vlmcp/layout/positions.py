"""Position ids computed on the global row (before sharding).

Rotary position ids restart at 0 in every packed sample. Qwen2-VL's M-RoPE gives
each token three ids (temporal, height, width), the rule of transformers 5.x
``Qwen2VLModel.get_rope_index``: text tokens count up on all three axes; an image
with an LLM token grid (t, h, w) takes ``base + (i_t, i_h, i_w)`` where ``base`` is
the next id, and the text after it continues from ``base + max(h, w)``: one past the
image's largest id for an image (t = 1); for a video grid with t > max(h, w)
transformers 5.x advances by max(h, w) as well, and so does this function. Computing
them per rank after sharding would lose the grids; shard them with
``shard.shard_position_ids``.
"""

from __future__ import annotations

import torch

from vlmcp.layout.images import row_images
from vlmcp.layout.validate import check_cu_seqlens, check_is_image

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
    image_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Qwen2-VL M-RoPE ids of a packed row, images anywhere in its samples.

    Args:
        is_image: ``BoolTensor[L]``.
        image_grid_thw: ``LongTensor[num_images, 3]``, the (t, h, w) LLM token grid of
            each image in row order (after any spatial merge: ``t * h * w`` is the
            image's token count).
        cu_seqlens: ``IntTensor[S+1]`` or None.
        image_ids: as for :func:`vlmcp.plan_cp` (None: each image-token run is one image).

    Returns:
        ``LongTensor[3, L]``.
    """
    check_is_image(is_image)
    is_image = is_image.cpu()
    seq_len = is_image.numel()
    cu = check_cu_seqlens(cu_seqlens, seq_len)
    images = row_images(is_image, cu, image_ids)
    n = images.num_images
    grids = torch.as_tensor(image_grid_thw, dtype=torch.long).cpu()
    if grids.dim() != 2 or grids.shape[1] != 3 or grids.shape[0] != n:
        raise ValueError(
            f"image_grid_thw must have shape ({n}, 3), one (t, h, w) per image in row order, "
            f"got {tuple(grids.shape)}")
    wrong = grids.prod(dim=1) != images.lens
    if bool(wrong.any()):
        i = int(torch.nonzero(wrong)[0])
        a, b = images.spans[i].tolist()
        raise ValueError(
            f"image_grid_thw[{i}]={grids[i].tolist()} has {int(grids[i].prod())} tokens but "
            f"image {i} (tokens {a}..{b - 1}) has {b - a}")
    # how far each token moves the next free id: text 1, an image max(h, w) (at its end)
    advance = (~is_image).long()
    if n:
        advance[images.spans[:, 1] - 1] = grids[:, 1:].max(dim=1).values
    before = torch.cumsum(advance, 0) - advance
    before = before - before[cu[:-1]][images.sample_ids]  # restart in every sample
    ids = before.expand(3, -1).clone()
    if n:
        img = torch.nonzero(is_image).flatten()
        which = images.image_ids[img]
        j = img - images.spans[which, 0]
        g = grids[which]
        hw = g[:, 1] * g[:, 2]
        ids[:, img] = before[images.spans[which, 0]] + torch.stack(
            [j // hw, (j // g[:, 2]) % g[:, 1], j % g[:, 2]])
    return ids
