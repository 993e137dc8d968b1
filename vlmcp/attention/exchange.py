"""Which tokens CP attention exchanges between ranks, derived from the plan alone.

A rank's *travelling* tokens are its valid, non-replicated slots: its zigzag
chunks (text only under ``image_strategy="replicate"``, text and image under
``"shard"``), padding excluded. Replicated image tokens never travel: every rank
already has them. Because ``shard.plan`` gives every peer's metadata, each rank
knows, without communicating, how many tokens every peer sends and where they sit
in the global row, so message sizes and block structure agree on all ranks.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from vlmcp.attention.masks import Run, runs_of
from vlmcp.layout.plan import RankShard

__all__ = ["Exchange", "exchange_of"]


@dataclass(frozen=True)
class Exchange:
    """The travelling tokens of every rank of a plan, seen from one rank.

    Attributes:
        rank: this rank.
        cp_size: P.
        send_index: ``LongTensor[T_rank]``, local slots of this rank's travelling tokens,
            in local order (the packed buffer this rank sends).
        counts: ``T_p`` for every rank p (tokens in p's packed buffer).
        positions: per rank p, ``LongTensor[T_p]`` global positions of p's packed buffer.
        runs: per rank p, the runs of p's packed buffer (storage index = buffer index).
        local_runs: runs of this rank's local slots (padding excluded).
    """

    rank: int
    cp_size: int
    send_index: torch.Tensor
    counts: tuple[int, ...]
    positions: tuple[torch.Tensor, ...]
    runs: tuple[tuple[Run, ...], ...]
    local_runs: tuple[Run, ...]


def _travelling(shard: RankShard) -> torch.Tensor:
    return torch.nonzero(~shard.replicated & (shard.positions >= 0)).flatten()


_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def exchange_of(shard: RankShard) -> Exchange:
    """The :class:`Exchange` of ``shard`` (cached per shard object: layers share it)."""
    hit = _CACHE.get(shard)
    if hit is not None:
        return hit
    idx, pos, runs = [], [], []
    for p in range(shard.cp_size):
        peer = shard if p == shard.rank else shard.plan.for_rank(p)
        i = _travelling(peer)
        idx.append(i)
        pos.append(peer.positions[i])
        runs.append(tuple(runs_of(peer.sample_ids[i], peer.offsets[i])))
    ex = Exchange(
        rank=shard.rank, cp_size=shard.cp_size, send_index=idx[shard.rank],
        counts=tuple(int(i.numel()) for i in idx), positions=tuple(pos), runs=tuple(runs),
        local_runs=tuple(runs_of(shard.sample_ids, shard.offsets)))
    _CACHE[shard] = ex
    return ex
