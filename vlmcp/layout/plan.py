"""The CP layout: which global tokens each rank of a CP group holds.

Note [vlmcp layout: replicated images anywhere, per-sample zigzag text]
-----------------------------------------------------------------------
A packed row holds S samples (``cu_seqlens`` marks them); text and images may
interleave in any order within a sample (a prompt, an image, a question, another
image, the answer; a video is one long image run). With
``image_strategy="replicate"`` (the seed's design) every rank keeps every image token,
and each sample's *text* tokens, wherever they sit, are cut into 2P chunks; rank r
takes chunks r and 2P-1-r. P = 2, text ``t`` chunked ``a b c d``::

    sample:  [ t t | I I I | t t t t t t | I I | t t t t ]       (global order)
    chunks:    a a           a b b b c c         c d d d        (cut by causal work)
    rank 0:  [ a a | I I I | a           | I I |   d d d ]  + padding
    rank 1:  [       I I I |   b b b c c | I I | c       ]  + padding

A rank's tokens of a sample stay in global order, images included, so its local row
is itself a packed row (local ``cu_seqlens``) whose own-K/V attention is one causal
block per sample. A rank's segment of a split sample is what it holds of it (segments of
one sample may differ in length from rank to rank: which rank takes which band is dealt
by tokens held, in :mod:`vlmcp.layout.cuts`); every rank has the same number of slots, the
busiest rank's, and the padding (``-1``) that evens them out closes the last segment. (A sample placed whole
on one rank, Note [vlmcp whole-sample placement], is a segment of that rank alone.) Where the cuts fall is
Note [vlmcp zigzag cut points: equal chunks or equal causal work] in
:mod:`vlmcp.layout.cuts`: equal chunks (megatron-core's order) for text-only samples
whose length divides by 2P, equal causal work for the others, so a short prompt
before a large image does not leave rank 0 idle.

With ``image_strategy="shard"`` (Megatron/LongVILA) the whole merged sample is cut
into equal chunks; nothing is replicated. Which layout ``"auto"`` picks is
:mod:`vlmcp.layout.choose`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

from vlmcp.layout.cuts import zigzag_cuts
from vlmcp.layout.images import RowImages

__all__ = ["CPPlan", "ImageStrategy", "RankShard", "TokenKind", "build_plan"]

ImageStrategy = Literal["replicate", "shard"]
"""A layout: where a sample's image tokens live. ``plan_cp`` also takes ``"auto"``."""


class TokenKind:
    """Values of :attr:`RankShard.kinds`."""

    TEXT = 0
    IMAGE = 1
    PAD = 2


@dataclass(frozen=True, eq=False)
class RankShard:
    """One rank's part of a planned row. Pure data, identical on every rank.

    Attributes:
        rank: this rank's index in the CP group.
        cp_size: P, the CP group size the plan was made for.
        image_strategy: ``"replicate"`` or ``"shard"``.
        seq_len: L, length of the global row.
        positions: ``LongTensor[N]``, global position of each local slot, ``-1`` for padding.
        sample_ids: ``LongTensor[N]``, sample index of each local slot (padding included).
        kinds: ``Int8Tensor[N]`` of :class:`TokenKind` values.
        replicated: ``BoolTensor[N]``, slots every rank holds (image tokens of split
            samples under ``replicate``).
        travels: ``BoolTensor[N]``, the zigzag-sharded slots of split samples: what ring
            and Ulysses exchange (whole samples' and replicated tokens never travel).
        cu_seqlens: ``IntTensor[S+1]`` (int32), local sample boundaries (padding included).
        max_seqlen: longest local sample segment.
        sample_starts: ``LongTensor[S]``, global start of each sample.
        image_lens: ``LongTensor[S]``, number of image tokens in each sample (anywhere in it).
        plan: the :class:`CPPlan` this shard belongs to (gives every peer's shard).
    """

    rank: int
    cp_size: int
    image_strategy: str
    seq_len: int
    positions: torch.Tensor
    sample_ids: torch.Tensor
    kinds: torch.Tensor
    replicated: torch.Tensor
    travels: torch.Tensor
    cu_seqlens: torch.Tensor
    max_seqlen: int
    sample_starts: torch.Tensor
    image_lens: torch.Tensor
    plan: CPPlan = field(repr=False)

    def __repr__(self) -> str:  # the tensors can hold a million entries
        return (f"RankShard(rank={self.rank}, cp_size={self.cp_size}, image_strategy="
                f"{self.image_strategy!r}, seq_len={self.seq_len}, slots={self.num_tokens}, "
                f"image={int(self.is_image.sum())}, text={int(self.is_text.sum())}, "
                f"pad={int(self.is_pad.sum())}, samples={self.cu_seqlens.numel() - 1})")

    @property
    def num_tokens(self) -> int:
        """Local slots, padding included."""
        return self.positions.numel()

    @property
    def is_image(self) -> torch.Tensor:
        return self.kinds == TokenKind.IMAGE

    @property
    def is_text(self) -> torch.Tensor:
        return self.kinds == TokenKind.TEXT

    @property
    def is_pad(self) -> torch.Tensor:
        return self.kinds == TokenKind.PAD

    @property
    def image_index(self) -> torch.Tensor:
        """``LongTensor[N]``: the image (row order, from 0) of each local image slot, ``-1`` elsewhere."""
        ids = self.plan.images.image_ids[self.positions.clamp(min=0)]
        return torch.where(self.positions >= 0, ids, -1)

    @property
    def offsets(self) -> torch.Tensor:
        """``LongTensor[N]``: position within its sample, ``-1`` for padding."""
        off = self.positions - self.sample_starts[self.sample_ids]
        return torch.where(self.positions >= 0, off, -1)

    def shard(self, x: torch.Tensor, dim: int = 0, fill: float | int | bool = 0) -> torch.Tensor:
        """Select this rank's tokens from a per-token tensor of the global row.

        Args:
            x: any tensor with ``x.shape[dim] == L`` (input ids, labels, embeddings,
                1-D position ids, or M-RoPE ids of shape ``(3, L)`` with ``dim=1``).
            dim: the token dimension of ``x``.
            fill: value placed in padding slots.

        Returns:
            ``x`` with dimension ``dim`` of size N, in local order. Differentiable:
            the gradient flows back to the selected global positions.
        """
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"shard expects a tensor, got {type(x).__name__}")
        if x.dim() == 0:
            raise ValueError("shard expects a tensor with a token dimension, got a scalar")
        d = dim % x.dim()
        if x.shape[d] != self.seq_len:
            raise ValueError(
                f"shard: tensor of shape {tuple(x.shape)} has {x.shape[d]} tokens on dim {dim}, "
                f"but the plan's row has L={self.seq_len}")
        pad = self.positions < 0
        out = x.index_select(d, self.positions.clamp(min=0).to(x.device))
        if bool(pad.any()):
            shape = [1] * x.dim()
            shape[d] = -1
            out = out.masked_fill(pad.to(x.device).view(shape), fill)
        return out

    def shard_labels(self, labels: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
        """Shard next-token labels (from :func:`vlmcp.shift_labels`); padding gets ``ignore_index``.

        Use this, not ``shard(labels)``: the default ``fill=0`` would make every padding
        slot a real target (token 0) and silently change the loss.
        """
        return self.shard(labels, fill=ignore_index)

    def shard_position_ids(self, position_ids: torch.Tensor) -> torch.Tensor:
        """Shard 1-D position ids ``(L,)`` or Qwen2-VL M-RoPE ids ``(3, L)``; padding gets 0."""
        ok = position_ids.dim() == 1 or (position_ids.dim() == 2 and position_ids.shape[0] == 3)
        if not ok or position_ids.shape[-1] != self.seq_len:
            raise ValueError(
                f"position ids must have shape ({self.seq_len},) or M-RoPE shape "
                f"(3, {self.seq_len}), got {tuple(position_ids.shape)}")
        return self.shard(position_ids, dim=-1, fill=0)


@dataclass(frozen=True, eq=False)
class CPPlan:
    """The layout of one (packed) row over a CP group. Build it with :func:`vlmcp.plan_cp`.

    Attributes:
        cp_size: P.
        image_strategy: ``"replicate"`` or ``"shard"``.
        seq_len: L.
        cu_seqlens: ``LongTensor[S+1]``, global sample boundaries.
        images: the row's :class:`~vlmcp.layout.images.RowImages` (image ids and spans,
            each token's sample and offset).
        is_image: ``BoolTensor[L]``.
        owner: ``LongTensor[L]``, the rank holding each token that is not replicated
            (zigzag-sharded, or in a whole sample); ``-1`` for replicated tokens.
        whole: ``LongTensor[S]``, the rank a sample is placed on whole, ``-1`` for a split
            sample (see Note [vlmcp whole-sample placement] in :mod:`vlmcp.layout.sample_placement`).
        travelling: ``BoolTensor[L]``, tokens exchanged by CP attention: the sharded
            tokens of split samples.
        cuts: ``LongTensor[S, 2P+1]``, zigzag cut points of each sample's sharded tokens.
        band_ranks: ``LongTensor[S, P]``, the rank holding band j (chunks j and 2P-1-j) of each
            sample: j where the sample is cut into equal chunks, else dealt by tokens held (Note
            [vlmcp zigzag cut points: equal chunks or equal causal work]).
        image_lens: ``LongTensor[S]``, image tokens per sample.
        replicated_lens: ``LongTensor[S]``, tokens of each sample held by every rank.
        rank_lens: ``LongTensor[S, P]``, non-replicated tokens of each sample on each rank.
        cost_estimates: under ``image_strategy="auto"``, the cost model's
            :class:`~vlmcp.layout.cost.CostEstimate` of each candidate layout
            (``replicate`` first); ``None`` when the layout was named explicitly.
    """

    cp_size: int
    image_strategy: str
    seq_len: int
    cu_seqlens: torch.Tensor
    images: RowImages = field(repr=False)
    is_image: torch.Tensor = field(repr=False)
    owner: torch.Tensor = field(repr=False)
    whole: torch.Tensor
    travelling: torch.Tensor = field(repr=False)
    cuts: torch.Tensor
    band_ranks: torch.Tensor
    image_lens: torch.Tensor
    replicated_lens: torch.Tensor
    rank_lens: torch.Tensor
    cost_estimates: tuple | None = None  # of vlmcp.layout.cost.CostEstimate (cost.py builds on this module)

    @property
    def num_samples(self) -> int:
        return self.image_lens.numel()

    @property
    def num_images(self) -> int:
        return self.images.num_images

    @property
    def sample_placement(self) -> str:
        """``"split"``, ``"whole"`` or ``"mixed"``: how the plan placed its samples."""
        whole = self.whole >= 0
        return "whole" if bool(whole.all()) else "mixed" if bool(whole.any()) else "split"

    @property
    def segment_lens(self) -> torch.Tensor:
        """``LongTensor[S, P]``: slots of sample s on rank r, before the row's closing padding.

        A split sample's segment on rank r is its replicated tokens and rank r's band; a whole
        sample has its length on its rank and nothing elsewhere.
        """
        split = self.replicated_lens[:, None] + self.rank_lens
        return torch.where((self.whole >= 0)[:, None], self.rank_lens, split)

    @property
    def num_slots(self) -> int:
        """Local slots per rank (the same on every rank), padding included."""
        return int(self.segment_lens.sum(dim=0).max()) if self.num_samples else 0

    def for_rank(self, rank: int) -> RankShard:
        """The :class:`RankShard` of ``rank`` (no communication; O(L)).

        Sample segments in row order; a rank's segment of a sample it holds nothing of is
        empty, and the padding that evens out the slot counts closes the last segment.
        """
        if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < self.cp_size:
            raise ValueError(f"rank must be an int in [0, {self.cp_size}), got {rank!r}")
        S = self.num_samples
        seg = self.segment_lens[:, rank].clone()
        seg[-1] += self.num_slots - int(seg.sum())
        cu_local = torch.zeros(S + 1, dtype=torch.long)
        torch.cumsum(seg, 0, out=cu_local[1:])
        n = int(cu_local[-1])
        pos = torch.nonzero((self.owner == rank) | (self.owner < 0)).flatten()
        sid = self.images.sample_ids[pos]
        held = self.replicated_lens + self.rank_lens[:, rank]
        first = torch.cumsum(held, 0) - held
        slot = cu_local[:-1][sid] + torch.arange(pos.numel()) - first[sid]
        positions = torch.full((n,), -1, dtype=torch.long)
        positions[slot] = pos
        kinds = torch.full((n,), TokenKind.PAD, dtype=torch.int8)
        kinds[slot] = torch.where(self.is_image[pos], TokenKind.IMAGE, TokenKind.TEXT).to(torch.int8)
        replicated = torch.zeros(n, dtype=torch.bool)
        replicated[slot] = self.owner[pos] < 0
        travels = torch.zeros(n, dtype=torch.bool)
        travels[slot] = self.travelling[pos]
        return RankShard(
            rank=rank, cp_size=self.cp_size, image_strategy=self.image_strategy,
            seq_len=self.seq_len, positions=positions,
            sample_ids=torch.repeat_interleave(torch.arange(S), seg, output_size=n),
            kinds=kinds, replicated=replicated, travels=travels, cu_seqlens=cu_local.to(torch.int32),
            max_seqlen=int(seg.max()) if S else 0,
            sample_starts=self.cu_seqlens[:-1].clone(), image_lens=self.image_lens, plan=self)

    def shards(self) -> list[RankShard]:
        """Every rank's shard, in rank order."""
        return [self.for_rank(r) for r in range(self.cp_size)]


def build_plan(cu: torch.Tensor, is_image: torch.Tensor, images: RowImages, cp_size: int,
               image_strategy: ImageStrategy, whole: torch.Tensor | None = None) -> CPPlan:
    """The layout of a validated row (see the Note); O(L) tensor work plus O(S P) cut points.

    ``whole``: ``LongTensor[S]``, the rank each sample is placed on whole, ``-1`` to split
    it (None: split every sample).
    """
    P, S = cp_size, cu.numel() - 1
    sid = images.sample_ids
    whole = torch.full((S,), -1, dtype=torch.long) if whole is None else whole.long()
    split = whole < 0
    sharded = (~is_image if image_strategy == "replicate" else torch.ones_like(is_image)) & split[sid]
    zpos = torch.nonzero(sharded).flatten()
    zsid = sid[zpos]
    zlens = torch.bincount(zsid, minlength=S)
    image_lens = torch.bincount(sid[is_image], minlength=S)
    replicated = torch.where(split, image_lens, 0) if image_strategy == "replicate" \
        else torch.zeros_like(image_lens)
    # equal chunks where the sharded tokens' offsets run 0..Z-1 (nothing replicated) and Z
    # divides by 2P: megatron-core's order; equal causal work elsewhere (Note in vlmcp.layout.cuts)
    balance = (replicated > 0) | (zlens % (2 * P) != 0)
    cuts, band_ranks = zigzag_cuts(zlens, images.offsets[zpos] + 1, balance, P)
    chunk_lens = cuts[:, 1:] - cuts[:, :-1]
    # sharded tokens are in row order, so their chunk ids are each sample's 0..2P-1 repeated
    chunk = torch.arange(2 * P).repeat(S).repeat_interleave(chunk_lens.flatten(), output_size=zpos.numel())
    owner = torch.where(split[sid], -1, whole[sid])
    band = torch.where(chunk < P, chunk, 2 * P - 1 - chunk)
    owner[zpos] = band_ranks[zsid, band]
    band_lens = chunk_lens[:, :P] + chunk_lens[:, P:].flip(1)
    rank_lens = torch.zeros_like(band_lens).scatter_(1, band_ranks, band_lens)
    seqlens = cu[1:] - cu[:-1]
    on_rank = (~split)[:, None] & (whole[:, None] == torch.arange(P)[None])
    rank_lens = torch.where(on_rank, seqlens[:, None], rank_lens)
    travelling = torch.zeros_like(is_image)
    travelling[zpos] = True
    return CPPlan(cp_size=P, image_strategy=image_strategy, seq_len=int(cu[-1]), cu_seqlens=cu,
                  images=images, is_image=is_image, owner=owner, whole=whole, travelling=travelling,
                  cuts=cuts, band_ranks=band_ranks, image_lens=image_lens, replicated_lens=replicated,
                  rank_lens=rank_lens)
