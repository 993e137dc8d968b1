"""The CP layout planner: which global tokens each rank of a CP group holds.

Note [vlmcp layout: replicated image prefix, per-sample zigzag text]
--------------------------------------------------------------------
A packed row holds S samples (``cu_seqlens`` marks them). Each sample is
``[image tokens | text tokens]``. With ``image_strategy="replicate"`` (the seed's
design) every rank keeps every image token, and each sample's text is padded to a
multiple of 2P, cut into 2P chunks, and rank r takes chunks r and 2P-1-r::

    sample:  [ I I I I | t0 t1 t2 t3 t4 t5 t6 t7 ]        P = 2, chunks of 2
                           c0    c1    c2    c3
    rank 0:  [ I I I I | t0 t1 | t6 t7 ]                   chunks 0 and 3
    rank 1:  [ I I I I | t2 t3 | t4 t5 ]                   chunks 1 and 2

Samples stay in order and each keeps its own contiguous local segment, so a
rank's local row is itself a packed row with local ``cu_seqlens``. Within a local
segment the tokens are in increasing global order and padding (``-1``) is a
suffix: padding is the tail of the global text and chunk r precedes chunk 2P-1-r.

With ``image_strategy="shard"`` (Megatron/LongVILA) the whole merged sample is
zigzagged the same way; nothing is replicated. ``image_strategy="auto"`` builds
both and keeps the one a cost model prices lower (see Note [vlmcp cost model:
replicate or shard image tokens] in :mod:`vlmcp.layout.cost`).

Causal work is balanced per sample: a text query at offset o sees o+1 keys, and
chunks r and 2P-1-r together hold the same sum of offsets on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, get_args

import torch

from vlmcp.layout.validate import check_cp_size, check_cu_seqlens, check_is_image, image_prefix_lens

if TYPE_CHECKING:
    from vlmcp.layout.cost import CostEstimate, CostModel

__all__ = ["CPPlan", "ImageStrategy", "RankShard", "TokenKind", "plan_cp"]

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
        replicated: ``BoolTensor[N]``, slots every rank holds (image tokens under
            ``replicate``); the other slots are zigzag-sharded and are what ring
            attention exchanges.
        cu_seqlens: ``IntTensor[S+1]`` (int32), local sample boundaries (padding included).
        max_seqlen: longest local sample segment.
        sample_starts: ``LongTensor[S]``, global start of each sample.
        image_lens: ``LongTensor[S]``, number of image tokens in each sample.
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
    """The layout of one (packed) row over a CP group. Build it with :func:`plan_cp`.

    Attributes:
        cp_size: P.
        image_strategy: ``"replicate"`` or ``"shard"``.
        seq_len: L.
        cu_seqlens: ``LongTensor[S+1]``, global sample boundaries.
        image_lens: ``LongTensor[S]``, image tokens per sample (a prefix of the sample).
        replicated_lens: ``LongTensor[S]``, tokens of each sample held by every rank.
        chunk_sizes: ``LongTensor[S]``, zigzag chunk length of each sample (2P chunks).
        cost_estimates: under ``image_strategy="auto"``, the cost model's
            :class:`~vlmcp.layout.cost.CostEstimate` of each candidate layout
            (``replicate`` first); ``None`` when the layout was named explicitly.
    """

    cp_size: int
    image_strategy: str
    seq_len: int
    cu_seqlens: torch.Tensor
    image_lens: torch.Tensor
    replicated_lens: torch.Tensor
    chunk_sizes: torch.Tensor
    cost_estimates: tuple[CostEstimate, ...] | None = None

    @property
    def num_samples(self) -> int:
        return self.image_lens.numel()

    @property
    def local_lens(self) -> torch.Tensor:
        """``LongTensor[S]``: slots per sample on every rank (the same on all ranks)."""
        return self.replicated_lens + 2 * self.chunk_sizes

    def for_rank(self, rank: int) -> RankShard:
        """The :class:`RankShard` of ``rank`` (no communication)."""
        if not isinstance(rank, int) or not 0 <= rank < self.cp_size:
            raise ValueError(f"rank must be an int in [0, {self.cp_size}), got {rank!r}")
        starts = self.cu_seqlens[:-1]
        seqlens = self.cu_seqlens[1:] - starts
        n_rep, chunk = self.replicated_lens, self.chunk_sizes
        local_lens = self.local_lens
        cu_local = torch.zeros(self.num_samples + 1, dtype=torch.long)
        torch.cumsum(local_lens, 0, out=cu_local[1:])
        n = int(cu_local[-1])
        sid = torch.repeat_interleave(torch.arange(self.num_samples), local_lens, output_size=n)
        u = torch.arange(n) - cu_local[sid]
        rep_s, chunk_s = n_rep[sid], chunk[sid]
        t = u - rep_s
        second = t >= chunk_s
        zig = torch.where(second, (2 * self.cp_size - 1 - rank) * chunk_s + (t - chunk_s),
                          rank * chunk_s + t)
        replicated = u < rep_s
        offset = torch.where(replicated, u, rep_s + zig)
        valid = offset < seqlens[sid]
        positions = torch.where(valid, starts[sid] + offset, -1)
        image = valid & (offset < self.image_lens[sid])
        kinds = torch.full((n,), TokenKind.PAD, dtype=torch.int8)
        kinds[valid] = TokenKind.TEXT
        kinds[image] = TokenKind.IMAGE
        return RankShard(
            rank=rank, cp_size=self.cp_size, image_strategy=self.image_strategy,
            seq_len=self.seq_len, positions=positions, sample_ids=sid, kinds=kinds,
            replicated=replicated, cu_seqlens=cu_local.to(torch.int32),
            max_seqlen=int(local_lens.max()) if self.num_samples else 0,
            sample_starts=starts.clone(), image_lens=self.image_lens, plan=self)

    def shards(self) -> list[RankShard]:
        """Every rank's shard, in rank order."""
        return [self.for_rank(r) for r in range(self.cp_size)]


def plan_cp(
    is_image: torch.Tensor,
    cp_size: int,
    cu_seqlens: torch.Tensor | None = None,
    image_strategy: ImageStrategy | Literal["auto"] = "replicate",
    cost_model: CostModel | None = None,
) -> CPPlan:
    """Plan how a (packed) multimodal row is laid out over a CP group.

    See Note [vlmcp layout: replicated image prefix, per-sample zigzag text].

    Args:
        is_image: ``BoolTensor[L]``, True at image tokens. Each sample's image tokens
            must be a prefix of the sample (one image span per sample).
        cp_size: P >= 1.
        cu_seqlens: ``IntTensor[S+1]`` sample boundaries, or None for one sample.
        image_strategy: ``"replicate"`` keeps image tokens whole on every rank and
            zigzags only text; ``"shard"`` zigzags the merged sample; ``"auto"`` plans
            both and returns the one whose busiest rank ``cost_model`` prices lower
            (ties, and P = 1, give ``"replicate"``). The decision reads only this
            metadata, so every rank that passes the same row gets the same plan.
        cost_model: the :class:`~vlmcp.layout.cost.CostModel` for ``"auto"``
            (default ``CostModel()``); only valid with ``"auto"``. It must be the same on
            every rank (built from configuration), or ranks may pick different layouts.

    Returns:
        A :class:`CPPlan`; ``plan.for_rank(r)`` gives rank r's :class:`RankShard`.
        ``plan.image_strategy`` is the layout built (under ``"auto"``, the one chosen)
        and ``plan.cost_estimates`` holds the estimates it was chosen by.

    Raises:
        TypeError, ValueError: for malformed input (the message names the bad value).
        NotImplementedError: for interleaved images (images not a sample prefix).
    """
    check_is_image(is_image)
    check_cp_size(cp_size)
    choices = (*get_args(ImageStrategy), "auto")
    if image_strategy not in choices:
        raise ValueError(f"image_strategy must be one of {choices}, got {image_strategy!r}")
    if cost_model is not None and image_strategy != "auto":
        raise ValueError(
            f"cost_model is only used by image_strategy='auto', got image_strategy={image_strategy!r}")
    is_image = is_image.detach().cpu()
    seq_len = is_image.numel()
    cu = check_cu_seqlens(cu_seqlens, seq_len)
    image_lens, first_bad = image_prefix_lens(is_image, cu)
    if first_bad >= 0:
        raise NotImplementedError(
            f"sample {first_bad} (tokens {int(cu[first_bad])}..{int(cu[first_bad + 1]) - 1}) has "
            f"image tokens after text; image_strategy={image_strategy!r} supports images only "
            "as a prefix of each sample (interleaved images are not implemented yet)")
    if image_strategy == "auto":
        # cost.py builds on this module (it prices CPPlans), so it is imported here.
        from vlmcp.layout.cost import choose_plan

        candidates = [_layout(cu, image_lens, cp_size, s) for s in get_args(ImageStrategy)]
        return choose_plan(candidates, cost_model)
    return _layout(cu, image_lens, cp_size, image_strategy)


def _layout(cu: torch.Tensor, image_lens: torch.Tensor, cp_size: int,
            image_strategy: ImageStrategy) -> CPPlan:
    """The plan of a validated row: O(S) arithmetic on its sample lengths."""
    seqlens = cu[1:] - cu[:-1]
    replicated = image_lens if image_strategy == "replicate" else torch.zeros_like(image_lens)
    zigzag_lens = seqlens - replicated
    chunk = (zigzag_lens + 2 * cp_size - 1) // (2 * cp_size)
    return CPPlan(cp_size=cp_size, image_strategy=image_strategy, seq_len=int(cu[-1]),
                  cu_seqlens=cu, image_lens=image_lens, replicated_lens=replicated,
                  chunk_sizes=chunk)
