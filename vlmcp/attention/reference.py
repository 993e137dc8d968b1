"""Dense single-process attention on the whole row: the ground truth for CP attention.

Plain torch ops on an explicit ``(L, L)`` mask, so autograd gives the reference
gradients; O(L^2) memory, meant for tests and checks, not for training.
"""

from __future__ import annotations

import torch

from vlmcp.layout.images import row_images

__all__ = ["reference_attention", "reference_mask"]


def reference_mask(is_image: torch.Tensor, cu_seqlens: torch.Tensor | None = None,
                   image_attention: str = "causal", image_ids: torch.Tensor | None = None,
                   sliding_window: int | None = None) -> torch.Tensor:
    """``BoolTensor[L, L]``: entry (i, j) is True iff query i attends to key j.

    Causal within each sample, nothing across samples; with
    ``image_attention="bidirectional"`` the tokens of each image also see each other
    (images as for :func:`vlmcp.plan_cp`: ``image_ids``, or maximal runs per sample).
    ``sliding_window`` ``W`` also requires ``i - j < W`` (transformers' Gemma 3 mask).
    """
    if image_attention not in ("causal", "bidirectional"):
        raise ValueError(f"image_attention must be 'causal' or 'bidirectional', got {image_attention!r}")
    L = is_image.numel()
    cu = torch.tensor([0, L]) if cu_seqlens is None else torch.as_tensor(cu_seqlens).long().cpu()
    sample = torch.repeat_interleave(torch.arange(cu.numel() - 1), cu[1:] - cu[:-1])
    if sample.numel() != L:
        raise ValueError(f"cu_seqlens ends at {int(cu[-1])}, but the row has L={L} tokens")
    idx = torch.arange(L)
    mask = (sample[:, None] == sample[None, :]) & (idx[None, :] <= idx[:, None])
    if image_attention == "bidirectional":
        ids = row_images(is_image.detach().cpu().bool(), cu, image_ids).image_ids
        mask |= (ids[:, None] == ids[None, :]) & (ids[:, None] >= 0)
    if sliding_window is not None:
        mask &= (idx[:, None] - idx[None, :]) < sliding_window
    return mask.to(is_image.device)


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_image: torch.Tensor,
                        cu_seqlens: torch.Tensor | None = None, image_attention: str = "causal",
                        softmax_scale: float | None = None,
                        image_ids: torch.Tensor | None = None,
                        sliding_window: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of the whole (packed) row in one process, in the inputs' dtype.

    Args:
        q: ``(L, H, D)``; k, v: ``(L, Hk, D)`` with ``H % Hk == 0`` (GQA).
        is_image: ``BoolTensor[L]``, image tokens (anywhere in their samples).
        cu_seqlens: ``IntTensor[S+1]`` sample boundaries, or None for one sample.
        image_attention: ``"causal"`` or ``"bidirectional"`` (the tokens of each image
            see each other both ways).
        softmax_scale: default ``D ** -0.5``.
        image_ids: as for :func:`vlmcp.plan_cp` (None: each image-token run is one image).
        sliding_window: ``W``: also ``i - j < W`` (Gemma 3 sliding layers); None: none.

    Returns:
        ``out (L, H, D)`` and ``lse (L, H)``, both differentiable. A query that sees no
        key gets ``out = 0``, ``lse = -inf`` and zero gradients (no NaN).
    """
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    mask = reference_mask(is_image, cu_seqlens, image_attention, image_ids, sliding_window)
    g = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = torch.einsum("qhd,khd->hqk", q, kk) * scale
    dead = ~mask.any(-1)
    s = s.masked_fill(~mask, float("-inf")).masked_fill(dead[:, None], 0.0)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.unsqueeze(-1)).masked_fill(~mask, 0.0)
    out = torch.einsum("hqk,khd->qhd", p, vv)
    return out, lse.masked_fill(dead, float("-inf")).transpose(0, 1)
