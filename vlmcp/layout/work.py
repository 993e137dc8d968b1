"""Exact attention-work accounting for a plan: attended (query, key) pairs per rank.

The mask is causal within each sample and empty across samples; with
``image_attention="bidirectional"`` the tokens of each image also see each other
in both directions. A query at offset o of its sample sees o + 1 keys, wherever
images sit (text after an image sees it, an image after text sees that text); an
image query under bidirectional attention also sees the rest of its image, so it
sees every key before its image's end. Padding slots attend to nothing. Replicated
image queries are computed on every rank, against every key they see (travelling
text included), so under ``image_strategy="replicate"`` each rank carries all
image-query work.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from vlmcp.layout.plan import CPPlan, RankShard

__all__ = ["ImageAttention", "WorkReport", "attended_pairs", "keys_per_query", "row_keys_per_query"]

ImageAttention = Literal["causal", "bidirectional"]


def _check_image_attention(image_attention) -> None:
    if image_attention not in ("causal", "bidirectional"):
        raise ValueError(f"image_attention must be 'causal' or 'bidirectional', got {image_attention!r}")


def row_keys_per_query(plan: CPPlan, image_attention: ImageAttention = "causal") -> torch.Tensor:
    """``LongTensor[L]``: how many keys each token of the global row attends to."""
    _check_image_attention(image_attention)
    return plan.images.keys_per_query(image_attention)


def keys_per_query(shard: RankShard, image_attention: ImageAttention = "causal") -> torch.Tensor:
    """``LongTensor[N]``: how many keys of the whole row each local query attends to (0 at padding)."""
    keys = row_keys_per_query(shard.plan, image_attention)[shard.positions.clamp(min=0)]
    return torch.where(shard.positions >= 0, keys, 0)


@dataclass(frozen=True)
class WorkReport:
    """Attended pairs per rank, split by query kind.

    Attributes:
        text_pairs: per rank, pairs whose query is a text token.
        image_pairs: per rank, pairs whose query is an image token.
        tokens: per rank, real (non-padding) local tokens.
        slots: per rank, local slots including padding.
        single_process_pairs: pairs of the whole row computed once, by one process.
    """

    text_pairs: tuple[int, ...]
    image_pairs: tuple[int, ...]
    tokens: tuple[int, ...]
    slots: tuple[int, ...]
    single_process_pairs: int

    @property
    def total_pairs(self) -> tuple[int, ...]:
        return tuple(t + i for t, i in zip(self.text_pairs, self.image_pairs, strict=False))

    @staticmethod
    def _balance(xs) -> float:
        mean = sum(xs) / len(xs)
        return max(xs) / mean if mean else 1.0

    @property
    def balance(self) -> float:
        """max/mean of total pairs over ranks (1.0 is perfect)."""
        return self._balance(self.total_pairs)

    @property
    def text_balance(self) -> float:
        """max/mean of text-query pairs over ranks."""
        return self._balance(self.text_pairs)

    @property
    def efficiency(self) -> float:
        """Ideal per-rank work (single process / P) over the busiest rank's work."""
        busiest = max(self.total_pairs)
        return self.single_process_pairs / len(self.slots) / busiest if busiest else 1.0


def attended_pairs(plan: CPPlan, image_attention: ImageAttention = "causal") -> WorkReport:
    """Count attended (query, key) pairs on every rank of ``plan`` (O(L), no shard is built)."""
    keys = row_keys_per_query(plan, image_attention)
    P = plan.cp_size
    # replicated tokens are held (and their queries computed) by every rank
    rank = torch.where(plan.owner >= 0, plan.owner, P)
    text = torch.bincount(rank, weights=torch.where(plan.is_image, 0, keys).double(), minlength=P + 1)
    image = torch.bincount(rank, weights=torch.where(plan.is_image, keys, 0).double(), minlength=P + 1)
    tokens = torch.bincount(rank, minlength=P + 1)
    every = lambda x: tuple(int(x[r]) + int(x[P]) for r in range(P))
    return WorkReport(every(text.long()), every(image.long()), every(tokens), (plan.num_slots,) * P,
                      int(keys.sum()))
