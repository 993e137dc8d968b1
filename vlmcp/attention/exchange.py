"""Which tokens CP attention exchanges between ranks, derived from the plan alone.

A rank's *travelling* tokens are its zigzag chunks of split samples (text only
under ``image_strategy="replicate"``, text and image under ``"shard"``), padding
excluded (``shard.travels``). Replicated image tokens never travel: every rank
already has them; nor do whole samples' tokens: their owner holds every key they
see. Because ``shard.plan`` gives every peer's metadata, each rank knows, without
communicating, how many tokens every peer sends and where they sit
in the global row, so message sizes and block structure agree on all ranks.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from vlmcp.layout.plan import RankShard

__all__ = ["Exchange", "exchange_of", "ring_bytes_sent"]


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
    """

    rank: int
    cp_size: int
    send_index: torch.Tensor
    counts: tuple[int, ...]
    positions: tuple[torch.Tensor, ...]


def _travelling(shard: RankShard) -> torch.Tensor:
    return torch.nonzero(shard.travels).flatten()


_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def exchange_of(shard: RankShard) -> Exchange:
    """The :class:`Exchange` of ``shard`` (cached per shard object: layers share it)."""
    hit = _CACHE.get(shard)
    if hit is not None:
        return hit
    # a rank's local order is global order, so its packed buffer is its owned tokens in row
    # order: read every peer's off the plan's owners, without building the peer's shard
    plan = shard.plan
    pos = tuple(torch.nonzero((plan.owner == p) & plan.travelling).flatten() for p in range(shard.cp_size))
    ex = Exchange(
        rank=shard.rank, cp_size=shard.cp_size, send_index=_travelling(shard),
        counts=tuple(int(x.numel()) for x in pos), positions=pos)
    _CACHE[shard] = ex
    return ex


def ring_bytes_sent(shard: RankShard, kv_heads: int, head_dim: int, itemsize: int,
                    grad_itemsize: int | None = None) -> tuple[int, int]:
    """Bytes this rank sends per attention layer under the ring backend: ``(forward, backward)``.

    At ring step s (0 <= s < P-1) a rank passes on the K/V buffer that rank r-s
    owns; backward rotates K/V again and also passes on the dK/dV accumulators
    (steps 1..P-1, in ``grad_itemsize``: float32 for 16/32-bit inputs, float64 for
    float64). Only travelling tokens count (see :func:`exchange_of`).
    """
    ex = exchange_of(shard)
    P, r = ex.cp_size, ex.rank
    grad_itemsize = max(itemsize, 4) if grad_itemsize is None else grad_itemsize
    per_token = 2 * kv_heads * head_dim  # K and V
    fwd = sum(ex.counts[(r - s) % P] for s in range(P - 1)) * per_token * itemsize
    dkv = sum(ex.counts[(r - s) % P] for s in range(1, P)) * per_token * grad_itemsize
    return fwd, fwd + dkv
