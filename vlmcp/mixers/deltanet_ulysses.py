"""A Gated DeltaNet layer's token mixing under Ulysses: head shards holding the whole row.

Note [vlmcp Gated DeltaNet under Ulysses]
-----------------------------------------
The convolution is depthwise and every value head's recurrence is independent, so a
slice of heads (with their conv channels) is a complete problem on the whole row. Rank
j takes q/k heads ``[j Hk/P, (j+1) Hk/P)`` and value heads ``[j Hv/P, (j+1) Hv/P)``
(the same GQA groups), and::

    rank r: mixed (N, Hk K + Hk K + Hv V), g, beta (N, Hv)       N = this rank's slots
      | channels regrouped per head slice, (N, P, C/P)
      | all-to-all: slice j of every rank's slots -> rank j               (P N, C/P)
      | global order: each owned token from its owner's slots, each replicated
      |   token from this rank's own copy (so its gradient is this rank's share)
      | per sample, zero history: causal conv1d -> act -> q, k, v -> gated delta rule
      | outputs back to every rank's slots (padding: zero), (P N, Hv/P, V)
      ' inverse all-to-all -> (N, Hv, V)

Exact and simple, but the bytes grow with L (about ``N x (C + 2 Hv)`` out and ``N x Hv x V``
back per rank, padding and replicated slots included) where the state passing of
:mod:`vlmcp.mixers.delta_rule_cp` sends a fixed ``Hv x K x (K + V)`` per segment; in exchange each
rank computes exactly its 1/P of the heads, with no redundant image work and no affine
maps (which cost the state passing up to ``(K + V) / V`` times the recurrence). Needs
``Hk`` and ``Hv`` divisible by P.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from vlmcp.layout.plan import RankShard
from vlmcp.mixers.delta_rule import chunk_gated_delta_rule
from vlmcp.mixers.head_shards import (
    UlyssesRow,
    conv_on_head_shards,
    from_head_shards,
    to_head_shards,
    ulysses_row,
)

__all__ = ["UlyssesRow", "gated_deltanet_ulysses", "ulysses_row"]


def gated_deltanet_ulysses(
    mixed: torch.Tensor, conv_weight: torch.Tensor, conv_bias: torch.Tensor | None, g: torch.Tensor,
    beta: torch.Tensor, shard: RankShard, group: dist.ProcessGroup, *, key_heads: int, key_dim: int,
    value_heads: int, value_dim: int, activation: Callable[[torch.Tensor], torch.Tensor],
    chunk_size: int = 64, scale: float | None = None, use_qk_l2norm: bool = True, kernel: str = "auto",
) -> torch.Tensor:
    """Conv1d, activation and gated delta rule of this rank's slots, through head shards (Note above).

    Args:
        mixed: ``(N, Hk K + Hk K + Hv V)``, the pre-convolution ``[q | k | v]`` channels.
        conv_weight: ``(C, 1, k)``, the depthwise conv's weight; conv_bias: ``(C,)`` or None.
        g: ``(N, Hv)`` log decays; beta: ``(N, Hv)``.
        shard, group: this rank's shard and the CP group (P ranks, ``Hk % P == Hv % P == 0``).
        key_heads, key_dim, value_heads, value_dim: ``Hk``, ``K``, ``Hv``, ``V``.
        activation: applied after the convolution (Qwen3.5: SiLU).
        chunk_size, scale, use_qk_l2norm, kernel: as in :func:`vlmcp.mixers.chunk_gated_delta_rule`.

    Returns:
        ``(N, Hv, V)`` in ``mixed.dtype``, zero at padding slots. Replicated slots' input
        gradients are this rank's share (its head slice).
    """
    P = dist.get_world_size(group)
    if key_heads % P or value_heads % P:
        raise ValueError(f"Gated DeltaNet under Ulysses needs key and value heads divisible by P={P}, got "
                         f"{key_heads} and {value_heads}")
    N, L = shard.num_tokens, shard.seq_len
    hk, hv = key_heads // P, value_heads // P
    row = ulysses_row(shard)
    blocks = [key_heads * key_dim, key_heads * key_dim, value_heads * value_dim]
    x = conv_on_head_shards(mixed, blocks, conv_weight, conv_bias, row, group, activation)
    gs, bs = (to_head_shards(t.reshape(N, P, -1), row, group) for t in (g, beta))
    q, k, v = torch.split(x, [hk * key_dim, hk * key_dim, hv * value_dim], dim=-1)
    out, _ = chunk_gated_delta_rule(q.reshape(L, hk, key_dim), k.reshape(L, hk, key_dim),
                                    v.reshape(L, hv, value_dim), gs, bs, row.cu_seqlens,
                                    chunk_size=chunk_size, scale=scale, use_qk_l2norm=use_qk_l2norm,
                                    kernel=kernel)
    return from_head_shards(out, row, group)
