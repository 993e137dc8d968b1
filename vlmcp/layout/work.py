"""Exact attention-work accounting for a plan: attended (query, key) pairs per rank.

The mask is causal within each sample and empty across samples; with
``image_attention="bidirectional"`` the image tokens of a sample also see each
other in both directions (prefix-LM). A query at offset o of its sample sees
o + 1 keys (an image query under bidirectional attention sees the whole image).
Padding slots attend to nothing. Replicated image queries are computed on every
rank, so under ``image_strategy="replicate"`` each rank carries all image-query work.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from vlmcp.layout.plan import CPPlan, RankShard

__all__ = ["ImageAttention", "WorkReport", "attended_pairs", "keys_per_query"]

ImageAttention = Literal["causal", "bidirectional"]


def keys_per_query(shard: RankShard, image_attention: ImageAttention = "causal") -> torch.Tensor:
    """``LongTensor[N]``: how many keys of the whole row each local query attends to."""
    if image_attention not in ("causal", "bidirectional"):
        raise ValueError(f"image_attention must be 'causal' or 'bidirectional', got {image_attention!r}")
    keys = shard.offsets + 1  # padding: -1 + 1 = 0
    if image_attention == "bidirectional":
        keys = torch.where(shard.is_image, shard.image_lens[shard.sample_ids], keys)
    return keys


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
    """Count attended (query, key) pairs on every rank of ``plan``."""
    text, image, tokens, slots = [], [], [], []
    for shard in plan.shards():
        keys = keys_per_query(shard, image_attention)
        text.append(int(keys[shard.is_text].sum()))
        image.append(int(keys[shard.is_image].sum()))
        tokens.append(int((~shard.is_pad).sum()))
        slots.append(shard.num_tokens)
    seqlens = plan.cu_seqlens[1:] - plan.cu_seqlens[:-1]
    single = int((seqlens * (seqlens + 1) // 2).sum())
    if image_attention == "bidirectional":
        n = plan.image_lens
        single += int((n * n - n * (n + 1) // 2).sum())
    return WorkReport(tuple(text), tuple(image), tuple(tokens), tuple(slots), single)
