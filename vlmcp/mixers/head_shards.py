"""The Ulysses road of a recurrent mixer: this rank's head shard of the whole row, and back.

A depthwise conv and a per-head recurrence are complete problems on a slice of heads, so
under Ulysses every rank runs its 1/P of the heads over the whole row (Note [vlmcp Gated
DeltaNet under Ulysses]; Mamba-2: Note [vlmcp Mamba-2 under Ulysses])::

    rank r's slots (N, P, c): channel slice j of each slot
      | all-to-all: slice j of every rank's slots -> rank j                 (P N, c)
      | global order: each owned token from its owner's slots, each replicated
      '   token from this rank's own copy (so its gradient is this rank's share)   (L, c)
    ... the mixer on the whole row, per sample ...
    outputs (L, *) -> every rank's slots (padding: a zero row), (P N, *)
      ' inverse all-to-all -> (N, P * *)

Both all-to-alls are autograd collectives whose dual is the inverse all-to-all
(:func:`vlmcp.comm.all_to_all`). :func:`ulysses_row` is the index metadata, computed
identically on every rank from the plan and cached per shard.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from vlmcp.comm import all_to_all
from vlmcp.layout.choose import plan_cp
from vlmcp.layout.plan import RankShard
from vlmcp.mixers.conv_halo import causal_conv1d_cp

__all__ = ["UlyssesRow", "channel_slices", "conv_on_head_shards", "from_head_shards", "to_head_shards",
           "ulysses_row"]


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
        raise AssertionError("vlmcp.mixers.head_shards: a position of the row is held by no rank")
    cu = plan.cu_seqlens.long()
    whole_row = plan_cp(torch.zeros(L, dtype=torch.bool), 1, cu).for_rank(0)
    if not torch.equal(whole_row.positions, torch.arange(L)):
        raise AssertionError("vlmcp.mixers.head_shards: a one-rank plan is not the row in order")
    row = UlyssesRow(order=order, back=torch.cat(back), cu_seqlens=cu, whole_row=whole_row)
    _CACHE[shard] = row
    return row


def to_head_shards(x: torch.Tensor, row: UlyssesRow, group: dist.ProcessGroup) -> torch.Tensor:
    """``x (N, P, c)``, channel slice j of this rank's slots -> slice ``rank`` of the whole row ``(L, c)``.

    Backward: the inverse all-to-all (each slot's gradient of slice j back from rank j); a
    replicated token's gradient reaches this rank's own copy only (its share).
    """
    received = all_to_all(x, group, scatter_dim=1, gather_dim=0).flatten(0, 1)
    rank = dist.get_rank(group)
    return torch.cat([received, x[:, rank]]).index_select(0, row.order.to(x.device))


def from_head_shards(out: torch.Tensor, row: UlyssesRow, group: dist.ProcessGroup) -> torch.Tensor:
    """``out (L, h, *)``, this rank's heads of the whole row -> every head of this rank's slots
    ``(N, P h, *)``, zero at padding slots. Backward: the inverse all-to-all."""
    padded = torch.cat([out, out.new_zeros((1,) + tuple(out.shape[1:]))])
    out = padded.index_select(0, row.back.to(out.device))
    return all_to_all(out, group, scatter_dim=0, gather_dim=1)


def channel_slices(blocks: Sequence[int], P: int) -> torch.Tensor:
    """``(P, sum(blocks) / P)``: row j holds head slice j's channels, slice j of each block in turn.

    A mixer's channels are blocks laid end to end (Gated DeltaNet's ``[q | k | v]``, Mamba-2's
    ``[x | B | C]``), each split into P equal contiguous parts, one per head slice.
    """
    parts, offset = [], 0
    for n in blocks:
        parts.append(torch.arange(n).view(P, n // P) + offset)
        offset += n
    return torch.cat(parts, 1)


def conv_on_head_shards(
    mixed: torch.Tensor, blocks: Sequence[int], conv_weight: torch.Tensor, conv_bias: torch.Tensor | None,
    row: UlyssesRow, group: dist.ProcessGroup, activation: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """This rank's head slice of a mixer's pre-convolution channels, over the whole row, through its
    depthwise causal conv (per sample, zero history) and ``activation``.

    Args:
        mixed: ``(N, sum(blocks))``, this rank's slots' channels, ``blocks`` end to end.
        blocks: the channel blocks (:func:`channel_slices`), each divisible by P.
        conv_weight: ``(sum(blocks), 1, k)``; conv_bias: ``(sum(blocks),)`` or None.
        row, group: :func:`ulysses_row` of this rank's shard, and the CP group.
        activation: applied after the convolution.

    Returns:
        ``(L, sum(blocks) / P)``: slice ``rank`` of each block, in order, for every position of the row.
    """
    P, rank = dist.get_world_size(group), dist.get_rank(group)
    slices = channel_slices(blocks, P).to(mixed.device)
    x = to_head_shards(mixed[:, slices.flatten()].view(mixed.shape[0], P, -1), row, group)
    mine = slices[rank]
    bias = conv_bias[mine] if conv_bias is not None else None
    return activation(causal_conv1d_cp(x, conv_weight[mine], bias, row.whole_row, None))
