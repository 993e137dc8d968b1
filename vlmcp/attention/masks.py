"""Mask structure of CP attention: which (query, key) blocks exist, and of what kind.

The mask of a row is causal within each sample and empty across samples; with
bidirectional image attention the image tokens of a sample (a prefix of it) also
see each other in both directions. Attention is computed block by block: a
:class:`Block` pairs a contiguous range of stored queries with a contiguous range
of stored keys of the same sample, and :func:`block_kind` says whether the block
is empty (skipped), full, causal (top-left aligned) or needs a dense mask.

Tokens are described by :class:`Run`: a stretch of stored tokens whose offsets in
their sample are consecutive. Zigzag chunks, replicated image prefixes and the
gathered rows of Ulysses are all runs, so the kind of every block follows from
four integers per block and nothing is materialised as an (L, L) mask. See
Note [vlmcp ring attention schedule] in :mod:`vlmcp.attention.ring` for why
per-sample zigzag makes every block full, causal or empty.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import NamedTuple

import torch

__all__ = ["Block", "MaskKind", "Run", "block_kind", "cross_blocks", "dense_mask", "runs_of",
           "self_blocks", "split_runs"]


class MaskKind(enum.Enum):
    """What a block of (queries, keys) needs from the kernel."""

    EMPTY = "empty"
    """No query sees any key: skip the block."""
    FULL = "full"
    """Every query sees every key: no mask."""
    CAUSAL = "causal"
    """Query i sees keys 0..i (top-left aligned): the kernel's causal path."""
    MASKED = "masked"
    """Anything else: a dense mask built by :func:`dense_mask`."""


class Run(NamedTuple):
    """Stored tokens ``start .. start+length-1`` of one sample, at offsets ``offset ..``."""

    sample: int
    start: int
    offset: int
    length: int


class Block(NamedTuple):
    """Queries ``q_start:q_end`` against keys ``k_start:k_end`` (storage indices).

    ``q_offset``, ``k_offset`` (offsets in the sample of the first query and key) and
    ``image_len`` (bidirectional image span of the sample, 0 for causal image
    attention) define the mask of a ``MASKED`` block; ``FULL`` blocks may be
    coalesced from several runs, and then the offsets describe the first one only.
    """

    q_start: int
    q_end: int
    k_start: int
    k_end: int
    kind: MaskKind
    q_offset: int = 0
    k_offset: int = 0
    image_len: int = 0


def block_kind(q_offset: int, q_len: int, k_offset: int, k_len: int, image_len: int = 0) -> MaskKind:
    """The kind of the block between two runs of the same sample.

    Query at offset ``a`` sees key at offset ``b`` iff ``b <= a``, or both are
    below ``image_len`` (bidirectional image span; pass 0 for causal images).

    Args:
        q_offset, q_len: offset of the first query in its sample, and query count.
        k_offset, k_len: the same for the keys.
        image_len: bidirectional image prefix length of the sample, or 0.

    Returns:
        The :class:`MaskKind` of the block.
    """
    if q_len <= 0 or k_len <= 0:
        return MaskKind.EMPTY
    q_last, k_last = q_offset + q_len - 1, k_offset + k_len - 1
    # every query sees an image key (image queries both ways, text ones causally)
    if k_last <= q_offset or k_last < image_len:
        return MaskKind.FULL
    no_image_pair = q_offset >= image_len or k_offset >= image_len
    if q_last < k_offset and no_image_pair:
        return MaskKind.EMPTY
    # Causal top-left needs the same offsets, and no image pair above the diagonal
    # (that would need two image offsets i < j, i.e. q_offset + 1 < image_len).
    if q_offset == k_offset and (q_offset + 1 >= image_len or k_len < 2):
        return MaskKind.CAUSAL
    return MaskKind.MASKED


def dense_mask(block: Block, q_len: int, k_len: int, device=None) -> torch.Tensor:
    """``BoolTensor[q_len, k_len]``, True where the query sees the key (for ``MASKED`` blocks)."""
    qo = torch.arange(q_len, device=device) + block.q_offset
    ko = torch.arange(k_len, device=device) + block.k_offset
    seen = ko[None, :] <= qo[:, None]
    if block.image_len:
        seen |= (qo[:, None] < block.image_len) & (ko[None, :] < block.image_len)
    return seen


def runs_of(sample_ids: torch.Tensor, offsets: torch.Tensor) -> list[Run]:
    """Split stored tokens into runs; padding (offset ``-1``) belongs to no run.

    Args:
        sample_ids: ``LongTensor[N]``, sample of each stored token.
        offsets: ``LongTensor[N]``, offset in the sample, ``-1`` for padding.
    """
    vi = torch.nonzero(offsets >= 0).flatten()
    if vi.numel() == 0:
        return []
    s, o = sample_ids[vi], offsets[vi]
    brk = torch.ones(vi.numel(), dtype=torch.bool)
    brk[1:] = (s[1:] != s[:-1]) | (o[1:] != o[:-1] + 1) | (vi[1:] != vi[:-1] + 1)
    first = torch.nonzero(brk).flatten()
    lengths = torch.diff(first, append=torch.tensor([vi.numel()]))
    return [Run(int(s[f]), int(vi[f]), int(o[f]), int(n))
            for f, n in zip(first.tolist(), lengths.tolist(), strict=True)]


def split_runs(runs: Sequence[Run], image_lens: Sequence[int]) -> list[Run]:
    """Cut runs at their sample's image boundary (for bidirectional image attention)."""
    out = []
    for r in runs:
        cut = image_lens[r.sample] - r.offset
        if 0 < cut < r.length:
            out += [r._replace(length=cut),
                    Run(r.sample, r.start + cut, r.offset + cut, r.length - cut)]
        else:
            out.append(r)
    return out


def cross_blocks(q_runs: Sequence[Run], k_runs: Sequence[Run], image_lens: Sequence[int]) -> list[Block]:
    """Non-empty blocks between query runs and key runs, full blocks coalesced.

    Args:
        q_runs, k_runs: runs of the query and key storage (split with :func:`split_runs`
            first under bidirectional attention so that no block needs a dense mask).
        image_lens: per sample, bidirectional image span (all zeros for causal images).

    Returns:
        Blocks sorted by query start; adjacent ``FULL`` blocks sharing a query range
        (or a key range) are merged so the kernel sees few, large calls.
    """
    by_sample: dict[int, list[Run]] = {}
    for r in k_runs:
        by_sample.setdefault(r.sample, []).append(r)
    blocks = []
    for q in q_runs:
        for k in by_sample.get(q.sample, ()):
            il = image_lens[q.sample]
            kind = block_kind(q.offset, q.length, k.offset, k.length, il)
            if kind is not MaskKind.EMPTY:
                blocks.append(Block(q.start, q.start + q.length, k.start, k.start + k.length,
                                    kind, q.offset, k.offset, il))
    return _coalesce(blocks)


def _coalesce(blocks: list[Block]) -> list[Block]:
    full = [b for b in blocks if b.kind is MaskKind.FULL]
    rest = [b for b in blocks if b.kind is not MaskKind.FULL]
    for key, same, a0, a1 in (((0, 1, 2), (0, 1), 2, 3), ((2, 3, 0), (2, 3), 0, 1)):
        full.sort(key=lambda b, key=key: tuple(b[i] for i in key))
        merged: list[Block] = []
        for b in full:
            m = merged[-1] if merged else None
            if m is not None and all(m[i] == b[i] for i in same) and m[a1] == b[a0]:
                merged[-1] = m._replace(**{m._fields[a1]: b[a1]})
            else:
                merged.append(b)
        full = merged
    return sorted(full + rest, key=lambda b: (b.q_start, b.k_start))


def self_blocks(segments: Sequence[tuple[int, int, int, int]]) -> list[Block]:
    """Blocks of queries against their own keys, for segments stored in sample order.

    Within such a segment "key offset <= query offset" is "key index <= query index",
    so the whole segment is one causal block, whatever runs it is made of.

    Args:
        segments: ``(start, length, q_skip, prefix)`` per sample: stored tokens
            ``start .. start+length-1`` in increasing offset order (no padding);
            the first ``q_skip`` queries are not computed (their output comes from
            elsewhere); the first ``prefix`` tokens see each other bidirectionally
            (the image span under bidirectional attention, else 0).

    Returns:
        At most two blocks per segment: queries against the bidirectional/skipped
        prefix (``FULL``), and the rest (``CAUSAL``).
    """
    blocks = []
    for start, length, q_skip, prefix in segments:
        if length <= q_skip:
            continue
        m = min(max(prefix if prefix > 1 else 0, q_skip), length)
        if m > 0:
            blocks.append(Block(start + q_skip, start + length, start, start + m, MaskKind.FULL))
        if m < length:
            blocks.append(Block(start + m, start + length, start + m, start + length, MaskKind.CAUSAL))
    return blocks
