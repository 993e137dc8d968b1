"""A Mamba-2 layer's token mixing under Ulysses: head shards holding the whole row.

Note [vlmcp Mamba-2 under Ulysses]
----------------------------------
The causal conv is depthwise and every head's SSD scan is independent given its group's B
and C, so a slice of heads with their groups is a complete problem on the whole row. With
``H`` and ``G`` divisible by P, rank j takes heads ``[j H/P, (j+1) H/P)`` and groups
``[j G/P, (j+1) G/P)`` (the groups those heads read: head h reads group ``h // (H/G)``) and
(:mod:`vlmcp.mixers.head_shards`)::

    rank r: xBC (N, H P + 2 G N_s), dt (N, H)                 N = this rank's slots
      | channels regrouped per head slice [x_j | B_j | C_j], all-to-all -> the whole row (L, c/P)
      | per sample, zero history: causal conv1d -> act -> x, B, C
      |   -> SSD scan (dt, A of the slice) + D x            (L, H/P, P)
      ' back to every rank's slots, inverse all-to-all    (N, H, P)

Exact and without redundant work (each rank scans 1/P of the heads; image tokens once), but
the bytes grow with L: about ``N x (H P + 2 G N_s + H)`` out and ``N x H x P`` back per rank,
where the state passing of :mod:`vlmcp.mixers.ssd_cp` sends ``H x (1 + P N_s)`` per segment.
Where P does not divide both H and G, the state passing runs (exact under either backend).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from vlmcp.attention.merge import accumulator_dtype
from vlmcp.layout.plan import RankShard
from vlmcp.mixers.head_shards import conv_on_head_shards, from_head_shards, to_head_shards, ulysses_row
from vlmcp.mixers.ssd import chunk_ssd

__all__ = ["mamba2_ulysses", "takes_ulysses"]


def takes_ulysses(heads: int, groups: int, P: int) -> bool:
    """Whether P ranks can split a Mamba-2 layer of ``heads`` heads in ``groups`` groups (Note above)."""
    return P > 1 and heads % P == 0 and groups % P == 0


def mamba2_ulysses(
    xbc: torch.Tensor, conv_weight: torch.Tensor, conv_bias: torch.Tensor | None, dt: torch.Tensor,
    A: torch.Tensor, D: torch.Tensor | None, shard: RankShard, group: dist.ProcessGroup, *, heads: int,
    head_dim: int, groups: int, state_dim: int, activation: Callable[[torch.Tensor], torch.Tensor],
    chunk_size: int = 64,
) -> torch.Tensor:
    """Conv1d, activation, SSD scan and ``D`` skip of this rank's slots, through head shards (Note above).

    Args:
        xbc: ``(N, H P + 2 G N_s)``, the pre-convolution ``[x | B | C]`` channels.
        conv_weight: ``(channels, 1, k)``, the depthwise conv's weight; conv_bias: ``(channels,)`` or None.
        dt: ``(N, H)`` time steps (after softplus and clamp); A: ``(H,)``; D: ``(H,)`` or None.
        shard, group: this rank's shard and the CP group (:func:`takes_ulysses` must hold).
        heads, head_dim, groups, state_dim: ``H``, ``P``, ``G``, ``N_s``.
        activation: applied after the convolution (Mamba-2: SiLU).
        chunk_size: tokens per chunk of the scan.

    Returns:
        ``(N, H, P)`` in :func:`accumulator_dtype` of ``xbc``, zero at padding slots. Replicated
        slots' input gradients are this rank's share (its head slice).
    """
    P, rank = dist.get_world_size(group), dist.get_rank(group)
    if not takes_ulysses(heads, groups, P):
        raise ValueError(f"Mamba-2 under Ulysses needs heads and groups divisible by P={P}, got {heads} "
                         f"heads in {groups} groups")
    N, L = shard.num_tokens, shard.seq_len
    h, g = heads // P, groups // P
    row = ulysses_row(shard)
    blocks = [heads * head_dim, groups * state_dim, groups * state_dim]
    mixed = conv_on_head_shards(xbc, blocks, conv_weight, conv_bias, row, group, activation)
    dts = to_head_shards(dt.reshape(N, P, h), row, group)
    x, B, C = torch.split(mixed, [h * head_dim, g * state_dim, g * state_dim], dim=-1)
    x = x.reshape(L, h, head_dim)
    heads_here = slice(rank * h, (rank + 1) * h)
    y, _, _ = chunk_ssd(x, dts, A[heads_here], B.reshape(L, g, state_dim), C.reshape(L, g, state_dim),
                        row.cu_seqlens, chunk_size=chunk_size)
    if D is not None:
        y = y + D[heads_here, None].to(y.dtype) * x.to(y.dtype)
    return from_head_shards(y, row, group).to(accumulator_dtype(xbc.dtype))
