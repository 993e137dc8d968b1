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

import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from vlmcp.comm import all_to_all
from vlmcp.layout.choose import plan_cp
from vlmcp.layout.plan import RankShard
from vlmcp.mixers.conv_halo import causal_conv1d_cp
from vlmcp.mixers.delta_rule import chunk_gated_delta_rule

__all__ = ["UlyssesRow", "gated_deltanet_ulysses", "ulysses_row"]


@dataclass(frozen=True, eq=False)
class UlyssesRow:
    """Rank r's index metadata for the Ulysses road (cached per shard).

    Attributes:
        order: ``LongTensor[L]``, for each global position, its row in
            ``[received slots (P N) | this rank's own slots (N)]``.
        back: ``LongTensor[P N]``, for each slot of each rank (rank order), its global
            position, ``L`` (a zero row) for padding.
        cu_seqlens: ``LongTensor[S+1]``, the row's samples.
        whole_row: a one-rank shard of the row (positions ``0..L-1``), for the convolution.
    """

    order: torch.Tensor
    back: torch.Tensor
    cu_seqlens: torch.Tensor
    whole_row: RankShard


_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def ulysses_row(shard: RankShard) -> UlyssesRow:
    """Build (or fetch) this rank's :class:`UlyssesRow` (metadata only)."""
    cached = _CACHE.get(shard)
    if cached is not None:
        return cached
    plan, P, N, L = shard.plan, shard.cp_size, shard.num_tokens, shard.seq_len
    order = torch.full((L,), -1, dtype=torch.long)
    back = []
    for s, other in enumerate(plan.shards()):
        held = other.positions >= 0
        owned = held & ~other.replicated
        order[other.positions[owned]] = s * N + torch.nonzero(owned).flatten()
        back.append(torch.where(held, other.positions, L))
    mine = torch.nonzero(shard.replicated & (shard.positions >= 0)).flatten()
    order[shard.positions[mine]] = P * N + mine
    if bool((order < 0).any()):
        raise AssertionError("vlmcp.mixers.deltanet_ulysses: a position of the row is held by no rank")
    cu = plan.cu_seqlens.long()
    whole_row = plan_cp(torch.zeros(L, dtype=torch.bool), 1, cu).for_rank(0)
    if not torch.equal(whole_row.positions, torch.arange(L)):
        raise AssertionError("vlmcp.mixers.deltanet_ulysses: a one-rank plan is not the row in order")
    row = UlyssesRow(order=order, back=torch.cat(back), cu_seqlens=cu, whole_row=whole_row)
    _CACHE[shard] = row
    return row


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
    P, rank = dist.get_world_size(group), dist.get_rank(group)
    if key_heads % P or value_heads % P:
        raise ValueError(f"Gated DeltaNet under Ulysses needs key and value heads divisible by P={P}, got "
                         f"{key_heads} and {value_heads}")
    N, L = shard.num_tokens, shard.seq_len
    hk, hv = key_heads // P, value_heads // P
    row = ulysses_row(shard)
    device = mixed.device
    # channel c of head slice j, for the q, k and v blocks in turn: (P, C/P) indices into C
    q_ch = torch.arange(key_heads * key_dim).view(P, hk * key_dim)
    v_ch = torch.arange(value_heads * value_dim).view(P, hv * value_dim) + 2 * key_heads * key_dim
    slices = torch.cat([q_ch, q_ch + key_heads * key_dim, v_ch], 1).to(device)

    def to_heads(x: torch.Tensor) -> torch.Tensor:  # (N, P, c) -> this rank's slice of the whole row (L, c)
        received = all_to_all(x, group, scatter_dim=1, gather_dim=0).flatten(0, 1)
        return torch.cat([received, x[:, rank]]).index_select(0, row.order.to(device))

    x = to_heads(mixed[:, slices.flatten()].view(N, P, -1))
    gs, bs = (to_heads(t.reshape(N, P, -1)) for t in (g, beta))
    mine = slices[rank]
    bias = conv_bias[mine] if conv_bias is not None else None
    x = activation(causal_conv1d_cp(x, conv_weight[mine], bias, row.whole_row, None))
    q, k, v = torch.split(x, [hk * key_dim, hk * key_dim, hv * value_dim], dim=-1)
    out, _ = chunk_gated_delta_rule(q.reshape(L, hk, key_dim), k.reshape(L, hk, key_dim),
                                    v.reshape(L, hv, value_dim), gs, bs, row.cu_seqlens,
                                    chunk_size=chunk_size, scale=scale, use_qk_l2norm=use_qk_l2norm,
                                    kernel=kernel)
    out = torch.cat([out, out.new_zeros((1, hv, value_dim))]).index_select(0, row.back.to(device))
    return all_to_all(out, group, scatter_dim=0, gather_dim=1)
